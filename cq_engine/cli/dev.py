"""``cq dev``: the whole stack on one machine: Spark Connect server, Dagster (webserver + daemon) with
a DAGSTER_HOME whose run queue serialises each definition, and a simulated sensor feed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Callable

from cq_engine.config import Settings
from cq_engine.cli.feed import FEEDS, floor_time
from cq_engine.ingest import ingest
from cq_engine.engine import Engine
from cq_engine.times import UTC, iso

DAGSTER_YAML = """\
# Written by `cq dev`. BLOCKED: one run at a time per definition (tag cq/name), later firings queue
# and run in order; DISCARD definitions skip in their schedule/sensor instead.
run_coordinator:
  module: dagster._core.run_coordinator
  class: QueuedRunCoordinator
concurrency:
  runs:
    tag_concurrency_limits:
      - key: cq/name
        value:
          applyLimitPerUniqueValue: true
        limit: 1
telemetry:
  enabled: false
"""


def write_dagster_home(path: str | Path) -> Path:
    """Create ``DAGSTER_HOME`` with the run-queue limits the timeout policies rely on."""
    home = Path(path).resolve()
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text(DAGSTER_YAML)
    return home


def dagster_env(settings: Settings, dagster_home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"DAGSTER_HOME": str(dagster_home), "CQ_SQL_DIR": str(Path(settings.sql_dir).resolve()),
                "CQ_WAREHOUSE": settings.warehouse if "://" in settings.warehouse else str(Path(settings.warehouse).resolve()),
                "CQ_HOME": str(Path(settings.home).resolve()), "CQ_TIMEZONE": settings.timezone,
                "CQ_MIN_EVERY": settings.min_every, "CQ_SPARK_PORT": str(settings.spark_port)})
    return env


def feed_forever(engine: Engine, *, every: float, stop: threading.Event, table: str = "sensors",
                 start: datetime | None = None, reading_every: timedelta = timedelta(seconds=5),
                 label: str = "cq dev feed", on_batch: Callable[[], None] | None = None) -> None:
    """Every ``every`` seconds, append to ``table`` the simulated readings (one per device per
    ``reading_every``) since the last batch (or ``start``), until ``stop`` is set."""
    start = start or floor_time(datetime.now(UTC), reading_every)
    while not stop.wait(every):
        end = floor_time(datetime.now(UTC), reading_every)
        if end > start:
            rows = FEEDS[table](start=start, end=end, every=reading_every)
            ingest(table=table, data=rows, engine=engine, label=label)  # through BEFORE INSERT triggers
            start = end
            if on_batch:
                on_batch()


def run_dev(settings: Settings, *, port: int = 3000, feed_every: float = 5.0, spark_server: bool = True,
            backfill: timedelta = timedelta(minutes=10)) -> int:
    from cq_engine import spark

    engine = Engine(settings=settings)
    for err in engine.catalog.errors:
        print(f"cq dev: {err}", file=sys.stderr)
    created = engine.ensure_tables()
    fed = [t.name for t in engine.catalog.tables if t.name in FEEDS]
    now = floor_time(datetime.now(UTC), timedelta(seconds=5))
    for table in fed:
        ingest(table=table, data=FEEDS[table](start=now - backfill, end=now), engine=engine, label="cq dev")
        print(f"cq dev: {table} holds the last {backfill} of readings; a new batch every {feed_every:g}s")
    if created:
        print(f"cq dev: created {', '.join(created)}")
    if spark_server:
        print(spark.start_server(settings).describe())
    dagster_home = write_dagster_home(os.environ.get("DAGSTER_HOME") or Path(settings.home) / "dagster")
    cmd = [sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml", "-p", str(port), "-h", "127.0.0.1"]
    proc = subprocess.Popen(cmd, env=dagster_env(settings, dagster_home), start_new_session=True)
    print(f"cq dev: Dagster UI on http://localhost:{port} (DAGSTER_HOME={dagster_home}); Ctrl-C stops everything")
    stop = threading.Event()
    for table in fed:
        threading.Thread(target=feed_forever, args=(engine,), kwargs={"every": feed_every, "stop": stop, "table": table,
                                                                      "start": now}, daemon=True).start()
    # Explicit handlers: a process started from a script may inherit an ignored SIGINT.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        while proc.poll() is None:
            time.sleep(0.5)
        return proc.returncode or 0
    except KeyboardInterrupt:
        return 0
    finally:
        stop.set()
        stop_process_group(proc)
        if spark_server:
            spark.stop_server(settings)
        print(f"cq dev: stopped at {iso(datetime.now(UTC))}")


def stop_process_group(proc: subprocess.Popen, *, first_signal: int = signal.SIGINT, timeout: float = 20) -> None:
    """Signal the whole process group (``dagster dev`` forwards SIGINT to webserver, daemon and runs),
    then SIGKILL whatever is left in it, run workers included."""
    for sig, wait in ((first_signal, timeout), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)
