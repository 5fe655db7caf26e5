"""stream_catchup: a stream catching up on a large backlog in one run versus a hand-written PySpark
aggregation of the same rows (target: stream run / hand-written <= 1.5).

A meters table (full: 20 meters x 1 row/s x 28 h = 2,016,000 rows in 20 commits; quick: 20 meters
x 2 h = 144,000 rows in 4 commits) gets the stream

    CREATE STREAM s INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname OPTIONS(WATERMARK(10s))
      INTO s_out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;

created on the empty table (a first ``evaluate_stream``), then the backlog is appended and the sensor
evaluated once: it must plan ONE realtime run covering every closed window. That run
(``Engine.run_stream``: pinned Delta read, window assignment, one Spark job, an atomic replace of the
windows' rows in the sink, the ledger entry) is timed against the job a data engineer would write:
``spark.read.parquet(*DeltaTable(uri).file_uris())``, the same closed windows'
``groupBy(tbname, window start)`` with the same aggregates, ``toArrow()``, ``write_deltalake(...,
mode="overwrite")``. Both outputs are checked to hold the same rows.

A note (no target) gives the same measurement for a data-shaped window, ``STATE_WINDOW(status)``
(status changes every 5 minutes), against hand-written segmentation with window functions (``lag``
+ running sum, then ``groupBy`` of the segments, the last one per meter still open). The stream's
per-group state (the frontier) is removed before each timed run, so every run segments the whole
backlog as the first one did.
"""

from __future__ import annotations

import itertools
import shutil
import statistics
from datetime import timedelta
from pathlib import Path

import pyarrow as pa

from . import STREAM_SQL, T0, Context, Outcome, make_engine, spread, timed, verdict

NAME = "stream_catchup"
TARGET = 1.5
METERS = 20
SQL = (
    STREAM_SQL
    + """
CREATE STREAM s_state STATE_WINDOW(status) FROM meters PARTITION BY tbname OPTIONS(WATERMARK(10s))
  INTO s_state_out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;
"""
)
STATE_PERIOD = 300  # seconds between status changes


