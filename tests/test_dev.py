"""`cq dev`: its feed resumes without duplicating readings, and the real command with the default
Spark port taken starts on another port (found by later commands) and stops quietly on Ctrl-C; a
SIGKILLed Spark Connect server is started again while firings go on, every window once."""

from __future__ import annotations

import itertools
import os
import re
import signal
import socket
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from dev_util import (
    CQ,
    SENSORS,
    dev_env,
    hold,
    project,
    sensor_keys,
    start_dev,
    stop_dev,
    ui_up,
    wait_for,
)
from netutil import free_port

from cq_engine.cli.dev import check_ports, feed_forever, seed_start
from cq_engine.cli.devstop import descendant
from cq_engine.cli.feed import FEEDS
from cq_engine.config import DEFAULT_SPARK_PORT, Settings
from cq_engine.engine import Engine
from cq_engine.errors import CQError
from cq_engine.ingest import ingest
from cq_engine.spark import server_status
from cq_engine.storage.delta import DeltaRsStorage
from cq_engine.storage.ledger import Ledger
from cq_engine.times import iso


def test_the_feed_resumes_after_its_newest_reading(tmp_path):
    engine = Engine(settings=project(tmp_path))
    engine.ensure_tables()
    now = datetime(2026, 11, 23, 4, 0, tzinfo=UTC)
    ten = timedelta(minutes=10)
    assert seed_start(engine, "sensors", now=now, backfill=ten) == now - ten  # empty: the whole backfill
    ingest(table="sensors", data=FEEDS["sensors"](start=now - ten, end=now), engine=engine)
    # A restart right away seeds nothing; two minutes later only those two minutes.
    assert seed_start(engine, "sensors", now=now, backfill=ten) == now
    assert seed_start(engine, "sensors", now=now + timedelta(minutes=2), backfill=ten) == now
    assert seed_start(engine, "sensors", now=now + timedelta(hours=1), backfill=ten) == now + timedelta(minutes=50)


def test_the_feed_commits_each_reading_within_its_interval_of_its_time(tmp_path):
    """A batch holds the reading of the current grid point: a firing at a grid point finds every reading
    of its range (committed at the latest one feed interval after its time, not a reading interval
    later)."""
    import threading

    engine = Engine(settings=Settings(**{**project(tmp_path).__dict__, "storage": "deltars"}))
    engine.ensure_tables()
    every, reading = 0.5, timedelta(seconds=5)
    lags: list[float] = []

    def newest() -> None:
        ts = pa.table(DeltaTable(str(tmp_path / "wh" / "sensors")).scan()).column("ts").to_pylist()
        lags.append((datetime.now(UTC) - max(ts)).total_seconds())

    stop = threading.Event()
    feed = threading.Thread(
        target=feed_forever,
        args=(engine,),
        kwargs={"every": every, "stop": stop, "reading_every": reading, "on_batch": newest},
        daemon=True,
    )
    feed.start()
    time.sleep(7)
    stop.set()
    feed.join(30)
    # Right after a grid point, the batch holds that point's readings (a reading interval late before).
    assert lags and min(lags) < 2.5, lags
    keys = sensor_keys(Settings(sql_dir="", warehouse=str(tmp_path / "wh"), home=""))
    assert len(keys) == len(set(keys))


def test_demo_appends_only_after_the_newest_reading(tmp_path, capsys):
    """`cq demo` after `cq dev` (or a second demo) appends no reading twice."""
    from cq_engine.cli.demo import run_demo

    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "sensors.sql").write_text(SENSORS.splitlines()[0] + "\n")  # the table alone
    settings = Settings(
        sql_dir=str(tmp_path / "sql"), warehouse=str(tmp_path / "wh"), home=str(tmp_path / ".cq"), storage="deltars"
    )
    engine = Engine(settings=settings)
    engine.ensure_tables()
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    fed = FEEDS["sensors"](start=now - timedelta(minutes=5), end=now - timedelta(minutes=2))  # cq dev's feed
    ingest(table="sensors", data=fed, engine=engine)
    assert run_demo(settings, now=now) == 0
    first = capsys.readouterr().out
    assert f"sensors: appended 72 readings for [{iso(now - timedelta(minutes=2))}, {iso(now)})" in first, first
    assert run_demo(settings, now=now + timedelta(seconds=30)) == 0
    assert "sensors: already holds readings up to" in capsys.readouterr().out
    keys = sensor_keys(settings)
    assert len(keys) == len(set(keys)), "a reading was appended twice"


