"""sliding_vs_groupby: a sliding INTERVAL stream's run versus hand-written PySpark over the same rows
(target: stream run / hand-written <= 1.3).

A meters table (full: 20 meters x 1 row/s x 41 h 40 min = 3,000,000 rows in 20 commits; quick: 2 h,
144,000 rows in 4 commits) gets the stream

    CREATE STREAM sl INTERVAL(1m) SLIDING(30s) FROM meters PARTITION BY tbname OPTIONS(WATERMARK(10s))
      INTO sl_out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;

created on the empty table (a first ``evaluate_stream``); the backlog is appended and the sensor plans
ONE realtime run over every closed window. That run (``Engine.run_stream``: pinned Delta read, window
assignment, one Spark job, one atomic replace in the sink, the ledger entry) is timed against
``spark.read.parquet(*DeltaTable(uri).file_uris())``, the rows those windows hold,
``groupBy(tbname, F.window("ts", "1 minute", "30 seconds").start)`` with the same aggregates, the same
window starts, ``toArrow()``, ``write_deltalake(..., mode="overwrite")``. Both outputs must hold the
same rows. Every row is in two windows, so this measures the window assignment: an explode and a hash
aggregate, like ``F.window``'s, with no sort of the (row, window) pairs.
"""

from __future__ import annotations

from datetime import timedelta

from . import T0, Context, Outcome, make_engine, spread, verdict
from .stream_catchup import METERS, _check_same, _measure, append_backlog, catchup_work

NAME = "sliding_vs_groupby"
TARGET = 1.3
SQL = """
CREATE TABLE meters (ts TIMESTAMP, current DOUBLE, voltage INT, status INT) TAGS (location STRING);
CREATE STREAM sl INTERVAL(1m) SLIDING(30s) FROM meters PARTITION BY tbname OPTIONS(WATERMARK(10s))
  INTO sl_out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;
"""


def hand_sliding(spark, source_uri: str, out_uri: str, lo, hi) -> int:
    """The baseline: the 1-minute windows sliding by 30 s that start in [lo, hi), written directly."""
    from deltalake import DeltaTable, write_deltalake
    from pyspark.sql import functions as F

    df = spark.read.parquet(*DeltaTable(source_uri).file_uris())
    df = df.where((F.col("ts") >= F.lit(lo)) & (F.col("ts") < F.lit(hi + timedelta(seconds=30))))
    agg = (
        df.groupBy("tbname", F.window("ts", "1 minute", "30 seconds").start.alias("_twstart"))
        .agg(F.count(F.lit(1)).alias("n"), F.avg("current").alias("c"))
        .where((F.col("_twstart") >= F.lit(lo)) & (F.col("_twstart") < F.lit(hi)))
        .select("_twstart", "n", "c", "tbname")
    )
    table = agg.toArrow()
    write_deltalake(out_uri, table, mode="overwrite")
    return table.num_rows


def run(ctx: Context) -> Outcome:
    from cq_engine.streams.sensor import evaluate_stream

    seconds, commits = (2 * 3600, 4) if ctx.quick else (3_000_000 // METERS, 20)
    warmup, repeat = (1, 3) if ctx.quick else (2, 5)
    spark = ctx.spark
    engine = make_engine(ctx.workdir(NAME), SQL, spark)
    stream = engine.stream("sl")
    now = T0 + timedelta(seconds=seconds + 3600)
    created = evaluate_stream(engine, stream, cursor=None, now=now)
    if created.works:
        raise RuntimeError(f"the first tick on the empty table planned runs: {created.works}")

    ctx.log(f"appending {seconds:,} s of 1-second readings of {METERS} meters in {commits} commits")
    rows = append_backlog(engine, seconds=seconds, commits=commits)
    work = catchup_work(engine, stream, created.cursor.to_json(), now)
    ((lo, hi),) = work.windows
    windows = (hi - lo) // timedelta(seconds=30)

    source_uri, out_uri = engine.storage.uri("meters"), engine.storage.uri("hand_out")
    ctx.log(f"timing the run ({windows} sliding windows x {METERS} meters) and the hand-written job")
    medians, samples, last = _measure(
        {
            "stream": lambda: engine.run_stream("sl", work),
            "hand": lambda: hand_sliding(spark, source_uri, out_uri, lo, hi),
        },
        repeat=repeat,
        warmup=warmup,
    )
    result = last["stream"]
    written = _check_same(engine.storage.uri("sl_out"), out_uri, "sliding")
    if result.rows_written != written:
        raise RuntimeError(f"the run wrote {result.rows_written} rows, the sink holds {written}")
    ratio = medians["stream"] / medians["hand"]
    line = f"{NAME}: stream run {medians['stream']:.3f}s  hand-written {medians['hand']:.3f}s  {verdict(ratio, TARGET)}"
    notes = [
        f"one realtime run: {windows} windows (1 min sliding by 30 s) x {METERS} meters = {written:,} rows written"
        f" (same as hand-written) from {rows:,} rows in {result.files_read}/{result.files_total} files;"
        f" {repeat} runs each after {warmup} warm-up(s): stream {spread(samples['stream'])},"
        f" hand-written {spread(samples['hand'])}"
    ]
    return Outcome(NAME, line, ratio, TARGET, notes=notes)
