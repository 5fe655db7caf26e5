"""``cq dev``: the whole stack on one machine: Spark Connect server, Dagster (webserver + daemon) with
a DAGSTER_HOME whose run queue serialises each definition, and a simulated sensor feed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

from cq_engine.cli import agent
from cq_engine.cli.devguard import kill_dagster_leftovers, refuse_beside_running, start_guard
from cq_engine.cli.devstop import drain_runs, freeze_daemon, kill_frozen, stop_process_group
from cq_engine.cli.devwatch import SqlWatch, describe
from cq_engine.cli.feed import FEEDS, floor_time
from cq_engine.cli.supervise import ServerSupervisor
from cq_engine.config import DEFAULT_SPARK_PORT, Settings
from cq_engine.engine import Engine
from cq_engine.errors import CQError
from cq_engine.ingest import ingest
from cq_engine.times import UTC, iso

DAGSTER_YAML = """\
# Written by `cq dev`. Batched firings (sensor cq_firings): the sensor keeps each definition in one
# run at a time; at most 2 batch runs at once (tag cq/batch). Per-definition runs (a definition's own
# job, a recalculation, a stream's runs, CQ_RUN_MODEL=per_firing): one at a time per definition
# (tag cq/name), later ones queue and run in order; DISCARD definitions skip in their sensor instead.
# Run monitoring fails a run whose worker process died (the run launcher's health check; Dagster's
# default launcher has none) and ends runs past their dagster/max_runtime tag (a hung worker), so the
# sensor retries their firings. Latency: the queue is read every second (Dagster's default is 5 s)
# by several threads, and sensors are evaluated in parallel, so one slow sensor delays no other.
# A run dequeued while its code location's server is away (restarted, reloading) goes back to the
# queue and is tried every 5 s for 3 minutes instead of failing at once (Dagster's default).
# The freshness daemon evaluates every sink's freshness policy (on by default; stated so it stays on).
run_coordinator:
  module: dagster._core.run_coordinator
  class: QueuedRunCoordinator
  config:
    dequeue_interval_seconds: 1
    dequeue_use_threads: true
    dequeue_num_workers: 4
    max_user_code_failure_retries: 36
    user_code_failure_retry_delay: 5
sensors:
  use_threads: true
  num_workers: 4
concurrency:
  runs:
    tag_concurrency_limits:
      - key: cq/name
        value:
          applyLimitPerUniqueValue: true
        limit: 1
      - key: cq/batch
        value: "true"
        limit: 2
run_launcher:
  module: dagster_defs.launcher
  class: CQRunLauncher
run_monitoring:
  enabled: true
  poll_interval_seconds: 30
freshness:
  enabled: true
telemetry:
  enabled: false
"""


# `cq dev`'s storage: Dagster's SQLite files, the event log's connections kept for reuse (an event
# 2.3 ms instead of 7.7; a thousand definitions' materializations and planned events are written in a
# fraction of the time). The Deployment's dagster.yaml names PostgreSQL instead.
DEV_EVENT_LOG_YAML = """\
event_log_storage:
  module: dagster_defs.event_log
  class: PooledSqliteEventLogStorage
  config:
    base_dir: {base_dir}
"""


def write_dagster_home(path: str | Path) -> Path:
    """Create ``DAGSTER_HOME`` with the run-queue limits the timeout policies rely on."""
    home = Path(path).resolve()
    home.mkdir(parents=True, exist_ok=True)
    base_dir = json.dumps(str(home / "history" / "runs") + os.sep)  # JSON strings are YAML
    (home / "dagster.yaml").write_text(DAGSTER_YAML + DEV_EVENT_LOG_YAML.format(base_dir=base_dir))
    _create_dagster_storage(home)
    return home


def _create_dagster_storage(home: Path) -> None:
    """Create the instance's SQLite databases once, before ``dagster dev`` starts its webserver and
    daemon: the two would create them at the same moment and may both stamp the schema, leaving a
    database that neither opens ("alembic_version has more than one head present")."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.get_runs(limit=1)
        instance.all_instigator_state()
        instance.event_log_storage.get_asset_records()


def dagster_env(settings: Settings, dagster_home: Path, *, spark_server: bool = True) -> dict[str, str]:
    env = dict(os.environ)
    if not spark_server and not settings.spark_remote:
        # --no-spark-server: in-process sessions are the choice, not a fallback to warn about.
        env.setdefault("CQ_SPARK_MASTER", settings.spark_master or "local[*]")
    env.update(
        {
            "DAGSTER_HOME": str(dagster_home),
            "CQ_SQL_DIR": str(Path(settings.sql_dir).resolve()),
            "CQ_WAREHOUSE": settings.warehouse
            if "://" in settings.warehouse
            else str(Path(settings.warehouse).resolve()),
            "CQ_HOME": str(Path(settings.home).resolve()),
            "CQ_TIMEZONE": settings.timezone,
            "CQ_MIN_EVERY": settings.min_every,
            "CQ_SPARK_PORT": str(settings.spark_port),
            "CQ_STORAGE": settings.storage,
            "CQ_SPARK_WRITE_BYTES": str(settings.spark_write_bytes),
        }
    )
    return env


