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
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cq_engine.context import EngineContext, RunResult
from cq_engine.durations import micros
from cq_engine.errors import CQError
from cq_engine.model import (
    DATA_SHAPED,
    EkSessionTrigger,
    EkSlidingTrigger,
    PeriodTrigger,
    SessionTrigger,
    SlidingTrigger,
    Stream,
    statement_hash,
)
from cq_engine.notify import outbox as notify_outbox
from cq_engine.resample.run import SINGLE_PARTITION_BYTES
from cq_engine.storage.base import Scan
from cq_engine.storage.delta import groups_predicate, ranges_predicate, storable_schema
from cq_engine.streams import timing as st
from cq_engine.streams.bounds import with_neighbours, with_outside
from cq_engine.streams.compose import query_result
from cq_engine.streams.events import NOTIFY_OK, build_events
from cq_engine.streams.frontier import RESUME, frontier_table, load_frontier, restarts, save_frontier, state_name
from cq_engine.streams.joins import with_joins
from cq_engine.streams.late import late_entries, without_late
from cq_engine.streams.output import GROUP_ID
from cq_engine.streams.plan import (
    ENGINE_COLUMNS,
    GROUP,
    PERIOD_COLUMNS,
    instant,
    join_source,
    partition_columns,
    period_frame,
    prepare,
    row_stats_needed,
    time_bounds,
    window_frame,
    with_empty_windows,
    with_placeholders,
    with_row_time,
)
from cq_engine.streams.sensor import table_span
from cq_engine.streams.sink import gone_groups, write_sink
from cq_engine.streams.windows.tdengine import (
    CLOSE_ROW,
    NEXT_STATE,
    OPEN_ROW,
    PREV_STATE,
    SHORT,
    STATE,
    WCLOSED,
    WEND,
    WLAST,
    WROWS,
    WSTART,
    assign_windows,
)
from cq_engine.times import EPOCH, UTC, epoch_ms, iso

_US = timedelta(microseconds=1)
_FAR = datetime(9999, 1, 1, tzinfo=UTC)
EMPTY_WINDOW_LIMIT = 1_000_000  # empty windows of one eKuiper run made rows (a local relation's size)
_PHASE = "__cq_count_phase"
_SHORT_ROWS = "__cq_short_rows"
_RESUMED = "__cq_resumed_at"


def _in_ranges(column: str, ranges) -> F.Column:
    c = F.unix_micros(F.col(column))
    cond = None
    for a, b in ranges:
        part = (c >= F.lit(micros(a - EPOCH))) & (c < F.lit(micros(b - EPOCH)))
        cond = part if cond is None else (cond | part)
    return cond if cond is not None else F.lit(False)


def _source_table(ctx: EngineContext, stream: Stream) -> tuple[str, str]:
    table = stream.trigger_source
    return table, ctx.source_time_column(stream.name, table, sink=stream.sink, role="trigger")


def run_work(ctx: EngineContext, stream: Stream, work: st.StreamWork) -> RunResult:
    """Execute one window-triggered stream run (real time, history chunk or recalculation)."""
    return record_work(ctx, stream, work, body=lambda: plan_work(ctx, stream, work).run())


def record_work(
    ctx: EngineContext, stream: Stream, work: st.StreamWork, *, body: Callable[[], _Outcome], into: list | None = None
) -> RunResult:
    """``body`` (the work's run) recorded as ``run_work`` records it (``into``: see ``_recorded``)."""
    if isinstance(stream.trigger, PeriodTrigger):
        raise CQError(f"{stream.name} is a PERIOD stream: it runs per tick (cq tick / its schedule)")
    lo, hi = st.work_range(stream, work, ctx.settings.timezone)
    revision = f"{work.kind}:{work.version}:{iso(work.tick) if work.tick else ''}"
    versions = {stream.trigger_source: work.version}
    return _recorded(
        ctx,
        stream,
        kind=work.kind,
        fire_time=work.tick,
        time_range=(lo, hi),
        versions=versions,
        revision=revision,
        body=body,
        into=into,
    )


def plan_work(ctx: EngineContext, stream: Stream, work: st.StreamWork, *, reads: dict | None = None) -> Planned:
    """Plan ``work`` (no Spark job runs, except for late data's restart points and deleted groups);
    ``reads`` shares identical snapshot reads between the runs of a round."""
    if isinstance(stream.trigger, PeriodTrigger):
        raise CQError(f"{stream.name} is a PERIOD stream: it runs per tick (cq tick / its schedule)")
    planner = _plan_data_shaped if stream.trigger.kind in DATA_SHAPED else _plan_time_windows
    return planner(ctx, stream, work, reads)


