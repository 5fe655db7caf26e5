"""recalculate_vs_groupby: ``Engine.recalculate`` over N one-minute windows versus the PySpark job a
data engineer would write by hand for the same result (target: engine / hand-written <= 1.5).

Source: 1-second readings of 3 devices in one-hour commits (full: one day = 1440 windows, 259,200
rows; quick: 3 hours = 180 windows). Both sides read the same parquet files, compute max/avg/count
per (minute, device), hand the result to Arrow and write it to a Delta table with delta-rs.
"""

from __future__ import annotations

from datetime import timedelta

from . import PER_MINUTE_SQL, T0, Context, Outcome, fresh_sink, make_engine, measure, spread, verdict

NAME = "recalculate_vs_groupby"
TARGET = 1.5
# Only for the profile of a missed target: per_minute without count().
NOCOUNT_SQL = """
CREATE CQ per_minute_nocount RESAMPLE EVERY 1m BEGIN
  SELECT max_value(temperature) AS tmax, avg(humidity) AS h INTO out_nocount FROM sensors GROUP BY (1m), device
END;
"""


def hand_written(spark, source_uri: str, out_uri: str, lo, hi, *, skip_files: bool = False):
    """The baseline: the same work written directly in PySpark + deltalake. ``skip_files``: read only the
    files whose ``ts`` statistics overlap [lo, hi) (the data skipping Delta readers do)."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake
    from pyspark.sql import functions as F

    dt = DeltaTable(source_uri)
    files = dt.file_uris()
    if skip_files:
        stats = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
        files = [u for u, a, b in zip(files, stats["min.ts"], stats["max.ts"]) if a < hi and b >= lo]
    df = spark.read.parquet(*files)
    df = df.where((F.col("ts") >= F.lit(lo)) & (F.col("ts") < F.lit(hi)))
    agg = (
        df.groupBy(F.window("ts", "1 minute"), "device")
        .agg(F.max("temperature").alias("tmax"), F.avg("humidity").alias("h"), F.count("temperature").alias("n"))
        .select(F.col("window.start").alias("ts"), "device", "tmax", "h", "n")
    )
    table = agg.toArrow()
    write_deltalake(out_uri, table, mode="overwrite")
    return table.num_rows


def _check_same(engine_uri: str, hand_uri: str) -> None:
    """Both sides must have written the same rows (averages up to float summation order)."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    def rows(uri):
        t = DeltaTable(uri).to_pyarrow_table(columns=["ts", "device", "tmax", "h", "n"])
        return t.sort_by([("ts", "ascending"), ("device", "ascending")])

    a, b = rows(engine_uri), rows(hand_uri)
    same = (
        a.num_rows == b.num_rows
        and all(a.column(c).equals(b.column(c)) for c in ("ts", "device", "tmax", "n"))
        and pc.max(pc.abs(pc.subtract(a.column("h"), b.column("h")))).as_py() < 1e-9
    )
    if not same:
        raise RuntimeError(
            f"the engine and the hand-written job wrote different results ({a.num_rows} vs {b.num_rows} rows)"
        )


def run(ctx: Context) -> Outcome:
    from cq_engine.cli.feed import sensor_rows

    hours = 3 if ctx.quick else 24
    # The first runs of each side are much slower (JIT, fresh shapes of Spark jobs): warm both up.
    warmup, repeat = (2, 3) if ctx.quick else (4, 5)
    lo, hi = T0, T0 + timedelta(hours=hours)
    windows = hours * 60

    engine = make_engine(ctx.workdir(NAME), PER_MINUTE_SQL + NOCOUNT_SQL, ctx.spark)
    ctx.log(f"loading {hours} one-hour commits")
    rows = 0
    for h in range(hours):
        data = sensor_rows(start=T0 + timedelta(hours=h), end=T0 + timedelta(hours=h + 1), every=timedelta(seconds=1))
        engine.storage.append("sensors", data)
        rows += data.num_rows
    source_uri = engine.storage.uri("sensors")
    out_uri = engine.storage.uri("hand_out")

    ctx.log("timing")
    medians, samples, last = measure(
        {
            "engine": lambda: fresh_sink(engine, "out") or engine.recalculate("per_minute", start=lo, end=hi),
            "hand": lambda: hand_written(ctx.spark, source_uri, out_uri, lo, hi),
        },
        repeat=repeat,
        warmup=warmup,
    )
    result = last["engine"]
    _check_same(engine.storage.uri("out"), out_uri)
    ratio = medians["engine"] / medians["hand"]
    line = f"{NAME}: engine {medians['engine']:.3f}s  hand-written {medians['hand']:.3f}s  {verdict(ratio, TARGET)}"
    details = (
        f"{windows} windows, {rows:,} source rows in {result.files_total} files, {result.rows_written} rows"
        f" written in {result.chunks} chunk(s), same as hand-written; {repeat} runs each after {warmup} warm-ups:"
        f" engine {spread(samples['engine'])}, hand-written {spread(samples['hand'])}"
    )
    outcome = Outcome(NAME, line, ratio, TARGET, notes=[details])
    if outcome.status == "MISSED" or ctx.verbose:
        if ctx.quick and not ctx.verbose:
            outcome.notes.append("(profile skipped under --quick; the full run or -v prints where the time goes)")
        else:
            outcome.notes += _profile(ctx, engine, lo, hi)
    return outcome


