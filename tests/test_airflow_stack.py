"""The Airflow adapter under a real Airflow 3 (``make cluster-test``; marker ``cluster``): the scheduler
(LocalExecutor), the DAG processor, the triggerer and the API server, started as ``make dev-airflow``
starts them (``airflow_dags.stack``), on 127.0.0.1, their metadata DB on a real PostgreSQL
(``Cluster.start_postgres``), the tasks' Spark a local Spark Connect server (``cq spark start``), the
warehouse a local directory of Delta tables fed while the stack runs.

Two continuous queries (BLOCKED, DISCARD) and a PERIOD stream fire for a few minutes; both queries are
paused through ``cq pause --via-airflow`` for a while. Checked through Airflow's REST API and the sinks:
every run succeeded, its data interval is the engine's firing range, every firing is in the ledger
once, the sinks equal pyarrow's computation at the source version each firing read, BLOCKED ran what it
missed while paused and DISCARD did not; ``cq recalculate --via-airflow`` (a backfill) writes the rows
``cq recalculate`` writes, and running it again changes nothing.

A TDengine INTERVAL stream and an eKuiper TUMBLINGWINDOW rule over the table ``readings`` (created
empty by the fixture, fed only by their test, after the CQ test) run on its commits: the triggerer's
watcher makes each new version an asset event, whose DAG runs the scheduler starts. Checked through
the REST API (every run asset-triggered by the watcher's events and succeeded, each event up to a
DAG's last run consumed by exactly one of its runs, the works their sink events report are the
ledger's) and through the ledger and
the sinks: every window closed at the last version computed by exactly one run, and in the sink once,
as pyarrow computes it from the source version that run read."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from netutil import free_port, port_open
from procutil import spawn_logged

from airflow_dags import stack as af
from cq_engine.catalog import load_catalog
from cq_engine.cli.devstop import stop_process_group
from cq_engine.cli.feed import floor_time, sensor_rows
from cq_engine.cli.streams import cursor_path, read_cursor
from cq_engine.cli.viaairflow import AirflowClient
from cq_engine.config import Settings
from cq_engine.schedule.ticks import ticks_of
from cq_engine.storage.delta import DeltaRsStorage
from cq_engine.storage.ledger import Ledger
from cq_engine.streams.timing import StreamCursor
from cq_engine.times import iso

pytestmark = pytest.mark.cluster

BIN = Path(sys.executable).parent
EVERY = timedelta(seconds=30)
USER, PASSWORD = "admin", secrets.token_urlsafe(12)
SQL = """\
CREATE TABLE IF NOT EXISTS sensors (ts TIMESTAMP, device STRING, temperature DOUBLE, humidity DOUBLE);

CREATE CQ blocked_cq RESAMPLE EVERY 30s TIMEOUT POLICY BLOCKED BEGIN
  SELECT max_value(temperature) AS temperature_max, avg(temperature) AS temperature_avg,
         count(temperature) AS samples
  INTO blocked_out FROM sensors GROUP BY (30s), device
END;

CREATE CQ discard_cq RESAMPLE EVERY 30s TIMEOUT POLICY DISCARD BEGIN
  SELECT max_value(temperature) AS temperature_max, avg(temperature) AS temperature_avg,
         count(temperature) AS samples
  INTO discard_out FROM sensors GROUP BY (30s), device
END;

CREATE STREAM n_period PERIOD(30s) FROM sensors INTO n_period_out AS SELECT _tlocaltime, count(*) AS n FROM %%trows;

-- Window-triggered, on the commits of `readings`: the eKuiper declaration is the table's (the
-- TDengine stream reads it too). The fixture creates it empty and only the streams' test feeds it,
-- so both are created on an empty table (no row is history) and run while the CQ test is over.
CREATE STREAM readings_events (device STRING, temperature FLOAT, humidity FLOAT, ts BIGINT)
  WITH (DATASOURCE="readings", TIMESTAMP="ts");

