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
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
import requests
from deltalake import DeltaTable
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

REPO = Path(__file__).resolve().parent.parent
SENSORS = """CREATE TABLE IF NOT EXISTS sensors (ts TIMESTAMP, device STRING, temperature DOUBLE, humidity DOUBLE);
CREATE CONTINUOUS QUERY hum_5s RESAMPLE EVERY 5s BEGIN
  SELECT avg(humidity) AS h INTO hum_5s FROM sensors GROUP BY (5s), device END;
CREATE STREAM hum_s INTERVAL(5s) SLIDING(5s) FROM sensors INTO hum_s AS SELECT _twstart, avg(humidity) AS h FROM %%trows;
"""


def project(tmp_path: Path) -> Settings:
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "sensors.sql").write_text(SENSORS)
    return Settings(sql_dir=str(tmp_path / "sql"), warehouse=str(tmp_path / "wh"), home=str(tmp_path / ".cq"))


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
    keys = _sensor_keys(Settings(sql_dir="", warehouse=str(tmp_path / "wh"), home=""))
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
    keys = _sensor_keys(settings)
    assert len(keys) == len(set(keys)), "a reading was appended twice"


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


def _hold(port: int) -> socket.socket | None:
    """Listen on ``port`` if nobody does yet (else someone else already holds it)."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        return None
    sock.listen()
    return sock


def _wait(predicate, timeout: float, what: str, proc: subprocess.Popen, out: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            pytest.fail(f"cq dev exited ({proc.returncode}) while waiting for {what}:\n{out.read_text()[-4000:]}")
        time.sleep(1)
    pytest.fail(f"timed out waiting for {what}:\n{out.read_text()[-4000:]}")


def _sensor_keys(settings: Settings) -> list[tuple]:
    data = pa.table(DeltaTable(str(Path(settings.warehouse) / "sensors")).scan())
    return sorted(zip(data.column("ts").to_pylist(), data.column("device").to_pylist()))


CQ = [sys.executable, "-m", "cq_engine.cli.main"]


def _dev_env(tmp_path: Path, settings: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CQ_", "DAGSTER_", "SPARK_"))}
    env.update(
        CQ_SQL_DIR=settings.sql_dir,
        CQ_WAREHOUSE=settings.warehouse,
        CQ_HOME=settings.home,
        DAGSTER_HOME=str(tmp_path / "dagster"),
        PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]),
        **extra,
    )
    return env


def _start_dev(out: Path, env: dict[str, str], *args: str) -> subprocess.Popen:
    """`cq dev ARGS` in the background, its output appended to ``out``."""
    with open(out, "ab") as sink:
        return subprocess.Popen(
            [*CQ, "dev", *args], cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )


def _stop_dev(proc: subprocess.Popen) -> None:
    """After a failure: Ctrl-C first (a killed `cq dev` would leave `dagster dev`, in its own session,
    running), then SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(300)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def _ui_up(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/server_info", timeout=3).status_code == 200
    except requests.RequestException:
        return False


@pytest.mark.spark
@pytest.mark.dagster_e2e
def test_cq_dev_ports_ctrl_c_restart_and_a_killed_daemon(tmp_path):
    import dagster as dg

    settings = project(tmp_path)
    holder = _hold(DEFAULT_SPARK_PORT)
    ui = free_port()
    env = _dev_env(tmp_path, settings)
    out = tmp_path / "dev.out"
    proc = _start_dev(out, env, "--port", str(ui), "--feed-every", "2", "--stop-wait", "600")  # a loaded machine
    try:
        _wait(lambda: "Dagster UI on" in out.read_text(), 400, "cq dev to start", proc, out)
        text = out.read_text()
        assert f"port {DEFAULT_SPARK_PORT} is taken; the Spark Connect server uses port" in text
        # A later command without CQ_SPARK_PORT finds the server on the port cq dev recorded.
        recorded = int((Path(settings.home) / "spark" / "port").read_text())
        assert recorded != DEFAULT_SPARK_PORT
        status = subprocess.run(
            [*CQ, "spark", "status"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert f"running at sc://localhost:{recorded}" in status.stdout, status.stdout + status.stderr
        _wait(lambda: _ui_up(ui), 400, "the Dagster UI", proc, out)
        with dg.DagsterInstance.from_config(str(tmp_path / "dagster")) as instance:
            _wait(
                lambda: instance.get_run_records(dg.RunsFilter(statuses=[dg.DagsterRunStatus.SUCCESS]), limit=1),
                400,
                "a firing to succeed",
                proc,
                out,
            )
            # Ctrl-C while a run is in flight: the firings' sensor keeps requesting runs every few seconds,
            # so the shutdown's wait for it is when a new run could start (and, unless nothing new may
            # start, then be killed). The stream is computed in the cq_streams sensor (Spark Connect).
            _wait(
                lambda: instance.get_latest_materialization_event(dg.AssetKey("hum_s")),
                400,
                "a stream window computed",
                proc,
                out,
            )
            flight = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]
            _wait(lambda: instance.get_run_records(dg.RunsFilter(statuses=flight), limit=1), 400, "a run", proc, out)
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
        assert _sensor_keys(settings) == sorted(set(_sensor_keys(settings)))

        # A restart resumes the feed after the newest reading (no re-seeded duplicates); a killed
        # dagster-daemon is named, and the rest stops.
        newest = max(_sensor_keys(settings))[0]
        out2 = tmp_path / "dev2.out"
        proc = _start_dev(out2, env, "--port", str(ui), "--feed-every", "2")
        _wait(lambda: "Dagster UI on" in out2.read_text(), 400, "cq dev to restart", proc, out2)
        resumed = re.search(r"sensors fed from (\S+)", out2.read_text()).group(1)
        assert datetime.fromisoformat(resumed) > newest
        _server_killed_while_firings_run(tmp_path, settings, proc, out2)
        daemon = _wait(lambda: descendant(proc.pid, "dagster._daemon"), 400, "the daemon", proc, out2)
        os.kill(daemon, signal.SIGKILL)
        assert proc.wait(400) == 1
        text = out2.read_text()
        assert "cq dev: Dagster exited unexpectedly" in text and "dagster-daemon process shut down unexpectedly" in text
        assert "cq dev: Spark Connect server stopped" in text, text[-3000:]
        keys = _sensor_keys(settings)
        assert len(keys) == len(set(keys))
    finally:
        _stop_dev(proc)
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
        _wait(lambda: instance.get_run_records(batch, limit=1), 400, "a batch of firings in flight", proc, out)
    os.kill(before.pid, signal.SIGKILL)
    killed = datetime.now(UTC)

    def back() -> bool:
        text = out.read_text()
        down = text.find("is not running; starting it again")
        return down >= 0 and "Spark Connect server running at" in text[down:]

    _wait(
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
    # old one failed; its retry started after the restart). BLOCKED runs them in order, after the
    # backlog the restart of cq dev left: minutes on a loaded machine.
    _wait(
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


def _ctrl_c_during(dagster_home: Path, runs, what: str, proc: subprocess.Popen, out: Path) -> tuple[str, list]:
    """Once a run matching the filter ``runs`` is in flight, Ctrl-C: what `cq dev` printed from then on
    (it must exit 0) and every run of the instance."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        _wait(lambda: instance.get_run_records(runs, limit=1), 600, what, proc, out)
        before = len(out.read_text())
        proc.send_signal(signal.SIGINT)
        assert proc.wait(600) == 0
        return out.read_text()[before:], [r.dagster_run for r in instance.get_run_records()]


@pytest.mark.spark
@pytest.mark.dagster_e2e
def test_cq_dev_ctrl_c_cancels_and_requeues_the_runs_that_cannot_finish(tmp_path):
    """Ctrl-C cancels the batched runs in flight at once (here the stream's works: without a Spark Connect
    server the cq_streams sensor hands them to runs): canceled, not failed, nothing left in flight, not
    queued again: the sensor requests the works again at the next start. (A definition's own run may
    finish for `--stop-wait` seconds, then is canceled and queued again with the same tags.)"""
    import dagster as dg

    settings = project(tmp_path)  # the stream alone: every run is one to queue again
    (tmp_path / "sql" / "sensors.sql").write_text(
        "\n".join(line for line in SENSORS.splitlines() if "hum_5s" not in line)
    )
    ui = free_port()
    env = _dev_env(tmp_path, settings, CQ_SPARK_PORT=str(free_port()))
    out = tmp_path / "dev.out"
    # In-process Spark: a run spends its first seconds starting a JVM, where a termination lands.
    proc = _start_dev(out, env, "--port", str(ui), "--feed-every", "2", "--stop-wait", "0", "--no-spark-server")
    try:
        _wait(lambda: "Dagster UI on" in out.read_text(), 400, "cq dev to start", proc, out)
        stream = dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED], tags={"cq/name": "hum_s"})
        after, runs = _ctrl_c_during(tmp_path / "dagster", stream, "a stream run in flight", proc, out)
        assert "Traceback" not in after, after
        status = {r.run_id: r.status for r in runs}
        assert dg.DagsterRunStatus.FAILURE not in status.values(), after
        # A run in flight either finished (a termination interrupts it between Spark calls) or was
        # canceled.
        canceled = [r for r in runs if r.status == dg.DagsterRunStatus.CANCELED]
        assert all(r.tags.get("cq/name") == "hum_s" and r.tags.get("cq/stream_batch") == "true" for r in canceled), (
            status
        )
        assert ("batch run(s) (their sensors request them again" in after) == bool(canceled), after
        requeued = {r.tags.get("dagster/parent_run_id") for r in runs} - {None}
        assert requeued == set(), status  # the sensor requests the works again instead
        left = [s for s in status.values() if s in (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED)]
        assert left == [], status
        if canceled:  # the next start: the sensor requests the canceled works again, and they succeed
            proc = _start_dev(out, env, "--port", str(ui), "--feed-every", "60", "--no-spark-server")

            def hum_works(run) -> set[str]:
                return set(run.run_config["ops"]["cq_streams"]["config"]["works"].get("hum_s", []))

            works = set().union(*(hum_works(r) for r in canceled))
            with dg.DagsterInstance.from_config(str(tmp_path / "dagster")) as instance:
                done = dg.RunsFilter(statuses=[dg.DagsterRunStatus.SUCCESS], tags={"cq/name": "hum_s"})

                def retried() -> bool:
                    return any(
                        r.dagster_run.tags.get("cq/attempt", "0") != "0" and works & hum_works(r.dagster_run)
                        for r in instance.get_run_records(done)
                    )

                _wait(retried, 600, "the canceled works, requested again", proc, out)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(600) == 0
    finally:
        _stop_dev(proc)
        subprocess.run([*CQ, "spark", "stop"], cwd=tmp_path, env=env, capture_output=True, timeout=120)


# -- a file that stops loading while the stack runs ------------------------------------------------
MINE = """CREATE CQ mine_5s RESAMPLE EVERY 5s BEGIN
  SELECT count(temperature) AS n INTO mine_5s FROM sensors GROUP BY (5s), device END;
CREATE CQ mine_10s RESAMPLE EVERY 10s BEGIN
  SELECT max_value(temperature) AS m INTO mine_10s FROM sensors GROUP BY (10s), device END;
CREATE STREAM mine_s INTERVAL(5s) SLIDING(5s) FROM sensors INTO mine_s AS SELECT _twstart, count(*) AS n FROM %%trows;
"""
TYPO = "CREATE CQ mine_c RESAMPLE EVERY 5s BEGIN\n  SELECT count(temperature) AS n INTO mine_c FROM sensors GROPU BY (5s) END;\n"
LOCATION_QUERY = """
{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus locationOrLoadError {
  __typename ... on PythonError { message }
  ... on RepositoryLocation { repositories { sensors { name } schedules { name } } } } } } } }
"""
RELOAD_MUTATION = """
mutation Reload($name: String!) { reloadRepositoryLocation(repositoryLocationName: $name) {
  __typename ... on WorkspaceLocationEntry { loadStatus } ... on PythonError { message } } }
"""
ERROR_ASSET_QUERY = """
query Node($key: AssetKeyInput!) { assetNodeOrError(assetKey: $key) {
  __typename ... on AssetNode { description } } }
"""
# The daemon refreshes its view of a reloaded location every 60 s (Dagster's RELOAD_WORKSPACE_INTERVAL).
DAEMON_REFRESH = timedelta(seconds=75)


def _graphql(port: int, query: str, variables: dict | None = None) -> dict:
    body = requests.post(
        f"http://127.0.0.1:{port}/graphql", json={"query": query, "variables": variables or {}}, timeout=60
    ).json()
    assert not body.get("errors"), body["errors"]
    return body["data"]


def _location(port: int) -> tuple[str, set[str]]:
    """The code location's name and its sensors and schedules (the definitions' switches)."""
    (entry,) = _graphql(port, LOCATION_QUERY)["workspaceOrError"]["locationEntries"]
    loc = entry["locationOrLoadError"]
    assert entry["loadStatus"] == "LOADED" and loc["__typename"] == "RepositoryLocation", entry
    return entry["name"], {x["name"] for r in loc["repositories"] for x in (*r["sensors"], *r["schedules"])}


def _reload(port: int) -> set[str]:
    """Reload definitions as the UI's button does; the switches the location then has."""
    name, _ = _location(port)
    result = _graphql(port, RELOAD_MUTATION, {"name": name})["reloadRepositoryLocation"]
    assert result["__typename"] == "WorkspaceLocationEntry", result
    return _location(port)[1]


