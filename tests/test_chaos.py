"""Faults on the deployed topology (``make chaos-test``; marker ``cluster``, run by ``.ci/run`` after the
cluster test): the docs' Deployment page (``tests/test_cluster.py``'s ``Cluster``: Spark standalone, the
engine's Connect server on it, Dagster on PostgreSQL, the warehouse on an S3-compatible store through
``s3a://``) runs a continuous query, a PERIOD stream and a window-triggered stream every 30 s through the
daemon while, one at a time and each while a run is in flight:

- a Spark worker is SIGKILLed, and started again 30 s later;
- the engine's Spark Connect server is SIGKILLed, and started again (``cq spark start``) 20 s later;
- PostgreSQL is stopped (``pg_ctl stop -m fast``) for a minute, then started;
- the object store stops answering for a minute: a TCP proxy in front of moto's server (every process
  of the deployment talks to the proxy) holds new connections unanswered and stalls the open ones,
  then lets them through again;
- the Dagster daemon is SIGKILLed, and started again 20 s later (its cursors are in PostgreSQL);
- the code location's server process is SIGKILLed, and started again 20 s later (the runs it started,
  its children, carry on);
- overload: busy loops of its own hold the load at 8 or more for three minutes or more, while a stream
  with FILL_HISTORY is added and the code location reloaded to load it (its history chunk computed under
  the load); its recovery is printed, not limited: what fell behind is caught up after it.

The feed writes straight to the store (not through the proxy), so windows keep coming due during every
fault. After each fault the stack must recover on its own (every definition has committed work due
since the cadence before the fault's end; timed from the ledger's commit times): the target is one
cadence (30 s), the assertion allows two for a loaded machine, and no run may be shown failed; at the end every firing, tick and window due from the
first one to the last is in the ledger once as succeeded, its sink rows equal an independent pyarrow
computation over the source at the version the ledger recorded, no sink holds a window twice, and no
run stays queued or started. Per fault the test prints (and docs/operations/guarantees.md records) the
time to recover, the firings retried and the runs that failed, with the error the UI shows for each,
and the load average.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from netutil import free_port, port_open
from test_cluster import BIN, PG_BIN, WORKER, Cluster, _wait

pytestmark = pytest.mark.cluster

# The cadence of every definition: 30 s on a quiet 2-core machine; on a busy one (a load average of 20
# or more) a firing committed by the cluster's executors takes most of a minute, so the stack cannot
# keep up with 30 s whatever the faults: CQ_CHAOS_EVERY=60 there.
EVERY = timedelta(seconds=int(os.environ.get("CQ_CHAOS_EVERY", "30")))
DEFINITIONS = """\
CREATE TABLE IF NOT EXISTS sensors (ts TIMESTAMP, device STRING, temperature DOUBLE, humidity DOUBLE);

CREATE CONTINUOUS QUERY t_cq RESAMPLE EVERY 30s BEGIN
  SELECT max_value(temperature) AS temperature_max, avg(temperature) AS temperature_avg,
         count(temperature) AS samples
  INTO t_cq FROM sensors GROUP BY (30s), device
END;

CREATE STREAM n_period PERIOD(30s) FROM sensors INTO n_period AS SELECT _tlocaltime, count(*) AS n FROM %%trows;

CREATE STREAM w_stream INTERVAL(30s) SLIDING(30s) FROM sensors OPTIONS(WATERMARK(2s))
  INTO w_stream AS SELECT _twstart, avg(temperature) AS t, count(*) AS n FROM %%trows;
""".replace("30s", f"{EVERY.seconds}s")
FAULT_SECONDS = {
    "worker": 30,
    "connect": 20,
    "postgres": 60,
    "object store": 60,
    "daemon": 20,
    "code server": 20,
    "overload": 120,  # after the code location's reload under the load (a minute or more)
}
# Overload: busy loops of the test's own (a load of 8 or more on 2 cores beside the stack) while a
# stream with FILL_HISTORY is created, so its history chunk and every firing, tick and window are
# computed under it; the code location is reloaded to load it, as the docs tell a user to.
OVERLOAD_HOGS = 4 * (os.cpu_count() or 2)
HISTORY_SQL = """\
CREATE STREAM h_hist INTERVAL(30s) SLIDING(30s) FROM sensors OPTIONS(WATERMARK(2s) | FILL_HISTORY)
  INTO h_hist AS SELECT _twstart, avg(temperature) AS t, count(*) AS n FROM %%trows;