CREATE STREAM readings_10s TRIGGER WINDOW_CLOSE INTO readings_10s_out AS
  SELECT _wstart AS ts, max(temperature) AS temperature_max, avg(temperature) AS temperature_avg,
         count(temperature) AS samples
  FROM readings PARTITION BY device INTERVAL(10s);

CREATE RULE readings_rule INTO readings_rule_out AS
  SELECT device, max(temperature) AS temperature_max, avg(temperature) AS temperature_avg,
         count(temperature) AS samples
  FROM readings_events GROUP BY device, TUMBLINGWINDOW(ss, 10);
"""
CQS = ("blocked_cq", "discard_cq")
DAGS = (*CQS, "n_period")
SINKS = {"blocked_cq": "blocked_out", "discard_cq": "discard_out", "n_period": "n_period_out"}
# The window-triggered DAGs: sink and its window-start column (the rule's sink is eKuiper's shape).
STREAMS = {"readings_10s": ("readings_10s_out", "ts"), "readings_rule": ("readings_rule_out", "window_start")}
WINDOW = timedelta(seconds=10)


class Stack:
    """The processes of the test; ``stop`` ends every one (safe at any point)."""

    def __init__(self, root: Path):
        self.root, self.logs = root, root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.settings = Settings(sql_dir=str(root / "sql"), warehouse=str(root / "wh"), home=str(root / ".cq"))
        self.stops: list = []
        self.procs: dict[str, subprocess.Popen] = {}
        self.stop_feed = threading.Event()
        self.client = AirflowClient(self.url, env={"CQ_AIRFLOW_USER": USER, "CQ_AIRFLOW_PASSWORD": PASSWORD})
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "CQ_", "SPARK_", "AWS_", "DAGSTER"))
        }
        self.env.update(
            {
                "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                "PYTHONUNBUFFERED": "1",
                "CQ_CONFIG": str(root / "no-cq.toml"),
                "CQ_SPARK_PORT": str(free_port()),
                "CQ_NO_AGENT": "1",
                **af.cq_env(sql_dir=root / "sql", warehouse=self.settings.warehouse, home=root / ".cq"),
            }
        )

    def spawn(self, name: str, cmd: list[str]) -> None:
        proc = self.procs[name] = spawn_logged(cmd, log=self.logs / f"{name}.log", cwd=self.root, env=self.env)
        self.stops.append(lambda: stop_process_group(proc, first_signal=15, timeout=60))

    def run(
        self, cmd: list[str], *, check: bool = True, timeout: float = 900, **env: str
    ) -> subprocess.CompletedProcess:
        out = subprocess.run(
            cmd, cwd=self.root, env={**self.env, **env}, capture_output=True, text=True, timeout=timeout
        )
        if check:
            assert out.returncode == 0, f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
        return out

    def cq(self, *args: str, check: bool = True, **env: str) -> subprocess.CompletedProcess:
        creds = {"CQ_AIRFLOW_USER": USER, "CQ_AIRFLOW_PASSWORD": PASSWORD}
        return self.run([str(BIN / "cq"), *args], check=check, **{**creds, **env})

    def tails(self, lines: int = 40) -> str:
        out = ""
        for log in sorted(self.logs.glob("*.log")):
            out += f"\n--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
        return out

    def stop(self) -> None:
        while self.stops:
            with contextlib.suppress(Exception):
                self.stops.pop()()


def wait_for(what: str, ready, *, timeout: float, stack: Stack, every: float = 3.0):
    """Poll ``ready()`` until it returns something truthy; fail with the logs' tails after ``timeout``."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            value = ready()
            if value:
                return value
        except Exception as exc:  # a server still starting
            last = exc
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:.0f}s (last error: {last}){stack.tails()}")


def feed(storage: DeltaRsStorage, stop: threading.Event, start: datetime, table: str = "sensors") -> None:
    """Append the readings up to now every few seconds (ts = reading time, never rewritten)."""
    while not stop.wait(3.0):
        end = floor_time(datetime.now(UTC), timedelta(seconds=1))
        if end > start:
            storage.append(table, sensor_rows(start=start, end=end, every=timedelta(seconds=1)))
            start = end


