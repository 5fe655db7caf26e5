"""``freshness``: commit-to-sink time of a WATERMARK(0s) INTERVAL stream under the real daemon.

Every 5 s the benchmark appends one commit of meter readings whose newest event time closes the
previous 5-second window, and polls the sinks until that window's row is there: the time from the
commit to the row, p50 and p95 over the windows of a few minutes. Two streams over the same table:
``fresh`` (default options: the shared ``cq_streams`` sensor computes its live windows through the
Spark Connect server) and ``fresh_ll`` (``LOW_LATENCY_CALC``, which now takes the same path). The
ratio checked is max(p50 / 5 s, p95 / 10 s) of ``fresh`` (targets: p50 <= 5 s, p95 <= 10 s);
``fresh_ll``'s figures are printed beside it.
"""

from __future__ import annotations

import os
import statistics
import time
from datetime import UTC, datetime, timedelta

from . import Context, Outcome, verdict

NAME = "freshness"
SUBPROCESS = True
WIDTH = 5  # seconds
SQL = """
CREATE TABLE meters (ts TIMESTAMP, current DOUBLE, voltage INT, status INT) TAGS (location STRING);
CREATE STREAM fresh INTERVAL(5s) SLIDING(5s) FROM meters PARTITION BY tbname OPTIONS(WATERMARK(0s))
  INTO fresh_out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;
CREATE STREAM fresh_ll INTERVAL(5s) SLIDING(5s) FROM meters PARTITION BY tbname
  OPTIONS(WATERMARK(0s) | LOW_LATENCY_CALC)
  INTO fresh_ll_out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;
"""
SINKS = ("fresh_out", "fresh_ll_out")


def rows(start: datetime, end: datetime):
    """One reading per meter per second in [start, end]: ``end`` itself closes the window before it."""
    import pyarrow as pa

    ts = [start + timedelta(seconds=k) for k in range(int((end - start).total_seconds()) + 1)]
    meters = ("m1", "m2")
    n = len(ts) * len(meters)
    return pa.table(
        {
            "ts": pa.array([t for t in ts for _ in meters], pa.timestamp("us", tz="UTC")),
            "current": pa.array([10.0 + (k % 7) for k in range(n)]),
            "voltage": pa.array([220] * n, pa.int32()),
            "status": pa.array([0] * n, pa.int32()),
            "tbname": [m for _ in ts for m in meters],
            "location": ["bench"] * n,
        }
    )


def run(ctx: Context) -> Outcome:
    import pyarrow as pa
    from deltalake import DeltaTable

    from cq_engine.config import Settings
    from cq_engine.engine import Engine

    from . import free_port
    from .daemon import Daemon

    windows = 8 if ctx.quick else 36
    work = ctx.workdir(NAME)
    (work / "sql").mkdir(exist_ok=True)
    (work / "sql" / "streams.sql").write_text(SQL)
    settings = Settings(
        sql_dir=str(work / "sql"), warehouse=str(work / "wh"), home=str(work / ".cq"), spark_port=free_port()
    )
    engine = Engine(settings=settings)
    engine.ensure_tables()
    daemon = Daemon(root=work, settings=settings)
    sinks = {name: settings.table_uri(name) for name in SINKS}
    latencies: dict[str, list[float]] = {name: [] for name in SINKS}
    waiting: dict[str, dict[datetime, float]] = {name: {} for name in SINKS}  # window start -> commit time

    def poll() -> None:
        for name, uri in sinks.items():
            if not waiting[name] or not DeltaTable.is_deltatable(uri):
                continue
            found = set(pa.table(DeltaTable(uri).scan(columns=["_twstart"])).column("_twstart").to_pylist())
            for w in [w for w in waiting[name] if w in found]:
                latencies[name].append(time.monotonic() - waiting[name].pop(w))

    try:
        daemon.start()
        # The sensor's first evaluation fixes its cursor on the empty table; rows after it are real time.
        time.sleep(30)
        t = datetime.now(UTC).replace(microsecond=0)
        t -= timedelta(seconds=t.second % WIDTH)
        engine.storage.append("meters", rows(t - timedelta(seconds=WIDTH), t))
        for k in range(windows + 2):
            start_next = t + timedelta(seconds=WIDTH * k)
            end_next = start_next + timedelta(seconds=WIDTH)
            next_commit = time.monotonic() + WIDTH
            engine.storage.append("meters", rows(start_next + timedelta(seconds=1), end_next))
            committed = time.monotonic()
            if k >= 2:  # the first windows pay the code server's warm-up
                for name in SINKS:
                    waiting[name][start_next] = committed
            while time.monotonic() < next_commit:
                poll()
                time.sleep(0.2)
        deadline = time.monotonic() + 180  # a loaded machine starts a run slowly
        while any(waiting.values()) and time.monotonic() < deadline:
            poll()
            time.sleep(0.2)
    finally:
        daemon.stop()

    def figures(name: str) -> tuple[float, float, str]:
        got = sorted(latencies[name])
        if len(got) < 3:
            return float("inf"), float("inf"), f"only {len(got)} windows reached the sink"
        p50 = statistics.median(got)
        p95 = got[min(len(got) - 1, round(0.95 * (len(got) - 1)))]
        return (
            p50,
            p95,
            (
                f"{len(got)} windows: p50 {p50:.1f}s, p95 {p95:.1f}s, max {got[-1]:.1f}s, "
                f"{len(waiting[name])} never arrived"
            ),
        )

    p50, p95, default = figures("fresh_out")
    if p50 == float("inf"):
        return Outcome(NAME, f"{NAME}: ERROR default stream: {default}")
    ratio = max(p50 / 5, p95 / 10)
    load = "load avg " + "/".join(f"{x:.1f}" for x in os.getloadavg())
    line = (
        f"{NAME}: commit-to-sink of a WATERMARK(0s) INTERVAL(5s) stream under the daemon (targets p50 <= 5s, "
        f"p95 <= 10s): default options {default}; LOW_LATENCY_CALC {figures('fresh_ll_out')[2]}; {load}; "
        f"{verdict(ratio, 1.0)}"
    )
    return Outcome(NAME, line, ratio=ratio, target=1.0)