def feed_forever(
    engine: Engine,
    *,
    every: float,
    stop: threading.Event,
    table: str = "sensors",
    start: datetime | None = None,
    reading_every: timedelta = timedelta(seconds=5),
    label: str = "cq dev feed",
    on_batch: Callable[[], None] | None = None,
) -> None:
    """Every ``every`` seconds (on the clock's multiples of it), append to ``table`` the simulated
    readings (one per device per ``reading_every``) since the last batch (or ``start``) up to now, the
    reading of the current grid point included, until ``stop`` is set. So each reading is committed
    within ``every`` of its own time, before a firing whose range it falls in ends (a batch at
    ``k * every``: a firing at a minute's end finds that minute's last reading)."""
    start = start or floor_time(datetime.now(UTC), reading_every)
    while not stop.wait(_until_next(every)):
        end = floor_time(datetime.now(UTC), reading_every) + reading_every
        if end > start:
            rows = FEEDS[table](start=start, end=end, every=reading_every)
            ingest(table=table, data=rows, engine=engine, label=label)  # through BEFORE INSERT triggers
            start = end
            if on_batch:
                on_batch()


def _until_next(every: float) -> float:
    """Seconds to the clock's next multiple of ``every`` (a few ms past it, so the grid point is in)."""
    return every - time.time() % every + 0.005


def seed_start(
    engine: Engine, table: str, *, now: datetime, backfill: timedelta, every: timedelta = timedelta(seconds=5)
) -> datetime:
    """Where the feed of ``table`` resumes: right after the newest reading already there (so a
    restart never writes the same readings twice), at most ``backfill`` before ``now``."""
    _, newest, _ = engine.storage.table_span(table, version=None, time_column=engine.time_column(table))
    start = now - backfill
    if newest is not None:  # statistics are truncated to ms: the feed's grid is coarser
        start = max(start, floor_time(newest, every) + every)
    return start


