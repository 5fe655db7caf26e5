"""``batch_firings``: the firings of one batch run, executed together vs one by one (same session).

Through a Spark Connect server started for it (the path of a batch run under ``cq dev``).

100 continuous queries (``orchestration``'s definitions: 10-second windows of max and count per
device, EVERY 30s) over the same source each fire once for the same 30-second range. The batch run's
path (``resample.fused.run_firings``: one Spark job for all, then one commit and one ledger entry per
firing) is timed against running the same firings one after another with ``Engine.run_firing`` (the
path of the one-run-per-firing model, minus its process start). The sinks are checked equal. The
ratio is fused / one-by-one; the per-firing cost of each is printed beside it: what the batch model
pays per firing bounds how many definitions one machine can serve.
"""

from __future__ import annotations

from datetime import timedelta

from . import T0, Context, Outcome, make_engine, timed, verdict
from .orchestration import definitions_sql

NAME = "batch_firings"
SUBPROCESS = True  # the runner stops its classic session: this one is a Connect client
TARGET = 0.25  # fused must be at least 4x cheaper per firing than one by one


def run(ctx: Context) -> Outcome:
    from . import on_connect_server

    n = 20 if ctx.quick else 100
    rounds = 2 if ctx.quick else 3
    return on_connect_server(ctx, NAME, lambda work, spark: _measure(ctx, work, spark, n=n, rounds=rounds))


def _measure(ctx: Context, work, spark, *, n: int, rounds: int) -> Outcome:
    from deltalake import DeltaTable

    from cq_engine.cli.feed import sensor_rows
    from cq_engine.resample.fused import FiringRequest, run_firings

    engine = make_engine(work, definitions_sql(n), spark)
    ctx.log("loading 30 minutes in 5-second commits (the feed of `cq dev`)")
    for s in range(0, 1800, 60):
        engine.storage.append(
            "sensors",
            sensor_rows(
                start=T0 + timedelta(seconds=s), end=T0 + timedelta(seconds=s + 60), every=timedelta(seconds=5)
            ),
        )
    cqs = [engine.continuous_query(f"q{i:03d}") for i in range(n)]

    def fire_at(k: int):
        return T0 + timedelta(minutes=10, seconds=30 * k)

    def one_by_one(k: int) -> None:
        for cq in cqs:
            engine.run_firing(cq.name, fire_at(k))

    def fused(k: int) -> None:
        outcomes = run_firings(engine.ctx, [FiringRequest(cq=cq, fire_time=fire_at(k)) for cq in cqs])
        failed = [o for o in outcomes if isinstance(o, Exception)]
        if failed:
            raise RuntimeError(f"{len(failed)} fused firing(s) failed: {failed[0]}")

    ctx.log("warm-up")
    one_by_one(0)
    fused(1)
    alone, together = [], []
    for r in range(rounds):
        ctx.log(f"round {r + 1}/{rounds}")
        alone.append(timed(lambda r=r: one_by_one(2 + 2 * r))[0])
        together.append(timed(lambda r=r: fused(3 + 2 * r))[0])
    # The same firing both ways gives the same sink rows: fused first (a batch run's firing is committed
    # once, so it could not follow), then one by one, which writes its cells over the fused ones.
    run_firings(engine.ctx, [FiringRequest(cq=cq, fire_time=fire_at(20)) for cq in cqs[:2]])
    expected = (
        DeltaTable(engine.storage.uri(cqs[0].sink))
        .to_pyarrow_table()
        .sort_by([("ts", "ascending"), ("device", "ascending")])
    )
    engine.run_firing(cqs[0].name, fire_at(20))
    got = (
        DeltaTable(engine.storage.uri(cqs[0].sink))
        .to_pyarrow_table()
        .sort_by([("ts", "ascending"), ("device", "ascending")])
    )
    if expected.num_rows == 0 or not got.equals(expected):
        raise RuntimeError("fused and one-by-one firings wrote different sink rows")
    a, t = sorted(alone)[len(alone) // 2], sorted(together)[len(together) // 2]
    ratio = t / a
    line = (
        f"{NAME}: {n} firings fused {t:.2f}s ({t / n * 1000:.0f} ms/firing) vs one by one {a:.2f}s "
        f"({a / n * 1000:.0f} ms/firing): {verdict(ratio, TARGET)}"
    )
    return Outcome(NAME, line, ratio=ratio, target=TARGET)