@dataclass
class _Outcome:
    """What a run's body did: rows written, the sink version, files scanned, and for events the
    result rows (engine columns included) and which windows it replaced."""

    rows: int
    version: int | None
    scanned: tuple[int, int]
    result: pa.Table | None = None
    replaced: Callable[[int, datetime], bool] = lambda group, start: False
    ignored: tuple[st.Ignored, ...] = ()  # windows the run dropped (TRUE_FOR)


@dataclass
class Planned:
    """A stream run planned, not executed (``plan_work``): the Spark plan of its result rows (built on
    demand) and the step that commits what they say (sink, frontier) once they are in Arrow."""

    stream: Stream
    work: st.StreamWork
    build: Callable[[], DataFrame] | None  # None: nothing to compute (only deleted groups to drop)
    finish: Callable[[pa.Table | None], _Outcome]
    read: tuple | None = None  # its trigger-table read: (table, time column, range, version)
    windows: DataFrame | None = None  # the windowed trigger rows the query evaluates (None: not shareable)
    keep: tuple[str, ...] = ()  # the engine columns its result keeps (``_keep``)
    state: tuple | None = None  # data-shaped windows: what its windowed rows depend on (frontier included)

    def run(self) -> _Outcome:
        """Compute (one Spark job) and commit."""
        return self.finish(self.build().toArrow() if self.build is not None else None)


def _read(
    ctx: EngineContext, table: str, time_column: str, read_range, version: int, reads: dict | None, late: tuple = ()
):
    """``storage.read_range`` of the trigger table, shared through ``reads`` when the same; without
    the rows ``late`` drops (``streams.late``: eKuiper's lateTolerance)."""
    key = (table, time_column, read_range, version, late)
    if reads is not None and key in reads:
        return reads[key]
    df, scan = ctx.storage.read_range(ctx.spark, table, time_column=time_column, time_range=read_range, version=version)
    if late and scan.files_read:
        df = without_late(ctx, df, late, time_column)
    if 0 <= scan.bytes_read <= SINGLE_PARTITION_BYTES:
        # A live run's few seconds of rows: one partition, so its window functions and aggregations
        # need no shuffle and the job is one stage (as a firing's, ``resample.run``).
        df = df.coalesce(1)
    out = (df, scan)
    if reads is not None:
        reads[key] = out
    return out


def _recorded(
    ctx: EngineContext,
    stream: Stream,
    *,
    kind,
    fire_time,
    time_range,
    versions: dict[str, int],
    revision: str,
    body: Callable[[], _Outcome],
    into: list | None = None,
) -> RunResult:
    """Run ``body`` inside the ledger's recording (``versions``: the source versions read, which the
    body may still fill in), then hand its events to NOTIFY. ``into``: the ledger entry is appended
    there, for one ``Ledger.record_many`` commit of many runs."""
    _ = ctx.spark  # a session start is not part of the run's cost
    clock = time.perf_counter()
    recording = ctx.ledger.recording(
        definition=stream.name, kind=kind, fire_time=fire_time, time_range=time_range, into=into
    )
    with recording as rec:
        rec.source_versions = versions
        out = body()
        rec.rows_written, rec.sink_version = out.rows, out.version
    for item in out.ignored:
        ctx.ledger.note_ignored(
            definition=stream.name, fire_time=fire_time, span=item.span, source_versions=versions, text=item.text
        )
    notified = _notify(ctx, stream, out, kind=kind, revision=revision)
    return RunResult(
        definition=stream.name,
        kind=kind,
        fire_time=fire_time,
        time_range=time_range,
        rows_written=out.rows,
        sink_version=out.version if out.version is not None else -1,
        source_versions=dict(versions),
        files_read=out.scanned[0],
        files_total=out.scanned[1],
        seconds=time.perf_counter() - clock,
        notified=notified,
        ignored=tuple(i.text for i in out.ignored),
    )


