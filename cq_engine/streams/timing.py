"""Timing of window-triggered streams: pure functions from (definition, cursor, new commits, now)
to the work each sensor tick requests. No I/O; ``now`` is always an argument; UTC inside.

A stream's work is a ``StreamWork``: the trigger table's version to read, and either the window
starts to (re)compute (time windows: INTERVAL/SLIDING) or how far to close data-shaped windows
(SESSION, STATE_WINDOW, EVENT_WINDOW, COUNT_WINDOW), which keep per-group state between runs.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timedelta
from typing import Any, ClassVar, Literal
from zoneinfo import ZoneInfo

from cq_engine.durations import format_duration
from cq_engine.errors import CQError
from cq_engine.model import DATA_SHAPED, SlidingTrigger, Stream
from cq_engine.schedule.cron import local_midnight
from cq_engine.times import EPOCH, UTC, iso, parse_time

TimeRange = tuple[datetime, datetime]
WorkKind = Literal["realtime", "history", "recalculate"]
_US = timedelta(microseconds=1)
_DAY = timedelta(days=1)
MAX_RANGES = 64  # more disjoint ranges than this are merged into one covering range


@dataclass(frozen=True)
class Span:
    """Event-time extent of some rows, from Delta statistics: [min_time, max_time] and a row count."""

    min_time: datetime | None
    max_time: datetime | None
    rows: int = 0


@dataclass(frozen=True)
class Change:
    """What one commit did to the trigger table, as the sensor sees it (statistics only)."""

    added: tuple[Span, ...] = ()
    removed: tuple[Span, ...] = ()


FORMAT = 1  # the JSON format of persisted cursors and work; bump on an incompatible change


class _Json:
    """JSON for the frozen dataclasses below: aware datetimes as ISO-8601, time ranges as pairs, and a
    ``format`` (:data:`FORMAT`). JSON without one predates the field and reads as format 1; a newer
    format is a ``CQError``, so an older engine never misreads a newer cursor."""

    _TIMES: tuple[str, ...] = ()
    _RANGES: tuple[str, ...] = ()
    __dataclass_fields__: ClassVar[dict[str, Any]]  # every subclass is a dataclass (for asdict/fields)

    def to_json(self) -> str:
        d = {"format": FORMAT, **asdict(self)}
        for k in self._TIMES:
            d[k] = iso(d[k]) if d[k] is not None else None
        for k in self._RANGES:
            d[k] = [[iso(a), iso(b)] for a, b in d[k]]
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str):
        raw = json.loads(text)
        fmt = raw.get("format", 1)
        if not isinstance(fmt, int) or fmt > FORMAT:
            raise CQError(
                f"{cls.__name__}: format {fmt!r} was written by a newer cq-engine (this one reads "
                f"up to {FORMAT}): {text[:200]}"
            )
        # JSON arrays back to the tuples the frozen dataclasses hold
        d = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in {f.name for f in fields(cls)}}
        t = lambda v: parse_time(v, tz=UTC, bounded=False) if v else None
        for k in cls._TIMES:
            if k in d:
                d[k] = t(d[k])
        for k in cls._RANGES:
            d[k] = tuple((t(a), t(b)) for a, b in d.get(k, ()))
        return cls(**d)


@dataclass(frozen=True)
class StreamWork(_Json):
    """One run of a window-triggered stream: its output is a pure function of these fields (and,
    for data-shaped windows, of the per-group state the previous run left)."""

    version: int
    kind: WorkKind = "realtime"
    windows: tuple[TimeRange, ...] = ()  # time windows: those whose start lies in these ranges
    close_until: datetime | None = None  # data-shaped: windows closed by this watermark
    emit_open: bool = False  # also write open windows' partial results
    recompute_from: datetime | None = None  # data-shaped: recompute windows from this event time
    origin: datetime | None = None  # data-shaped: where a group without state starts
    tick: datetime | None = None  # processing time of the tick (``_tlocaltime``)
    write_open: bool = True  # False: open windows are computed only for WINDOW_OPEN notifications
    deleted: bool = False  # rows were removed from the trigger table (DELETE_OUTPUT_TABLE looks)
    ignored: tuple[str, ...] = ()  # rows the tick that requested the run left out, and why (TickPlan.ignored)
    closed_from: datetime | None = None  # data-shaped: the watermark before this run (for its shown range)

    _TIMES = ("close_until", "recompute_from", "origin", "tick", "closed_from")
    _RANGES = ("windows",)


@dataclass(frozen=True)
class StreamCursor(_Json):
    """The sensor's memory between ticks (stored as JSON in the Dagster cursor)."""

    version: int  # last trigger-table version seen
    created: datetime  # processing time of the first tick: the stream's creation
    max_event: datetime | None = None  # largest event time seen (Delta statistics)
    closed_until: datetime | None = None  # windows ending at or before this are done (watermark T)
    origin: datetime | None = None  # data-shaped: start of a group without state
    last_partial: datetime | None = None  # processing time of the last MAX_DELAY emission
    pending: tuple[TimeRange, ...] = ()  # CONTINUOUS_WINDOW_CLOSE: changes awaiting recalculation
    last_recalc: datetime | None = None
    definition: str = ""  # hash of the statement the cursor belongs to

    _TIMES = ("created", "max_event", "closed_until", "origin", "last_partial", "last_recalc")
    _RANGES = ("pending",)