@contextlib.contextmanager
def running(
    root: Path,
    sql: str,
    dags: tuple[str, ...],
    *,
    feed_sensors: bool = True,
    empty_tables: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> Iterator[Stack]:
    """The whole stack over ``sql`` (in ``root/sql``) until the end of the block: PostgreSQL, the Spark
    Connect server, Airflow's components; ready once the API server answers and every DAG of ``dags``
    is parsed. ``feed_sensors``: ``sensors`` gets 5 minutes of history, then the readings up to now
    every few seconds (``Stack.stop_feed`` ends it). ``empty_tables``: declared tables created empty
    before Airflow starts (a watcher's first event, version 0, then precedes any row). ``env``: more
    environment for every process (``CQ_AIRFLOW_FORM``). Also the ``airflow`` benchmark's stack."""
    from test_cluster import PG_BIN, Cluster

    if not (PG_BIN / "initdb").is_file():
        raise RuntimeError(f"PostgreSQL is not installed ({PG_BIN}/initdb): run `make cluster-setup`")
    (root / "sql").mkdir(parents=True, exist_ok=True)
    (root / "sql" / "defs.sql").write_text(sql)
    s = Stack(root)
    s.env.update(env or {})
    pg = Cluster(root / "pg")
    try:
        pg.start_postgres()
        s.stops.append(pg.stop)
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=pg.pg_port, user="postgres", dbname="postgres", autocommit=True
        ) as c:
            c.execute("CREATE DATABASE airflow")
        db = f"postgresql+psycopg2://postgres@127.0.0.1:{pg.pg_port}/airflow"
        home = root / "airflow_home"
        s.env.update(af.airflow_env(home=home, port=s.port, db_url=db, user=USER, secret=secrets.token_hex(16)))
        af.write_password(home=home, user=USER, password=PASSWORD)

        storage = DeltaRsStorage(warehouse=s.settings.warehouse)
        for name in empty_tables:
            table = load_catalog(s.settings.sql_dir).table(name)
            assert table is not None and storage.create_table(table), name
        if feed_sensors:
            now = floor_time(datetime.now(UTC), timedelta(seconds=1))
            storage.append(
                "sensors", sensor_rows(start=now - timedelta(minutes=5), end=now, every=timedelta(seconds=1))
            )
            feeder = threading.Thread(target=feed, args=(storage, s.stop_feed, now), daemon=True)
            s.stops.append(lambda: (s.stop_feed.set(), feeder.join(30)))

        s.run([str(BIN / "cq"), "spark", "start"])
        s.stops.append(lambda: s.run([str(BIN / "cq"), "spark", "stop"], check=False, timeout=120))
        s.run(af.migrate_command())
        for name, cmd in af.commands(port=s.port).items():
            s.spawn(name, cmd)
        wait_for("the API server", lambda: port_open(s.port), timeout=300, stack=s)
        wait_for(f"the {len(dags)} DAGs", lambda: all(dag(s, d) for d in dags), timeout=300, stack=s)
        if feed_sensors:
            feeder.start()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, request):
    from test_cluster import PG_BIN

    if not (PG_BIN / "initdb").is_file():
        pytest.fail(f"PostgreSQL is not installed ({PG_BIN}/initdb): run `make cluster-test`, which installs it")
    root = tmp_path_factory.mktemp("airflow_stack")
    failed_before = request.session.testsfailed
    # `readings` empty, so the watcher's first event (version 0) creates the streams' cursors before any row.
    with running(root, SQL, (*DAGS, *STREAMS), empty_tables=("readings",)) as s:
        try:
            yield s
        finally:
            if request.session.testsfailed > failed_before:
                print(f"\nAirflow stack logs ({s.logs}):{s.tails(80)}", file=sys.__stderr__)