def _notify(ctx: EngineContext, stream: Stream, out: _Outcome, *, kind: str, revision: str) -> int:
    """After the sink commit: the run's events into the outbox, then delivery (``notify_outbox``)."""
    notify = stream.notify
    if notify is None or out.result is None or (kind == "history" and not notify.history):
        return 0
    now_ms, rows = epoch_ms(datetime.now(UTC)), out.result.to_pylist()
    return notify_outbox.publish(
        ctx,
        stream,
        lambda reported: build_events(
            stream, rows, reported=reported, replaced=out.replaced, revision=revision, now_ms=now_ms
        ),
    )


def _keep(stream: Stream, windows) -> list[str]:
    """Engine columns a run keeps in its result: state bookkeeping, and what events report."""
    keep = [*ENGINE_COLUMNS, *partition_columns(stream)]
    if stream.notify is not None:
        keep += [c for c in (WEND, STATE, PREV_STATE, NEXT_STATE, OPEN_ROW, CLOSE_ROW) if c in windows.columns]
    return keep


def _empty_grid(ctx: EngineContext, stream: Stream, work: st.StreamWork) -> DataFrame | None:
    """eKuiper's ungrouped TUMBLING/HOPPING rules emit every window of the grid, empty ones too: the
    run's windows (``work.windows``, from the first event's on) as frame rows without source rows,
    so ``with_empty_windows`` makes them rows of NULL aggregates (``Stream.empty_window_rows``)."""
    trig = stream.trigger
    if stream.form != "ekuiper" or not stream.empty_window_rows or not isinstance(trig, SlidingTrigger):
        return None
    if trig.interval is None:
        return None
    starts = st.grid_starts(trig, work.windows, limit=EMPTY_WINDOW_LIMIT)
    if not starts:
        return None
    until = work.close_until or _FAR
    grid = ctx.spark.createDataFrame([(t,) for t in starts], f"{WSTART} timestamp")
    grid = grid.withColumn(WEND, F.timestamp_micros(F.unix_micros(F.col(WSTART)) + F.lit(micros(trig.interval))))
    grid = grid.withColumn(WCLOSED, F.col(WEND) <= instant(until))
    return with_placeholders(stream, grid, tick=work.tick, tz=ctx.settings.timezone)


def _compute(ctx: EngineContext, stream: Stream, windows, keep: list[str], *, read_range, version: int, grid=None):
    """The run's result rows: the query over every window (one Spark plan), the windows without a
    result (FORCE_OUTPUT, events, eKuiper's empty windows: ``grid``), and NOTIFY's WHERE."""
    empties = stream.empty_window_rows or stream.notify is not None
    frame = window_frame(stream, windows) if (empties or any(q.reads != "trows" for q in stream.leaves)) else None
    if grid is not None and frame is not None:
        frame = frame.unionByName(
            grid.select(*[c for c in grid.columns if c in frame.columns]), allowMissingColumns=True
        )

    def rows_of(q: Stream) -> tuple[DataFrame, bool]:
        if q.reads == "trows":
            return with_joins(ctx, stream, q, windows, time_range=read_range), False
        assert frame is not None  # built whenever a query reads another table
        source, time_column = _joined_table(ctx, q, read_range, version)
        source = with_row_time(stream, source, time_column)  # the joined rows' own event time
        return join_source(q, frame, source, time_column=time_column, bin=_bin(q)), True

    result = query_result(stream, rows_of, keep=keep)
    if empties:
        assert frame is not None  # built whenever empties are
        result = with_empty_windows(stream, result, frame, keep)
    if stream.notify is not None and stream.notify.where:
        result = result.withColumn(NOTIFY_OK, F.coalesce(F.expr(stream.notify.where), F.lit(False)))
    return result


def _joined_table(ctx: EngineContext, stream: Stream, read_range, version: int):
    """The table a query reads besides %%trows: only the event time its windows can reach when the
    WHERE bounds the time column by window placeholders, else all of it."""
    table = stream.read_table
    time_column = ctx.source_time_column(stream.name, table, sink=stream.sink)
    pinned = version if table == stream.trigger_table else None
    bounded = read_range if time_bounds(stream.where, time_column) else None
    df, _ = ctx.storage.read_range(ctx.spark, table, time_column=time_column, time_range=bounded, version=pinned)
    return df, time_column


def _bin(stream: Stream) -> timedelta:
    """The range join's bucket: about one window (time windows), the gap (sessions), else a minute."""
    trig = stream.trigger
    if isinstance(trig, SlidingTrigger):
        return st.window_length(trig)
    return trig.gap if isinstance(trig, SessionTrigger) else timedelta(minutes=1)