@dataclass(frozen=True)
class Ignored:
    """Rows a tick leaves out: which (a row count from file statistics, their event time), and the
    line that says why and how to get them computed."""

    what: str  # history | late | expired (rows a tick leaves out) | true_for (windows a run drops)
    rows: int
    span: TimeRange  # [first, last] event time
    text: str


@dataclass(frozen=True)
class TickPlan:
    """What one sensor evaluation decided: the new cursor and the runs to request, in order."""

    cursor: StreamCursor
    works: tuple[StreamWork, ...] = ()
    reason: str = ""
    ignored: tuple[Ignored, ...] = ()  # rows left out: which rows and windows, why, and the fix


# --- window grids of time windows ----------------------------------------------------------------


def tick_floor(trigger: SlidingTrigger, t: datetime, tz: str) -> datetime:
    """The latest sliding-only tick at or before ``t`` (PERIOD's day-reset rule, in event time)."""
    zone, s = ZoneInfo(tz), trigger.sliding
    if s >= _DAY:
        base = _base(datetime(1970, 1, 1).date(), zone, trigger)
        return base + ((t - base) // s) * s
    day = _day_of(t, zone, trigger)
    base = _base(day, zone, trigger)
    return base + ((t - base) // s) * s


def tick_after(trigger: SlidingTrigger, t: datetime, tz: str) -> datetime:
    """The first sliding-only tick strictly after ``t`` (a day's last window may be shorter)."""
    zone = ZoneInfo(tz)
    floor = tick_floor(trigger, t, tz)
    if trigger.sliding >= _DAY:
        return floor + trigger.sliding
    return min(floor + trigger.sliding, _base(_day_of(floor, zone, trigger) + _DAY, zone, trigger))


def _base(day, zone: ZoneInfo, trigger: SlidingTrigger) -> datetime:
    return local_midnight(day, zone) + trigger.sliding_offset


def _day_of(t: datetime, zone: ZoneInfo, trigger: SlidingTrigger):
    """The local date whose tick sequence ``t`` falls in (before the offset: the previous day's)."""
    day = t.astimezone(zone).date()
    return day if t >= _base(day, zone, trigger) else day - _DAY


def window_length(trigger: SlidingTrigger) -> timedelta:
    """An upper bound of a time window's length."""
    return trigger.interval if trigger.interval is not None else trigger.sliding


def _grid_ceil(trigger: SlidingTrigger, t: datetime) -> datetime:
    """The first INTERVAL window start at or after ``t`` (starts: epoch + offset + k*sliding)."""
    base = EPOCH + trigger.interval_offset
    return base - ((base - t) // trigger.sliding) * trigger.sliding


def _snap(trigger: SlidingTrigger, a: datetime, b: datetime) -> TimeRange | None:
    a, b = _grid_ceil(trigger, a), _grid_ceil(trigger, b)
    return (a, b) if a < b else None


def grid_starts(trigger: SlidingTrigger, ranges: Sequence[TimeRange], *, limit: int) -> list[datetime]:
    """Every INTERVAL window start in the half-open ``ranges`` (at most ``limit`` of them)."""
    assert trigger.interval is not None  # an INTERVAL grid
    out: list[datetime] = []
    for a, b in ranges:
        t = _grid_ceil(trigger, a)
        while t < b and len(out) < limit:
            out.append(t)
            t += trigger.sliding
    return out


def starts_overlapping(trigger: SlidingTrigger, lo: datetime, hi: datetime, tz: str) -> TimeRange:
    """Window starts of the windows that hold any event time in the closed interval [lo, hi]."""
    if trigger.interval is not None:
        return _snap(trigger, lo - trigger.interval + _US, hi + _US) or (lo, lo)
    return tick_floor(trigger, lo, tz), hi + _US


def starts_ending_in(trigger: SlidingTrigger, lo: datetime, hi: datetime, tz: str) -> TimeRange | None:
    """Window starts of the windows whose end lies in (lo, hi]."""
    if hi <= lo:
        return None
    if trigger.interval is not None:
        return _snap(trigger, lo - trigger.interval + _US, hi - trigger.interval + _US)
    # [tick_i, tick_i+1) ends in (lo, hi] iff floor(lo) <= tick_i < floor(hi).
    a, b = tick_floor(trigger, lo, tz), tick_floor(trigger, hi, tz)
    return (a, b) if a < b else None


def key_ranges(stream: Stream, windows: Sequence[TimeRange], tz: str) -> list[TimeRange]:
    """The sink time-column ranges holding exactly the output of windows starting in ``windows``."""
    trig = stream.trigger
    if stream.key_bound == "start" or not isinstance(trig, SlidingTrigger):
        return list(windows)
    if stream.key_bound == "row":  # windows that do not overlap (the parser's rule): all of their time
        return [(_start_ceil(trig, a, tz), _start_ceil(trig, b, tz)) for a, b in windows]
    if trig.interval is not None:
        return [(a + trig.interval, b + trig.interval) for a, b in windows]
    return [(tick_after(trig, a - _US, tz), tick_after(trig, b - _US, tz) + _US) for a, b in windows]


def _start_ceil(trigger: SlidingTrigger, t: datetime, tz: str) -> datetime:
    """The first window start at or after ``t``."""
    return _grid_ceil(trigger, t) if trigger.interval is not None else tick_after(trigger, t - _US, tz)


def work_range(stream: Stream, work: StreamWork, tz: str) -> TimeRange:
    """The half-open ``[start, end)`` a run is shown with (tags, metadata, the ledger, ``cq tick``).
    Time windows: the starts of the windows it computes, on the window grid (cursors such as "after
    the last event seen" make the work's ranges ``...:40.000001``; the grid holds the same windows).
    Data-shaped: from where it recomputes, or the watermark it starts after, to the one it closes by.
    For showing only: what a run reads comes from the work's own fields."""
    if work.windows:
        trig = stream.trigger
        assert isinstance(trig, SlidingTrigger)  # the only trigger with time windows
        return _start_ceil(trig, work.windows[0][0], tz), _start_ceil(trig, work.windows[-1][1], tz)
    lo = work.recompute_from or work.closed_from or work.origin or EPOCH
    return lo, max(work.close_until or lo, lo)


def merge_ranges(ranges: Sequence[TimeRange]) -> tuple[TimeRange, ...]:
    """Sorted, overlapping and adjacent ranges merged; beyond MAX_RANGES one covering range."""
    out: list[list[datetime]] = []
    for a, b in sorted(r for r in ranges if r[0] < r[1]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    if len(out) > MAX_RANGES:
        return ((out[0][0], out[-1][1]),)
    return tuple((a, b) for a, b in out)


# --- the sensor's decision -----------------------------------------------------------------------


def latest(*values: datetime | None) -> datetime | None:
    """The latest of the given times, ignoring None."""
    present = [v for v in values if v is not None]
    return max(present) if present else None


def watermark(stream: Stream, max_event: datetime | None, now: datetime) -> datetime | None:
    """T: windows ending at or before it are closed."""
    if stream.options.trigger_mode == "force_window_close":
        return now  # windows close by processing time
    return max_event - stream.options.watermark if max_event is not None else None


def first_tick(stream: Stream, *, version: int, span: Span, now: datetime, tz: str, chunk_rows: int) -> TickPlan:
    """The stream's creation: remember where real time starts; with FILL_HISTORY request the
    history in chunks of about ``chunk_rows`` rows."""
    o = stream.options
    closed = watermark(stream, span.max_time, now)
    history = o.fill_history or o.fill_history_first
    if history:
        origin = o.history_start or span.min_time
    else:
        origin = span.max_time + _US if span.max_time is not None else None
    cursor = StreamCursor(version=version, created=now, max_event=span.max_time, closed_until=closed, origin=origin)
    works: list[StreamWork] = []
    if history and span.min_time is not None and closed is not None:
        lo = max(o.history_start or span.min_time, span.min_time)
        works = history_works(
            stream,
            version=version,
            lo=lo,
            hi=closed,
            rows=span.rows,
            now=now,
            tz=tz,
            chunk_rows=chunk_rows,
            origin=origin,
        )
    reason = (
        f"created at version {version}"
        + (f"; history in {len(works)} run(s)" if works else "")
        + ("" if history else "; existing data is history (no FILL_HISTORY)")
    )
    ignored: tuple[Ignored, ...] = ()
    if not history and span.rows and span.min_time is not None and span.max_time is not None:
        ignored = (
            _ignored(
                stream,
                "history",
                span.rows,
                span.min_time,
                span.max_time,
                tz,
                "they were in the table when the stream was created and it has no FILL_HISTORY",
            ),
        )
    return TickPlan(cursor, tuple(works), reason, ignored)


def _ignored(
    stream: Stream, what: str, rows: int, lo: datetime, hi: datetime, tz: str, why: str, *, partly: bool = False
) -> Ignored:
    """One line of ``TickPlan.ignored``: the rows (from file statistics, so ``up to`` when a file held
    kept rows too), the windows they fall in, why, and how to get them computed."""
    where = f"event time [{iso(lo)}, {iso(hi)}]"
    if isinstance(stream.trigger, SlidingTrigger):
        a, b = starts_overlapping(stream.trigger, lo, hi, tz)
        where += f", windows starting in [{iso(a)}, {iso(b)})"
    fix = f"`cq recalculate {stream.name} --from {iso(lo)}` computes them"
    if what == "history":
        fix += " (or FILL_HISTORY 1 when the stream is created)"
    text = f"{what}: {'up to ' if partly else ''}{rows} row(s) ignored, {where}: {why}; {fix}"
    return Ignored(what, rows, (lo, hi), text)


def with_exact_late(
    plan: TickPlan, stream: Stream, late: Sequence[tuple[int, datetime, datetime]], tz: str
) -> TickPlan:
    """``plan`` with its ``late`` lines (counted from file statistics) replaced by the exact ones of an
    eKuiper rule's dropped rows (``streams.late``): ``(rows, first, last)`` per file."""
    why = (
        f"lateTolerance {format_duration(stream.options.watermark)} drops rows older than the watermark "
        "before any window, as eKuiper does"
    )
    exact = tuple(_ignored(stream, "late", rows, lo, hi, tz, why) for rows, lo, hi in late)
    ignored = tuple(i for i in plan.ignored if i.what != "late") + exact
    works = tuple(replace(w, ignored=_texts(ignored)) if w.ignored or ignored else w for w in plan.works)
    return replace(plan, ignored=ignored, works=works)


def true_for_ignored(stream: Stream, starts: Sequence[datetime], rows: int) -> Ignored:
    """The windows a run's TRUE_FOR dropped (closed, first to last row shorter than it): how many,
    their rows and starts, and why."""
    d = getattr(stream.trigger, "true_for", None)
    assert d is not None  # only STATE and EVENT windows with TRUE_FOR drop windows
    lo, hi = min(starts), max(starts)
    text = (
        f"true_for: {len(starts)} window(s) of {rows} row(s) ignored, windows starting in [{iso(lo)}, {iso(hi)}]: "
        f"shorter than TRUE_FOR {format_duration(d)} from first to last row"
    )
    return Ignored("true_for", rows, (lo, hi), text)


def history_works(
    stream: Stream,
    *,
    version: int,
    lo: datetime,
    hi: datetime,
    rows: int,
    now: datetime,
    tz: str,
    chunk_rows: int,
    origin: datetime | None,
) -> list[StreamWork]:
    """Runs computing the windows closed by ``hi`` from event time ``lo`` on, in chunks of about
    ``chunk_rows`` rows (assuming rows spread evenly over time)."""
    if hi <= lo:
        return []
    chunks = max(1, -(-rows // max(1, chunk_rows)))
    if stream.trigger.kind in DATA_SHAPED:
        step = (hi - lo) / chunks
        bounds = [lo + step * i for i in range(chunks)] + [hi]
        return [
            StreamWork(version=version, kind="history", close_until=b, origin=origin, tick=now, closed_from=a)
            for a, b in itertools.pairwise(bounds)
        ]
    trig = stream.trigger
    assert isinstance(trig, SlidingTrigger)  # the triggers with time windows
    first = lo if stream.options.history_start is not None else starts_overlapping(trig, lo, lo, tz)[0]
    last = starts_ending_in(trig, EPOCH, hi, tz)
    if last is None or last[1] <= first:
        return []
    step = (last[1] - first) / chunks
    bounds = [first + step * i for i in range(chunks)] + [last[1]]
    return [
        StreamWork(version=version, kind="history", windows=((a, b),), tick=now, close_until=hi)
        for a, b in itertools.pairwise(bounds)
        if a < b
    ]


def plan_tick(
    stream: Stream, cursor: StreamCursor, *, version: int, changes: Sequence[Change], now: datetime, tz: str
) -> TickPlan:
    """One sensor evaluation after the first: what the commits since ``cursor.version`` (and the
    passing of processing time) make due."""
    o = stream.options
    added = [s for c in changes for s in c.added]
    removed = [s for c in changes for s in c.removed]
    max_event = latest(cursor.max_event, *(s.max_time for s in added))
    t_prev = cursor.closed_until
    t_new = latest(t_prev, watermark(stream, max_event, now))
    # EXPIRED_TIME ignores older changes; DELETE_MARK drops the state a recomputation would need.
    horizon = min([d for d in (o.expired_time, o.delete_mark) if d is not None], default=None)
    floor = t_new - horizon if (horizon is not None and t_new is not None) else None

    ignored = _late_ignored(stream, added, t_prev, floor, tz)
    # Changes to event time already closed: late rows, and removed files (deletes, updates).
    late: list[TimeRange] = []
    if t_prev is not None and o.trigger_mode != "force_window_close":
        spans = ([] if o.ignore_disorder else added) + (removed if o.delete_recalc else [])
        for s in spans:
            lo = s.min_time or EPOCH
            hi = min(s.max_time or t_prev, t_prev)
            if floor is not None:
                lo = max(lo, floor)
            if lo < t_prev and lo <= hi:
                late.append((lo, hi + _US))  # half-open, so a single instant survives merging
    pending = cursor.pending
    recalc_due = False
    if o.trigger_mode == "continuous_window_close":
        pending, late = merge_ranges([*pending, *late]), []
        every = o.recalc_every or timedelta(minutes=60)
        recalc_due = bool(pending) and now - (cursor.last_recalc or cursor.created) >= every
    at_once = o.trigger_mode == "at_once"
    partial_due = (
        o.max_delay is not None
        and max_event is not None
        and t_new is not None
        and max_event > t_new
        and now - (cursor.last_partial or cursor.created) >= o.max_delay
    )
    notify_open = stream.notify is not None and "WINDOW_OPEN" in stream.notify.events
    opened = ("WINDOW_OPEN" in o.event_types or notify_open) and max_event is not None and max_event != cursor.max_event
    writes_open = (at_once and bool(added)) or partial_due or "WINDOW_OPEN" in o.event_types
    closes = "WINDOW_CLOSE" in o.event_types and not at_once
    deleted = bool(removed) and o.delete_output_table

    new_cursor = replace(
        cursor,
        version=version,
        max_event=max_event,
        closed_until=t_new,
        last_partial=now if partial_due else cursor.last_partial,
        pending=pending,
    )
    if recalc_due:
        late, new_cursor = list(pending), replace(new_cursor, pending=(), last_recalc=now)

    if stream.trigger.kind in DATA_SHAPED:
        advanced = t_new is not None and t_new != t_prev
        emit_open = writes_open or opened
        if not (advanced or late or emit_open or deleted):
            return TickPlan(new_cursor, (), f"nothing to do at version {version}", ignored)
        work = StreamWork(
            version=version,
            close_until=t_new,
            emit_open=bool(emit_open),
            recompute_from=min(a for a, _ in late) if late else None,
            origin=cursor.origin,
            tick=now,
            write_open=bool(writes_open),
            deleted=deleted,
            ignored=_texts(ignored),
            closed_from=t_prev or (_first_closable(added) if added else None),
        )
        return TickPlan(new_cursor, (work,), _describe(stream, work, tz), ignored)

    trig = stream.trigger
    assert isinstance(trig, SlidingTrigger)  # the triggers with time windows
    ranges: list[TimeRange] = []
    if closes and t_new is not None:  # a stream created on an empty table closes from the beginning
        r = starts_ending_in(trig, t_prev or _first_closable(added), t_new, tz)
        if r:
            ranges.append(r)
    if t_prev is not None:
        last_closed = starts_ending_in(trig, EPOCH, t_prev, tz)
        for lo, hi in late:  # only windows already closed: open ones are computed when they close
            a, b = starts_overlapping(trig, lo, hi - _US, tz)
            if last_closed is not None:
                ranges.append((a, min(b, last_closed[1])))
    if at_once:
        for s in added:
            if s.min_time is not None and s.max_time is not None:
                ranges.append(starts_overlapping(trig, s.min_time, s.max_time, tz))
    if partial_due:  # open windows holding data: their partial results
        assert t_new is not None and max_event is not None  # partial_due implies both
        ranges.append(starts_overlapping(trig, t_new, max_event, tz))
    if opened:  # windows whose first row arrived in this tick
        assert max_event is not None  # opened implies it
        if cursor.max_event is not None:
            ranges.append((cursor.max_event + _US, max_event + _US))
        else:
            lo = min((s.min_time for s in added if s.min_time is not None), default=max_event)
            ranges.append(starts_overlapping(trig, lo, max_event, tz))
    windows = merge_ranges(ranges)
    if not windows and not deleted:
        return TickPlan(new_cursor, (), f"no window closed or changed at version {version}", ignored)
    work = StreamWork(
        version=version,
        windows=windows,
        tick=now,
        close_until=t_new,
        write_open=bool(writes_open),
        deleted=deleted,
        ignored=_texts(ignored),
        # Without FILL_HISTORY the rows up to the creation's last one are history: a window open at
        # creation counts only the rows after it, as TDengine computes only what arrives later.
        origin=None if (o.fill_history or o.fill_history_first) else cursor.origin,
    )
    return TickPlan(new_cursor, (work,), _describe(stream, work, tz), ignored)


def _texts(ignored: Sequence[Ignored], limit: int = 3) -> tuple[str, ...]:
    """What a run carries (in its ``cq/work`` tag, so bounded): the first ``limit`` lines and a count."""
    lines = [i.text for i in ignored[:limit]]
    if len(ignored) > limit:
        lines.append(f"... and {len(ignored) - limit} more (the ledger has them all)")
    return tuple(lines)


def _late_ignored(
    stream: Stream, added: Sequence[Span], t_prev: datetime | None, floor: datetime | None, tz: str
) -> tuple[Ignored, ...]:
    """The added rows in event time already closed that no run will compute (``TickPlan.ignored``):
    all of them under FORCE_WINDOW_CLOSE or IGNORE_DISORDER, those older than the EXPIRED_TIME /
    DELETE_MARK horizon otherwise."""
    o = stream.options
    if t_prev is None:
        return ()
    out = []
    for s in added:
        if s.min_time is None or s.min_time >= t_prev:
            continue
        hi = min(s.max_time or t_prev, t_prev)
        what = "late"
        if o.trigger_mode == "force_window_close":
            why = "FORCE_WINDOW_CLOSE closes windows by processing time and never reopens one"
        elif o.ignore_disorder:
            why = {
                "old": "IGNORE EXPIRED 1 drops rows of closed windows",
                "ekuiper": f"lateTolerance {format_duration(o.watermark)} drops rows older than the watermark, as eKuiper does",
            }.get(stream.form, "IGNORE_DISORDER drops rows of closed windows")
        elif floor is not None and s.min_time < floor:
            hi = min(hi, floor - _US)
            horizon = "EXPIRED_TIME" if o.expired_time is not None else "DELETE_MARK"
            what, why = "expired", f"older than the {horizon} horizon {iso(floor)}"
        else:
            continue
        out.append(_ignored(stream, what, s.rows, s.min_time, hi, tz, why, partly=hi < (s.max_time or hi)))
    return tuple(out)


def _first_closable(added: Sequence[Span]) -> datetime:
    """The earliest event time added: windows ending after it are the ones that can hold data."""
    return min((s.min_time for s in added if s.min_time is not None), default=EPOCH)


def recalculation_work(
    stream: Stream, *, version: int, start: datetime, end: datetime, max_event: datetime | None, now: datetime, tz: str
) -> StreamWork:
    """``RECALCULATE STREAM s FROM start TO end``: the closed windows holding event time in [start, end)."""
    t = watermark(stream, max_event, now)
    if stream.trigger.kind in DATA_SHAPED:
        return StreamWork(version=version, kind="recalculate", close_until=t, recompute_from=start, tick=now)
    trig = stream.trigger
    assert isinstance(trig, SlidingTrigger)  # the triggers with time windows
    a, b = starts_overlapping(trig, start, end - _US, tz)
    closed = starts_ending_in(trig, EPOCH, t, tz) if t is not None else None
    hi = min(b, closed[1]) if closed else a
    return StreamWork(version=version, kind="recalculate", windows=merge_ranges([(a, hi)]), tick=now, close_until=t)


def _describe(stream: Stream, work: StreamWork, tz: str) -> str:
    if work.windows or work.deleted:
        if not work.windows:
            return "removing the output of deleted groups"
        trig = stream.trigger
        assert isinstance(trig, SlidingTrigger)  # the only trigger with time windows
        shown = [(_start_ceil(trig, a, tz), _start_ceil(trig, b, tz)) for a, b in work.windows]
        return "windows starting in " + ", ".join(f"[{iso(a)}, {iso(b)})" for a, b in shown)
    parts = [f"close data-shaped windows up to {iso(work.close_until)}" if work.close_until else "no closing"]
    if work.recompute_from:
        parts.append(f"recompute from {iso(work.recompute_from)}")
    if work.emit_open:
        parts.append("with open windows' partial results" if work.write_open else "with open windows (to notify)")
    if work.deleted:
        parts.append("removing the output of deleted groups")
    return "; ".join(parts)


__all__ = [
    "Change",
    "Ignored",
    "Span",
    "StreamCursor",
    "StreamWork",
    "TickPlan",
    "first_tick",
    "grid_starts",
    "history_works",
    "key_ranges",
    "merge_ranges",
    "plan_tick",
    "recalculation_work",
    "starts_ending_in",
    "starts_overlapping",
    "tick_after",
    "tick_floor",
    "true_for_ignored",
    "with_exact_late",
    "work_range",
]
