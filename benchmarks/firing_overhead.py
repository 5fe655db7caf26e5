"""firing_overhead: one warm firing through the engine versus the same hand-written PySpark job on
the same warm session (target: engine / hand-written <= 1.1).

The continuous query

    CREATE CQ per_2h RESAMPLE EVERY 2h BEGIN
      SELECT max_value(temperature) AS tmax, avg(humidity) AS h, count(temperature) AS n
      INTO out FROM sensors GROUP BY (1m), device
    END

fires over two hours of 1-second readings of 3 devices (120 one-minute windows x 3 devices from
21,600 rows; the table holds 4 hours in 10-minute commits). ``Engine.run_firing`` (the timing check,
the pinned, file-skipping Delta read, the query, the sink's range replace, the ledger entry) is timed
against the job a data engineer would write on the same in-process session: read the table's parquet
files whose ``ts`` statistics overlap the range (Delta's data skipping, which the engine does too),
filter the range, ``groupBy(F.window("ts", "1 minute"), "device")``, ``toArrow()``,
``write_deltalake(..., mode="overwrite")``. Both results are checked to be equal. What the ratio
measures is everything the engine adds to the Spark job of a firing.
"""

from __future__ import annotations

from datetime import timedelta

from . import PER_MINUTE_SQL, T0, Context, Outcome, make_engine, measure, spread, verdict
from .recalculate_vs_groupby import _check_same, hand_written

NAME = "firing_overhead"
TARGET = 1.1
SQL = PER_MINUTE_SQL.replace("CQ per_minute RESAMPLE EVERY 1m", "CQ per_2h RESAMPLE EVERY 2h")


def run(ctx: Context) -> Outcome:
    from cq_engine.cli.feed import sensor_rows

    warmup, repeat = (2, 3) if ctx.quick else (4, 7)
    engine = make_engine(ctx.workdir(NAME), SQL, ctx.spark)
    ctx.log("loading 4 hours in 10-minute commits")
    for m in range(0, 240, 10):
        engine.storage.append(
            "sensors",
            sensor_rows(
                start=T0 + timedelta(minutes=m), end=T0 + timedelta(minutes=m + 10), every=timedelta(seconds=1)
            ),
        )
    fire = T0 + timedelta(hours=4)  # the range [T0 + 2h, T0 + 4h)
    lo, hi = fire - timedelta(hours=2), fire
    source_uri, out_uri = engine.storage.uri("sensors"), engine.storage.uri("hand_out")

    ctx.log("timing")
    medians, samples, last = measure(
        {
            "engine": lambda: engine.run_firing("per_2h", fire),
            "hand": lambda: hand_written(ctx.spark, source_uri, out_uri, lo, hi, skip_files=True),
        },
        repeat=repeat,
        warmup=warmup,
    )
    result = last["engine"]
    _check_same(engine.storage.uri("out"), out_uri)
    ratio = medians["engine"] / medians["hand"]
    line = f"{NAME}: engine {medians['engine']:.3f}s  hand-written {medians['hand']:.3f}s  {verdict(ratio, TARGET)}"
    details = (
        f"one 2-hour firing: {result.rows_written} rows written (same as hand-written), files read"
        f" {result.files_read}/{result.files_total}; {repeat} runs each after {warmup} warm-ups:"
        f" engine {spread(samples['engine'])}, hand-written {spread(samples['hand'])}"
    )
    return Outcome(NAME, line, ratio, TARGET, notes=[details])