def test_a_process_counts_as_in_a_sqlite_transaction_only_while_it_writes(tmp_path):
    """`cq dev`'s Ctrl-C freezes the daemon outside a SQLite write; the read locks every open WAL
    connection holds do not count (counted, every Ctrl-C waited the whole 60 s budget)."""
    import sqlite3

    from cq_engine.cli.devstop import _holds_lock

    db = str(tmp_path / "runs.db")
    reader, writer = sqlite3.connect(db, isolation_level=None), sqlite3.connect(db, isolation_level=None)
    try:
        reader.execute("PRAGMA journal_mode=WAL")
        reader.execute("CREATE TABLE t (x)")
        reader.execute("SELECT count(*) FROM t").fetchall()
        locks = Path("/proc/locks").read_text()
        assert f" READ {os.getpid()} " in locks  # an open WAL connection holds read locks...
        assert not _holds_lock(os.getpid())  # ...which are no transaction
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("INSERT INTO t VALUES (1)")
        assert _holds_lock(os.getpid())
        writer.execute("COMMIT")
        assert not _holds_lock(os.getpid())
    finally:
        reader.close()
        writer.close()


def test_the_terminal_gets_dagsters_warnings_and_errors_the_log_everything():
    from cq_engine.cli.dev import shown

    info = b"\x1b[32m2026-12-02 01:36:18 +0000\x1b[0m - dagster.daemon.SensorDaemon - \x1b[34mINFO\x1b[0m - Sensor cq_streams skipped\n"
    event = b"2026-12-02 01:36:17 +0000 - dagster - DEBUG - cq_firings_job - 1234 - RUN_SUCCESS - Finished\n"
    warning = b"2026-12-02 01:36:17 +0000 - dagster - WARNING - __repository__ - cq_streams - s: table missing\n"
    trace = b"Traceback (most recent call last):\n"
    assert [shown(x, verbose=False) for x in (info, event, warning, trace)] == [False, False, True, True]
    assert all(shown(x, verbose=True) for x in (info, event))


def test_ports_are_checked_before_anything_is_created(tmp_path):
    settings = project(tmp_path)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        with pytest.raises(CQError, match=f"port {taken} \\(the Dagster UI\\) is already in use"):
            check_ports(settings, port=taken, spark_server=True)
        with pytest.raises(CQError, match=f"port {taken} \\(CQ_SPARK_PORT\\) is already in use"):
            check_ports(Settings(**{**settings.__dict__, "spark_port": taken}), port=free_port(), spark_server=True)
    assert not (tmp_path / "wh").exists() and not (tmp_path / ".cq").exists()


