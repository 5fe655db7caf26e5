"""stream_series: a stream with several result rows per window (TDengine's multi-row functions) versus
hand-written PySpark of the same query (target: stream run / hand-written <= 1.5; the note gives the
same stream without the functions, ``SELECT ts, current``, so what the functions add is read apart
from what every run of a stream costs: its pinned read, window assignment, sink replace and ledger).

A meters table (full: 20 meters x 1 row/s x 12 h = 864,000 rows in 20 commits; quick: 2 h in 4
commits) gets the stream

    CREATE STREAM series INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname
      INTO series_out AS SELECT ts, diff(current) AS d, csum(current) AS cs, mavg(current, 5) AS ma FROM %%trows;

created on the empty table; the backlog is appended and the sensor plans ONE realtime run over every
closed window: a result row per input row. That run (``Engine.run_stream``: pinned Delta read, window
assignment, the window functions, one atomic replace in the sink, the ledger entry) is timed against
``spark.read.parquet(*DeltaTable(uri).file_uris())`` of the rows those windows hold, the same window
functions over ``(tbname, minute)`` ordered by ``ts`` (``lag``, a running ``sum``, ``avg`` over the
last 5 rows), ``toArrow()`` and ``write_deltalake(..., mode="overwrite")``. Both outputs must hold the
same rows. It shows that several rows per window cost one Spark job, not a job per row or window.
"""

from __future__ import annotations

from datetime import timedelta

from . import T0, Context, Outcome, make_engine, same_rows, spread, verdict
from .stream_catchup import METERS, _measure, append_backlog, catchup_work

NAME = "stream_series"
TARGET = 1.5
SQL = """
CREATE TABLE meters (ts TIMESTAMP, current DOUBLE, voltage INT, status INT) TAGS (location STRING);
CREATE STREAM series INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname
  INTO series_out AS SELECT ts, diff(current) AS d, csum(current) AS cs, mavg(current, 5) AS ma FROM %%trows;
CREATE STREAM plain INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname
  INTO plain_out AS SELECT ts, current FROM %%trows;
"""


def hand_series(spark, source_uri: str, out_uri: str, lo, hi) -> int:
    """The baseline: DIFF, CSUM and MAVG(5) per meter and minute over the rows in [lo, hi)."""
    from deltalake import DeltaTable, write_deltalake
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    df = spark.read.parquet(*DeltaTable(source_uri).file_uris())
    df = df.where((F.col("ts") >= F.lit(lo)) & (F.col("ts") < F.lit(hi)))
    w = Window.partitionBy("tbname", F.date_trunc("minute", "ts")).orderBy("ts")
    out = df.select(
        "ts",
        (F.col("current") - F.lag("current").over(w)).alias("d"),
        F.sum("current").over(w.rowsBetween(Window.unboundedPreceding, 0)).alias("cs"),
        F.when(F.row_number().over(w) >= 5, F.avg("current").over(w.rowsBetween(-4, 0))).alias("ma"),
        "tbname",
    )
    table = out.toArrow()
    write_deltalake(out_uri, table, mode="overwrite")
    return table.num_rows


def run(ctx: Context) -> Outcome:
    from cq_engine.streams.sensor import evaluate_stream

    hours, commits = (2, 4) if ctx.quick else (12, 20)
    warmup, repeat = (1, 3) if ctx.quick else (2, 5)
    spark = ctx.spark
    engine = make_engine(ctx.workdir(NAME), SQL, spark)
    now = T0 + timedelta(hours=hours + 1)
    cursors = {}
    for name in ("series", "plain"):
        created = evaluate_stream(engine, engine.stream(name), cursor=None, now=now)
        if created.works:
            raise RuntimeError(f"the first tick on the empty table planned runs: {created.works}")
        cursors[name] = created.cursor.to_json()
    ctx.log(f"appending {hours} h of 1-second readings of {METERS} meters in {commits} commits")
    rows = append_backlog(engine, seconds=hours * 3600, commits=commits)
    works = {name: catchup_work(engine, engine.stream(name), cursor, now) for name, cursor in cursors.items()}
    ((lo, hi),) = works["series"].windows
    source_uri, out_uri = engine.storage.uri("meters"), engine.storage.uri("hand_out")
    medians, samples, last = _measure(
        {
            "stream": lambda: engine.run_stream("series", works["series"]),
            "hand": lambda: hand_series(spark, source_uri, out_uri, lo, hi),
            "plain": lambda: engine.run_stream("plain", works["plain"]),
        },
        repeat=repeat,
        warmup=warmup,
    )
    written = same_rows(engine.storage.uri("series_out"), out_uri, exact=["tbname", "ts"], rounded=["d", "cs", "ma"])
    if last["stream"].rows_written != written:
        raise RuntimeError(f"the run wrote {last['stream'].rows_written} rows, the sink holds {written}")
    ratio = medians["stream"] / medians["hand"]
    windows = (hi - lo) // timedelta(minutes=1)
    line = f"{NAME}: stream run {medians['stream']:.3f}s  hand-written {medians['hand']:.3f}s  {verdict(ratio, TARGET)}"
    notes = [
        f"one realtime run: {windows} windows x {METERS} meters, {written:,} result rows (a row per input row,"
        f" same as hand-written) from {rows:,} rows; {repeat} runs each after {warmup} warm-up(s):"
        f" stream {spread(samples['stream'])}, hand-written {spread(samples['hand'])}",
        f"the same stream without the functions (SELECT ts, current): {medians['plain']:.3f}s"
        f" ({spread(samples['plain'])}): the functions add {medians['stream'] - medians['plain']:.3f}s",
    ]
    return Outcome(NAME, line, ratio, TARGET, notes=notes)
