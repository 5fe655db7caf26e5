"""The package's import structure (pure: reads the source with ``ast``, imports nothing): no import
cycle, lower layers never import higher ones, and only ``storage/`` touches ``deltalake``."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "cq_engine"
ADAPTER = PACKAGE.parent / "dagster_defs"
AIRFLOW_ADAPTER = PACKAGE.parent / "airflow_dags"


def _modules(*packages: Path) -> dict[str, Path]:
    out = {}
    for package in packages:
        for path in sorted(package.rglob("*.py")):
            parts = list(path.relative_to(package.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules(PACKAGE)
EVERY_MODULE = _modules(PACKAGE, ADAPTER, AIRFLOW_ADAPTER)  # the adapters too: no circle in them either
OURS = ("cq_engine", "dagster_defs", "airflow_dags")


def _resolve(name: str, modules: dict[str, Path] = EVERY_MODULE) -> str:
    while name not in modules:
        name = name.rpartition(".")[0]
    return name


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute name ``from .x import y`` (level >= 1) in ``module`` refers to."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _imports(path: Path, module: str = "") -> tuple[set[str], set[str]]:
    """(our modules, other top-level packages) imported anywhere in the file — function-level,
    ``TYPE_CHECKING`` and relative imports included, and modules imported by name
    (``importlib.import_module("literal")``)."""
    ours, others = set(), set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or node.level):
            base = node.module if node.level == 0 else _absolute(module, path, node)
            assert base is not None
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in EVERY_MODULE else base for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        for name in names:
            if name.split(".")[0] in OURS:
                ours.add(_resolve(name))
            else:
                others.add(name.split(".")[0])
    return ours, others


GRAPH = {m: {d for d in _imports(p, m)[0] - {m} if d in MODULES} for m, p in MODULES.items()}
EXTERNAL = {
    m: _imports(p, m)[1] | {d.split(".")[0] for d in _imports(p, m)[0] if d not in MODULES} for m, p in MODULES.items()
}
WHOLE = {m: _imports(p, m)[0] - {m} for m, p in EVERY_MODULE.items()}


def _cycle(graph: dict[str, set[str]] | None = None) -> list[str] | None:
    graph = GRAPH if graph is None else graph
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return [*stack[stack.index(d) :], d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_cycle():
    cycle = _cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_import_cycle_in_the_adapter_or_across_packages():
    """Relative imports and imports by name count: no file-level circle anywhere."""
    cycle = _cycle(WHOLE)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_sees_relative_and_by_name_imports():
    assert "dagster_defs.builders" in WHOLE["dagster_defs.batch"]  # ``from .builders import ...``
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert "cq_engine.cli.main" in WHOLE["cq_engine.cli.client"]


def _in(module: str, *packages: str) -> bool:
    return any(module == f"cq_engine.{p}" or module.startswith(f"cq_engine.{p}.") for p in packages)


# Layers, bottom up: a module may import its own layer and the ones below, never one above.
# As ARCHITECTURE.md's table: core; parse, pure timing and storage; session; execution; facade; CLI.
LAYERS = [
    ("errors", "names", "times", "durations", "config", "configfile", "jars", "model", "statefile"),
    (
        "parse",
        "lastgood",
        "catalog",
        "schedule",
        "scheduling",
        "resample.timing",
        "streams.timing",
        "streams.output",
        "storage",
        "health",
        "arrivals",
    ),
    ("spark", "context", "recovery"),
    ("resample", "streams", "notify", "triggers", "ingest", "housekeeping"),
    ("engine",),
    ("cli",),
]


def _layer(module: str) -> int:
    if module == "cq_engine":
        return len(LAYERS)  # the package's public API may re-export anything
    # The most specific entry wins (``streams.timing`` over ``streams``).
    found = [(len(p), i) for i, packages in enumerate(LAYERS) for p in packages if _in(module, p)]
    assert found, f"{module} is in no layer of test_architecture.LAYERS: add it"
    return max(found)[1]


def test_lower_layers_never_import_higher_ones():
    bad = [
        f"{m} (layer {_layer(m)}) imports {d} (layer {_layer(d)})"
        for m, deps in sorted(GRAPH.items())
        for d in sorted(deps)
        if _layer(d) > _layer(m)
    ]
    assert not bad, "\n".join(bad)


def test_parse_is_pure_and_storage_knows_no_execution_model():
    for m, deps in GRAPH.items():
        if _in(m, "parse"):
            assert all(_in(d, "parse", "errors", "names", "times", "durations", "model") for d in deps), (m, deps)
        if _in(m, "storage"):  # storage knows the core only
            bad = [
                d
                for d in deps
                if not _in(d, "storage", "errors", "names", "times", "durations", "config", "jars", "model")
            ]
            assert not bad, f"{m} imports {bad}"


def test_only_the_cli_imports_the_engine_facade():
    users = sorted(m for m, deps in GRAPH.items() if "cq_engine.engine" in deps and m != "cq_engine")
    assert all(_in(m, "cli") for m in users), users


def test_the_core_does_not_import_the_dagster_adapter():
    users = sorted(
        m for m, ext in EXTERNAL.items() if ext & {"dagster", "dagster_defs", "dagster_graphql"} and not _in(m, "cli")
    )
    assert not users, users


def test_the_core_does_not_import_the_airflow_adapter():
    users = sorted(m for m, ext in EXTERNAL.items() if ext & {"airflow", "airflow_dags"})
    assert not users, users


def test_the_adapters_do_not_import_each_other():
    crossing = sorted(
        f"{m} imports {d}"
        for m, deps in WHOLE.items()
        for d in deps
        if {m.split(".")[0], d.split(".")[0]} == {"dagster_defs", "airflow_dags"}
    )
    assert not crossing, crossing


def test_deltalake_only_in_storage():
    users = sorted(m for m, ext in EXTERNAL.items() if "deltalake" in ext and not _in(m, "storage"))
    assert not users, users


def test_the_graph_sees_the_package():
    assert {"cq_engine.engine", "cq_engine.context", "cq_engine.storage.base", "cq_engine.streams.run"} <= set(GRAPH)
    assert "cq_engine.resample.run" in GRAPH["cq_engine.engine"]


def test_public_api_is_lazy_and_complete():
    import subprocess
    import sys

    code = (
        "import sys, cq_engine\n"
        "heavy = [m for m in ('pyspark', 'deltalake', 'dagster', 'cq_engine.engine') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "from cq_engine import Trigger, CQError, Settings\n"
        "assert Trigger.__module__ == 'cq_engine.triggers' and issubclass(CQError, Exception)\n"
        "print(len(cq_engine.__all__))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    import cq_engine

    for name in cq_engine.__all__:
        assert getattr(cq_engine, name) is not None, name


def test_only_one_adapter_module_imports_dagsters_private_modules():
    """``dagster_defs.internals`` says why each private name is needed; no other module reaches in."""
    users = sorted(
        m
        for m, p in EVERY_MODULE.items()
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        and any(
            name.startswith("dagster._")
            for name in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""])
        )
    )
    assert set(users) == {"dagster_defs.internals"}, users
