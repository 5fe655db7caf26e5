"""``stream_scale``: N default-option window-triggered streams under the real daemon, as ``cq dev``.

The daemon, a code server and a Spark Connect server run as in ``cq dev`` (benchmarks.daemon, its
``dagster.yaml``); a thread appends meter readings (every 5 s, one per meter) to ``meters`` and the
eKuiper ``demo`` table every 5 s. The streams cycle through INTERVAL(10s) SLIDING(10s) (half of
them), SESSION, STATE_WINDOW, EVENT_WINDOW, COUNT_WINDOW and an eKuiper TUMBLINGWINDOW rule, all with
default options. After a warm-up it watches a window of several minutes and reports:

- the share of the time windows (INTERVAL streams: rows in their sinks; rules: the ledger) that closed
  at least 30 s before the window's end and are in the sinks by its end (target >= 95%);
- freshness of the INTERVAL streams' windows: the commit that closes a window -> its ledger commit,
  p50 / p95 (target p95 <= 15 s at N = 100);
- the worst lag of any time-window stream (each second: now minus the newest range end committed,
  target <= 30 s), the runs Dagster created, and the load average.

The ratio checked is (1 - share) / 0.05 (<= 1: at least 95%), a missed lag target counts as a miss.
``CQ_BENCH_STREAMS_N`` (default 100) and ``CQ_BENCH_STREAMS_SECONDS`` (default 300) size it.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from datetime import UTC, datetime, timedelta

from . import Context, Outcome, verdict
from .orchestration import worst_lag

NAME = "stream_scale"
SUBPROCESS = True
FEED = timedelta(seconds=5)
WIDTH = timedelta(seconds=10)
DONE_BEFORE = timedelta(seconds=30)
LAG_TARGET = 30.0
KINDS = (
    *["interval"] * 5,
    "session",
    "state",
    "event",
    "count",
    "rule",
)
HEAD = """CREATE TABLE IF NOT EXISTS meters (ts TIMESTAMP, current FLOAT, voltage INT, phase FLOAT, status INT)
  TAGS (location VARCHAR(64), groupid INT);
CREATE STREAM demo (ID STRING, temperature DOUBLE, revenue DOUBLE, ts BIGINT)
  WITH (DATASOURCE="demo", FORMAT="json", KEY="ts", TIMESTAMP="ts");
"""
TRIGGERS = {
    "interval": "INTERVAL(10s) SLIDING(10s)",
    "session": "SESSION(ts, 3s)",
    "state": "STATE_WINDOW(status)",
    "event": "EVENT_WINDOW(START WITH current > 11 END WITH current < 10)",
    "count": "COUNT_WINDOW(10)",
}


def kind_of(i: int) -> str:
    return KINDS[i % len(KINDS)]


def definitions_sql(n: int) -> str:
    lines = [HEAD]
    for i in range(n):
        name, kind = f"s{i:03d}", kind_of(i)
        if kind == "rule":
            lines.append(
                f"CREATE RULE {name} INTO {name}_out AS SELECT count(*) AS n, avg(temperature) AS c "
                "FROM demo GROUP BY ID, TUMBLINGWINDOW(ss, 10);\n"
            )
        else:
            lines.append(
                f"CREATE STREAM {name} {TRIGGERS[kind]} FROM meters PARTITION BY tbname INTO {name}_out AS "
                "SELECT _twstart, avg(current) AS c, count(*) AS n FROM %%trows;\n"
            )
    return "".join(lines)


def feed(
    engine, stop: threading.Event, start: datetime, commits: list[tuple[float, datetime]], *, sensors: bool = False
) -> None:
    """Every 5 s the readings since the last commit; ``commits`` gets (wall time, newest event time).
    ``sensors``: ``orchestration``'s table too (``mixed``)."""
    from cq_engine.cli.feed import demo_rows, floor_time, meter_rows, sensor_rows

    while not stop.wait(FEED.total_seconds()):
        end = floor_time(datetime.now(UTC), FEED)
        if end <= start:
            continue
        if sensors:
            engine.storage.append("sensors", sensor_rows(start=start, end=end, every=FEED))
        # [start, end] inclusive of `end`: the reading at `end` closes the window before it.
        engine.storage.append("meters", meter_rows(start=start + FEED, end=end + FEED, every=FEED))
        engine.storage.append("demo", demo_rows(start=start + FEED, end=end + FEED, every=FEED))
        commits.append((time.time(), end))
        start = end


