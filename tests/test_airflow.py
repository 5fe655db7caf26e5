"""The Airflow adapter without Spark: CQTimetable against the engine's own firing times, and the DAG
file as Airflow's DagBag parses it (DAG count, a broken file's import error, nothing heavy imported)."""

import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cq_engine.catalog import load_catalog
from cq_engine.model import ContinuousQuery, PeriodTrigger
from cq_engine.parse import ParseOptions, parse_text
from cq_engine.schedule.ticks import ticks_of

REPO = Path(__file__).resolve().parents[1]
T0 = datetime(2024, 3, 30, 22, 0, tzinfo=UTC)  # Europe/Berlin's clocks go forward 31 March, 02:00
CQS = """
CREATE TABLE IF NOT EXISTS sensors (ts TIMESTAMP, device STRING, temperature DOUBLE);
CREATE CQ ranged RESAMPLE EVERY 90s BOUNDARY 2024-03-01T00:00:10Z RANGE 4m, 30s BEGIN
  SELECT max_value(temperature) AS tmax INTO ranged_out FROM sensors GROUP BY (30s)
END;
CREATE CQ dropping RESAMPLE EVERY 1m TIMEOUT POLICY DISCARD BEGIN
  SELECT count(temperature) AS n INTO dropping_out FROM sensors GROUP BY (1m)
END;
CREATE CQ later RESAMPLE EVERY 1h BOUNDARY 2199-01-01T00:00:00Z BEGIN
  SELECT count(temperature) AS n INTO later_out FROM sensors GROUP BY (1h)
END;
"""
PERIOD = """
CREATE TABLE IF NOT EXISTS meters (ts TIMESTAMP, current DOUBLE);
CREATE STREAM ticking PERIOD(7h, 5m) FROM meters INTO ticking_out AS SELECT _tlocaltime, count(*) AS n FROM %%trows;
"""


def definitions(text: str, tz: str = "UTC") -> dict:
    from zoneinfo import ZoneInfo

    statements = parse_text(text, file="t.sql", options=ParseOptions(tz=ZoneInfo(tz), min_every=timedelta(seconds=1)))
    return {d.name: d for d in statements if hasattr(d, "sink")}


def timetable(definition, tz: str = "UTC"):
    from airflow_dags.dags import timetable_of

    return timetable_of(definition, timezone=tz)


def walk(tt, first, count: int) -> list:
    """``count`` run infos after the run whose data interval is ``first``'s, with catchup."""
    from airflow.timetables.base import TimeRestriction

    infos, last = [], first
    for _ in range(count):
        info = tt.next_dagrun_info(last_automated_data_interval=last, restriction=TimeRestriction(None, None, True))
        infos.append(info)
        last = info.data_interval
    return infos


@pytest.mark.parametrize(("sql", "name", "tz"), [(CQS, "ranged", "UTC"), (PERIOD, "ticking", "Europe/Berlin")])
def test_runs_are_the_engines_firings_with_their_ranges(airflow_home, sql, name, tz):
    from airflow.timetables.base import DataInterval

    definition = definitions(sql, tz)[name]
    ticks = ticks_of(definition, timezone=tz)
    fires = ticks.between(T0, T0 + timedelta(days=3))
    tt = timetable(definition, tz)
    infos = walk(tt, DataInterval(*ticks.range_of(fires[0])), len(fires) - 1)
    assert [i.run_after for i in infos] == fires[1:]
    assert [tuple(i.data_interval) for i in infos] == [ticks.range_of(f) for f in fires[1:]]
    assert all(i.run_after.timezone_name == tz for i in infos)  # shown in CQ_TIMEZONE


def test_first_run_is_the_first_firing_from_deployment_or_boundary(airflow_home):
    from airflow.timetables.base import TimeRestriction

    cqs = definitions(CQS)
    never = TimeRestriction(earliest=None, latest=None, catchup=True)
    before = datetime.now(UTC)
    info = timetable(cqs["ranged"]).next_dagrun_info(last_automated_data_interval=None, restriction=never)
    assert before <= info.run_after < before + timedelta(seconds=90)
    assert ticks_of(cqs["ranged"], timezone="UTC").is_tick(info.run_after)
    later = timetable(cqs["later"]).next_dagrun_info(last_automated_data_interval=None, restriction=never)
    assert later.run_after == datetime(2199, 1, 1, tzinfo=UTC)
    ended = TimeRestriction(earliest=None, latest=datetime(2198, 1, 1, tzinfo=UTC), catchup=True)
    assert timetable(cqs["later"]).next_dagrun_info(last_automated_data_interval=None, restriction=ended) is None