def _error_asset(port: int) -> str | None:
    node = _graphql(port, ERROR_ASSET_QUERY, {"key": {"path": ["cq_errors", "mine_sql_load_error"]}})
    node = node["assetNodeOrError"]
    return node["description"] if node["__typename"] == "AssetNode" else None


def _done(ledger: Ledger, name: str, kind: str = "firing") -> list:
    return [e for e in ledger.entries(name) if e.kind == kind and e.status == "succeeded"]


def _go_on(ledger: Ledger, runs: tuple, since: datetime, proc: subprocess.Popen, out: Path) -> None:
    """Wait until each (definition, ledger kind) committed once more past the daemon's refresh after ``since``."""
    for name, kind in runs:
        _wait(
            lambda name=name, kind=kind: any(e.finished_at > since + DAEMON_REFRESH for e in _done(ledger, name, kind)),
            600,
            f"{name} to go on after {since}",
            proc,
            out,
        )


@pytest.mark.spark
@pytest.mark.dagster_e2e
def test_a_file_that_stops_loading_while_cq_dev_runs_keeps_its_definitions_running(tmp_path):
    """Three definitions of a new file run; the file gets a typo and the location is reloaded: `cq dev`
    says so, the UI holds their switches and a named error asset, and they go on (no firing missed, the
    stream neither re-created nor its history ignored again); fixed and reloaded, they carry on."""
    settings = project(tmp_path)
    mine = Path(settings.sql_dir) / "mine.sql"
    mine.write_text(MINE)
    ui = free_port()
    env = _dev_env(tmp_path, settings, CQ_SPARK_PORT=str(free_port()))
    out = tmp_path / "dev.out"
    proc = _start_dev(out, env, "--port", str(ui), "--feed-every", "2", "--stop-wait", "600")
    ledger = Ledger(store=DeltaRsStorage(warehouse=settings.warehouse))
    try:
        _wait(lambda: _ui_up(ui), 600, "the Dagster UI", proc, out)
        _wait(lambda: len(_done(ledger, "mine_5s")) >= 2, 600, "mine_5s's firings", proc, out)
        _wait(lambda: _done(ledger, "mine_s", "realtime"), 600, "mine_s's windows", proc, out)
        ignored = [e for e in ledger.entries("mine_s") if e.status == "ignored"]
        switches = {"mine_5s_ticks", "mine_10s_ticks", "mine_s_ticks"}
        assert switches <= _location(ui)[1]

        mine.write_text(MINE + TYPO)
        said = "keep running at the file's last good version"
        _wait(lambda: said in out.read_text(), 60, "cq dev to say the file fails", proc, out)
        line = next(x for x in out.read_text().splitlines() if said in x)
        assert "mine.sql:7:" in line and "GROPU" in line and "mine_5s, mine_10s, mine_s keep running" in line
        assert said in (Path(env["DAGSTER_HOME"]) / "dev.log").read_text()  # and in its log
        assert switches <= _reload(ui)
        broken_at = datetime.now(UTC)
        description = _error_asset(ui)
        assert description and "mine.sql:7:" in description and "mine_5s, mine_10s, mine_s keep running" in description
        # Past the daemon's refresh, the kept definitions still fire, every one of their firings.
        _go_on(ledger, (("mine_5s", "firing"), ("mine_10s", "firing"), ("mine_s", "realtime")), broken_at, proc, out)

        mine.write_text(MINE + TYPO.replace("GROPU", "GROUP"))
        _wait(lambda: "mine.sql loads again" in out.read_text(), 60, "cq dev to say the file loads", proc, out)
        assert switches | {"mine_c_ticks"} <= _reload(ui)
        fixed_at = datetime.now(UTC)
        assert _error_asset(ui) is None
        _go_on(ledger, (("mine_5s", "firing"), ("mine_c", "firing"), ("mine_s", "realtime")), fixed_at, proc, out)
        for name, every in (("mine_5s", 5), ("mine_10s", 10)):
            times = sorted(e.fire_time for e in _done(ledger, name))
            assert len(times) == len(set(times)), f"{name}: a firing committed twice"
            gaps = [(a, b) for a, b in itertools.pairwise(times) if b - a != timedelta(seconds=every)]
            assert not gaps, f"{name}: firings missing: {gaps}"
        # The stream was never created again: no more history ignored, its windows without a gap.
        assert [e for e in ledger.entries("mine_s") if e.status == "ignored"] == ignored
        sink = pa.table(DeltaTable(str(Path(settings.warehouse) / "mine_s")).scan())
        starts = sorted(set(sink.column("_twstart").to_pylist()))
        assert all(b - a == timedelta(seconds=5) for a, b in itertools.pairwise(starts)), starts
    finally:
        _stop_dev(proc)
        subprocess.run([*CQ, "spark", "stop"], cwd=tmp_path, env=env, capture_output=True, timeout=120)