def _profile(ctx: Context, engine, lo, hi) -> list[str]:
    """Split both sides into planning (Python -> JVM calls), the Spark job (toArrow) and the rest (the
    Delta write, plus the ledger for the engine). A DataFrame is re-planned before every job: running
    the same DataFrame twice would reuse its shuffle files and skip stages. A second definition, the
    same query without count(), shows what IoTDB's empty windows (count 0) cost: they need a grid of
    windows x groups left-joined with the aggregate."""
    import statistics

    from cq_engine.resample.plan import plan_query
    from cq_engine.resample.run import coverages
    from cq_engine.resample.timing import recalculation_range

    spark = ctx.spark
    source_uri, out_uri = engine.storage.uri("sensors"), engine.storage.uri("hand_out")

    def engine_plan(name):
        cq = engine.definition(name)
        fires, _ = recalculation_range(cq.resample, start=lo, end=hi)
        (cov,) = coverages(engine.ctx, cq, fires)
        df, _ = engine.storage.read_range(spark, "sensors", time_column="ts", time_range=cov.read_range)
        return plan_query(spark, cq, df, time_column="ts", coverage=cov)

    def hand_plan():
        from deltalake import DeltaTable
        from pyspark.sql import functions as F

        df = spark.read.parquet(*DeltaTable(source_uri).file_uris())
        df = df.where((F.col("ts") >= F.lit(lo)) & (F.col("ts") < F.lit(hi)))
        return (
            df.groupBy(F.window("ts", "1 minute"), "device")
            .agg(F.max("temperature").alias("tmax"), F.avg("humidity").alias("h"), F.count("temperature").alias("n"))
            .select(F.col("window.start").alias("ts"), "device", "tmax", "h", "n")
        )

    steps = {
        "engine plan": lambda: engine_plan("per_minute"),
        "engine plan+job": lambda: engine_plan("per_minute").to_arrow(),
        "engine whole": lambda: engine.recalculate("per_minute", start=lo, end=hi),
        "nocount plan+job": lambda: engine_plan("per_minute_nocount").to_arrow(),
        "hand plan": hand_plan,
        "hand plan+job": lambda: hand_plan().toArrow(),
        "hand whole": lambda: hand_written(spark, source_uri, out_uri, lo, hi),
    }
    _, samples, _ = measure(steps, repeat=5, warmup=1)
    t = {k: statistics.median(v) for k, v in samples.items()}
    rest = lambda whole, part: max(0.0, t[whole] - t[part])  # differences of medians: clamp noise
    return [
        f"profile (medians of 5): engine {t['engine whole']:.3f}s = plan {t['engine plan']:.3f}s"
        f" + Spark job {rest('engine plan+job', 'engine plan'):.3f}s"
        f" + sink commit/ledger/rest {rest('engine whole', 'engine plan+job'):.3f}s;"
        f" hand-written {t['hand whole']:.3f}s = plan {t['hand plan']:.3f}s"
        f" + Spark job {rest('hand plan+job', 'hand plan'):.3f}s + write {rest('hand whole', 'hand plan+job'):.3f}s",
        f"the same engine query without count() (no empty-window grid join): plan+job"
        f" {t['nocount plan+job']:.3f}s vs {t['engine plan+job']:.3f}s with it",
    ]