def _plan_time_windows(ctx: EngineContext, stream: Stream, work: st.StreamWork, reads: dict | None) -> Planned:
    table, time_column = _source_table(ctx, stream)
    tz = ctx.settings.timezone
    build, windows, read_range, scanned = None, None, None, (0, 0)
    keep: tuple[str, ...] = ()
    since = work.origin if work.kind == "realtime" else None
    late = late_entries(ctx, stream) if work.kind != "recalculate" else ()
    if work.windows:
        assert isinstance(stream.trigger, SlidingTrigger)  # the only trigger with time windows
        lo, hi = work.windows[0][0], work.windows[-1][1] + st.window_length(stream.trigger)
        read_range = (lo, hi)
        df, scan = _read(ctx, table, time_column, read_range, work.version, reads, late)
        if since is not None:  # history without FILL_HISTORY (``timing.plan_tick``)
            df = df.filter(F.col(time_column) >= instant(since))
        rows = with_neighbours(stream, prepare(stream, df), time_column)  # TWA's points around windows
        windows = assign_windows(
            rows,
            stream.trigger,
            time_column=time_column,
            keys=list(stream.partition_by),
            close_until=work.close_until or _FAR,
            timezone=tz,
            row_stats=row_stats_needed(stream),
            columns=_row_columns(stream, rows, scan, bool(late)),
        )
        windows = with_row_time(stream, windows.filter(_in_ranges(WSTART, work.windows)), time_column)
        windows = with_placeholders(stream, windows, tick=work.tick, tz=tz)
        keep = tuple(_keep(stream, windows))
        computed, around = windows, (table, time_column, read_range, work.version)
        grid = _empty_grid(ctx, stream, work)
        build = lambda: _compute(
            ctx,
            stream,
            with_outside(ctx, stream, computed, around),
            list(keep),
            read_range=(lo, hi),
            version=work.version,
            grid=grid,
        )
        scanned = (scan.files_read, scan.files_total)

    def finish(result: pa.Table | None) -> _Outcome:
        gone = gone_groups(ctx, stream, work.version) if work.deleted else []
        ranges = _written_ranges(stream, work, tz)
        rows, version = write_sink(
            ctx,
            stream,
            result,
            open_ok=work.write_open,
            gone=gone,
            ranges_of=lambda column: ranges_predicate(column, st.key_ranges(stream, ranges, tz)),
            app_version=work.version,
            kind=work.kind,
        )

        def replaced(group: int, start: datetime) -> bool:
            return group in gone or any(a <= start < b for a, b in ranges)

        return _Outcome(rows, version, scanned, result, replaced)

    read = (table, time_column, read_range, work.version, since, late) if read_range else None
    return Planned(stream, work, build, finish, read, windows, keep)


# (stream, read shape) -> the columns of its prepared trigger rows: they depend on the definition and
# the trigger table's columns, not on the versions or ranges read. A sensor evaluation asked a Connect
# server for them (a schema request, a round trip) for every work of every stream.
_ROW_COLUMNS: dict[tuple, list[str]] = {}
_ROW_COLUMNS_KEPT = 512


def _row_columns(stream: Stream, rows: DataFrame, scan: Scan, *variant: bool) -> list[str]:
    """``rows.columns``, asked of Spark once per ``stream``, trigger table columns (``scan.columns``,
    from the Delta log; without them, every time) and ``variant`` (what else shaped ``rows``)."""
    if not scan.columns:
        return list(rows.columns)
    key = (stream, scan.table, scan.columns, *variant)
    try:
        found = _ROW_COLUMNS.get(key)
    except TypeError:  # a definition holding something unhashable: asked every time
        return list(rows.columns)
    if found is None:
        if len(_ROW_COLUMNS) >= _ROW_COLUMNS_KEPT:
            _ROW_COLUMNS.clear()
        found = _ROW_COLUMNS[key] = list(rows.columns)
    return found


def _written_ranges(stream: Stream, work: st.StreamWork, tz: str) -> list[tuple[datetime, datetime]]:
    """The window starts whose rows the run replaces: all of its windows, or only the closed ones when
    open windows are computed just to notify (their partial rows, if any, stay)."""
    if work.write_open or work.close_until is None:
        return list(work.windows)
    assert isinstance(stream.trigger, SlidingTrigger)  # the only trigger with time windows
    closed = st.starts_ending_in(stream.trigger, EPOCH, work.close_until, tz)
    if closed is None:
        return []
    return [(a, min(b, closed[1])) for a, b in work.windows if a < closed[1]]