def api(s: Stack, path: str) -> dict:
    return s.client.get(path)


def dag(s: Stack, dag_id: str) -> dict | None:
    with contextlib.suppress(Exception):
        return api(s, f"/api/v2/dags/{dag_id}")
    return None


def runs(s: Stack, dag_id: str, *, run_type: str | None = None) -> list[dict]:
    query = "order_by=logical_date&limit=1000" + (f"&run_type={run_type}" if run_type else "")
    return api(s, f"/api/v2/dags/{dag_id}/dagRuns?{query}")["dag_runs"]


def t(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def ledger(s: Stack) -> Ledger:
    return Ledger(store=DeltaRsStorage(warehouse=s.settings.warehouse))


def fired(s: Stack, name: str) -> list[datetime]:
    """The fire times of ``name``'s succeeded firings, in the order they ran."""
    return [e.fire_time for e in ledger(s).entries(name) if e.status == "succeeded" and e.kind in ("firing", "period")]


_SOURCES: dict[tuple[str, int], pa.Table] = {}


def source_at(s: Stack, version: int, table: str = "sensors") -> pa.Table:
    # Keyed by the table's URI: each stack (this module's, the batched test's) has a warehouse of its own.
    uri = s.settings.table_uri(table)
    if (uri, version) not in _SOURCES:
        _SOURCES[uri, version] = DeltaTable(uri, version=version).to_pyarrow_table()
    return _SOURCES[uri, version]


def between(table: pa.Table, lo: datetime, hi: datetime) -> pa.Table:
    ts = pa.timestamp("us", "UTC")
    return table.filter(
        pc.and_(pc.greater_equal(table["ts"], pa.scalar(lo, ts)), pc.less(table["ts"], pa.scalar(hi, ts)))
    )


def expected_window(source: pa.Table, lo: datetime, hi: datetime) -> list[tuple]:
    """One firing's rows by pyarrow and Python: per device the source knows, max, mean and count of
    its temperatures in [lo, hi) (a device without any: nulls and 0, docs/dialects/iotdb.md)."""
    rows = between(source, lo, hi).to_pylist()
    out = []
    for device in sorted(set(source["device"].to_pylist())):
        temps = [r["temperature"] for r in rows if r["device"] == device and r["temperature"] is not None]
        out.append(
            (lo, device, max(temps, default=None), round(sum(temps) / len(temps), 9) if temps else None, len(temps))
        )
    return out


def sink_rows(uri: str, lo: datetime, hi: datetime, time_column: str = "ts") -> list[tuple]:
    """The sink's rows with ``time_column`` in [lo, hi), shaped as ``expected_window``'s."""
    rows = DeltaTable(uri).to_pyarrow_table().to_pylist()
    return sorted(
        (
            r[time_column],
            r["device"],
            r["temperature_max"],
            None if r["temperature_avg"] is None else round(r["temperature_avg"], 9),
            r["samples"],
        )
        for r in rows
        if lo <= r[time_column] < hi
    )


def test_cli_errors_against_the_api_server(stack):
    """An unknown DAG and bad credentials: one line naming the URL and the DAG, exit 1, no traceback."""
    out = stack.cq("pause", "no_such_cq", "--via-airflow", stack.url, check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out
    assert out.stderr.startswith(f"cq: error: --via-airflow {stack.url}: DAG 'no_such_cq': ") and "404" in out.stderr
    out = stack.cq("resume", "blocked_cq", "--via-airflow", stack.url, check=False, CQ_AIRFLOW_PASSWORD="wrong")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out
    assert "401" in out.stderr and "CQ_AIRFLOW_PASSWORD" in out.stderr and stack.url in out.stderr, out.stderr
    out = stack.cq(
        "recalculate", "no_such_cq", "--from", "2026-01-01T00:00:00Z", "--via-airflow", stack.url, check=False
    )
    assert out.returncode == 1 and "DAG 'no_such_cq'" in out.stderr and "404" in out.stderr, out


def succeeded(s: Stack, dag_id: str) -> list[dict]:
    return [r for r in runs(s, dag_id) if r["state"] == "success"]


def settled(s: Stack, cutoff: datetime) -> bool:
    """No run due by ``cutoff`` of any DAG still queued or running, and no backfill unfinished."""
    active = [
        r for d in DAGS for r in runs(s, d) if r["state"] in ("queued", "running") and t(r["run_after"]) <= cutoff
    ]
    backfills = api(s, "/api/v2/backfills?dag_id=blocked_cq")["backfills"]
    return not active and all(b["completed_at"] for b in backfills)


def backfill(s: Stack, lo: datetime, hi: datetime) -> dict:
    """``cq recalculate blocked_cq --via-airflow`` over [lo, hi), waited for: Airflow's backfill."""
    out = s.cq("recalculate", "blocked_cq", "--from", lo.isoformat(), "--to", hi.isoformat(), "--via-airflow", s.url)
    m = re.match(r"blocked_cq: backfill (\d+) created on ", out.stdout)
    assert m, out.stdout
    ident = int(m.group(1))
    done = wait_for(
        f"backfill {ident}",
        lambda: (b := api(s, f"/api/v2/backfills/{ident}"))["completed_at"] and b,
        timeout=600,
        stack=s,
    )
    assert done["reprocess_behavior"] == "completed" and t(done["from_date"]) == lo, done
    return done


def pause_a_while(s: Stack, ticks: dict, *, wait: tuple[str, ...]) -> tuple[list[datetime], datetime]:
    """Both continuous queries paused with ``cq pause --via-airflow`` for 75 s, then resumed with ``cq
    resume``; then waits until each definition of ``wait`` fired a cadence after that. The firings of
    ``blocked_cq`` that came due while paused (at least two), and when they were resumed."""
    for name in CQS:
        out = s.cq("pause", name, "--via-airflow", s.url)
        assert out.stdout.strip() == f"{name}: DAG {name} on {s.url} paused", out.stdout
        assert dag(s, name)["is_paused"] is True
    paused_at = datetime.now(UTC)
    time.sleep(75)
    for name in CQS:
        out = s.cq("resume", name, "--via-airflow", s.url)
        assert out.stdout.strip() == f"{name}: DAG {name} on {s.url} unpaused", out.stdout
        assert dag(s, name)["is_paused"] is False
    resumed_at = datetime.now(UTC)
    due = [f for f in ticks["blocked_cq"].between(paused_at, resumed_at) if paused_at < f < resumed_at]
    assert len(due) >= 2, due
    after = ticks["blocked_cq"].next(resumed_at + EVERY)
    for name in wait:
        wait_for(
            f"{name} fired after resuming", lambda n=name: any(f >= after for f in fired(s, n)), timeout=400, stack=s
        )
    return due, resumed_at


def firings_once(name: str, entries: list, due: list[datetime]) -> list:
    """``name``'s succeeded firings and PERIOD ticks among ledger ``entries``, checked: each once;
    without a gap, but for ``discard_cq``, whose gaps span the firings ``due`` while it was paused."""
    done = [e for e in entries if e.status == "succeeded" and e.kind in ("firing", "period")]
    times = [e.fire_time for e in done]
    assert len(times) == len(set(times)), f"{name}: a firing succeeded twice"
    gaps = [(a, b) for a, b in itertools.pairwise(sorted(times)) if b - a != EVERY]
    if name == "discard_cq":
        assert gaps and all(a < due[-1] and b > due[0] for a, b in gaps), gaps
    else:
        assert not gaps, f"{name}: firings missing between {gaps}"
    return done


def cq_sinks_match_their_sources(s: Stack) -> None:
    """Each continuous query's firing (its latest succeeded run) has the sink rows pyarrow computes at
    the source version it read."""
    for name in CQS:
        latest = {e.fire_time: e for e in ledger(s).entries(name) if e.status == "succeeded" and e.kind == "firing"}
        for e in latest.values():
            want = expected_window(source_at(s, e.source_versions["sensors"]), e.range_start, e.range_end)
            assert sink_rows(s.settings.table_uri(SINKS[name]), e.range_start, e.range_end) == want, e


def test_firings_pause_resume_and_backfill(stack):
    s = stack
    tz = "UTC"
    defs = {d.name: d for d in load_catalog(s.settings.sql_dir).definitions}
    ticks = {name: ticks_of(defs[name], timezone=tz) for name in DAGS}
    for d in DAGS:
        wait_for(f"{d}'s first successful run", lambda d=d: succeeded(s, d), timeout=400, stack=s)

    # Both queries paused by the CLI; while paused, firings come due that only BLOCKED runs later.
    due, resumed_at = pause_a_while(s, ticks, wait=DAGS)

    # BLOCKED: every firing that came due while paused ran late, in order; DISCARD skipped them (Airflow
    # may create the one its last parse had already scheduled: at most one).
    blocked = fired(s, "blocked_cq")
    assert set(due) <= set(blocked), (due, blocked)
    assert [f for f in blocked if f in due] == due  # in order
    late = {e.fire_time: e.started_at for e in ledger(s).entries("blocked_cq")}
    assert all(late[f] >= resumed_at - timedelta(seconds=5) for f in due), (due, late)
    discarded = [f for f in fired(s, "discard_cq") if f in due]
    assert len(discarded) <= 1, (due, discarded)

    # The feed stops: the backfill and `cq recalculate` read the same source.
    s.stop_feed.set()
    time.sleep(4)
    snapshot = {name: ledger(s).entries(name) for name in DAGS}
    first = min(blocked)
    lo, hi = ticks["blocked_cq"].range_of(first)[0], first + 2 * EVERY  # three firings: [lo, hi)
    backfill(s, lo, hi)
    backfilled = sink_rows(s.settings.table_uri("blocked_out"), lo, hi)
    copy = s.root / "wh_copy"
    shutil.copytree(s.settings.warehouse, copy)
    s.run(
        [str(BIN / "cq"), "recalculate", "blocked_cq", "--from", lo.isoformat(), "--to", hi.isoformat()],
        CQ_WAREHOUSE=str(copy),
    )
    recalculated = sink_rows(str(copy / "blocked_out"), lo, hi)
    final = DeltaTable(s.settings.table_uri("sensors")).to_pyarrow_table()
    want = sorted(r for w in range(3) for r in expected_window(final, lo + w * EVERY, lo + (w + 1) * EVERY))
    assert backfilled == recalculated == want and len(want) > 3
    entries = len(ledger(s).entries("blocked_cq"))
    backfill(s, lo, hi)  # again, over the same source: the same three firings, the same rows
    again = ledger(s).entries("blocked_cq")[entries:]
    redone = sorted(e.fire_time for e in again if e.kind == "firing" and e.fire_time <= hi)  # not the live ones
    assert redone == [first, first + EVERY, first + 2 * EVERY], again
    assert sink_rows(s.settings.table_uri("blocked_out"), lo, hi) == backfilled

    cutoff = datetime.now(UTC)
    wait_for("the runs due so far to end", lambda: settled(s, cutoff), timeout=400, stack=s)

    # Every run succeeded, its data interval the engine's range of its firing (run_after).
    for name in DAGS:
        all_runs = [r for r in runs(s, name) if t(r["run_after"]) <= cutoff]
        assert all(r["state"] == "success" for r in all_runs), [(r["dag_run_id"], r["state"]) for r in all_runs]
        for r in all_runs:
            fire = t(r["run_after"])
            assert (t(r["data_interval_start"]), t(r["data_interval_end"])) == ticks[name].range_of(fire), r
        backfill_runs = [r for r in all_runs if r["run_type"] == "backfill"]
        if name == "blocked_cq":
            assert sorted(t(r["run_after"]) for r in backfill_runs) == [first, first + EVERY, first + 2 * EVERY]
        else:
            assert not backfill_runs

    # The ledger before the backfill: every firing once; BLOCKED and PERIOD without a gap.
    for name in DAGS:
        done_entries = firings_once(name, snapshot[name], due)
        runs_by_fire = {t(r["run_after"]): r for r in runs(s, name)}  # every firing of the ledger is a run
        for e in done_entries:
            r = runs_by_fire[e.fire_time]
            assert (t(r["data_interval_start"]), t(r["data_interval_end"])) == (e.range_start, e.range_end), (r, e)

    # The sinks: each firing's rows (its latest run's) as pyarrow computes them at the version it read.
    cq_sinks_match_their_sources(s)
    ticked = sorted(
        (e for e in ledger(s).entries("n_period") if e.status == "succeeded" and e.kind == "period"),
        key=lambda e: e.fire_time,
    )
    by_tick = {
        r["_tlocaltime"]: r["n"]
        for r in DeltaTable(s.settings.table_uri("n_period_out")).to_pyarrow_table().to_pylist()
    }
    for prev, e in itertools.pairwise(ticked):
        grew = len(source_at(s, e.source_versions["sensors"])) - len(source_at(s, prev.source_versions["sensors"]))
        assert by_tick.get(e.fire_time, 0) == grew, (e.fire_time, by_tick)


def cursor(s: Stack, name: str) -> StreamCursor | None:
    """The stream DAG's cursor (``cq tick``'s file under the workers' CQ_HOME), or None before its first run."""
    text = read_cursor(cursor_path(s.settings, name))
    return None if text is None else StreamCursor.from_json(text)


def watcher_events(s: Stack, table: str) -> list[dict]:
    """The asset events of ``table``'s watcher (not a task's outlet), oldest first."""
    (asset,) = [a for a in api(s, f"/api/v2/assets?name_pattern={table}&limit=100")["assets"] if a["name"] == table]
    events = api(s, f"/api/v2/assets/events?asset_id={asset['id']}&order_by=timestamp&limit=1000")["asset_events"]
    return [e for e in events if (e["extra"] or {}).get("from_trigger")]


def streams_settled(s: Stack, version: int) -> bool:
    """Each stream's cursor at ``version``, and no run of their DAGs queued or running or waiting on a
    queued asset event."""
    if any((c := cursor(s, name)) is None or c.version != version for name in STREAMS):
        return False
    if any(api(s, f"/api/v2/dags/{name}/assets/queuedEvents")["queued_events"] for name in STREAMS):
        return False
    return not any(r["state"] in ("queued", "running") for name in STREAMS for r in runs(s, name))


def window_starts(lo: datetime, hi: datetime) -> list[datetime]:
    return [lo + i * WINDOW for i in range((hi - lo) // WINDOW)]


def test_interval_stream_and_ekuiper_rule_run_on_the_tables_commits(stack):
    """A TDengine INTERVAL stream and an eKuiper TUMBLINGWINDOW rule over ``readings``, scheduled on its
    asset: the triggerer's watcher turns the feed's commits into asset events, which start their DAG
    runs. Checked through the REST API (every run asset-triggered by the watcher's events of
    ``readings``, succeeded; each event up to a DAG's last run consumed by one of its runs; the works the runs' sink events
    report are the ledger's) and through the sinks and the ledger: every window closed at the last
    version is computed by exactly one succeeded run, and the sink holds it once, as pyarrow computes
    it from the source version that run read."""
    s = stack
    uri = s.settings.table_uri("readings")
    # Created on the empty table (the watcher's first event, version 0): nothing is history.
    for name in STREAMS:
        wait_for(f"{name}'s first run", lambda n=name: succeeded(s, n) and cursor(s, n), timeout=400, stack=s)
        created = cursor(s, name)
        assert created is not None and (created.version, created.max_event) == (0, None), created
    stop = threading.Event()
    start = floor_time(datetime.now(UTC), timedelta(seconds=1))
    feeder = threading.Thread(
        target=feed, args=(DeltaRsStorage(warehouse=s.settings.warehouse), stop, start, "readings"), daemon=True
    )
    feeder.start()
    try:
        time.sleep(75)  # seven windows or so, a commit every 3 s
    finally:
        stop.set()
        feeder.join(60)
    version = DeltaTable(uri).version()
    final = source_at(s, version, "readings")
    assert version >= 10 and len(final) > 0
    wait_for("the streams to reach the last commit", lambda: streams_settled(s, version), timeout=600, stack=s)
    first = floor_time(pc.min(final["ts"]).as_py(), WINDOW)
    latest = pc.max(final["ts"]).as_py()

    # The watcher: one event per new latest version it saw, from the table's creation to the last.
    events = watcher_events(s, "readings")
    versions = [e["extra"]["payload"]["version"] for e in events]
    assert versions[0] == 0 and versions[-1] == version and versions == sorted(set(versions)), versions
    assert all(e["extra"]["payload"]["table"] == "readings" for e in events)

    for name, (sink, time_column) in STREAMS.items():
        # Airflow: every run asset-triggered, by events of `readings`' watcher, and succeeded.
        all_runs = runs(s, name)
        assert len(all_runs) >= 3 and all(r["state"] == "success" for r in all_runs), [
            (r["dag_run_id"], r["state"]) for r in all_runs
        ]
        assert {r["run_type"] for r in all_runs} == {"asset_triggered"}, all_runs
        # Each run consumed the watcher's events since the run before it (Airflow: those up to the
        # first one queued for it, its run_after; later ones go to the next run, while this run's task
        # reads the table's latest version anyway): every event up to the last run's, each once.
        consumed = []
        for r in all_runs:
            upstream = api(s, f"/api/v2/dags/{name}/dagRuns/{r['dag_run_id']}/upstreamAssetEvents")["asset_events"]
            assert upstream and {e["name"] for e in upstream} == {"readings"}, (r, upstream)
            consumed += [e["id"] for e in upstream]
        last = max(t(r["run_after"]) for r in all_runs)
        assert sorted(consumed) == sorted(e["id"] for e in events if t(e["timestamp"]) <= last), (consumed, events)

        # The ledger: each closed window computed by exactly one succeeded run, none left out.
        entries = [e for e in ledger(s).entries(name) if e.status == "succeeded"]
        assert entries and {e.kind for e in entries} == {"realtime"}, entries
        windows = [w for e in entries for w in window_starts(e.range_start, e.range_end)]
        assert len(windows) == len(set(windows)), f"{name}: a window computed twice: {sorted(windows)}"
        done = cursor(s, name)
        assert done is not None and done.closed_until == latest, (done, latest)
        assert sorted(windows) == window_starts(first, floor_time(latest, WINDOW)), (sorted(windows), first, latest)

        # The runs' results (each sink asset event's extra, the task's XCom) report the ledger's works.
        outlet = api(s, f"/api/v2/assets/events?source_dag_id={name}&limit=1000")["asset_events"]
        reported = sorted((w["range_start"], w["range_end"], w["version"]) for e in outlet for w in e["extra"]["works"])
        assert reported == sorted(
            (iso(e.range_start), iso(e.range_end), e.source_versions["readings"]) for e in entries
        ), outlet
        assert all(e["extra"]["stream"] == name and e["name"] == sink for e in outlet)

        # The sink: each window once, as pyarrow computes it at the version its run read.
        table_uri = s.settings.table_uri(sink)
        want_all = []
        for e in entries:
            source = source_at(s, e.source_versions["readings"], "readings")
            want = sorted(
                r for w in window_starts(e.range_start, e.range_end) for r in expected_window(source, w, w + WINDOW)
            )
            assert sink_rows(table_uri, e.range_start, e.range_end, time_column) == want, (name, e)
            want_all += want
        assert len(DeltaTable(table_uri).to_pyarrow_table()) == len(want_all) > 0, name