# -- Ctrl-C, SIGKILL and a second cq dev -------------------------------------------------------------
def _stack_pids(settings: Settings, dagster_home: Path) -> list[str]:
    """The live processes whose environment names this CQ_HOME or DAGSTER_HOME, with their commands."""
    needles = {f"CQ_HOME={Path(settings.home).resolve()}".encode(), f"DAGSTER_HOME={dagster_home.resolve()}".encode()}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if not needles & set((entry / "environ").read_bytes().split(b"\0")):
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                continue
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry.name}: {command[:150]}")
        except OSError:
            continue
    return found


def _none_left(settings: Settings, dagster_home: Path, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while (left := _stack_pids(settings, dagster_home)) and time.monotonic() < deadline:
        time.sleep(1)
    return left


@pytest.mark.spark
@pytest.mark.dagster_e2e
def test_cq_dev_ctrl_c_commits_no_firing_past_the_feed_and_sigkill_leaves_no_process(tmp_path):
    """Ctrl-C while batch runs hold firings ahead: every firing committed read readings of its range
    (the feed stops last), no run failed, only batch runs were canceled, nothing is left running. A
    second `cq dev` on the same CQ_HOME is refused while one runs. A SIGKILLed `cq dev` takes every
    process of its stack with it (Dagster's, the Spark Connect JVM, the agent: sessions of their own)."""
    import dagster as dg

    settings = project(tmp_path)
    ui = free_port()
    env = _dev_env(tmp_path, settings, CQ_SPARK_PORT=str(free_port()))
    dagster_home = tmp_path / "dagster"
    out = tmp_path / "dev.out"
    proc = _start_dev(out, env, "--port", str(ui), "--feed-every", "2", "--stop-wait", "30")
    ledger = Ledger(store=DeltaRsStorage(warehouse=settings.warehouse))
    try:
        _wait(lambda: _ui_up(ui), 600, "the Dagster UI", proc, out)
        second = subprocess.run(
            [*CQ, "dev", "--port", str(free_port())], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
        )
        assert second.returncode == 1 and "a cq dev stack still runs on CQ_HOME=" in second.stderr, second
        _wait(lambda: len(_done(ledger, "hum_5s")) >= 3, 600, "hum_5s's firings", proc, out)
        batch = dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED], tags={"cq/batch": "true"})
        after, runs = _ctrl_c_during(dagster_home, batch, "a batch run in flight", proc, out)
        assert "Traceback" not in after, after
        assert after.index("Dagster webserver and daemon stopped") < after.index("feed stopped"), after
        assert not [r.run_id for r in runs if r.status == dg.DagsterRunStatus.FAILURE], after
        canceled = [r for r in runs if r.status == dg.DagsterRunStatus.CANCELED]
        assert all(r.tags.get("cq/batch") == "true" or r.tags.get("cq/stream_batch") == "true" for r in canceled)
        assert not [r.run_id for r in runs if r.status in (dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING)]
        assert _none_left(settings, dagster_home, 30) == []
        # No firing was committed for a range the feed never reached (its readings are 5 s apart).
        newest = max(pa.table(DeltaTable(str(Path(settings.warehouse) / "sensors")).scan()).column("ts").to_pylist())
        past = [
            (e.fire_time, e.range_end) for e in _done(ledger, "hum_5s") if e.range_end > newest + timedelta(seconds=5)
        ]
        assert past == [], f"firings past the feed's newest reading {newest}: {past}"

        # Restarted, then SIGKILLed: nothing of the stack is left after a few seconds.
        proc = _start_dev(out, env, "--port", str(ui), "--feed-every", "2")
        _wait(lambda: _ui_up(ui), 600, "the Dagster UI again", proc, out)
        live = Settings(**{**settings.__dict__, "spark_port": int(env["CQ_SPARK_PORT"])})
        _wait(lambda: server_status(live).running, 600, "the Spark Connect server", proc, out)
        assert len(_stack_pids(settings, dagster_home)) >= 5  # dagster dev, webserver, daemon, code server, JVM
        proc.kill()
        proc.wait(30)
        assert _none_left(settings, dagster_home, 60) == []
    finally:
        _stop_dev(proc)
        subprocess.run([*CQ, "spark", "stop"], cwd=tmp_path, env=env, capture_output=True, timeout=120)
        for line in _stack_pids(settings, dagster_home):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