def test_blocked_catches_up_and_discard_skips_what_came_due_meanwhile(airflow_home):
    from airflow.timetables.base import DataInterval, TimeRestriction

    cqs = definitions(CQS)
    long_ago = DataInterval(T0 - timedelta(minutes=1), T0)
    catchup = TimeRestriction(earliest=None, latest=None, catchup=True)
    assert timetable(cqs["dropping"]).next_dagrun_info(
        last_automated_data_interval=long_ago, restriction=catchup
    ).run_after == T0 + timedelta(minutes=1)
    now = datetime.now(UTC)
    skipping = TimeRestriction(earliest=None, latest=None, catchup=False)
    nxt = timetable(cqs["dropping"]).next_dagrun_info(last_automated_data_interval=long_ago, restriction=skipping)
    assert now <= nxt.run_after < now + timedelta(minutes=1) + timedelta(seconds=5)


def test_manual_run_computes_the_latest_firing(airflow_home):
    import pendulum

    definition = definitions(CQS)["ranged"]
    ticks = ticks_of(definition, timezone="UTC")
    at = pendulum.instance(T0 + timedelta(seconds=200))
    interval = timetable(definition).infer_manual_data_interval(run_after=at)
    assert tuple(interval) == ticks.range_of(ticks.latest(T0 + timedelta(seconds=200)))


def test_timetable_survives_dag_serialization(airflow_home):
    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import DagSerialization

    tt = timetable(definitions(PERIOD, "Asia/Tokyo")["ticking"], "Asia/Tokyo")
    dag = DAG(dag_id="t", schedule=tt, start_date=datetime(2024, 1, 1, tzinfo=UTC))
    again = DagSerialization.from_dict(DagSerialization.to_dict(dag)).timetable
    assert type(again).__name__ == "CQTimetable"
    assert again == tt and again.summary == tt.summary


def broken_project(tmp_path, monkeypatch):
    sql = tmp_path / "sql"
    shutil.copytree(REPO / "sql", sql)
    (sql / "zz_broken.sql").write_text(
        "CREATE CQ broken RESAMPLE EVERY 1m BEGIN\n  SELECT count(s) INTO out FROM sensors GROUP BY (1q)\nEND;\n"
    )
    for var, value in {
        "CQ_SQL_DIR": sql,
        "CQ_WAREHOUSE": tmp_path / "wh",
        "CQ_HOME": tmp_path / ".cq",
        "CQ_CONFIG": tmp_path / "none.toml",
    }.items():
        monkeypatch.setenv(var, str(value))
    return sql