""".replace("30s", f"{EVERY.seconds}s")
# CQ_CHAOS_FAULTS=daemon,code server runs only those (in this order), e.g. to look at one fault again.
FAULTS = [f.strip() for f in os.environ.get("CQ_CHAOS_FAULTS", ",".join(FAULT_SECONDS)).split(",") if f.strip()]
ARTIFACTS = Path(__file__).parent / "artifacts" / "chaos"
# Recovered: every definition has committed work due at most one cadence before the fault ended, and
# one cadence has passed since it ended, measured from the ledger's commit times, not by polling. So
# recovery is never below the cadence, and the target (30 s, issue 43) is met when the stack has caught
# up by then. The assertion allows a second cadence: with none, a loaded machine's few seconds fail a
# run that did recover (35 s for the object store at load 4); it still fails a stack that recovers by
# back-offs or restarts. The figures against the target are printed per fault
# (docs/operations/guarantees.md). RECOVERY_DEADLINE only ends the wait for a stack that does not recover.
RECOVERY_LIMIT = 2 * EVERY
# A restarted Connect server is a new Spark application: its executors are new JVMs that fetch the
# engine's jars from it and its first jobs open every Delta table afresh, a cold start of 43-69 s after
# it answers at load 5-9 (docs/operations/guarantees.md); a third cadence for it. It still fails a run
# that waits out a back-off or a time-out (180 s) instead of reconnecting.
RECOVERY_LIMITS = {"connect": 3 * EVERY}
RECOVERY_DEADLINE = 600


class StallProxy:
    """A TCP proxy in front of the object store. ``stall()``: new connections are accepted and left
    unanswered, open ones stop moving (a store that stops answering: clients see timeouts, not a
    refusal); ``resume()``: the held connections are closed (clients retry) and traffic flows again."""

    def __init__(self, port: int, upstream: int):
        self.upstream = upstream
        self.stalled = threading.Event()
        self.held: list[socket.socket] = []
        self.lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", port))
        self.closed = False
        threading.Thread(target=self._accept, name="s3-proxy", daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if self.stalled.is_set():
                with self.lock:
                    self.held.append(client)
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream), timeout=10)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        try:
            while not self.closed:
                if self.stalled.is_set():
                    time.sleep(0.2)
                    continue
                for key, _ in sel.select(timeout=0.2):
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    key.data.sendall(data)
        except OSError:
            return
        finally:
            sel.close()
            a.close()
            b.close()

    def stall(self) -> None:
        self.stalled.set()

    def resume(self) -> None:
        with self.lock:
            held, self.held = self.held, []
            self.stalled.clear()
        for sock in held:
            with contextlib.suppress(OSError):
                sock.close()

    def close(self) -> None:
        self.closed = True
        self.resume()
        self.server.close()


class ChaosCluster(Cluster):
    """The Deployment's cluster, with the object store behind a ``StallProxy`` and a way to break and
    mend each part."""

    def start_s3(self) -> None:
        # Every process of the deployment gets the proxy's port (the Deployment page's 9000); moto listens behind it.
        self.moto_port = free_port()
        self._spawn("moto", [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(self.moto_port)])
        _wait("the S3 server", lambda: port_open(self.moto_port), 120, self.logs)
        self.proxy = StallProxy(self.s3_port, self.moto_port)
        self.stops.append(self.proxy.close)
        import boto3

        boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{self.moto_port}",
            region_name=self.env["AWS_REGION"],
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        ).create_bucket(Bucket="cq-warehouse")

    def spark_block_env(self) -> str:
        script = self.local(self.blocks[1][1])
        return "\n".join(line for line in script.splitlines() if line.startswith(("SPARK_HOME=", "export ")))

    def worker_pid(self, i: int) -> int:
        return int(next(self.logs.glob(f"spark-*-{WORKER}-{i}.pid")).read_text())

    def start_worker(self, i: int) -> None:
        script = self.local(self.blocks[1][1]).replace("\\\n", " ")
        start = next(line for line in script.splitlines() if f"start {WORKER} $i" in line)
        args = start.split(f"{WORKER} $i", 1)[1].strip()
        self._run(
            [
                "bash",
                "-e",
                "-c",
                f'{self.spark_block_env()}\n"$SPARK_HOME/sbin/spark-daemon.sh" start {WORKER} {i} {args}',
            ]
        )

    def connect_pid(self) -> int:
        return int(next((self.root / ".cq" / "spark").glob("*SparkConnectServer-1.pid")).read_text())

    def restart_connect(self) -> None:
        self._run(["bash", "-e", "-c", self.local(self.blocks[2][1])])


class Overload:
    """``OVERLOAD_HOGS`` busy loops beside the stack, and a new FILL_HISTORY stream loaded under them."""

    def __init__(self) -> None:
        self.hogs: list[subprocess.Popen] = []

    def start(self, cluster: ChaosCluster, names: list[str]) -> None:
        hog = [sys.executable, "-c", "while True: pass"]
        self.hogs = [subprocess.Popen(hog, start_new_session=True) for _ in range(OVERLOAD_HOGS)]
        (cluster.root / "sql" / "history.sql").write_text(HISTORY_SQL)
        # Reloaded as the docs say, by the call the UI's Reload makes: the code server loads the
        # definitions in a new process and tells the old one to shut down once its runs in flight end.
        # (A SIGTERMed server exits only after those runs, minutes for a batch run under this load.)
        from dagster._grpc.client import DagsterGrpcClient

        DagsterGrpcClient(port=cluster.code_port, host="127.0.0.1").reload_code(timeout=300)
        names.append("h_hist")

    def stop(self) -> None:
        for hog in self.hogs:
            hog.kill()
            hog.wait()
        self.hogs = []


@dataclass
class Fault:
    name: str
    started: datetime
    ended: datetime | None = None
    recovered: datetime | None = None
    retried: int = 0  # firings/works whose first attempt failed and were run again
    failed_runs: list[str] = field(default_factory=list)  # "run id: error" as the UI shows it

    caught_up: float = 0.0  # seconds from the end to the last definition's first commit of work due since
    load: str = ""  # the load average when it recovered

    @property
    def recovery(self) -> float:
        assert self.ended is not None and self.recovered is not None
        return (self.recovered - self.ended).total_seconds()

    def line(self) -> str:
        assert self.ended is not None
        return (
            f"{self.name}: down {(self.ended - self.started).total_seconds():.0f}s, recovered "
            f"{self.recovery:.0f}s after it ended (caught up {self.caught_up:.0f}s after), {self.retried} "
            f"firing(s)/window(s) retried, {len(self.failed_runs)} run(s) failed, load {self.load}"
            + "".join(f"\n    {r}" for r in self.failed_runs)
        )


def _feed(storage, stop: threading.Event, start: datetime) -> None:
    """Readings every second, appended every 2 s straight to the store (not through the proxy)."""
    from cq_engine.cli.feed import floor_time, sensor_rows

    while not stop.wait(2.0):
        end = floor_time(datetime.now(UTC), timedelta(seconds=1))
        if end > start:
            with contextlib.suppress(Exception):  # retried at the next round
                storage.append("sensors", sensor_rows(start=start, end=end, every=timedelta(seconds=1)))
                start = end


def _due(entries, now: datetime) -> datetime | None:
    """The newest fire time / window end covered by succeeded entries."""
    ends = [e.fire_time or e.range_end for e in entries if e.status == "succeeded"]
    return max(ends) if ends else None


def _first_commit(entries, since: datetime) -> datetime | None:
    """When the first succeeded entry of work due at ``since`` or later was committed (the ledger's
    finish time), or None."""
    times = [e.finished_at for e in entries if e.status == "succeeded" and (e.fire_time or e.range_end) >= since]
    return min(times) if times else None


def _load() -> str:
    return "/".join(f"{v:.1f}" for v in os.getloadavg())


def test_the_deployment_recovers_from_each_fault_on_its_own(tmp_path):
    if not (PG_BIN / "initdb").is_file():
        pytest.fail(f"PostgreSQL is not installed ({PG_BIN}/initdb): run `make chaos-test`, which installs it")
    from cq_engine import jars

    assert not jars.missing(jars.delta_artifacts() + jars.s3a_artifacts()), "run `make jars`"
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "chaos.sql").write_text(DEFINITIONS)
    cluster = ChaosCluster(tmp_path)
    overload = Overload()
    stop_feed, old = threading.Event(), dict(os.environ)
    faults: list[Fault] = []
    try:
        cluster.start_postgres()
        cluster.start_s3()
        cluster.start_spark()
        cluster.start_connect()
        # This process reads and feeds the store directly, behind the proxy's back.
        os.environ.update({k: v for k, v in cluster.env.items() if k.startswith("AWS_")})
        os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{cluster.moto_port}"
        from cq_engine.config import load_settings
        from cq_engine.engine import Engine

        direct = {**cluster.env, "CQ_STORAGE": "deltars", "AWS_ENDPOINT_URL": os.environ["AWS_ENDPOINT_URL"]}
        feeder = Engine(settings=load_settings(environ=direct))
        feeder.ensure_tables()
        start = datetime.now(UTC).replace(microsecond=0)
        threading.Thread(target=_feed, args=(feeder.storage, stop_feed, start), daemon=True).start()
        cluster.start_dagster()
        names = ["t_cq", "n_period", "w_stream"]

        def ledger(name: str) -> list:
            return [e for e in feeder.ledger.entries(name) if e.kind != "ignored"]

        def caught_up(since: datetime) -> bool:
            """Every definition has succeeded entries up to ``since`` (its newest due time then)."""
            return all((_due(ledger(n), since) or since - EVERY * 100) >= since - 2 * EVERY for n in names)

        _wait("every definition firing through the daemon", lambda: caught_up(datetime.now(UTC)), 900, cluster.logs)
        from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

        instance = DagsterInstance.from_config(cluster.env["DAGSTER_HOME"])

        def in_flight() -> bool:
            return bool(instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.STARTED]), limit=1))

        def fault(name: str, breaks, mends) -> None:
            _wait(f"a run in flight before the {name} fault", in_flight, 300, cluster.logs)
            f = Fault(name, datetime.now(UTC))
            faults.append(f)
            breaks()
            time.sleep(FAULT_SECONDS[name])
            mends()
            f.ended = datetime.now(UTC)
            # Recovered: every definition has succeeded up to a due time after the fault ended.
            mark = f.ended + EVERY
            _wait(
                f"recovery from the {name} fault",
                lambda: caught_up(mark) and datetime.now(UTC) > mark,
                RECOVERY_DEADLINE,
                cluster.logs,
            )
            # When it recovered, from the ledger's commit times (not when this loop looked).
            firsts = [_first_commit(ledger(n), mark - 2 * EVERY) for n in names]
            assert all(firsts), firsts
            last = max(t for t in firsts if t is not None)
            f.recovered = max(mark, last)
            f.caught_up = (last - f.ended).total_seconds()
            f.load = _load()
            print(f.line(), flush=True)

        breaks_and_mends = {
            "worker": (lambda: os.kill(cluster.worker_pid(1), signal.SIGKILL), lambda: cluster.start_worker(1)),
            "connect": (lambda: os.kill(cluster.connect_pid(), signal.SIGKILL), cluster.restart_connect),
            "postgres": (
                lambda: subprocess.run(cluster.pg_stop, capture_output=True, check=True),
                lambda: cluster._run(cluster.pg_start),
            ),
            "object store": (cluster.proxy.stall, cluster.proxy.resume),
            # Its cursors are in PostgreSQL; a supervisor (systemd, Kubernetes) starts it again.
            "daemon": (lambda: os.kill(cluster.daemon.pid, signal.SIGKILL), cluster.start_daemon),
            # The server process only, as the OOM killer would: the runs it started are its children.
            "code server": (lambda: os.kill(cluster.code_server.pid, signal.SIGKILL), cluster.start_code_server),
            "overload": (lambda: overload.start(cluster, names), overload.stop),
        }
        unknown = set(FAULTS) - set(breaks_and_mends)
        assert not unknown, f"CQ_CHAOS_FAULTS: no fault {sorted(unknown)} (there are {list(breaks_and_mends)})"
        for name in FAULTS:
            fault(name, *breaks_and_mends[name])

        # Nothing stays queued or started: the runs in flight now finish (or fail) on their own.
        def settled() -> bool:
            stuck = instance.get_run_records(
                RunsFilter(
                    statuses=[DagsterRunStatus.QUEUED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED],
                    created_before=faults[-1].recovered,
                )
            )
            return not stuck

        _wait("the runs created before the last recovery to finish", settled, 300, cluster.logs)
        stop_feed.set()
        _report(faults, instance, feeder, names)
        _check_exactly_once(feeder, names)
        # What a user sees (issue 43): every fault recovered within the limit, no run shown failed.
        # Overload is not timed against the limit: minutes of work fell behind under it and are caught up
        # after it (printed); it must end with every firing, tick and window exactly once.
        slow = [
            f"{f.name}: {f.recovery:.0f}s"
            for f in faults
            if f.recovery > RECOVERY_LIMITS.get(f.name, RECOVERY_LIMIT).total_seconds() and f.name != "overload"
        ]
        assert not slow, (
            f"recovered later than the limit ({RECOVERY_LIMIT.total_seconds():.0f}s, connect {RECOVERY_LIMITS['connect'].total_seconds():.0f}s) after the fault: {slow}"
        )
        failed = [r for f in faults for r in f.failed_runs] + _failed_runs(
            instance, since=None, until=faults[0].started
        )
        assert not failed, f"runs shown failed: {failed}"
    finally:
        stop_feed.set()
        overload.stop()
        cluster.stop()
        os.environ.clear()
        os.environ.update(old)
        # The daemon's, the servers' and the Connect server's logs outlive pytest's temporary directories.
        shutil.rmtree(ARTIFACTS, ignore_errors=True)
        shutil.copytree(cluster.logs, ARTIFACTS, ignore=shutil.ignore_patterns("work"), dirs_exist_ok=True)
        for log in (tmp_path / ".cq" / "spark").glob("*.out*"):
            shutil.copy(log, ARTIFACTS)


def _report(faults: list[Fault], instance, feeder, names) -> None:
    """Fill in per fault the retried firings (failed ledger entries of its span) and the failed runs
    (with the error of their failure event: what the run's page shows)."""

    entries = [e for n in names for e in feeder.ledger.entries(n)]
    for i, f in enumerate(faults):
        assert f.ended is not None and f.recovered is not None
        # Up to the next fault (the last: to now): a run failed by a fault may end after its recovery.
        until = faults[i + 1].started if i + 1 < len(faults) else datetime.now(UTC)
        f.retried = sum(1 for e in entries if e.status == "failed" and f.started <= e.started_at < until)
        f.failed_runs = _failed_runs(instance, since=f.started, until=until)
    print("\n".join(f.line() for f in faults), flush=True)


def _failed_runs(instance, *, since: datetime | None, until: datetime) -> list[str]:
    """The runs that ended failed between ``since`` and ``until``, each with the error its page shows."""
    from dagster import DagsterRunStatus, RunsFilter

    out = []
    for record in instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.FAILURE])):
        run = record.dagster_run
        ended = record.end_time or record.update_timestamp.timestamp()
        if (since is None or since.timestamp() <= ended) and ended < until.timestamp():
            out.append(f"{run.run_id[:8]} ({run.job_name}): {_why(instance, run.run_id)}")
    return out


