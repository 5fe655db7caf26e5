"""Window assignment for TDengine stream triggers (seed 000: 触发类型, window_clause) as one lazy Spark plan.

:func:`assign_windows` turns the rows of a trigger table into one row per (row, window containing it)
and annotates each with its window's bounds, size and whether it is closed as of ``close_until``.
Only DataFrame API window functions, ``sequence`` + ``explode`` and cumulative sums: no UDFs, no
actions, so it runs the same on classic Spark and Spark Connect and costs one job when consumed.

Times are integer microseconds inside (``unix_micros``), so all window arithmetic is exact.
Semantics per trigger type (groups = ``keys``, rows ordered by time, timestamps unique per group):

* ``SlidingTrigger`` with ``interval``: ``[o + k*sliding, o + k*sliding + interval)``, ``o`` the
  interval offset from the UTC epoch, any integer ``k``; ``sliding_offset`` is ignored (seed).
* ``SlidingTrigger`` without ``interval``: windows between consecutive PERIOD ticks in event time
  (``cron.period_ticks``): sliding < 1 day resets every local day of ``timezone``; otherwise ticks
  ``M_1970-01-01 + offset + k*sliding``. ``_wend`` is the next tick.
* ``SessionTrigger``: rows at most ``gap`` apart share a window; ``_wend`` = last row + gap; closed
  when ``last + gap < T``.
* ``StateTrigger``: runs of equal non-NULL state; NULL-state rows are dropped. Closed when the next
  run's first row is at or before T. ``__cq_prev_state``/``__cq_next_state`` are the adjacent runs'
  states before TRUE_FOR filtering (the values the state changed from / to).
* ``EventTrigger``: opened by a ``start`` row while none is open, closed by the first ``end`` row at
  or after the opener (possibly the opener itself). NULL conditions count as false.
* ``CountTrigger``: valid rows only; windows start at valid rows ``0, slide, 2*slide, ...`` and hold
  up to ``count`` rows; closed once full with the last row at or before T. With ``ekuiper`` (seed
  003's COUNTWINDOW(n, k): a window fires at every k-th row once n arrived) the starts are shifted by
  ``ceil(n/k)*k - n`` rows (earlier rows are in no window); not yet full windows are open, as for
  TDengine. ``count_phase_column`` overrides the shift per group (resuming from saved state).
* ``EkSlidingTrigger``, ``EkSessionTrigger``: eKuiper's SLIDINGWINDOW and SESSIONWINDOW, see
  :mod:`cq_engine.streams.windows.ekuiper` (sliding windows add ``WSEQ``: one window per triggering
  row, so several may share a start).

TRUE_FOR(d) drops closed windows whose ``last - first < d``; open windows are kept. With
``mark_short`` they are kept and marked (``SHORT``), so a run can report what it dropped.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from cq_engine.durations import micros
from cq_engine.model import (
    CountTrigger,
    EkSessionTrigger,
    EkSlidingTrigger,
    EventTrigger,
    SessionTrigger,
    SlidingTrigger,
    StateTrigger,
)
from cq_engine.streams.windows.common import (
    CLOSE_ROW,
    LAST_US,
    NEXT_STATE,
    OPEN_ROW,
    PREV_STATE,
    SEG,
    SHORT,
    STATE,
    T_US,
    WCLOSED,
    WE_US,
    WEND,
    WLAST,
    WROWS,
    WS_US,
    WSEQ,
    WSTART,
    check_positive,
    exact_col,
    floor_div,
    ordered,
    per_window,
    running,
    window_stats,
)
from cq_engine.streams.windows.ekuiper import ek_session, ek_sliding
from cq_engine.times import EPOCH, UTC

_DAY = 86_400_000_000


def assign_windows(
    df: DataFrame,
    trigger,
    *,
    time_column: str,
    keys: list[str],
    close_until: datetime,
    timezone: str = "UTC",
    count_phase_column: str | None = None,
    session_start_column: str | None = None,
    row_stats: bool = True,
    mark_short: bool = False,
    columns: list[str] | None = None,
) -> DataFrame:
    """One row per (input row, window containing it): all input columns, then ``WSTART``, ``WEND``,
    ``WLAST`` (timestamps), ``WROWS`` (long), ``WCLOSED`` (boolean), then the extras of STATE
    (``STATE``, ``PREV_STATE``, ``NEXT_STATE``) and EVENT (``OPEN_ROW``, ``CLOSE_ROW``) windows.
    Rows after ``close_until`` join windows normally but never close one; rows without a time
    belong to no window. Lazy: no Spark action.

    ``count_phase_column`` (COUNT windows only): an integer column whose value on a group's first
    counted row is the 0-based index (among the group's counted rows) of its first window start;
    NULL (or no column) keeps the default: 0 for TDengine, ``ceil(n/k)*k - n`` for eKuiper. A caller
    resuming a group from saved state at a window start sets 0 there. Negative values count as 0.

    ``session_start_column`` (eKuiper sessions only): a timestamp column, on a resumed run the
    frontier, which the first window reports as its start when it is a check point before its first
    row (the window followed a cut, see ``windows.ekuiper``).

    ``row_stats=False`` (time windows only; data-shaped windows need them to segment): no ``WLAST``
    or ``WROWS`` column. Per row they take a window function over (group, window), i.e. a shuffle
    and a sort of every (row, window) pair; without them a time window is an explode (sliding) or a
    projection (tumbling), and a caller aggregates the window's ``max``/``count`` instead.

    ``mark_short`` (STATE and EVENT windows with TRUE_FOR): keep the windows TRUE_FOR drops, with a
    last boolean column ``SHORT`` true on their rows.

    ``columns``: ``df``'s column names when the caller knows them (else asked of Spark: a round trip
    to a Connect server)."""
    if close_until.tzinfo is None or close_until.utcoffset() is None:
        raise ValueError("close_until must be timezone-aware")
    until = micros(close_until.astimezone(UTC) - EPOCH)
    keys = list(keys)
    inputs = list(df.columns) if columns is None else list(columns)
    rows = df.withColumn(T_US, F.unix_micros(exact_col(time_column))).filter(F.col(T_US).isNotNull())
    extras: list[str] = []
    stats = [WLAST, WROWS]
    if isinstance(trigger, SlidingTrigger):
        out = _sliding(rows, trigger, keys, until, timezone, row_stats=row_stats)
        stats = stats if row_stats else []
    elif isinstance(trigger, SessionTrigger):
        out = _session(rows, trigger, keys, until)
    elif isinstance(trigger, StateTrigger):
        out, extras = _state(rows, trigger, keys, until, mark_short), [STATE, PREV_STATE, NEXT_STATE]
    elif isinstance(trigger, EventTrigger):
        out, extras = _event(rows, trigger, keys, until, inputs, mark_short), [OPEN_ROW, CLOSE_ROW]
    elif isinstance(trigger, CountTrigger):
        out = _count(rows, trigger, keys, until, count_phase_column, inputs)
    elif isinstance(trigger, EkSlidingTrigger):
        out, extras = ek_sliding(rows, trigger, keys, until), [WSEQ]
    elif isinstance(trigger, EkSessionTrigger):
        out = ek_session(rows, trigger, keys, until, session_start_column)
    else:
        raise TypeError(f"assign_windows: unsupported trigger {trigger!r}")
    if mark_short and getattr(trigger, "true_for", None) is not None:
        extras.append(SHORT)
    stat_columns = {WLAST: F.timestamp_micros(F.col(LAST_US)), WROWS: F.col(WROWS).cast("long")}
    return out.select(
        *[exact_col(n) for n in inputs],
        F.timestamp_micros(F.col(WS_US)).alias(WSTART),
        F.timestamp_micros(F.col(WE_US)).alias(WEND),
        *[stat_columns[n].alias(n) for n in stats],
        F.col(WCLOSED).cast("boolean").alias(WCLOSED),
        *[F.col(n) for n in extras],
    )


def with_next_tick(
    df: DataFrame, trigger: SlidingTrigger, *, column: str, out: str, timezone: str = "UTC"
) -> DataFrame:
    """``out``: the sliding-only tick strictly after the timestamp ``column`` — for a window ending
    at a tick, the end of the next window (``_tnext_ts``)."""
    df = df.withColumn(T_US, F.unix_micros(exact_col(column)))
    df = _tick_bounds(df, micros(trigger.sliding), micros(trigger.sliding_offset), timezone)
    return df.withColumn(out, F.timestamp_micros(F.col(WE_US))).drop(T_US, WS_US, WE_US)


# --- helpers -----------------------------------------------------------------------------------


def _true_for(df: DataFrame, d: timedelta | None, mark: bool) -> DataFrame:
    if d is None:
        return df
    short = F.col(WCLOSED) & (F.col(LAST_US) - F.col(WS_US) < F.lit(micros(d)))
    return df.withColumn(SHORT, short) if mark else df.filter(~short)


# --- time windows ------------------------------------------------------------------------------


def _sliding(df: DataFrame, trig: SlidingTrigger, keys, until: int, timezone: str, *, row_stats: bool) -> DataFrame:
    s = micros(trig.sliding)
    check_positive(s, "sliding")
    t = F.col(T_US)
    if trig.interval is not None:
        i, off = micros(trig.interval), micros(trig.interval_offset)
        check_positive(i, "interval")
        rel = t - F.lit(off)
        k_max = floor_div(rel, s)
        if s == i:
            df = df.withColumn(SEG, k_max)
        else:  # every k with k*s <= rel < k*s + i
            k_min = floor_div(rel - F.lit(i), s) + F.lit(1)
            df = df.filter(k_min <= k_max).withColumn(SEG, F.explode(F.sequence(k_min, k_max)))
        ws = F.lit(off) + F.col(SEG) * F.lit(s)
        df = df.withColumns({WS_US: ws, WE_US: ws + F.lit(i)})
    else:
        df = _tick_bounds(df, s, micros(trig.sliding_offset), timezone).withColumn(SEG, F.col(WS_US))
    df = df.withColumn(WCLOSED, F.col(WE_US) <= F.lit(until))
    if not row_stats:
        return df
    w = per_window(keys, SEG)
    return df.withColumns({LAST_US: F.max(T_US).over(w), WROWS: F.count(F.lit(1)).over(w)})


def _tick_bounds(df: DataFrame, s: int, off: int, timezone: str) -> DataFrame:
    """``WS_US``/``WE_US``: the PERIOD ticks (event time) at or before / after each row (cron.period_ticks)."""
    t = F.col(T_US)
    tz = ZoneInfo(timezone)  # validates the name
    if off < 0 or (s < _DAY and off >= _DAY):
        raise ValueError(f"sliding offset must be in [0, 1d) for sliding < 1d: {timedelta(microseconds=off)!r}")
    if s >= _DAY:
        base = micros(datetime(1970, 1, 1, tzinfo=tz).astimezone(UTC) - EPOCH) + off
        ws = F.lit(base) + floor_div(t - F.lit(base), s) * F.lit(s)
        return df.withColumns({WS_US: ws, WE_US: ws + F.lit(s)})
    # Local date number d of the row; M(j) = first instant of local date d + j, j in -2..2.
    # from_utc_timestamp / to_utc_timestamp shift by the zone's offset independently of the session zone.
    wall = F.unix_micros(F.from_utc_timestamp(F.timestamp_micros(t), timezone))
    df = df.withColumn("__cq_w_day", floor_div(wall, _DAY))
    m = {j: f"__cq_w_m{j + 2}" for j in range(-2, 3)}
    df = df.withColumns(
        {
            m[j]: F.unix_micros(
                F.to_utc_timestamp(F.timestamp_micros((F.col("__cq_w_day") + F.lit(j)) * F.lit(_DAY)), timezone)
            )
            for j in m
        }
    )
    M = {j: F.col(name) for j, name in m.items()}
    first = {j: M[j] + F.lit(off) for j in (-2, -1, 0, 1, 2)}  # a day's first tick, if before M(j+1)

    def last_tick(j: int) -> Column:
        return first[j] + floor_div(M[j + 1] - F.lit(1) - first[j], s) * F.lit(s)

    in_day = t >= first[0]
    k = floor_div(t - first[0], s)
    ws = F.when(in_day, first[0] + k * F.lit(s)).when(first[-1] < M[0], last_tick(-1)).otherwise(last_tick(-2))
    nxt = first[0] + (k + F.lit(1)) * F.lit(s)
    we = (
        F.when(in_day & (nxt < M[1]), nxt)
        .when(~in_day & (first[0] < M[1]), first[0])
        .when(first[1] < M[2], first[1])
        .otherwise(first[2])
    )
    return df.withColumns({WS_US: ws, WE_US: we}).drop("__cq_w_day", *m.values())


# --- data-shaped windows -----------------------------------------------------------------------


def _session(df: DataFrame, trig: SessionTrigger, keys, until: int) -> DataFrame:
    gap = micros(trig.gap)
    prev = F.lag(T_US).over(ordered(keys))
    new = F.when(prev.isNull() | (F.col(T_US) - prev > F.lit(gap)), 1).otherwise(0)
    df = window_stats(df.withColumn(SEG, F.sum(new).over(running(keys))), keys, SEG)
    return df.withColumns({WE_US: F.col(LAST_US) + F.lit(gap), WCLOSED: F.col(LAST_US) + F.lit(gap) < F.lit(until)})


def _state(df: DataFrame, trig: StateTrigger, keys, until: int, mark_short: bool) -> DataFrame:
    df = df.withColumn(STATE, F.expr(trig.column)).filter(F.col(STATE).isNotNull())
    o = ordered(keys)
    df = df.withColumns(
        {
            "__cq_w_prev": F.lag(STATE).over(o),
            "__cq_w_next": F.lead(STATE).over(o),
            "__cq_w_next_t": F.lead(T_US).over(o),
        }
    )
    new = F.when(F.col(STATE).eqNullSafe(F.col("__cq_w_prev")), 0).otherwise(1)
    df = window_stats(df.withColumn(SEG, F.sum(new).over(running(keys))), keys, SEG)
    w = per_window(keys, SEG)
    next_start = F.last("__cq_w_next_t").over(w)  # first row of the next run
    df = df.withColumns(
        {
            WE_US: F.col(LAST_US),
            PREV_STATE: F.first("__cq_w_prev").over(w),
            NEXT_STATE: F.last("__cq_w_next").over(w),
            WCLOSED: F.coalesce(next_start <= F.lit(until), F.lit(False)),
        }
    )
    return _true_for(df, trig.true_for, mark_short)


def _event(df: DataFrame, trig: EventTrigger, keys, until: int, inputs: list[str], mark_short: bool) -> DataFrame:
    # A window is open at row i iff some start row lies after the last end row before i: so the
    # rows between consecutive end rows (g = end rows strictly before i) hold at most one window,
    # from the segment's first start row through its closing end row (its last row).
    start = F.coalesce(F.expr(trig.start).cast("boolean"), F.lit(False)).cast("int")
    end = F.coalesce(F.expr(trig.end).cast("boolean"), F.lit(False)).cast("int")
    df = df.withColumns({"__cq_w_s": start, "__cq_w_e": end})
    before = ordered(keys).rowsBetween(Window.unboundedPreceding, -1)
    df = df.withColumn(SEG, F.coalesce(F.sum("__cq_w_e").over(before), F.lit(0)))
    started = F.max("__cq_w_s").over(
        Window.partitionBy(*[exact_col(k) for k in keys], F.col(SEG))
        .orderBy(F.col(T_US))
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    df = df.withColumn("__cq_w_in", started == 1).filter(F.col("__cq_w_in"))
    df = window_stats(df, keys, SEG)
    w = per_window(keys, SEG)
    closed = F.last("__cq_w_e").over(w) == 1
    df = df.withColumns(
        {
            WE_US: F.col(LAST_US),
            WCLOSED: closed & (F.col(LAST_US) <= F.lit(until)),
            OPEN_ROW: F.first(_condition_struct(trig.start, inputs)).over(w),
            "__cq_w_close": F.last(_condition_struct(trig.end, inputs)).over(w),
        }
    )
    df = df.withColumn(CLOSE_ROW, F.when(F.col(WCLOSED), F.col("__cq_w_close")))
    return _true_for(df, trig.true_for, mark_short)


def condition_columns(sql: str, columns: list[str]) -> list[str]:
    """The columns of ``columns`` a Spark SQL condition reads, in order of first use (case-insensitive)."""
    import sqlglot
    from sqlglot import exp

    known = {c.lower(): c for c in columns}
    out: list[str] = []
    for col in sqlglot.parse_one(sql, read="spark").find_all(exp.Column, bfs=False):
        name = known.get(col.name.lower())
        if name is not None and name not in out:
            out.append(name)
    return out


def _condition_struct(sql: str, inputs: list[str]) -> Column:
    return F.struct(*[exact_col(n).alias(n) for n in condition_columns(sql, inputs)])


def _count(
    df: DataFrame, trig: CountTrigger, keys, until: int, phase_column: str | None, inputs: list[str]
) -> DataFrame:
    n, slide = trig.count, trig.slide
    check_positive(n, "count")
    check_positive(slide, "slide")
    if trig.columns:
        valid = [exact_col(c).isNotNull() for c in trig.columns]
        df = df.filter(valid[0] if len(valid) == 1 else F.greatest(*valid))
    order = ordered(keys)
    if trig.ekuiper:  # over the whole stream, rows share times: ties in one order, the same every run
        order = order.orderBy(F.col(T_US), F.xxhash64(*[exact_col(c) for c in inputs]))
    idx = F.row_number().over(order) - F.lit(1)
    phase = -(-n // slide) * slide - n if trig.ekuiper else 0  # eKuiper: full windows end at rows k, 2k, ...
    if phase_column is not None:
        first = F.first(exact_col(phase_column).cast("long")).over(per_window(keys))
        idx = idx - F.greatest(F.coalesce(first, F.lit(phase)), F.lit(0))
    elif phase:
        idx = idx - F.lit(phase)
    df = df.withColumn("__cq_w_i", idx).filter(F.col("__cq_w_i") >= 0)  # rows before the first start: none
    j_max = floor_div(F.col("__cq_w_i"), slide)
    if slide == n:
        df = df.withColumn(SEG, j_max)
    else:  # every j >= 0 with j*slide <= i < j*slide + n
        j_min = F.greatest(F.lit(0).cast("long"), floor_div(F.col("__cq_w_i") - F.lit(n), slide) + F.lit(1))
        df = df.filter(j_min <= j_max).withColumn(SEG, F.explode(F.sequence(j_min, j_max)))
    df = window_stats(df, keys, SEG)
    return df.withColumns(
        {WE_US: F.col(LAST_US), WCLOSED: (F.col(WROWS) == F.lit(n)) & (F.col(LAST_US) <= F.lit(until))}
    )