def test_dagbag_loads_every_definition_and_one_import_error_for_the_broken_file(airflow_home, tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    sql = broken_project(tmp_path, monkeypatch)
    catalog = load_catalog(sql)
    scheduled = {
        d.name
        for d in catalog.definitions
        if isinstance(d, ContinuousQuery) or isinstance(d.trigger, PeriodTrigger)  # type: ignore[union-attr]
    }
    bag = DagBag(dag_folder=str(REPO / "airflow_dags" / "dags"))
    # Every definition: the scheduled ones, and the window-triggered streams and rules (on assets).
    assert set(bag.dags) == {d.name for d in catalog.definitions} and len(scheduled) >= 3
    assert len(set(bag.dags) - scheduled) >= 5
    assert list(bag.import_errors) == [str(REPO / "airflow_dags" / "dags" / "cq_dags.py")]
    (error,) = bag.import_errors.values()
    assert error.startswith(f"SqlLoadError: {sql / 'zz_broken.sql'}:2:")
    assert "Traceback" not in error and "broken did not load" in error
    dag = bag.dags["readings_per_minute"]
    assert [a.name for a in dag.tasks[0].outlets] == ["readings_per_minute"]
    assert [a.name for a in dag.tasks[0].inlets] == ["meters"]


def test_parsing_imports_nothing_heavy(airflow_home, tmp_path, monkeypatch):
    broken_project(tmp_path, monkeypatch)
    code = (
        "import sys; from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(REPO / 'airflow_dags' / 'dags')!r})\n"
        "assert bag.dags\n"
        "assert 'current_1m' in bag.dags and 'demo_counts' in bag.dags\n"  # stream and rule DAGs too
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'pyspark', 'dagster', 'deltalake', 'py4j', 'pyarrow'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_dev_airflow_plan(tmp_path, monkeypatch):
    """`make dev-airflow`'s stack: AIRFLOW_HOME under CQ_HOME, SQLite there (or the given PostgreSQL
    with psycopg 3 for Airflow's async engine), every server on 127.0.0.1, a login kept across starts."""
    import json

    from airflow_dags.dev import USER, plan

    monkeypatch.setenv("CQ_HOME", str(tmp_path / ".cq"))
    monkeypatch.setenv("CQ_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("CQ_SQL_DIR", str(REPO / "sql"))
    monkeypatch.delenv("CQ_AIRFLOW_DB", raising=False)
    p = plan(environ={"PATH": "/bin", "AIRFLOW_HOME": "/elsewhere"}, port=8123, db_url=None)
    home = tmp_path / ".cq" / "airflow"
    assert p.home == home and p.url == "http://127.0.0.1:8123"
    env = p.env
    assert env["AIRFLOW_HOME"] == str(home) and env["PATH"] == "/bin"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == f"sqlite:///{home / 'airflow.db'}"
    assert "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC" not in env
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(REPO / "airflow_dags" / "dags")
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:8123/execution/"
    assert env["AIRFLOW__API_AUTH__JWT_SECRET"] == env["AIRFLOW__API__SECRET_KEY"]
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == f"{USER}:admin"
    assert json.loads((home / "passwords.json").read_text()) == {USER: p.password}
    assert env["CQ_SQL_DIR"] == str(REPO / "sql") and env["CQ_HOME"] == str(tmp_path / ".cq")
    assert {name: cmd[1:] for name, cmd in p.commands.items()} == {
        "api-server": ["api-server", "--host", "127.0.0.1", "--port", "8123"],
        "dag-processor": ["dag-processor"],
        "scheduler": ["scheduler", "--skip-serve-logs"],
        "triggerer": ["triggerer", "--skip-serve-logs"],
    }
    again = plan(environ={}, port=8123, db_url="postgresql+psycopg2://u@127.0.0.1:5432/airflow")
    assert again.password == p.password and again.env["AIRFLOW__API__SECRET_KEY"] == env["AIRFLOW__API__SECRET_KEY"]
    assert again.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"] == "postgresql+psycopg://u@127.0.0.1:5432/airflow"


@pytest.mark.parametrize(
    "args",
    [
        ["pause", "temperature_1m"],
        ["resume", "temperature_1m"],
        ["recalculate", "temperature_1m", "--from", "2026-01-01T00:00:00Z", "--to", "2026-01-01T01:00:00Z"],
    ],
)
def test_via_airflow_unreachable_is_one_clear_line(args, tmp_path):
    """A closed port: `cq: error:` naming the URL and the DAG, exit 1, no traceback (no Airflow needed)."""
    import os

    from netutil import free_port

    url = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, "CQ_NO_AGENT": "1", "CQ_SQL_DIR": str(REPO / "sql"), "CQ_CONFIG": str(tmp_path / "no.toml")}
    out = subprocess.run(
        [str(Path(sys.executable).parent / "cq"), *args, "--via-airflow", url],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 1 and out.stdout == "", out
    assert out.stderr.startswith(f"cq: error: --via-airflow {url}: DAG 'temperature_1m': API server unreachable (")
    assert "Traceback" not in out.stderr and len(out.stderr.splitlines()) == 1


def test_via_airflow_rejects_bad_arguments_before_any_call(tmp_path):
    import os

    env = {**os.environ, "CQ_NO_AGENT": "1", "CQ_SQL_DIR": str(REPO / "sql"), "CQ_CONFIG": str(tmp_path / "no.toml")}
    cq = str(Path(sys.executable).parent / "cq")
    for args, message in [
        (["--to", "soon"], "cq: error: --to: 'soon' is not a time"),
        (["--to", "2025-01-01T00:00:00Z"], "cq: error: --from 2026-01-01T00:00:00Z is not before --to"),
        (["--via-dagster", "localhost:9"], "cq: error: --via-dagster and --via-airflow: choose one"),
    ]:
        out = subprocess.run(
            [
                cq,
                "recalculate",
                "temperature_1m",
                "--from",
                "2026-01-01T00:00:00Z",
                "--via-airflow",
                "http://127.0.0.1:9",
                *args,
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        assert out.returncode == 1 and out.stderr.startswith(message) and "Traceback" not in out.stderr, out


def test_a_backfill_gets_the_firings_whose_range_starts_in_it(airflow_home):
    """Airflow walks a backfill's [from, to] with both bounds (the scheduler never sets the upper one):
    the runs are the firings whose range (the run's logical date onwards) starts in it, RANGE or not."""
    from airflow.timetables.base import TimeRestriction

    for name in ("ranged", "dropping"):
        definition = definitions(CQS)[name]
        ticks = ticks_of(definition, timezone="UTC")
        lo, hi = T0 + timedelta(minutes=7, seconds=10), T0 + timedelta(minutes=20)
        restriction = TimeRestriction(earliest=lo, latest=hi, catchup=True)
        tt, infos, info = timetable(definition), [], None
        while info := tt.next_dagrun_info_v2(last_dagrun_info=info, restriction=restriction):
            infos.append(info)
        want = [f for f in ticks.between(lo, hi + timedelta(minutes=10)) if lo <= ticks.range_of(f)[0] <= hi]
        assert [i.run_after for i in infos] == want and len(want) > 5, name
        assert [i.logical_date for i in infos] == [ticks.range_of(f)[0] for f in want]


def test_dev_airflow_refuses_a_taken_port(tmp_path, monkeypatch, capsys):
    import socket

    from airflow_dags.dev import main

    monkeypatch.setenv("CQ_HOME", str(tmp_path / ".cq"))
    monkeypatch.setenv("CQ_CONFIG", str(tmp_path / "none.toml"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert err == f"dev-airflow: error: port {port} on 127.0.0.1 is taken: choose another with --port\n"