def _why(instance, run_id: str) -> str:
    """Why a run failed, as its page in the UI shows it: the run failure's message, after every distinct
    error of its events in order (a step's or a resource's failure, the queue's retries of its launch), so
    an error the run recovered from is not mistaken for the cause."""
    from dagster import DagsterEventType

    said: list[str] = []
    for event in instance.all_logs(run_id):
        data = event.dagster_event.event_specific_data if event.dagster_event else None
        error = getattr(data, "error", None)
        failure = event.dagster_event and event.dagster_event.event_type == DagsterEventType.RUN_FAILURE
        texts = [event.message, error.message] if error is not None else [event.message] if failure else []
        for text in texts:
            text = " ".join(text.split())[:300]
            if text and text not in said:
                said.append(text)
    return " | ".join(said) if said else "(no error event)"


_SOURCES: dict[int, pa.Table] = {}
_FILES: dict[str, pa.Table] = {}


def _source(feeder, version: int) -> pa.Table:
    """The source at ``version``. The feed only appends, one file per commit, so a version is the files
    of the one before plus its own: each file is read once (the checks ask for hundreds of versions of a
    table of hundreds of files, and each read of a version read every file again), each version once."""
    if version not in _SOURCES:
        dataset = DeltaTable(feeder.settings.table_uri("sensors"), version=version).to_pyarrow_dataset()
        parts = []
        for fragment in dataset.get_fragments():
            if fragment.path not in _FILES:
                _FILES[fragment.path] = fragment.to_table(schema=dataset.schema)
            parts.append(_FILES[fragment.path])
        _SOURCES[version] = pa.concat_tables(parts) if parts else dataset.schema.empty_table()
    return _SOURCES[version]


