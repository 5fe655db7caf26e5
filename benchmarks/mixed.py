"""``mixed``: N continuous queries every 30 s **and** N default-option streams under one daemon, as ``cq dev``.

The definitions of ``orchestration`` (``q000``...: max/count per 10 s and device over ``sensors``) and of
``stream_scale`` (``s000``...: INTERVAL/SESSION/STATE/EVENT/COUNT streams over ``meters`` and an eKuiper
rule) share one code location, daemon and Spark Connect server; their feeds commit every 5 s. After a
warm-up it watches a window of several minutes and checks both targets at once: >= 95% of the CQs' due
firings done with worst lag <= 60 s, and >= 95% of the streams' windows closed >= 30 s before the end
in their sinks with worst lag <= 30 s. The ratio is the worse of the two shares' (1 - share) / 0.05,
above 1 when a lag target is missed. ``CQ_BENCH_MIXED_N`` (default 100) and ``CQ_BENCH_MIXED_SECONDS``
(default 300) size it.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime, timedelta

from . import Context, Outcome, orchestration, stream_scale, verdict

NAME = "mixed"
SUBPROCESS = True


def run(ctx: Context) -> Outcome:
    import dagster as dg

    from cq_engine.cli.feed import demo_rows, floor_time, meter_rows, sensor_rows

    from .daemon import Daemon, daemon_engine, load_text, observe

    n = 10 if ctx.quick else int(os.environ.get("CQ_BENCH_MIXED_N", "100"))
    window = 120 if ctx.quick else int(os.environ.get("CQ_BENCH_MIXED_SECONDS", "300"))
    files = {"cq.sql": orchestration.definitions_sql(n), "streams.sql": stream_scale.definitions_sql(n)}
    settings, engine = daemon_engine(ctx, NAME, files)
    work = ctx.workdir(NAME)
    step = stream_scale.FEED
    now = floor_time(datetime.now(UTC), step)
    engine.storage.append("sensors", sensor_rows(start=now - timedelta(minutes=10), end=now))
    engine.storage.append("meters", meter_rows(start=now - timedelta(minutes=2), end=now + step, every=step))
    engine.storage.append("demo", demo_rows(start=now - timedelta(minutes=2), end=now + step, every=step))
    commits: list[tuple[float, datetime]] = []
    stop = threading.Event()
    feeder = threading.Thread(
        target=stream_scale.feed, args=(engine, stop, now, commits), kwargs={"sensors": True}, daemon=True
    )
    daemon = Daemon(root=work, settings=settings)
    streams = [f"s{i:03d}" for i in range(n)]
    try:
        daemon.start()
        feeder.start()
        ctx.log(f"{n} CQs and {n} streams; waiting for a committed firing and window")
        deadline = time.monotonic() + 600
        while {e.kind for e in engine.ledger.entries() if e.status == "succeeded"} < {"firing", "realtime"}:
            daemon._check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"no firing and window committed within 600 s\n{daemon.log_tail('daemon')}")
            time.sleep(5)
        w0, w1, loads, queued = observe(ctx, daemon, seconds=window)
        sinks = stream_scale.read_sinks(settings, streams)
        time.sleep(orchestration.EVERY + 5)  # CQ firings due in the window may finish up to EVERY after it
        entries = engine.ledger.entries()
        runs = daemon.instance().get_run_records(dg.RunsFilter(created_after=w0, created_before=w1))
    finally:
        stop.set()
        daemon.stop()
    cq_share, _, cq_due, cq_worst, failed = orchestration.score(entries, n=n, w0=w0, w1=w1)
    in_time = [e for e in entries if e.status == "succeeded" and e.finished_at <= w1]
    st_share, st_due, latencies, st_worst = stream_scale.score(
        names=streams, sinks=sinks, entries=in_time, commits=commits, w0=w0, w1=w1
    )
    p50, p95 = stream_scale.percentiles(latencies)
    ratio = max((1 - cq_share) / 0.05, (1 - st_share) / 0.05, 0.0)
    notes = []
    if cq_worst > orchestration.LAG_TARGET:
        notes.append(f"CQ worst lag {cq_worst:.0f}s MISSED the {orchestration.LAG_TARGET:.0f}s target")
    if st_worst > stream_scale.LAG_TARGET:
        notes.append(f"stream worst lag {st_worst:.0f}s MISSED the {stream_scale.LAG_TARGET:.0f}s target")
    if notes:
        ratio = max(ratio, 1.01)
    load = load_text(loads)
    line = (
        f"{NAME}: {n} CQs every {orchestration.EVERY}s + {n} streams, {(w1 - w0).total_seconds() / 60:.1f} min: "
        f"CQs {cq_share:.1%} of {cq_due} due firings, worst lag {cq_worst:.0f}s (target <= 60s), {failed} failed; "
        f"streams {st_share:.1%} of {st_due} windows, freshness p50 {p50:.1f}s p95 {p95:.1f}s, worst lag "
        f"{st_worst:.0f}s (target <= 30s); {len(runs)} runs created, at most {max(queued, default=0)} queued at once; {load}; {verdict(ratio, 1.0)}"
    )
    return Outcome(NAME, line, ratio=ratio, target=1.0, notes=notes)
