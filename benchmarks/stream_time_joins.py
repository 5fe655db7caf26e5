"""stream_time_joins: a stream whose query is a TDengine WINDOW join (each reading with the caps of its
status within 5 s of it, counted and averaged: a result row per input row) versus the same query
hand-written in PySpark as a Spark user writes it, a left join on the status and the time range, then
an aggregate per reading (target: stream run / hand-written <= 1.5; below 1 the engine is faster).

A meters table (full: 20 meters x 1 row/s x 4 h = 288,000 rows in 8 commits; quick: 2 h in 4 commits)
and a caps table (a cap per status every 10 s) get the stream

    CREATE STREAM around INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname INTO around_out AS
      SELECT m.ts, m.current, count(c.cap) AS n, avg(c.cap) AS a
      FROM %%trows m LEFT WINDOW JOIN caps c ON m.status = c.status WINDOW_OFFSET(-5s, 5s);

created on the empty table; the backlog is appended and the sensor plans ONE realtime run over every
closed window. That run (``Engine.run_stream``: pinned Delta reads, window assignment, the join on
time buckets, the aggregate per trigger row, one atomic replace in the sink, the ledger entry) is timed
against ``spark.read.parquet`` of both tables, ``join(caps, status equal and ts within 5 s, "left")``,
``groupBy`` the reading, ``toArrow()`` and ``write_deltalake(..., mode="overwrite")``. Both outputs must
hold the same rows. Spark plans the hand-written join as a sort-merge join on the status with the time
range as a filter — every reading against every cap of its status — where the engine's bucket join
compares each reading with the caps of two buckets.
"""

from __future__ import annotations

from datetime import timedelta

from . import T0, Context, Outcome, make_engine, same_rows, spread, verdict
from .stream_catchup import METERS, _measure, append_backlog, catchup_work

NAME = "stream_time_joins"
TARGET = 1.5
CAP_EVERY_S = 10
STATUSES = 3  # stream_catchup's meters cycle through statuses 0..2
SQL = """
CREATE TABLE meters (ts TIMESTAMP, current DOUBLE, voltage INT, status INT) TAGS (location STRING);
CREATE TABLE caps (ts TIMESTAMP, status INT, cap DOUBLE);
CREATE STREAM around INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname INTO around_out AS
  SELECT m.ts, m.current, count(c.cap) AS n, avg(c.cap) AS a
  FROM %%trows m LEFT WINDOW JOIN caps c ON m.status = c.status WINDOW_OFFSET(-5s, 5s);
"""


def _caps(seconds: int):
    import pyarrow as pa

    times, statuses, caps = [], [], []
    for s in range(0, seconds, CAP_EVERY_S):
        for st in range(STATUSES):
            times.append(T0 + timedelta(seconds=s + st))
            statuses.append(st)
            caps.append(float((s // CAP_EVERY_S + st) % 17))
    return pa.table(
        {
            "ts": pa.array(times, pa.timestamp("us", tz="UTC")),
            "status": pa.array(statuses, pa.int32()),
            "cap": pa.array(caps, pa.float64()),
        }
    )


def hand_window_join(spark, meters_uri: str, caps_uri: str, out_uri: str, lo, hi) -> int:
    """The baseline: each reading in [lo, hi) left-joined with the caps of its status within 5 s."""
    from deltalake import DeltaTable, write_deltalake
    from pyspark.sql import functions as F

    m = spark.read.parquet(*DeltaTable(meters_uri).file_uris()).alias("m")
    m = m.where((F.col("m.ts") >= F.lit(lo)) & (F.col("m.ts") < F.lit(hi)))
    c = spark.read.parquet(*DeltaTable(caps_uri).file_uris()).alias("c")
    near = (F.col("c.ts") >= F.col("m.ts") - F.expr("INTERVAL 5 SECONDS")) & (
        F.col("c.ts") <= F.col("m.ts") + F.expr("INTERVAL 5 SECONDS")
    )
    joined = m.join(c, (F.col("m.status") == F.col("c.status")) & near, "left")
    out = joined.groupBy(F.col("m.tbname").alias("tbname"), F.col("m.ts").alias("ts"), F.col("m.current")).agg(
        F.count("c.cap").alias("n"), F.avg("c.cap").alias("a")
    )
    table = out.toArrow()
    write_deltalake(out_uri, table, mode="overwrite")
    return table.num_rows


def run(ctx: Context) -> Outcome:
    from cq_engine.streams.sensor import evaluate_stream

    hours, commits = (2, 4) if ctx.quick else (4, 8)  # the hand-written join grows as readings x caps
    warmup, repeat = 1, 3
    spark = ctx.spark
    engine = make_engine(ctx.workdir(NAME), SQL, spark)
    now = T0 + timedelta(hours=hours + 1)
    engine.storage.append("caps", _caps(hours * 3600 + 60))
    created = evaluate_stream(engine, engine.stream("around"), cursor=None, now=now)
    if created.works:
        raise RuntimeError(f"the first tick on the empty table planned runs: {created.works}")
    ctx.log(f"appending {hours} h of 1-second readings of {METERS} meters in {commits} commits")
    rows = append_backlog(engine, seconds=hours * 3600, commits=commits)
    work = catchup_work(engine, engine.stream("around"), created.cursor.to_json(), now)
    ((lo, hi),) = work.windows
    uri = engine.storage.uri
    medians, samples, last = _measure(
        {
            "stream": lambda: engine.run_stream("around", work),
            "hand": lambda: hand_window_join(spark, uri("meters"), uri("caps"), uri("hand_out"), lo, hi),
        },
        repeat=repeat,
        warmup=warmup,
    )
    written = same_rows(uri("around_out"), uri("hand_out"), exact=["tbname", "ts", "current", "n"], rounded=["a"])
    if last["stream"].rows_written != written:
        raise RuntimeError(f"the run wrote {last['stream'].rows_written} rows, the sink holds {written}")
    ratio = medians["stream"] / medians["hand"]
    windows = (hi - lo) // timedelta(minutes=1)
    line = f"{NAME}: stream run {medians['stream']:.3f}s  hand-written {medians['hand']:.3f}s  {verdict(ratio, TARGET)}"
    notes = [
        f"one realtime run: {windows} windows x {METERS} meters, {written:,} result rows (one per reading, same as"
        f" hand-written) from {rows:,} readings and {STATUSES * (hours * 360 + 6):,} caps; {repeat} runs each after"
        f" {warmup} warm-up(s): stream {spread(samples['stream'])}, hand-written {spread(samples['hand'])}",
    ]
    return Outcome(NAME, line, ratio, TARGET, notes=notes)