def run(ctx: Context) -> Outcome:
    import dagster as dg

    from cq_engine.cli.feed import demo_rows, floor_time, meter_rows

    from .daemon import Daemon, daemon_engine, load_text, observe

    n = 10 if ctx.quick else int(os.environ.get("CQ_BENCH_STREAMS_N", "100"))
    window = 120 if ctx.quick else int(os.environ.get("CQ_BENCH_STREAMS_SECONDS", "300"))
    settings, engine = daemon_engine(ctx, NAME, {"streams.sql": definitions_sql(n)})
    work = ctx.workdir(NAME)
    now = floor_time(datetime.now(UTC), FEED)
    engine.storage.append("meters", meter_rows(start=now - timedelta(minutes=2), end=now + FEED, every=FEED))
    engine.storage.append("demo", demo_rows(start=now - timedelta(minutes=2), end=now + FEED, every=FEED))
    commits: list[tuple[float, datetime]] = []
    stop = threading.Event()
    feeder = threading.Thread(target=feed, args=(engine, stop, now, commits), daemon=True)
    daemon = Daemon(root=work, settings=settings)
    names = [f"s{i:03d}" for i in range(n)]
    try:
        daemon.start()
        feeder.start()
        ctx.log(f"{n} streams; waiting for the first committed window")
        deadline = time.monotonic() + 600
        while not [e for e in engine.ledger.entries() if e.status == "succeeded" and e.kind == "realtime"]:
            daemon._check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"no stream window committed within 600 s\n{daemon.log_tail('daemon')}")
            time.sleep(5)
        w0, w1, loads, queued = observe(ctx, daemon, seconds=window)
        sinks = read_sinks(settings, names)
        entries = [e for e in engine.ledger.entries() if e.status == "succeeded" and e.finished_at <= w1]
        runs = daemon.instance().get_run_records(dg.RunsFilter(created_after=w0, created_before=w1))
    finally:
        stop.set()
        daemon.stop()
    share, due, latencies, worst = score(names=names, sinks=sinks, entries=entries, commits=commits, w0=w0, w1=w1)
    p50, p95 = percentiles(latencies)
    load = load_text(loads)
    ratio = (1 - share) / 0.05 if share < 1 else 0.0
    line = (
        f"{NAME}: {n} default-option streams (interval/session/state/event/count/eKuiper rule), "
        f"{(w1 - w0).total_seconds() / 60:.1f} min: {share:.1%} of {due} windows closed >= 30 s before the end in "
        f"the sinks (target >= 95%); freshness commit->row p50 {p50:.1f}s p95 {p95:.1f}s "
        f"({len(latencies)} windows); worst lag {worst:.0f}s (target <= {LAG_TARGET:.0f}s); "
        f"{len(runs)} runs created, at most {max(queued, default=0)} queued at once; {load}; {verdict(ratio, 1.0)}"
    )
    notes = [] if worst <= LAG_TARGET else [f"worst lag {worst:.0f}s MISSED the {LAG_TARGET:.0f}s target"]
    return Outcome(NAME, line, ratio=ratio if worst <= LAG_TARGET else max(ratio, 1.01), target=1.0, notes=notes)


def _meters():
    from cq_engine.cli.feed import METERS

    return METERS


def _ceil(t: datetime, step: timedelta) -> datetime:
    seconds = step.total_seconds()
    return datetime.fromtimestamp(-(-t.timestamp() // seconds) * seconds, UTC)


def _covered(entries, lo: datetime, hi: datetime):
    """The first committed entry whose range covers ``[lo, hi)``."""
    found = [e for e in entries if e.range_start <= lo and e.range_end >= hi]
    return min(found, key=lambda e: e.finished_at) if found else None


def read_sinks(settings, names: list[str]) -> dict[str, set]:
    """(tbname, _twstart) of every INTERVAL stream's sink."""
    import pyarrow as pa
    from deltalake import DeltaTable

    sinks = {}
    for i, name in enumerate(names):
        uri = settings.table_uri(f"{name}_out")
        if kind_of(i) == "interval" and DeltaTable.is_deltatable(uri):
            data = pa.table(DeltaTable(uri).scan(columns=["tbname", "_twstart"])).to_pylist()
            sinks[name] = {(r["tbname"], r["_twstart"]) for r in data}
    return sinks


def score(*, names, sinks, entries, commits, w0: datetime, w1: datetime) -> tuple[float, int, list[float], float]:
    """(share of the due windows in the sinks, windows due, freshness latencies sorted, worst lag)."""
    meters = sorted({m[0] for m in _meters()})
    first = _ceil(w0, WIDTH)
    starts = []
    t = first
    while t + WIDTH <= w1 - DONE_BEFORE:
        starts.append(t)
        t += WIDTH
    by_stream: dict[str, list] = {}
    for e in entries:
        by_stream.setdefault(e.definition, []).append(e)
    due = present = 0
    latencies: list[float] = []
    for i, name in enumerate(names):
        kind = kind_of(i)
        if kind == "interval":
            got = sinks.get(name, set())
            keys = [(m, s) for m in meters for s in starts]
            due += len(keys)
            present += sum(1 for k in keys if k in got)
        elif kind == "rule":
            due += len(starts)
            present += sum(1 for s in starts if _covered(by_stream.get(name, []), s, s + WIDTH))
        if kind == "interval":
            for s in starts:
                done = _covered(by_stream.get(name, []), s, s + WIDTH)
                closing = next((c for c in commits if c[1] >= s + WIDTH), None)
                if done is not None and closing is not None:
                    latencies.append(done.finished_at.timestamp() - closing[0])
    share = present / due if due else 0.0
    latencies.sort()
    timed = [s for i, s in enumerate(names) if kind_of(i) in ("interval", "rule")]
    return share, due, latencies, worst_lag(entries, names=timed, start=w0, end=w1)


def percentiles(latencies: list[float]) -> tuple[float, float]:
    """p50 and p95 of sorted ``latencies`` (inf when empty)."""
    if not latencies:
        return float("inf"), float("inf")
    return statistics.median(latencies), latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))]