# --- data-shaped windows ---------------------------------------------------------------------------


def _plan_data_shaped(ctx: EngineContext, stream: Stream, work: st.StreamWork, reads: dict | None) -> Planned:
    table, time_column = _source_table(ctx, stream)
    tz = ctx.settings.timezone
    keys = list(stream.partition_by)
    frontier, gids, saved_fields = load_frontier(ctx, stream, keys)
    origin = work.origin or EPOCH
    restarted: dict[tuple, datetime] = {}
    if work.recompute_from is not None:
        found = restarts(ctx, stream, work.recompute_from)
        for g in frontier:
            gid = gids.get(g)
            restarted[g] = min(frontier[g], found.get(gid, origin) if gid is not None else origin)
        frontier.update(restarted)
    lo = min([origin, *frontier.values()])
    hi = None if work.emit_open else (work.close_until + _US if work.close_until else None)
    read_range = (lo, hi) if hi is not None else (lo, _FAR)
    late = late_entries(ctx, stream) if work.kind != "recalculate" else ()
    df, scan = _read(ctx, table, time_column, read_range, work.version, reads, late)
    true_for = getattr(stream.trigger, "true_for", None) is not None
    # Everything the windowed rows depend on: streams of a round that agree on it (one table, trigger,
    # partitioning and frontier: created together, as streams over one table often are) get the same
    # frame, so its schema is asked once and ``streams.fused`` evaluates them in one aggregation.
    state = (
        (table, time_column, read_range, work.version, late),
        stream.trigger,
        tuple(keys),
        stream.partition_exprs,
        stream.options.pre_filter,
        stream.where if stream.form == "old" else None,
        frozenset(frontier.items()),
        frozenset(gids.items()),
        tuple(str(f) for f in saved_fields),
        origin,
        work.close_until,
    )
    base = reads.get(state) if reads is not None else None
    if base is None:
        marks = frontier_table(frontier, gids, saved_fields) if frontier else None
        base = _windowed_rows(
            ctx,
            stream,
            prepare(stream, df),
            time_column=time_column,
            marks=marks,
            origin=origin,
            close_until=work.close_until or lo,
            scan=scan,
            late=bool(late),
        )
        if reads is not None:
            reads[state] = base
    windows = with_placeholders(stream, with_row_time(stream, base, time_column), tick=work.tick, tz=tz)
    short = None
    if true_for:
        short = _short_windows(stream, windows)
        windows = windows.filter(~F.col(SHORT)).drop(SHORT)
    slack = stream.trigger.gap if isinstance(stream.trigger, SessionTrigger) else timedelta(0)
    keep = tuple(_keep(stream, windows))

    def build() -> DataFrame:
        computed = _compute(
            ctx, stream, windows, list(keep), read_range=(lo, hi + slack if hi else _FAR), version=work.version
        )
        if short is not None:  # the dropped windows ride along in the same job, one row each
            computed = computed.withColumn(SHORT, F.lit(False)).unionByName(short, allowMissingColumns=True)
        return computed

    def finish(result: pa.Table | None) -> _Outcome:
        assert result is not None  # a data-shaped run always computes
        pcols = partition_columns(stream)
        groups = list(zip(*[result.column(c).to_pylist() for c in pcols])) if keys else [()] * result.num_rows
        starts, closed, last, ids = (result.column(c).to_pylist() for c in (WSTART, WCLOSED, WLAST, GROUP))
        dropped = result.column(SHORT).to_pylist() if short is not None else [False] * result.num_rows
        moved: dict[tuple, datetime] = {}
        open_start: dict[tuple, datetime] = {}
        bounds = {g: frontier.get(g, origin) for g in set(groups)}
        complete = []
        for g, s, c, t, gid in zip(groups, starts, closed, last, ids):
            gids[g] = gid
            # A closed window starting before its group's resume point (eKuiper's sliding windows look back)
            # saw only part of its rows; it was written by the run that saw all of them.
            complete.append(not (c and s < bounds[g]))
            if not complete[-1]:
                continue
            if c:
                moved[g] = max(moved.get(g, EPOCH), t + _US)
            else:
                open_start[g] = min(open_start.get(g, _FAR), s)
        ignored: tuple[st.Ignored, ...] = ()
        if short is not None:
            gone_short = [i for i, (d, c) in enumerate(zip(dropped, complete)) if d and c]
            if gone_short:
                rows_dropped = sum(result.column(_SHORT_ROWS).to_pylist()[i] or 0 for i in gone_short)
                ignored = (st.true_for_ignored(stream, [starts[i] for i in gone_short], rows_dropped),)
            complete = [c and not d for c, d in zip(complete, dropped)]
        if not all(complete):
            result = result.filter(pa.array(complete, pa.bool_()))
        if short is not None:
            result = result.drop_columns([SHORT, _SHORT_ROWS])
        if isinstance(stream.trigger, EkSlidingTrigger):  # a later row's window reaches back `size` (inclusive)
            moved = {g: m - _US - stream.trigger.size for g, m in moved.items()}
        new_frontier = dict(frontier)
        new_frontier.update(moved)
        new_frontier.update(open_start)
        bounds.update(restarted)
        by_gid = {gids[g]: b for g, b in bounds.items() if g in gids}
        gone = gone_groups(ctx, stream, work.version) if work.deleted else []
        rows, version = 0, None
        if by_gid or gone:
            rows, version = write_sink(
                ctx,
                stream,
                result,
                open_ok=work.emit_open and work.write_open,
                gone=gone,
                ranges_of=lambda column: groups_predicate(
                    column, [GROUP_ID], sorted(((g,), b) for g, b in by_gid.items())
                ),
                app_version=work.version,
                kind=work.kind,
            )
        key_fields = list(
            storable_schema(pa.schema([result.schema.field(c).with_name(k) for c, k in zip(pcols, keys)]))
        )
        save_frontier(
            ctx, stream, new_frontier, gids, key_fields, app_id=f"cq-engine/{stream.name}", app_version=work.version
        )

        def replaced(group: int, start: datetime) -> bool:
            return group in gone or (group in by_gid and start >= by_gid[group])

        return _Outcome(rows, version, (scan.files_read, scan.files_total), result, replaced, ignored)

    shareable = None if true_for else windows  # TRUE_FOR's dropped windows are a branch of their own
    return Planned(stream, work, build, finish, state[0], shareable, keep, state)