def check_ports(settings: Settings, *, port: int, spark_server: bool) -> Settings:
    """Before anything is created: the Dagster UI port must be free; the Spark Connect port too,
    unless our server already runs on it. A taken *default* Spark port is replaced by a free one
    (recorded in CQ_HOME when the server starts, where later commands find it)."""
    from cq_engine import spark

    if spark.port_taken(port):
        raise CQError(f"port {port} (the Dagster UI) is already in use by another process; use --port")
    if not spark_server or settings.spark_remote or spark.server_status(settings).running:
        return settings
    if spark.port_taken(settings.spark_port):
        if settings.spark_port != DEFAULT_SPARK_PORT:
            raise CQError(f"port {settings.spark_port} (CQ_SPARK_PORT) is already in use by another process")
        free = _free_port()
        print(f"cq dev: port {DEFAULT_SPARK_PORT} is taken; the Spark Connect server uses port {free}")
        settings = replace(settings, spark_port=free)
    return settings


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_dev(
    settings: Settings,
    *,
    port: int = 3000,
    feed_every: float = 5.0,
    spark_server: bool = True,
    backfill: timedelta = timedelta(minutes=10),
    drain_timeout: float = 120,
    verbose: bool = False,
) -> int:
    from cq_engine import spark

    # Explicit handlers, set first: a process started from a script may inherit an ignored SIGINT.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    dagster_home = Path(os.environ.get("DAGSTER_HOME") or Path(settings.home) / "dagster")
    refuse_beside_running(settings.home, dagster_home)
    settings = check_ports(settings, port=port, spark_server=spark_server)
    start_guard(settings.home)  # from here, every process started dies with this one (its pipe's end is ours)
    proc: subprocess.Popen | None = None
    # Only our own server is supervised (not a CQ_SPARK_REMOTE one, which `cq dev` does not start).
    supervisor = ServerSupervisor(settings, say=_say) if spark_server and not settings.spark_remote else None
    try:
        engine = Engine(settings=settings)
        for err in engine.catalog.errors:
            print(f"cq dev: {describe(err)}", file=sys.stderr)
        created = engine.ensure_tables()
        fed = [t.name for t in engine.catalog.tables if t.name in FEEDS]
        now = floor_time(datetime.now(UTC), timedelta(seconds=5))
        starts = {}
        for table in fed:
            starts[table] = seed_start(engine, table, now=now, backfill=backfill)
            if starts[table] < now:
                ingest(table=table, data=FEEDS[table](start=starts[table], end=now), engine=engine, label="cq dev")
            print(
                f"cq dev: {table} fed from {iso(starts[table])} (at most the last {backfill}); a new batch every "
                f"{feed_every:g}s"
            )
            starts[table] = max(starts[table], now)
        if created:
            print(f"cq dev: created {', '.join(created)}")
        if spark_server:
            print(spark.start_server(settings).describe())
            agent.start(settings.home)  # `cq` commands in another terminal run warm
        dagster_home = write_dagster_home(dagster_home)
        log_path = dagster_home / "dev.log"
        # `dagster dev` warns at every start that it is superseded by `dg dev` (not a user's concern).
        quiet = ["-W", "ignore:Function `dev_command` is superseded"]
        cmd = [
            sys.executable,
            *quiet,
            "-m",
            "dagster",
            "dev",
            "-w",
            "workspace.yaml",
            "-p",
            str(port),
            "-h",
            "127.0.0.1",
        ]
        proc = subprocess.Popen(
            cmd,
            env=dagster_env(settings, dagster_home, spark_server=spark_server),
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        echo = threading.Event()
        echo.set()
        pump = threading.Thread(target=_pump, args=(proc, log_path, echo, verbose), daemon=True)
        pump.start()
        print(
            f"cq dev: Dagster UI on http://localhost:{port} (DAGSTER_HOME={dagster_home}, log {log_path}"
            f"{'' if verbose else LOG_NOTE}); Ctrl-C stops everything"
        )
        if supervisor is not None:
            supervisor.start()
        watch = SqlWatch(settings, say=lambda line: _say(line, log=log_path))
        watch.start()
    except KeyboardInterrupt:  # Ctrl-C while starting: undo what was started, quietly
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if supervisor is not None:
            supervisor.stop()
        if proc is not None:
            stop_process_group(proc)
        if spark_server and spark.stop_server(settings):
            print("cq dev: Spark Connect server stopped")
        print("cq dev: interrupted while starting; stopped")
        return 130
    stop = threading.Event()
    for table in fed:
        threading.Thread(
            target=feed_forever,
            args=(engine,),
            kwargs={"every": feed_every, "stop": stop, "table": table, "start": starts[table]},
            daemon=True,
        ).start()
    code = 0
    try:
        while proc.poll() is None:
            time.sleep(0.5)
        echo.clear()
        pump.join(5)
        died = _who_died(log_path)
        print(
            f"cq dev: Dagster exited unexpectedly (code {proc.returncode}){': ' + died if died else ''}; "
            f"stopping the rest (see {log_path})",
            file=sys.stderr,
        )
        code = 1
    except KeyboardInterrupt:
        pass
    # Quiet from here on: Dagster's output goes to its log only, and a second Ctrl-C must not
    # interrupt the shutdown with a traceback.
    echo.clear()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    watch.stop()
    if proc.poll() is None:
        daemon = freeze_daemon(proc, dagster_home)  # first: no sensor tick, nothing leaves the run queue
        drain_runs(dagster_home, timeout=drain_timeout, ui=f"127.0.0.1:{port}")
        kill_frozen(daemon)
        stop_process_group(proc)
        print("cq dev: Dagster webserver and daemon stopped")
    kill_dagster_leftovers(dagster_home)  # a run worker outside the group must not commit after the feed
    # The feed stops last: every firing committed meanwhile read the readings of its range.
    stop.set()
    if fed:
        print(f"cq dev: feed stopped ({', '.join(fed)})")
    pump.join(5)
    if supervisor is not None:
        supervisor.stop()  # no restart of the server we are about to stop
    if spark_server:
        agent.stop(settings.home)
        spark.stop_server(settings)
        print("cq dev: Spark Connect server stopped")
    print(f"cq dev: stopped at {iso(datetime.now(UTC))}")
    return code


def _say(line: str, *, log: Path | None = None) -> None:
    """A line of ours in the terminal, and in Dagster's log beside what it says."""
    print(line, flush=True)
    if log is not None:
        with open(log, "a", encoding="utf-8") as f:
            f.write(line + "\n")


LOG_NOTE = ": all of Dagster's output; here only its warnings and errors (--verbose: all)"
_ANSI = re.compile(rb"\x1b\[[0-9;]*m")
_ROUTINE = re.compile(rb" - (?:DEBUG|INFO) - ")  # Dagster's log format: "<time> - <logger> - <LEVEL> - ..."


def shown(line: bytes, *, verbose: bool) -> bool:
    """Whether a line of Dagster's output is echoed to the terminal: its warnings, errors and anything
    not in its log format (a traceback's lines); everything with ``verbose``. The log keeps all."""
    return verbose or not _ROUTINE.search(_ANSI.sub(b"", line))


def _pump(proc: subprocess.Popen, log_path: Path, echo: threading.Event, verbose: bool = False) -> None:
    """Copy Dagster's output to its log file, and what ``shown`` lets through to our stdout while
    ``echo`` is set."""
    assert proc.stdout is not None  # started with stdout=PIPE
    with open(log_path, "ab") as log:
        for line in iter(proc.stdout.readline, b""):
            log.write(line)
            log.flush()
            if echo.is_set() and shown(line, verbose=verbose):
                sys.stdout.buffer.write(line)
                sys.stdout.flush()


def _who_died(log_path: Path) -> str | None:
    """The line where ``dagster dev`` says which of its processes ended."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()[-200:]
    except OSError:
        return None
    found = [line for line in lines if "shut down unexpectedly" in line]
    return found[-1].split(" - ")[-1].strip() if found else None
