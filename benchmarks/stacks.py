"""``python -m benchmarks.stacks [--only NAME ...] [--quick]``: the same benchmarks on the previous and the
current Spark/Delta stack, side by side in one run.

The current stack is this checkout's ``.venv`` (``make setup``: the pins of pyproject.toml). The previous
one is a second venv, ``.venv-previous``, built once by ``make setup VENV=.venv-previous`` and then given
the previous pins (``--previous``, default pyspark 4.0.1 + delta-spark 4.0.1) without their dependencies;
``make jars`` there fetches that stack's jars, which ``cq_engine.jars`` derives from the installed packages.
Each benchmark runs in its own process per stack, the two interleaved (previous, current, and the other
order for the next benchmark) so a burst of load on the shared machine hits both alike.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BENCHMARKS = ("recalculate_vs_groupby", "firing_overhead", "batch_firings", "stream_catchup")
PREVIOUS = "pyspark[connect]==4.0.1 delta-spark==4.0.1"
_SUMMARY = re.compile(r"^\s+(\S+)\s+(OK|MISSED|INFO|ERROR)\s+ratio (\S+)")


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def build_previous(venv: Path, pins: str) -> None:
    """The previous stack's venv: this checkout installed editable, then ``pins`` over it."""
    marker = venv / "cq-stack-pins"
    if marker.is_file() and marker.read_text() == pins and _venv_python(venv).is_file():
        return
    subprocess.run(["make", "--no-print-directory", "setup", f"VENV={venv}"], cwd=ROOT, check=True)
    pip = [str(_venv_python(venv)), "-m", "pip", "install", "--quiet", "--no-deps", *pins.split()]
    subprocess.run(pip, cwd=ROOT, check=True)
    # The jars of the pins just installed (make jars asks the venv's cq_engine.jars for them).
    subprocess.run(["make", "--no-print-directory", "jars", f"VENV={venv}"], cwd=ROOT, check=True)
    marker.write_text(pins)


def stack_versions(python: Path) -> str:
    code = (
        "from importlib.metadata import version as v; print('pyspark', v('pyspark'), '+ delta-spark', v('delta-spark'))"
    )
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def run_one(python: Path, name: str, *, quick: bool) -> tuple[str, str, float]:
    """(status, ratio, seconds) of ``python -m benchmarks --only name`` in that stack's venv."""
    cmd = [str(python), "-m", "benchmarks", "--only", name, *(["--quick"] if quick else [])]
    clock = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    took = time.perf_counter() - clock
    lines = proc.stdout.splitlines()
    for line in lines:
        if line.startswith(f"{name}:") or line.startswith("  "):
            print(f"    {line}", flush=True)
    for line in lines:
        m = _SUMMARY.match(line)
        if m and m.group(1) == name:
            return m.group(2), m.group(3), took
    print(proc.stderr[-2000:], file=sys.stderr)
    return "ERROR", "-", took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.stacks", description=__doc__.splitlines()[0])
    p.add_argument("--only", action="append", metavar="NAME", help="benchmark to run (repeatable)")
    p.add_argument("--previous", default=PREVIOUS, help=f"pins of the previous stack (default: {PREVIOUS!r})")
    p.add_argument("--venv", default=str(ROOT / ".venv-previous"), help="where the previous stack's venv lives")
    p.add_argument("--quick", action="store_true", help="the benchmarks' smaller sizes")
    args = p.parse_args(argv)
    previous_venv = Path(args.venv)
    build_previous(previous_venv, args.previous)
    stacks = {"previous": _venv_python(previous_venv), "current": _venv_python(ROOT / ".venv")}
    for label, python in stacks.items():
        print(f"{label}: {stack_versions(python)}", flush=True)
    rows = []
    for i, name in enumerate(args.only or DEFAULT_BENCHMARKS):
        order = list(stacks) if i % 2 == 0 else list(reversed(stacks))
        results = {}
        for label in order:
            print(f"{name} on the {label} stack (load {os.getloadavg()[0]:.1f})", flush=True)
            results[label] = run_one(stacks[label], name, quick=args.quick)
        rows.append((name, results))
    print("\nsummary: ratio against the benchmark's own baseline, on each stack; seconds of the whole process")
    print(f"  {'benchmark':<24} {'previous':>16} {'current':>16}  current/previous")
    failed = False
    for name, r in rows:
        prev, cur = r["previous"], r["current"]
        failed |= "ERROR" in (prev[0], cur[0])
        try:
            rel = f"{float(cur[1]) / float(prev[1]):.2f}"
        except ValueError:
            rel = "-"
        print(f"  {name:<24} {prev[1]:>8} {prev[2]:>6.0f}s {cur[1]:>8} {cur[2]:>6.0f}s  {rel}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