def _rows(schema: pa.Schema, start_s: int, end_s: int) -> pa.Table:
    """Seconds [start_s, end_s) after T0 of every meter: one row per meter per second."""
    import numpy as np

    secs = np.arange(start_s, end_s, dtype=np.int64)
    meter = np.repeat(np.arange(METERS, dtype=np.int64), len(secs))
    t = np.tile(secs, METERS)
    t0_us = int(T0.timestamp()) * 1_000_000
    names = pa.array([f"d{i:03d}" for i in range(METERS)])
    idx = pa.array(meter)
    return (
        pa.table(
            {
                "ts": pa.array(t0_us + t * 1_000_000, pa.timestamp("us", tz="UTC")),
                "current": pa.array(((t * 7 + meter * 3) % 101) / 10.0),
                "voltage": pa.array(200 + t % 40, pa.int32()),
                "status": pa.array((t // STATE_PERIOD + meter) % 3, pa.int32()),
                "tbname": names.take(idx),
                "location": pa.array([f"loc-{i % 4}" for i in range(METERS)]).take(idx),
            }
        )
        .select(schema.names)
        .cast(schema)
    )


def hand_interval(spark, source_uri: str, out_uri: str, lo, hi) -> int:
    """The baseline: the one-minute windows starting in [lo, hi) (so rows in [lo, hi)), written directly."""
    from deltalake import DeltaTable, write_deltalake
    from pyspark.sql import functions as F

    df = spark.read.parquet(*DeltaTable(source_uri).file_uris())
    df = df.where((F.col("ts") >= F.lit(lo)) & (F.col("ts") < F.lit(hi)))
    agg = (
        df.groupBy("tbname", F.window("ts", "1 minute").start.alias("_twstart"))
        .agg(F.count(F.lit(1)).alias("n"), F.avg("current").alias("c"))
        .select("_twstart", "n", "c", "tbname")
    )
    table = agg.toArrow()
    write_deltalake(out_uri, table, mode="overwrite")
    return table.num_rows


def hand_state(spark, source_uri: str, out_uri: str, until) -> int:
    """The baseline of the STATE_WINDOW stream: runs of equal status per meter (rows up to ``until``),
    the last run of each meter still open (no next run has started)."""
    from deltalake import DeltaTable, write_deltalake
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    df = spark.read.parquet(*DeltaTable(source_uri).file_uris())
    df = df.where(F.col("ts") <= F.lit(until)).where(F.col("status").isNotNull())
    by_time = Window.partitionBy("tbname").orderBy("ts")
    new = F.when(F.col("status").eqNullSafe(F.lag("status").over(by_time)), 0).otherwise(1)
    df = df.withColumn("seg", F.sum(new).over(by_time.rowsBetween(Window.unboundedPreceding, Window.currentRow)))
    segs = df.groupBy("tbname", "seg").agg(
        F.min("ts").alias("_twstart"), F.count(F.lit(1)).alias("n"), F.avg("current").alias("c")
    )
    segs = segs.withColumn("last", F.max("seg").over(Window.partitionBy("tbname")))
    table = segs.where(F.col("seg") < F.col("last")).select("_twstart", "n", "c", "tbname").toArrow()
    write_deltalake(out_uri, table, mode="overwrite")
    return table.num_rows


def _check_same(engine_uri: str, hand_uri: str, what: str) -> int:
    """Both sides must hold the same rows (averages up to float summation order); returns the count."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    def rows(uri):
        t = DeltaTable(uri).to_pyarrow_table(columns=["_twstart", "tbname", "n", "c"])
        return t.sort_by([("tbname", "ascending"), ("_twstart", "ascending")])

    a, b = rows(engine_uri), rows(hand_uri)
    same = (
        a.num_rows == b.num_rows
        and a.num_rows > 0
        and all(a.column(c).equals(b.column(c)) for c in ("_twstart", "tbname", "n"))
        and pc.max(pc.abs(pc.subtract(a.column("c"), b.column("c")))).as_py() < 1e-9
    )
    if not same:
        raise RuntimeError(
            f"{what}: the stream run and the hand-written job wrote different results"
            f" ({a.num_rows} vs {b.num_rows} rows)"
        )
    return a.num_rows


def append_backlog(engine, *, seconds: int, commits: int) -> int:
    """Seconds [0, seconds) after T0 of every meter into ``meters`` in ``commits`` commits; the row count."""
    schema = engine.storage.schema("meters")
    bounds = [seconds * i // commits for i in range(commits + 1)]
    rows = 0
    for a, b in itertools.pairwise(bounds):
        data = _rows(schema, a, b)
        engine.storage.append("meters", data)
        rows += data.num_rows
    return rows


def catchup_work(engine, stream, cursor: str, now):
    """The one realtime run the sensor must plan for the backlog (checked)."""
    from cq_engine.streams.sensor import evaluate_stream

    plan = evaluate_stream(engine, stream, cursor=cursor, now=now)
    if len(plan.works) != 1 or plan.works[0].kind != "realtime" or len(plan.works[0].windows) != 1:
        raise RuntimeError(f"the catch-up tick planned {plan.works}, expected one realtime run")
    return plan.works[0]


def _measure(cases: dict, *, repeat: int, warmup: int, setup: dict | None = None):
    """Like benchmarks.measure (interleaved cases, medians after warm-ups), with an untimed setup
    step before each timed call."""
    setup = setup or {}
    samples: dict[str, list[float]] = {k: [] for k in cases}
    last: dict[str, object] = {}
    for i in range(warmup + repeat):
        for key, fn in cases.items():
            if key in setup:
                setup[key]()
            seconds, last[key] = timed(fn)
            if i >= warmup:
                samples[key].append(seconds)
    return {k: statistics.median(v) for k, v in samples.items()}, samples, last


def run(ctx: Context) -> Outcome:
    from cq_engine.streams.sensor import evaluate_stream

    hours, commits = (2, 4) if ctx.quick else (28, 20)
    warmup, repeat = (1, 3) if ctx.quick else (2, 5)
    spark = ctx.spark
    engine = make_engine(ctx.workdir(NAME), SQL, spark)
    stream, state_stream = engine.stream("s"), engine.stream("s_state")
    now = T0 + timedelta(hours=hours + 1)
    # The streams are created on the empty table: the backlog is real-time data for them.
    created = {s.name: evaluate_stream(engine, s, cursor=None, now=now) for s in (stream, state_stream)}
    for s, plan in created.items():
        if plan.works:
            raise RuntimeError(f"{s}: the first tick on the empty table planned runs: {plan.works}")

    ctx.log(f"appending {hours} h of 1-second readings of {METERS} meters in {commits} commits")
    seconds = hours * 3600
    rows = append_backlog(engine, seconds=seconds, commits=commits)
    work = catchup_work(engine, stream, created["s"].cursor.to_json(), now)
    lo, hi = work.windows[0]
    last_event = T0 + timedelta(seconds=seconds - 1)
    # Every window closed by T = last event - 10s.
    if lo != T0 or hi != T0 + timedelta(minutes=(seconds - 11) // 60):
        raise RuntimeError(f"the catch-up run covers window starts [{lo}, {hi}), expected every closed window")
    windows = (hi - T0) // timedelta(minutes=1)  # those holding rows

    source_uri, out_uri = engine.storage.uri("meters"), engine.storage.uri("hand_out")
    ctx.log(f"timing the catch-up run ({windows} windows x {METERS} meters) and the hand-written job")
    medians, samples, last = _measure(
        {
            "stream": lambda: engine.run_stream("s", work),
            "hand": lambda: hand_interval(spark, source_uri, out_uri, lo, hi),
        },
        repeat=repeat,
        warmup=warmup,
    )
    result = last["stream"]
    written = _check_same(engine.storage.uri("s_out"), out_uri, "interval")
    if written != windows * METERS or result.rows_written != written:
        raise RuntimeError(
            f"expected {windows * METERS} rows, the run wrote {result.rows_written}, the sink holds {written}"
        )
    ratio = medians["stream"] / medians["hand"]
    line = f"{NAME}: stream run {medians['stream']:.3f}s  hand-written {medians['hand']:.3f}s  {verdict(ratio, TARGET)}"
    notes = [
        f"one realtime run planned for the backlog: {windows} one-minute windows x {METERS} meters = {written:,}"
        f" rows written (same as hand-written) from {rows:,} rows in {result.files_read}/{result.files_total}"
        f" files; {repeat} runs each after {warmup} warm-up(s): stream {spread(samples['stream'])},"
        f" hand-written {spread(samples['hand'])}"
    ]
    outcome = Outcome(NAME, line, ratio, TARGET, notes=notes)
    if outcome.status == "MISSED" or ctx.verbose:
        if ctx.quick and not ctx.verbose:
            outcome.notes.append("(profile skipped under --quick; the full run or -v prints where the time goes)")
        else:
            outcome.notes += _profile(ctx, engine, work, source_uri, out_uri, lo, hi)

    ctx.log("timing the STATE_WINDOW catch-up run and its hand-written job")
    outcome.notes.append(
        _state_note(
            ctx,
            engine,
            state_stream,
            created["s_state"].cursor.to_json(),
            now,
            source_uri,
            last_event,
            warmup=warmup,
            repeat=repeat,
        )
    )
    return outcome


def _state_note(
    ctx: Context, engine, stream, cursor: str, now, source_uri: str, last_event, *, warmup: int, repeat: int
) -> str:
    from cq_engine.streams.sensor import evaluate_stream

    plan = evaluate_stream(engine, stream, cursor=cursor, now=now)
    if len(plan.works) != 1 or plan.works[0].close_until is None:
        raise RuntimeError(f"the STATE_WINDOW catch-up tick planned {plan.works}, expected one run")
    work = plan.works[0]
    until = work.close_until
    if until != last_event - timedelta(seconds=10):
        raise RuntimeError(f"the STATE_WINDOW run closes up to {until}, expected {last_event - timedelta(seconds=10)}")
    frontier = Path(engine.storage.state_uri(f"streams/{stream.name}/frontier"))
    out_uri = engine.storage.uri("hand_state_out")
    medians, samples, last = _measure(
        {
            "stream": lambda: engine.run_stream(stream.name, work),
            "hand": lambda: hand_state(ctx.spark, source_uri, out_uri, until),
        },
        setup={"stream": lambda: shutil.rmtree(frontier, ignore_errors=True)},
        repeat=repeat,
        warmup=warmup,
    )
    written = _check_same(engine.storage.uri("s_state_out"), out_uri, "STATE_WINDOW")
    if last["stream"].rows_written != written:
        raise RuntimeError(f"STATE_WINDOW: the run wrote {last['stream'].rows_written} rows, the sink holds {written}")
    return (
        f"STATE_WINDOW(status) (no target): stream run {medians['stream']:.3f}s  hand-written (lag + running sum +"
        f" groupBy) {medians['hand']:.3f}s  ratio {medians['stream'] / medians['hand']:.2f}; {written:,} closed"
        f" windows, same as hand-written; stream {spread(samples['stream'])}, hand-written {spread(samples['hand'])}"
    )


def _profile(ctx: Context, engine, work, source_uri: str, out_uri: str, lo, hi) -> list[str]:
    """Split both sides into planning (Python -> JVM calls), the Spark job (toArrow) and the rest (the
    Delta write; the run's sink replace and ledger). The stream side's plan is the one ``run_work``
    builds for time windows (stream_run._run_time_windows)."""
    from deltalake import DeltaTable
    from pyspark.sql import functions as F

    from cq_engine.streams import timing as st
    from cq_engine.streams.plan import evaluate, prepare, row_stats_needed, with_placeholders
    from cq_engine.streams.run import _in_ranges
    from cq_engine.streams.windows.tdengine import WSTART, assign_windows

    spark = ctx.spark
    stream = engine.stream("s")
    tz = engine.settings.timezone

    def stream_plan():
        table, tc = stream.trigger_table, engine.time_column(stream.trigger_table)
        w_lo, w_hi = work.windows[0][0], work.windows[-1][1] + st.window_length(stream.trigger)
        df, _ = engine.storage.read_range(spark, table, time_column=tc, time_range=(w_lo, w_hi), version=work.version)
        windows = assign_windows(
            prepare(stream, df),
            stream.trigger,
            time_column=tc,
            keys=list(stream.partition_by),
            close_until=work.close_until or T0 + timedelta(days=36500),
            timezone=tz,
            row_stats=row_stats_needed(stream),
        )
        windows = with_placeholders(stream, windows.filter(_in_ranges(WSTART, work.windows)), tick=work.tick, tz=tz)
        return evaluate(stream, windows)

    def hand_plan():
        df = spark.read.parquet(*DeltaTable(source_uri).file_uris())
        df = df.where((F.col("ts") >= F.lit(lo)) & (F.col("ts") < F.lit(hi)))
        return (
            df.groupBy("tbname", F.window("ts", "1 minute").start.alias("_twstart"))
            .agg(F.count(F.lit(1)).alias("n"), F.avg("current").alias("c"))
            .select("_twstart", "n", "c", "tbname")
        )

    steps = {
        "stream plan": stream_plan,
        "stream plan+job": lambda: stream_plan().toArrow(),
        "stream whole": lambda: engine.run_stream("s", work),
        "hand plan": hand_plan,
        "hand plan+job": lambda: hand_plan().toArrow(),
        "hand whole": lambda: hand_interval(spark, source_uri, out_uri, lo, hi),
    }
    t, _, _ = _measure(steps, repeat=3, warmup=1)
    rest = lambda whole, part: max(0.0, t[whole] - t[part])  # differences of medians: clamp noise
    return [
        f"profile (medians of 3): stream run {t['stream whole']:.3f}s = plan {t['stream plan']:.3f}s"
        f" + Spark job {rest('stream plan+job', 'stream plan'):.3f}s"
        f" + sink replace/ledger/rest {rest('stream whole', 'stream plan+job'):.3f}s;"
        f" hand-written {t['hand whole']:.3f}s = plan {t['hand plan']:.3f}s"
        f" + Spark job {rest('hand plan+job', 'hand plan'):.3f}s + write {rest('hand whole', 'hand plan+job'):.3f}s"
    ]