def _windowed_rows(
    ctx: EngineContext,
    stream: Stream,
    df: DataFrame,
    *,
    time_column: str,
    marks: pa.Table | None,
    origin: datetime,
    close_until: datetime,
    scan: Scan,
    late: bool,
) -> DataFrame:
    """The trigger rows (``df``, read as ``scan``, without late rows if ``late``) from each group's
    frontier (``marks``, None: none saved) on, segmented into windows (``assign_windows``)."""
    keys = list(stream.partition_by)
    if marks is not None:
        marks = marks.drop_columns([GROUP]).rename_columns([f"__cq_k{i}" for i in range(len(keys))] + [RESUME])
        fr = F.broadcast(ctx.spark.createDataFrame(marks))
        cond = [F.col(k).eqNullSafe(F.col(f"__cq_k{i}")) for i, k in enumerate(keys)]
        df = df.join(fr, on=cond, how="left") if cond else df.crossJoin(fr)
        df = df.filter(F.col(time_column) >= F.coalesce(F.col(RESUME), instant(origin)))
        resumed = F.col(RESUME).isNotNull() & (F.col(RESUME) > instant(origin))
        if stream.trigger.kind == "count":  # a resumed group's first row starts a window
            df = df.withColumn(_PHASE, F.when(resumed, F.lit(0)))
        if isinstance(stream.trigger, EkSessionTrigger):  # a window resumed after a cut starts there
            df = df.withColumn(_RESUMED, F.when(resumed, F.col(RESUME)))
        df = df.drop(RESUME, *[f"__cq_k{i}" for i in range(len(keys))])
    phase = _PHASE if marks is not None and stream.trigger.kind == "count" else None  # (no schema round trip)
    resumed_at = _RESUMED if marks is not None and isinstance(stream.trigger, EkSessionTrigger) else None
    return assign_windows(
        df,
        stream.trigger,
        time_column=time_column,
        keys=keys,
        close_until=close_until,
        timezone=ctx.settings.timezone,
        count_phase_column=phase,
        session_start_column=resumed_at,
        mark_short=getattr(stream.trigger, "true_for", None) is not None,
        columns=_row_columns(stream, df, scan, late, marks is not None),
    )