@pytest.mark.spark
@pytest.mark.dagster_e2e
def test_cq_dev_ports_ctrl_c_restart_and_a_killed_daemon(tmp_path):
    import dagster as dg

    settings = project(tmp_path)
    holder = hold(DEFAULT_SPARK_PORT)
    ui = free_port()
    env = dev_env(tmp_path, settings)
    out = tmp_path / "dev.out"
    proc = start_dev(out, env, "--port", str(ui), "--feed-every", "2", "--stop-wait", "600")  # a loaded machine
    try:
        wait_for(lambda: "Dagster UI on" in out.read_text(), 400, "cq dev to start", proc, out)
        text = out.read_text()
        assert f"port {DEFAULT_SPARK_PORT} is taken; the Spark Connect server uses port" in text
        # A later command without CQ_SPARK_PORT finds the server on the port cq dev recorded.
        recorded = int((Path(settings.home) / "spark" / "port").read_text())
        assert recorded != DEFAULT_SPARK_PORT
        status = subprocess.run(
            [*CQ, "spark", "status"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert f"running at sc://localhost:{recorded}" in status.stdout, status.stdout + status.stderr
        wait_for(lambda: ui_up(ui), 400, "the Dagster UI", proc, out)
        with dg.DagsterInstance.from_config(str(tmp_path / "dagster")) as instance:
            wait_for(
                lambda: instance.get_run_records(dg.RunsFilter(statuses=[dg.DagsterRunStatus.SUCCESS]), limit=1),
                400,
                "a firing to succeed",
                proc,
                out,
            )
            # Ctrl-C while a run is in flight: the firings' sensor keeps requesting runs every few seconds,
            # so the shutdown's wait for it is when a new run could start (and, unless nothing new may
            # start, then be killed). The stream is computed in the cq_streams sensor (Spark Connect).
            wait_for(
                lambda: instance.get_latest_materialization_event(dg.AssetKey("hum_s")),
                400,
                "a stream window computed",
                proc,
                out,
            )
            flight = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]
            wait_for(lambda: instance.get_run_records(dg.RunsFilter(statuses=flight), limit=1), 400, "a run", proc, out)
            before = len(out.read_text())
            proc.send_signal(signal.SIGINT)
            assert proc.wait(600) == 0
            after = out.read_text()[before:]
            failed = instance.get_run_records(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
            # Batch runs are canceled at once (their sensors request their work again at the next start).
            canceled = instance.get_run_records(dg.RunsFilter(statuses=[dg.DagsterRunStatus.CANCELED]))
            # Nor left "in flight" with its worker gone (run monitoring would fail it at the next start).
            left = instance.get_run_records(dg.RunsFilter(statuses=[*flight, dg.DagsterRunStatus.CANCELING]))
        assert "Traceback" not in after and "KeyboardInterrupt" not in after, after
        for line in (
            "cq dev: feed stopped (sensors)",
            "cq dev: Dagster webserver and daemon stopped",
            "cq dev: Spark Connect server stopped",
            "cq dev: stopped at",
        ):
            assert line in after, after
        assert len(after.strip().splitlines()) <= 8, after  # one line per component (and a wait notice)
        assert failed == [], [(r.dagster_run.run_id, r.dagster_run.tags) for r in failed]
        assert all(
            "true" in (r.dagster_run.tags.get("cq/batch"), r.dagster_run.tags.get("cq/stream_batch")) for r in canceled
        )
        assert left == [], [(r.dagster_run.run_id, r.dagster_run.status) for r in left]
        assert not (Path(settings.home) / "spark" / "port").exists()
        assert sensor_keys(settings) == sorted(set(sensor_keys(settings)))

        # A restart resumes the feed after the newest reading (no re-seeded duplicates); a killed
        # dagster-daemon is named, and the rest stops.
        newest = max(sensor_keys(settings))[0]
        out2 = tmp_path / "dev2.out"
        proc = start_dev(out2, env, "--port", str(ui), "--feed-every", "2")
        wait_for(lambda: "Dagster UI on" in out2.read_text(), 400, "cq dev to restart", proc, out2)
        resumed = re.search(r"sensors fed from (\S+)", out2.read_text()).group(1)
        assert datetime.fromisoformat(resumed) > newest
        _server_killed_while_firings_run(tmp_path, settings, proc, out2)
        daemon = wait_for(lambda: descendant(proc.pid, "dagster._daemon"), 400, "the daemon", proc, out2)
        os.kill(daemon, signal.SIGKILL)
        assert proc.wait(400) == 1
        text = out2.read_text()
        assert "cq dev: Dagster exited unexpectedly" in text and "dagster-daemon process shut down unexpectedly" in text
        assert "cq dev: Spark Connect server stopped" in text, text[-3000:]
        keys = sensor_keys(settings)
        assert len(keys) == len(set(keys))
    finally:
        stop_dev(proc)
        subprocess.run([*CQ, "spark", "stop"], cwd=tmp_path, env=env, capture_output=True, timeout=120)
        if holder is not None:
            holder.close()


# Recovery is a check every 2 s plus a JVM start (about 15-30 s on an idle 2-core machine, 112 s at a load
# average of 60): well within a minute when idle; the deadline leaves room for a shared machine.
RECOVERY_DEADLINE = 300


def _server_killed_while_firings_run(tmp_path: Path, settings: Settings, proc: subprocess.Popen, out: Path) -> None:
    """SIGKILL the Connect server's JVM while a batch of firings runs: `cq dev` says so and starts it
    again; runs go on through it, and each firing of hum_5s is in the ledger once as succeeded, in
    order, its sink rows equal to its window computed from the source at the version it read."""
    import dagster as dg

    port = int((Path(settings.home) / "spark" / "port").read_text())
    live = Settings(**{**settings.__dict__, "spark_port": port})
    before = server_status(live)
    assert before.running, out.read_text()[-3000:]
    with dg.DagsterInstance.from_config(str(tmp_path / "dagster")) as instance:
        batch = dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED], tags={"cq/batch": "true"})
        wait_for(lambda: instance.get_run_records(batch, limit=1), 400, "a batch of firings in flight", proc, out)
    os.kill(before.pid, signal.SIGKILL)
    killed = datetime.now(UTC)

    def back() -> bool:
        text = out.read_text()
        down = text.find("is not running; starting it again")
        return down >= 0 and "Spark Connect server running at" in text[down:]

    wait_for(
        back,
        RECOVERY_DEADLINE,
        "cq dev to start the killed Spark Connect server again",
        proc,
        out,
    )
    after = server_status(live)
    assert after.running and after.pid != before.pid and after.port == port
    assert f"the Spark Connect server (pid {before.pid}) is not running" in out.read_text()
    ledger = Ledger(store=DeltaRsStorage(warehouse=settings.warehouse))

    def firings() -> list:
        return [e for e in ledger.entries("hum_5s") if e.kind == "firing" and e.status == "succeeded"]

    # The firings due during the outage are committed, through the new server (the run that lost the
    # old one waits for it and runs them on a new session). BLOCKED runs them in order, after the
    # backlog the restart of cq dev left: minutes on a loaded machine.
    wait_for(
        lambda: any(e.fire_time > killed + timedelta(seconds=5) for e in firings()),
        1200,
        "the firings due during the outage",
        proc,
        out,
    )
    done = firings()
    times = sorted(e.fire_time for e in done)
    assert len(times) == len(set(times)), "a firing succeeded twice"
    around = [t for t in times if t >= killed - timedelta(seconds=30)]
    assert around and around[0] <= killed, (killed, around[:3])
    assert all(b - a == timedelta(seconds=5) for a, b in itertools.pairwise(around)), around  # none missing
    sink = pa.table(DeltaTable(str(Path(settings.warehouse) / "hum_5s")).scan())
    time_col = next(f.name for f in sink.schema if pa.types.is_timestamp(f.type))
    keys = list(zip(sink.column(time_col).to_pylist(), sink.column("device").to_pylist()))
    assert len(keys) == len(set(keys)), "a window is in the sink twice"
    rows = {k: h for k, h in zip(keys, sink.column("h").to_pylist())}
    sensors = str(Path(settings.warehouse) / "sensors")
    for e in done:
        if e.fire_time < killed - timedelta(seconds=30):
            continue
        source = pa.table(DeltaTable(sensors, version=e.source_versions["sensors"]).scan())
        expected: dict[str, list[float]] = {}
        for ts, device, h in zip(*(source.column(c).to_pylist() for c in ("ts", "device", "humidity"))):
            if e.range_start <= ts < e.range_end and h is not None:
                expected.setdefault(device, []).append(h)
        got = {d: h for (t, d), h in rows.items() if t == e.range_start}
        assert got.keys() == expected.keys(), (e.fire_time, got, expected)
        for device, hs in expected.items():
            assert got[device] == pytest.approx(sum(hs) / len(hs)), (e.fire_time, device)
