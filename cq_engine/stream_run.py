"""run for streams: one ``StreamWork`` (or one PERIOD tick) → one Spark job → one atomic sink commit.

Time windows (INTERVAL/SLIDING) are stateless: a run recomputes every window starting in its
ranges, for every partition group, and replaces exactly those windows' rows. Data-shaped windows
(SESSION, STATE_WINDOW, EVENT_WINDOW, COUNT_WINDOW) keep per group the start of the first window
not yet closed (the *frontier*, a Delta table under ``_cq/streams/<name>/``); a run segments each
group from its frontier, writes the windows it closed, and moves the frontier. The sink is written
before the frontier, so a run retried after a crash recomputes the same windows from the same
snapshot and writes the same rows.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from pyspark.sql import functions as F

from . import stream_timing as st
from .durations import micros
from .errors import CQError
from .ledger import LedgerEntry
from .model import DATA_SHAPED, PeriodTrigger, Stream
from .storage.delta import groups_predicate, ranges_predicate
from .stream_plan import ENGINE_COLUMNS, evaluate, period_frame, pre_window_filter, with_placeholders
from .times import EPOCH, UTC, iso
from .windows import WCLOSED, WLAST, WSTART, assign_windows

if TYPE_CHECKING:
    from .run import Engine, RunResult

_US = timedelta(microseconds=1)
_FAR = datetime(9999, 1, 1, tzinfo=UTC)
RESUME = "__cq_resume"


def _in_ranges(column: str, ranges) -> F.Column:
    c = F.unix_micros(F.col(column))
    cond = None
    for a, b in ranges:
        part = (c >= F.lit(micros(a - EPOCH))) & (c < F.lit(micros(b - EPOCH)))
        cond = part if cond is None else (cond | part)
    return cond if cond is not None else F.lit(False)


def _source_table(engine: "Engine", stream: Stream) -> tuple[str, str]:
    table = stream.trigger_table or stream.source
    return table, engine.source_time_column(stream.name, table, sink=stream.sink, role="trigger")


def state_uri(engine: "Engine", stream: Stream, what: str) -> str:
    return engine.settings.state_uri(f"streams/{stream.name}/{what}")


def run_work(engine: "Engine", stream: Stream, work: st.StreamWork) -> "RunResult":
    """Execute one window-triggered stream run (real time, history chunk or recalculation)."""
    if isinstance(stream.trigger, PeriodTrigger):
        raise CQError(f"{stream.name} is a PERIOD stream: it runs per tick (cq tick / its schedule)")
    runner = _run_data_shaped if stream.trigger.kind in DATA_SHAPED else _run_time_windows
    lo, hi = work.extent
    return _recorded(engine, stream, kind=work.kind, fire_time=work.tick, time_range=(lo, hi),
                     versions=lambda table: {table: work.version}, body=lambda: runner(engine, stream, work))


def _recorded(engine: "Engine", stream: Stream, *, kind, fire_time, time_range, versions, body) -> "RunResult":
    from .run import RunResult

    engine.spark  # a session start is not part of the run's cost
    started, clock = datetime.now(UTC), time.perf_counter()
    table = stream.trigger_table or stream.source
    try:
        rows, sink_version, scanned = body()
    except Exception as exc:
        engine.ledger.record(LedgerEntry(
            definition=stream.name, kind=kind, fire_time=fire_time, range_start=time_range[0],
            range_end=time_range[1], source_versions=versions(table), rows_written=0, sink_version=None,
            status="failed", started_at=started, finished_at=datetime.now(UTC), error=str(exc)[:2000]))
        raise
    engine.ledger.record(LedgerEntry(
        definition=stream.name, kind=kind, fire_time=fire_time, range_start=time_range[0], range_end=time_range[1],
        source_versions=versions(table), rows_written=rows, sink_version=sink_version, status="succeeded",
        started_at=started, finished_at=datetime.now(UTC)))
    return RunResult(definition=stream.name, kind=kind, fire_time=fire_time, time_range=time_range,
                     rows_written=rows, sink_version=sink_version if sink_version is not None else -1,
                     source_versions=versions(table), files_read=scanned[0], files_total=scanned[1],
                     seconds=time.perf_counter() - clock)


def _write(engine: "Engine", stream: Stream, data: pa.Table, *, predicate: str, app_version: int, kind: str) -> int:
    return engine.storage.replace_where(
        stream.sink, data, predicate=predicate, time_column=stream.time_column,
        app_id=f"cq-engine/{stream.name}/{kind}", app_version=app_version,
        metadata={"cq.definition": stream.name, "cq.kind": kind})


def _run_time_windows(engine: "Engine", stream: Stream, work: st.StreamWork):
    table, time_column = _source_table(engine, stream)
    tz = engine.settings.timezone
    lo, hi = work.windows[0][0], work.windows[-1][1] + st.window_length(stream.trigger)
    df, scan = engine.storage.read_range(engine.spark, table, time_column=time_column, time_range=(lo, hi),
                                         version=work.version)
    df = pre_window_filter(stream, df)
    windows = assign_windows(df, stream.trigger, time_column=time_column, keys=list(stream.partition_by),
                             close_until=work.close_until or _FAR, timezone=tz)
    windows = with_placeholders(stream, windows.filter(_in_ranges(WSTART, work.windows)), tick=work.tick, tz=tz)
    result = evaluate(stream, windows, keep_state=False).toArrow()
    predicate = ranges_predicate(stream.time_column, st.key_ranges(stream, work.windows, tz))
    version = _write(engine, stream, result, predicate=predicate, app_version=work.version, kind=work.kind)
    return result.num_rows, version, (scan.files_read, scan.files_total)


# --- data-shaped windows ---------------------------------------------------------------------------


def load_frontier(uri: str, keys: list[str]) -> dict[tuple, datetime]:
    """Per partition group (its key values), the start of its first window not yet closed."""
    if not DeltaTable.is_deltatable(uri):
        return {}
    return _frontier_of(pa.table(DeltaTable(uri).scan()), keys)


def _frontier_of(data: pa.Table, keys: list[str]) -> dict[tuple, datetime]:
    return {tuple(row[k] for k in keys): row[RESUME] for row in data.to_pylist()}


def _frontier_table(frontier: dict[tuple, datetime], key_fields: list[pa.Field]) -> pa.Table:
    """The frontier as Arrow: the key columns (typed as in the trigger table), then ``RESUME``."""
    schema = pa.schema([*key_fields, pa.field(RESUME, pa.timestamp("us", tz="UTC"))])
    columns = [[g[i] for g in frontier] for i in range(len(key_fields))] + [list(frontier.values())]
    return pa.table(columns, schema=schema)


def _save_frontier(uri: str, frontier: dict[tuple, datetime], key_fields: list[pa.Field], app_id: str,
                   app_version: int) -> None:
    write_deltalake(uri, _frontier_table(frontier, key_fields), mode="overwrite", schema_mode="overwrite",
                    commit_properties=CommitProperties(app_transactions=[Transaction(app_id=app_id, version=app_version)]))


def move_frontier(engine: "Engine", stream: Stream, *, to: datetime) -> None:
    """Every group resumes at ``to`` or later (``--ignore-untreated``)."""
    uri = state_uri(engine, stream, "frontier")
    if not DeltaTable.is_deltatable(uri):
        return
    current = pa.table(DeltaTable(uri).scan())
    keys = [n for n in current.column_names if n != RESUME]
    frontier = {g: max(t, to) for g, t in _frontier_of(current, keys).items()}
    _save_frontier(uri, frontier, [current.schema.field(k) for k in keys], f"cq-engine/{stream.name}/untreated", 0)


def _restarts(engine: "Engine", stream: Stream, at: datetime, keys: list[str]) -> dict[tuple, datetime]:
    """Per group, a window start at or before ``at`` from which segmenting again reproduces every
    window before it: the latest one (for sliding COUNT_WINDOWs, the earliest still holding ``at``)."""
    if not engine.storage.exists(stream.sink):
        return {}
    from pyspark.sql import Window

    sink_time = stream.time_column
    df, _ = engine.storage.read_range(engine.spark, stream.sink, time_column=sink_time,
                                      time_range=(EPOCH, at + _US))
    trig = stream.trigger
    back = -(-trig.count // trig.slide) if trig.kind == "count" else 1
    starts = df.select(*keys, sink_time).distinct()
    rank = F.row_number().over(Window.partitionBy(*keys).orderBy(F.col(sink_time).desc()))
    rows = starts.withColumn("__cq_rank", rank).filter(F.col("__cq_rank") <= back) \
        .groupBy(*keys).agg(F.min(sink_time).alias("restart")).toArrow()
    return {tuple(r[k] for k in keys): r["restart"] for r in rows.to_pylist()}


def _run_data_shaped(engine: "Engine", stream: Stream, work: st.StreamWork):
    table, time_column = _source_table(engine, stream)
    spark, tz = engine.spark, engine.settings.timezone
    keys = list(stream.partition_by)
    schema = engine.storage.schema(table)
    key_fields = [schema.field(schema.get_field_index(next(n for n in schema.names if n.lower() == k.lower())))
                  for k in keys]
    uri = state_uri(engine, stream, "frontier")
    frontier = load_frontier(uri, [f.name for f in key_fields])
    origin = work.origin or EPOCH
    restarted: dict[tuple, datetime] = {}
    if work.recompute_from is not None:
        found = _restarts(engine, stream, work.recompute_from, keys)
        for g in set(frontier) | set(found):
            restarted[g] = min(frontier.get(g, _FAR), found.get(g, origin))
        frontier.update(restarted)
    lo = min([origin, *frontier.values()])
    hi = None if work.emit_open else (work.close_until + _US if work.close_until else None)
    df, scan = engine.storage.read_range(spark, table, time_column=time_column,
                                         time_range=(lo, hi) if hi is not None else (lo, _FAR), version=work.version)
    if frontier:
        marks = _frontier_table(frontier, key_fields).rename_columns([f"__cq_k{i}" for i in range(len(keys))] + [RESUME])
        fr = F.broadcast(spark.createDataFrame(marks))
        cond = [F.col(k).eqNullSafe(F.col(f"__cq_k{i}")) for i, k in enumerate(keys)]
        df = df.join(fr, on=cond, how="left") if cond else df.crossJoin(fr)
        df = df.filter(F.col(time_column) >= F.coalesce(F.col(RESUME), F.lit(origin).cast("timestamp")))
        df = df.drop(RESUME, *[f"__cq_k{i}" for i in range(len(keys))])
    df = pre_window_filter(stream, df)
    windows = assign_windows(df, stream.trigger, time_column=time_column, keys=keys,
                             close_until=work.close_until or lo, timezone=tz)
    windows = with_placeholders(stream, windows, tick=work.tick, tz=tz)
    result = evaluate(stream, windows, keep_state=True).toArrow()

    out_keys = [next(n for n in result.column_names if n.lower() == k.lower()) for k in keys]
    groups = list(zip(*[result.column(k).to_pylist() for k in out_keys])) if keys else [()] * result.num_rows
    starts, closed, last = (result.column(c).to_pylist() for c in (WSTART, WCLOSED, WLAST))
    moved: dict[tuple, datetime] = {}
    open_start: dict[tuple, datetime] = {}
    for g, s, c, t in zip(groups, starts, closed, last):
        if c:
            moved[g] = max(moved.get(g, EPOCH), t + _US)
        else:
            open_start[g] = min(open_start.get(g, _FAR), s)
    new_frontier = dict(frontier)
    new_frontier.update(moved)
    new_frontier.update(open_start)
    emitted = result if work.emit_open else result.filter(pc.equal(result.column(WCLOSED), True))
    emitted = emitted.drop_columns(list(ENGINE_COLUMNS))
    bounds = {g: frontier.get(g, origin) for g in set(groups)}
    bounds.update(restarted)
    version = None
    if bounds:
        predicate = groups_predicate(stream.time_column, out_keys or keys, sorted(bounds.items(), key=str))
        version = _write(engine, stream, emitted, predicate=predicate, app_version=work.version, kind=work.kind)
    _save_frontier(uri, new_frontier, key_fields, f"cq-engine/{stream.name}", work.version)
    return emitted.num_rows, version, (scan.files_read, scan.files_total)


# --- PERIOD ---------------------------------------------------------------------------------------


def _period_tick(stream: Stream, tick: datetime, ticks) -> tuple[datetime, datetime]:
    """Check ``tick`` is a PERIOD tick; the ticks before and after it (``_tprev/_tnext_localtime``)."""
    span = max(stream.trigger.period, timedelta(days=1)) * 2
    if not ticks.is_tick(tick):
        nxt = ticks.between(tick, tick + span)
        raise CQError(f"{iso(tick)} is not a PERIOD tick of {stream.name!r}" + (f"; next: {iso(nxt[0])}" if nxt else ""))
    after = ticks.between(tick + _US, tick + span)
    return ticks.range_of(tick)[0], (after[0] if after else tick + stream.trigger.period)


def run_period(engine: "Engine", stream: Stream, tick: datetime, *, ticks) -> "RunResult":
    """One PERIOD tick (``ticks``: the stream's ``ticks.Ticks``): the subquery over ``%%trows`` (rows
    committed to the trigger table since the previous tick) or over its FROM table, written at the
    tick's time."""
    prev_tick, next_tick = _period_tick(stream, tick, ticks)
    versions: dict[str, int] = {}

    def body():
        table = stream.source
        time_column = engine.source_time_column(stream.name, table, sink=stream.sink)
        if stream.trigger_table and stream.source == stream.trigger_table:
            after, until = _tick_versions(engine, stream, tick)
            df, scan = engine.storage.read_added(engine.spark, table, after=after, until=until, time_column=time_column)
            versions[table] = until
        else:
            df, scan = engine.storage.read_range(engine.spark, table, time_column=time_column, time_range=None)
            versions[table] = scan.version
        result = period_frame(stream, df, tick=tick, prev_tick=prev_tick, next_tick=next_tick).toArrow()
        predicate = ranges_predicate(stream.time_column, [(tick, tick + _US)])
        version = _write(engine, stream, result, predicate=predicate, app_version=micros(tick - EPOCH), kind="period")
        return result.num_rows, version, (scan.files_read, scan.files_total)

    return _recorded(engine, stream, kind="period", fire_time=tick, time_range=(prev_tick, tick),
                     versions=lambda table: dict(versions), body=body)