def _between(table: pa.Table, lo: datetime, hi: datetime) -> pa.Table:
    ts = pa.timestamp("us", "UTC")
    return table.filter(
        pc.and_(pc.greater_equal(table["ts"], pa.scalar(lo, ts)), pc.less(table["ts"], pa.scalar(hi, ts)))
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 9)


def _check_exactly_once(feeder, names) -> None:
    """Every firing / tick / window from the first to the last succeeded exactly once, contiguous, and
    its sink rows equal pyarrow's over the source at the version the ledger recorded."""
    for name in names:
        done = [e for e in feeder.ledger.entries(name) if e.status == "succeeded" and e.kind != "ignored"]
        assert done, name
        sink = DeltaTable(feeder.settings.table_uri(name)).to_pyarrow_table().to_pylist()
        if name in ("t_cq", "n_period"):
            times = [e.fire_time for e in done]
            assert len(times) == len(set(times)), f"{name}: a firing succeeded twice"
            times.sort()
            gaps = [(a, b) for a, b in itertools.pairwise(times) if b - a != EVERY]
            assert not gaps, f"{name}: firings missing between {gaps}"
        if name == "t_cq":
            keys = [(r["ts"], r["device"]) for r in sink]
            assert len(keys) == len(set(keys)), "t_cq: a window is in the sink twice"
            for e in done:
                source = _source(feeder, e.source_versions["sensors"])
                rows = _between(source, e.range_start, e.range_end).to_pylist()
                expected = []
                # Every device the source holds at that version is a row (docs/dialects/iotdb.md: the known groups),
                # also one without a temperature in the range (the feed's 3% missing, or a range the feed
                # did not reach during a fault): null aggregates, 0 samples.
                for device in sorted(set(source.column("device").to_pylist())):
                    temps = [r["temperature"] for r in rows if r["device"] == device and r["temperature"] is not None]
                    avg = round(sum(temps) / len(temps), 9) if temps else None
                    expected.append((device, max(temps, default=None), avg, len(temps)))
                got = sorted(
                    (r["device"], r["temperature_max"], _round(r["temperature_avg"]), r["samples"])
                    for r in sink
                    if e.range_start <= r["ts"] < e.range_end
                )
                assert got == expected, (name, e)
        elif name == "n_period":
            by_tick = {}
            for r in sink:
                assert r["_tlocaltime"] not in by_tick, f"n_period: tick {r['_tlocaltime']} is in the sink twice"
                by_tick[r["_tlocaltime"]] = r["n"]
            done.sort(key=lambda e: e.fire_time)
            for prev, e in itertools.pairwise(done):
                after, until = prev.source_versions["sensors"], e.source_versions["sensors"]
                expected = len(_source(feeder, until)) - len(_source(feeder, after))  # the feed only appends
                assert by_tick.get(e.fire_time, 0) == expected, (name, e.fire_time, after, until)
        else:
            starts = [r["_twstart"] for r in sink]
            assert len(starts) == len(set(starts)), f"{name}: a window is in the sink twice"
            # Without FILL_HISTORY the rows up to the creation's last one are history (the ledger's
            # ignored entry ends just past it): a window open at creation counts only the later rows,
            # and holds no row when none came (docs/dialects/tdengine.md).
            history = [e for e in feeder.ledger.entries(name) if e.kind == "ignored" and "history" in (e.error or "")]
            origin = max((e.range_end for e in history), default=None)
            computed: list[datetime] = []
            for e in done:
                source = _source(feeder, e.source_versions["sensors"])
                t = e.range_start
                while t < e.range_end:
                    computed.append(t)
                    rows = _between(source, max(t, origin) if origin else t, t + EVERY)
                    temps = [v for v in rows["temperature"].to_pylist() if v is not None]
                    got = [r for r in sink if r["_twstart"] == t]
                    if len(rows):
                        assert len(got) == 1 and got[0]["n"] == len(rows), (name, t, e, got)
                        avg = sum(temps) / len(temps) if temps else None
                        assert got[0]["t"] == (avg if avg is None else pytest.approx(avg)), (name, t)
                    t += EVERY
            assert len(computed) == len(set(computed)), f"{name}: a window was computed by two succeeded runs"
            computed.sort()
            gaps = [(a, b) for a, b in itertools.pairwise(computed) if b - a != EVERY]
            assert not gaps, f"{name}: windows missing between {gaps}"