def _short_windows(stream: Stream, windows):
    """One row per closed window TRUE_FOR drops: what the frontier needs (group, start, last row,
    closed), its row count, and ``SHORT``; unioned into the run's result rather than a job of its own."""
    pcols = partition_columns(stream)
    return (
        windows.filter(F.col(SHORT))
        .groupBy(*pcols, GROUP, WSTART)
        .agg(F.max(WLAST).alias(WLAST), F.max(WROWS).alias(_SHORT_ROWS))
        .withColumns({WCLOSED: F.lit(True), SHORT: F.lit(True)})
    )


# --- PERIOD ---------------------------------------------------------------------------------------


def _period_tick(stream: Stream, tick: datetime, ticks) -> tuple[datetime, datetime]:
    """Check ``tick`` is a PERIOD tick; the ticks before and after it (``_tprev/_tnext_localtime``)."""
    trig = stream.trigger
    assert isinstance(trig, PeriodTrigger)  # only PERIOD streams tick
    span = max(trig.period, timedelta(days=1)) * 2
    if not ticks.is_tick(tick):
        nxt = ticks.between(tick, tick + span)
        raise CQError(
            f"{iso(tick)} is not a PERIOD tick of {stream.name!r}" + (f"; next: {iso(nxt[0])}" if nxt else "")
        )
    after = ticks.between(tick + _US, tick + span)
    return ticks.range_of(tick)[0], (after[0] if after else tick + trig.period)


def run_period(ctx: EngineContext, stream: Stream, tick: datetime, *, ticks, once: bool = False) -> RunResult:
    """One PERIOD tick (``ticks``: the stream's ``ticks.Ticks``): the subquery over ``%%trows`` (rows
    committed to the trigger table since the previous tick) or over its FROM table, written at the
    tick's time. ``once``: a tick whose sink holds it, or a later tick, already (committed by another
    run at the same time) raises ``AlreadyCommitted`` and is recorded nowhere, as a continuous
    query's firing in a batch run is; the ledger's check alone sees only the runs before."""
    prev_tick, next_tick = _period_tick(stream, tick, ticks)
    versions: dict[str, int] = {}
    paused = notify_outbox.gate(ctx, stream)
    if paused:  # ON_FAILURE PAUSE: a tick does not run past undelivered notifications
        raise CQError(f"{stream.name}: {paused}; tick {iso(tick)} not run")

    def body() -> _Outcome:
        frame_of = lambda d: period_frame(stream, d, tick=tick, prev_tick=prev_tick, next_tick=next_tick)
        read: dict[tuple[str, str], DataFrame] = {}
        scanned = [0, 0]

        def rows_of(q: Stream) -> tuple[DataFrame, bool]:
            table, trows = q.read_table, q.reads == "trows"
            if (table, str(trows)) not in read:
                time_column = ctx.source_time_column(stream.name, table, sink=stream.sink)
                if trows:
                    after, until = _tick_versions(ctx, stream, tick)
                    df, scan = ctx.storage.read_added(
                        ctx.spark, table, after=after, until=until, time_column=time_column
                    )
                    versions[table] = until
                else:
                    df, scan = ctx.storage.read_range(ctx.spark, table, time_column=time_column, time_range=None)
                    versions.setdefault(table, scan.version)
                scanned[0] += scan.files_read
                scanned[1] += scan.files_total
                read[table, str(trows)] = frame_of(with_row_time(stream, prepare(stream, df), time_column))
            return with_joins(ctx, stream, q, read[table, str(trows)], time_range=None), False

        keep = [GROUP, WSTART, WEND, WCLOSED, *partition_columns(stream)]
        result = query_result(stream, rows_of, keep=keep, window_columns=PERIOD_COLUMNS)
        if stream.options.force_output or stream.notify is not None:
            # Without PARTITION BY a tick always has its one window, rows or not; with it, the groups seen.
            frame = frame_of(ctx.spark.range(1)) if not stream.partition_by else rows_of(stream.leaves[0])[0]
            result = with_empty_windows(stream, result, frame.select(*keep, *PERIOD_COLUMNS).distinct(), keep)
        if stream.notify is not None and stream.notify.where:
            result = result.withColumn(NOTIFY_OK, F.coalesce(F.expr(stream.notify.where), F.lit(False)))
        result = result.toArrow()
        written, version = write_sink(
            ctx,
            stream,
            result,
            open_ok=True,
            gone=[],
            ranges_of=lambda column: ranges_predicate(
                column, [(prev_tick, tick) if stream.key_bound == "row" else (tick, tick + _US)]
            ),
            app_version=micros(tick - EPOCH),
            kind="period",
            once=once,
        )
        return _Outcome(written, version, (scanned[0], scanned[1]), result, lambda group, start: start == prev_tick)

    return _recorded(
        ctx,
        stream,
        kind="period",
        fire_time=tick,
        time_range=(prev_tick, tick),
        versions=versions,
        revision=f"period:{iso(tick)}",
        body=body,
    )