def _tick_versions(engine: "Engine", stream: Stream, tick: datetime) -> tuple[int, int]:
    """The trigger-table versions ``(after, until]`` whose rows are this tick's ``%%trows``; recorded
    so a retried tick reads the same rows. The first tick only sets the baseline."""
    uri = state_uri(engine, stream, "ticks")
    rows = pa.table(DeltaTable(uri).scan()).to_pylist() if DeltaTable.is_deltatable(uri) else []
    for r in rows:
        if r["tick"] == tick:
            return r["after"], r["until"]
    until = engine.storage.version(stream.trigger_table)
    earlier = [r["until"] for r in rows if r["tick"] < tick]
    after = max(earlier) if earlier else until
    write_deltalake(uri, pa.table({"tick": pa.array([tick], pa.timestamp("us", tz="UTC")),
                                   "after": pa.array([after], pa.int64()), "until": pa.array([until], pa.int64())}),
                    mode="append")
    return after, until


def stream_created(engine: "Engine", stream: Stream, *, now: datetime) -> datetime:
    """When the stream (this statement of it) was first seen: PERIOD's creation day, recorded in
    ``_cq/streams/<name>/created`` the first time it is asked for."""
    from .stream_sensor import definition_hash

    uri = state_uri(engine, stream, "created")
    digest = definition_hash(stream)
    if DeltaTable.is_deltatable(uri):
        for row in pa.table(DeltaTable(uri).scan()).to_pylist():
            if row["definition"] == digest:
                return row["created"]
    write_deltalake(uri, pa.table({"definition": [digest], "created": pa.array([now], pa.timestamp("us", tz="UTC"))}),
                    mode="overwrite")
    return now


