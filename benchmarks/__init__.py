"""cq-engine benchmarks: ``python -m benchmarks [--quick] [--only NAME]`` (see benchmarks/README.md).

Each benchmark is a module with ``NAME`` and ``run(ctx) -> Outcome``. Every measurement is compared
with a baseline measured in the same run on the same machine, so the ratios mean something even on a
noisy shared box; times are medians of several repetitions taken after a warm-up.
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# All benchmark data starts here (a fixed instant, so runs are reproducible).
T0 = datetime(2024, 3, 1, tzinfo=UTC)

PER_MINUTE_SQL = """
CREATE TABLE IF NOT EXISTS sensors (ts TIMESTAMP, device STRING, temperature DOUBLE, humidity DOUBLE);
CREATE CQ per_minute RESAMPLE EVERY 1m BEGIN
  SELECT max_value(temperature) AS tmax, avg(humidity) AS h, count(temperature) AS n
  INTO out FROM sensors GROUP BY (1m), device
END;
"""

# The meters super table and a 1-minute interval stream over it (the stream benchmarks).
STREAM_SQL = """
CREATE TABLE meters (ts TIMESTAMP, current DOUBLE, voltage INT, status INT) TAGS (location STRING);
CREATE STREAM s INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname OPTIONS(WATERMARK(10s))
  INTO s_out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;
"""


# The storage the benchmarks' engines use (``--storage``, ``--spark-write-bytes``; the engine's defaults).
STORAGE: dict = {"kind": "spark", "write_bytes": None}


@dataclass
class Outcome:
    """One benchmark's result: its printed line, and the ratio checked against its target (if any)."""

    name: str
    line: str
    ratio: float | None = None
    target: float | None = None  # the ratio must be <= target
    notes: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.ratio is None:
            return "ERROR"
        if self.target is None:
            return "INFO"
        return "OK" if self.ratio <= self.target else "MISSED"


def verdict(ratio: float, target: float | None) -> str:
    if target is None:
        return f"ratio {ratio:.2f} (no target)"
    return f"ratio {ratio:.2f} (target <= {target:.2f}) {'OK' if ratio <= target else 'MISSED'}"


class Context:
    """What every benchmark gets: the size (quick or full), a temp root, one shared in-process Spark."""

    def __init__(self, *, quick: bool, root: Path, verbose: bool = False):
        self.quick = quick
        self.root = root
        self.verbose = verbose
        self._spark = None

    def workdir(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def spark(self):
        """One classic in-process session (``local[*]``) shared by the in-process benchmarks."""
        if self._spark is None:
            from pyspark.sql import SparkSession

            from cq_engine.config import Settings
            from cq_engine.spark import engine_conf

            # cq_engine.spark.local_session's configuration (Delta's jars included), minus the progress bars.
            builder = SparkSession.builder.master("local[*]").appName("cq-engine-bench")
            conf = engine_conf(Settings(storage=STORAGE["kind"]))
            for key, value in {**conf, "spark.ui.showConsoleProgress": "false"}.items():
                builder = builder.config(key, value)
            self._spark = builder.getOrCreate()
            self._spark.sparkContext.setLogLevel("ERROR")
        return self._spark

    def stop_spark(self) -> None:
        """Free the in-process JVM (so it does not compete with the subprocess benchmarks)."""
        if self._spark is not None:
            self._spark.stop()
            self._spark = None

    def log(self, message: str) -> None:
        if self.verbose:
            print(f"  [{time.strftime('%H:%M:%S')}] {message}", flush=True)


def make_engine(workdir: Path, sql: str, spark, **settings):
    """An Engine over ``workdir`` (sql/, wh/, .cq/) with one definition file holding ``sql``."""
    from cq_engine.config import Settings
    from cq_engine.engine import Engine

    (workdir / "sql").mkdir(parents=True, exist_ok=True)
    (workdir / "sql" / "defs.sql").write_text(sql)
    settings.setdefault("storage", STORAGE["kind"])
    if STORAGE["write_bytes"] is not None:
        settings.setdefault("spark_write_bytes", STORAGE["write_bytes"])
    s = Settings(sql_dir=str(workdir / "sql"), warehouse=str(workdir / "wh"), home=str(workdir / ".cq"), **settings)
    engine = Engine(settings=s, spark_session=spark)
    if engine.catalog.errors:
        raise RuntimeError(f"benchmark definitions do not parse: {engine.catalog.errors}")
    engine.ensure_tables()
    return engine


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    clock = time.perf_counter()
    result = fn()
    return time.perf_counter() - clock, result


def measure(
    cases: dict[str, Callable[[], object]], *, repeat: int, warmup: int = 1
) -> tuple[dict[str, float], dict[str, list[float]], dict[str, object]]:
    """Median wall time of each case over ``repeat`` runs after ``warmup`` runs. Cases are
    interleaved (a, b, a, b, ...) so a slow spell of the shared machine hits all of them alike.
    Returns (median per case, all samples per case, last result per case)."""
    samples: dict[str, list[float]] = {k: [] for k in cases}
    last: dict[str, object] = {}
    for i in range(warmup + repeat):
        for key, fn in cases.items():
            seconds, last[key] = timed(fn)
            if i >= warmup:
                samples[key].append(seconds)
    return {k: statistics.median(v) for k, v in samples.items()}, samples, last


def spread(samples: list[float]) -> str:
    """The range of the samples (noise indicator)."""
    if len(samples) == 1:
        return f"{samples[0]:.3f}s"
    return f"{min(samples):.3f}-{max(samples):.3f}s"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def on_connect_server(ctx: Context, name: str, measure: Callable[[Path, Any], Outcome]) -> Outcome:
    """``measure(workdir, spark)`` as a client of a Spark Connect server started for benchmark ``name``
    (how the batch run and the stream sensor run their work), stopped afterwards."""
    from pyspark.sql import SparkSession

    from cq_engine.config import Settings
    from cq_engine.spark import client_url, start_server, stop_server

    work = ctx.workdir(name)
    server = Settings(home=str(work / ".cq"), warehouse=str(work / "wh"), spark_port=free_port())
    start_server(server)
    try:
        return measure(work, SparkSession.builder.remote(client_url(server)).getOrCreate())
    finally:
        stop_server(server)


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def clean_env() -> dict[str, str]:
    """The current environment without any CQ_* or Spark Connect client settings."""
    drop = ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "SPARK_API_MODE")
    return {k: v for k, v in os.environ.items() if not k.startswith("CQ_") and k not in drop}


def fresh_sink(engine, table: str) -> None:
    """Drop ``table`` before a repetition: with the Spark storage, Delta skips a rerun on the same source
    version (idempotent writes), which would time nothing; the hand-written side overwrites a whole table."""
    if "://" not in engine.storage.uri(table):
        remove_tree(Path(engine.storage.uri(table)))


def same_rows(engine_uri: str, hand_uri: str, *, exact: list[str], rounded: list[str]) -> int:
    """Both Delta tables hold the same rows (``rounded`` columns to 6 places); their count. Raises if
    they differ or are empty."""
    from deltalake import DeltaTable

    def rows(uri):
        t = DeltaTable(uri).to_pyarrow_table(columns=[*exact, *rounded])
        return sorted(
            (*[r[c] for c in exact], *[None if r[c] is None else round(r[c], 6) for c in rounded])
            for r in t.to_pylist()
        )

    a, b = rows(engine_uri), rows(hand_uri)
    if a != b or not a:
        raise RuntimeError(f"the stream run and the hand-written job wrote different rows ({len(a)} vs {len(b)})")
    return len(a)