def _tick_versions(ctx: EngineContext, stream: Stream, tick: datetime) -> tuple[int, int]:
    """The trigger-table versions ``(after, until]`` whose rows are this tick's ``%%trows``; recorded
    so a retried tick reads the same rows. The first tick only sets the baseline. Recorded once even
    by two runs of the tick at the same moment (the tick as the append's application transaction):
    the second reads the first's, so the tick after reads on from the versions the sink was written
    with, not from a loser's later ``until``."""
    name = state_name(stream, "ticks")

    def recorded() -> tuple[list[dict], tuple[int, int] | None]:
        table = ctx.storage.read_state(name)
        rows = table.to_pylist() if table is not None else []
        return rows, next(((r["after"], r["until"]) for r in rows if r["tick"] == tick), None)

    rows, found = recorded()
    if found is not None:
        return found
    assert stream.trigger_table is not None  # %%trows reads the trigger table
    until = ctx.storage.version(stream.trigger_table)
    earlier = [r["until"] for r in rows if r["tick"] < tick]
    after = max(earlier) if earlier else until
    row = pa.table(
        {
            "tick": pa.array([tick], pa.timestamp("us", tz="UTC")),
            "after": pa.array([after], pa.int64()),
            "until": pa.array([until], pa.int64()),
        }
    )
    if ctx.storage.append_state(name, row, once=(f"cq-engine/{stream.name}/ticks", micros(tick - EPOCH))):
        return after, until
    rows, found = recorded()
    if found is not None:  # another run recorded this tick meanwhile: its versions
        return found
    # A tick before the latest recorded one, run by hand (`cq tick NAME --at`): recorded as it is.
    ctx.storage.append_state(name, row)
    return after, until


def recorded_created(ctx: EngineContext, stream: Stream) -> datetime | None:
    """The stream's recorded creation (see ``stream_created``), or None; reads only."""
    digest = statement_hash(stream)
    recorded = ctx.storage.read_state(state_name(stream, "created"))
    for row in recorded.to_pylist() if recorded is not None else []:
        if row["definition"] == digest:
            return row["created"]
    return None


def stream_created(ctx: EngineContext, stream: Stream, *, now: datetime) -> datetime:
    """When the stream (this statement of it) was first seen: PERIOD's creation day, recorded in
    ``_cq/streams/<name>/created`` the first time it is asked for."""
    recorded = recorded_created(ctx, stream)
    if recorded is not None:
        return recorded
    ctx.storage.overwrite_state(
        state_name(stream, "created"),
        pa.table({"definition": [statement_hash(stream)], "created": pa.array([now], pa.timestamp("us", tz="UTC"))}),
    )
    return now


def recalculate_stream(
    ctx: EngineContext, stream: Stream, *, start: datetime, end: datetime | None, now: datetime
) -> RunResult:
    """``RECALCULATE STREAM s FROM start [TO end]`` (not for PERIOD, as seed 000 says)."""
    if isinstance(stream.trigger, PeriodTrigger):
        raise CQError(f"{stream.name!r} is a PERIOD stream: RECALCULATE applies to every other trigger type")
    table, time_column = _source_table(ctx, stream)
    version = ctx.storage.version(table)
    span = table_span(ctx, table, version=version, time_column=time_column)
    if span.max_time is None:
        raise CQError(f"recalculate: trigger table {table!r} of {stream.name!r} holds no rows")
    end = end or span.max_time + _US
    if end <= start:
        raise CQError(f"recalculate: empty range [{iso(start)}, {iso(end)})")
    work = st.recalculation_work(
        stream, version=version, start=start, end=end, max_event=span.max_time, now=now, tz=ctx.settings.timezone
    )
    if not work.windows and work.close_until is None:
        raise CQError(
            f"recalculate: no closed window of {stream.name!r} holds event time in [{iso(start)}, {iso(end)})"
        )
    return run_work(ctx, stream, work)