def recalculate_stream(engine: "Engine", stream: Stream, *, start: datetime, end: datetime | None,
                       now: datetime) -> "RunResult":
    """``RECALCULATE STREAM s FROM start [TO end]`` (not for PERIOD, as seed 000 says)."""
    from .stream_sensor import table_span

    if isinstance(stream.trigger, PeriodTrigger):
        raise CQError(f"{stream.name!r} is a PERIOD stream: RECALCULATE applies to every other trigger type")
    table, time_column = _source_table(engine, stream)
    version = engine.storage.version(table)
    span = table_span(engine.storage.uri(table), version=version, time_column=time_column,
                      storage_options=engine.storage.storage_options)
    if span.max_time is None:
        raise CQError(f"recalculate: trigger table {table!r} of {stream.name!r} holds no rows")
    end = end or span.max_time + _US
    if end <= start:
        raise CQError(f"recalculate: empty range [{iso(start)}, {iso(end)})")
    work = st.recalculation_work(stream, version=version, start=start, end=end, max_event=span.max_time,
                                 now=now, tz=engine.settings.timezone)
    if not work.windows and work.close_until is None:
        raise CQError(f"recalculate: no closed window of {stream.name!r} holds event time in [{iso(start)}, {iso(end)})")
    return run_work(engine, stream, work)
