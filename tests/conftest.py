"""Shared fixtures and the test markers.

Markers (set here, from what a test uses, so no test file has to remember them):
- ``spark``: starts a JVM (the ``spark`` fixture, or a file that runs firings/servers itself);
- ``dagster_e2e``: runs the real Dagster daemon and webserver;
- ``ui``: drives the Dagster UI in headless Chromium.
``make check`` runs the rest with ``-m "not spark and not dagster_e2e and not ui"`` and ``CQ_TEST_QUICK=1``,
under which starting a JVM fails the test: a test that needs Spark but lacks the marker is caught at once.
"""

import os

import pytest

# Files whose tests start Spark (or a Connect server, or Dagster runs that do) without the ``spark`` fixture.
SPARK_FILES = {
    "test_airflow_batched_stack.py",
    "test_airflow_stack.py",
    "test_cli.py",
    "test_dagster_defs.py",
    "test_delta_log.py",
    "test_ek_windows.py",
    "test_ekuiper_rules.py",
    "test_fused.py",
    "test_plan.py",
    "test_recovery.py",
    "test_runner.py",
    "test_seed_cq.py",
    "test_spark_runtime.py",
    "test_storage.py",
    "test_stream_notify.py",
    "test_stream_outputs.py",
    "test_streams.py",
    "test_windows.py",
}
DAGSTER_E2E_FILES = {"test_dagster_e2e.py", "test_triggers_e2e.py", "test_cluster.py", "test_chaos.py"}
UI_FILES = {"test_dagster_ui.py"}


def pytest_collection_modifyitems(config, items):
    # Every test of a module using the Dagster stack, those without the fixture too: a module's tests
    # may share module state, and its other tests then wait on no second worker's stack.
    stacked = {item.path.name for item in items if "dagster_stack" in item.fixturenames}
    for item in items:
        name = item.path.name
        # `make test` runs on two xdist workers (--dist loadgroup): a file's tests stay on one worker, so
        # its module fixtures (a Bench, a Connect server) are built once; the modules sharing the Dagster
        # stack (the ``dagster_stack`` fixture) form one group, so one worker starts it once.
        item.add_marker(pytest.mark.xdist_group("dagster_stack" if name in stacked else name))
        if name in UI_FILES:
            item.add_marker(pytest.mark.ui)
        if name in DAGSTER_E2E_FILES or name in UI_FILES:
            item.add_marker(pytest.mark.dagster_e2e)
        if name in SPARK_FILES or name in DAGSTER_E2E_FILES or name in UI_FILES or "spark" in item.fixturenames:
            item.add_marker(pytest.mark.spark)


def pytest_configure(config):
    if os.environ.get("CQ_TEST_QUICK") == "1":
        import pyspark.java_gateway

        def refuse(*args, **kwargs):
            raise RuntimeError("this test starts a JVM: it needs the `spark` marker (tests/conftest.py)")

        pyspark.java_gateway.launch_gateway = refuse


@pytest.fixture(scope="module")
def dagster_stack(request, tmp_path_factory):
    """The running Dagster stack of tests/dagster_e2e_util.py (started on first use, shared by later
    modules); imported here lazily so the quick tests never load it."""
    from dagster_e2e_util import acquire, release

    stack = acquire(tmp_path_factory)
    yield stack
    release(request)


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory):
    """Airflow's configuration for this test process: AIRFLOW_HOME in a temporary directory (never
    ~/airflow), no examples, the DAG folder ``airflow_dags/dags``, a SQLite metadata DB there (created
    by ``airflow db migrate`` only for tests that ask for ``airflow_db``). Set before Airflow is
    imported: it reads its configuration once per process."""
    home = tmp_path_factory.mktemp("airflow_home")
    dags = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "airflow_dags", "dags")
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": dags,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
    }
    os.environ.update(env)
    return home


@pytest.fixture(scope="session")
def airflow_db(airflow_home):
    """Airflow's metadata DB (SQLite under ``airflow_home``), migrated by Airflow's own CLI."""
    import subprocess
    import sys

    airflow = os.path.join(os.path.dirname(sys.executable), "airflow")
    subprocess.run([airflow, "db", "migrate"], check=True, capture_output=True, env=os.environ.copy())
    return airflow_home


@pytest.fixture(scope="session")
def spark():
    """One real in-process Spark session shared by the whole test run."""
    from cq_engine.spark import local_session

    session = local_session(app_name="cq-engine-tests")
    yield session
    session.stop()


# What a run is about to do, in one line: the first `make test` takes minutes and should say why.
# Most specific first: a browser test also runs Dagster and Spark.
_KINDS = (("ui", "browser"), ("dagster_e2e", "Dagster end-to-end"), ("spark", "Spark"))


def pytest_collection_finish(session):
    counts = {label: 0 for _, label in _KINDS}
    unit = 0
    for item in session.items:
        kind = next((label for marker, label in _KINDS if item.get_closest_marker(marker)), None)
        if kind is None:
            unit += 1
        else:
            counts[kind] += 1
    parts = [f"{unit} unit"] + [f"{counts[label]} {label}" for label in ("Spark", "Dagster end-to-end", "browser")]
    session.config.get_terminal_writer().line(
        f"cq-engine: {len(session.items)} tests: {', '.join(parts)} "
        "(the whole suite takes about 29 min on a 2-core machine, longer on a busy one)"
    )


# The storage-sensitive suites run against both storages, each on its own write path: "spark" is Spark's
# Delta connector with every commit written by the executors (CQ_SPARK_WRITE_BYTES=0; under the default
# setting a small result is committed through delta-rs, the path every other test takes), "deltars" the
# deltalake package. A module-scoped engine fixture parametrized with these gives each suite both.
STORAGES = {"spark": {"storage": "spark", "spark_write_bytes": 0}, "deltars": {"storage": "deltars"}}


@pytest.fixture(params=list(STORAGES))
def on_both_storages(request, monkeypatch):
    """Run the test once per storage (``streams_util.Bench`` engines use it)."""
    import streams_util

    monkeypatch.setitem(streams_util.STORAGE, "settings", STORAGES[request.param])
    return request.param


def record_paths(monkeypatch, module, name: str) -> list[str]:
    """Patch ``module.name(fs, path)`` to record each call's file name (then call the real one);
    the list of names, in call order."""
    seen: list[str] = []
    real = getattr(module, name)

    def recording(fs, path):
        seen.append(os.path.basename(path))
        return real(fs, path)

    monkeypatch.setattr(module, name, recording)
    return seen


def sql_project(tmp_path, monkeypatch, files: dict[str, str]):
    """A project under ``tmp_path``: ``files`` (name -> text) in ``sql/``, the warehouse ``wh`` and
    CQ_HOME ``.cq``, named by the environment for the CLI (no cq.toml); its ``Settings``."""
    from cq_engine.config import Settings

    (tmp_path / "sql").mkdir()
    for name, text in files.items():
        (tmp_path / "sql" / name).write_text(text)
    settings = Settings(sql_dir=str(tmp_path / "sql"), warehouse=str(tmp_path / "wh"), home=str(tmp_path / ".cq"))
    for var, value in {
        "CQ_SQL_DIR": settings.sql_dir,
        "CQ_WAREHOUSE": settings.warehouse,
        "CQ_HOME": settings.home,
        "CQ_CONFIG": tmp_path / "none.toml",
    }.items():
        monkeypatch.setenv(var, str(value))
    return settings
