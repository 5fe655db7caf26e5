"""A query's data-shaped sub-windows (``SESSION``, ``STATE_WINDOW``, ``EVENT_WINDOW``, ``COUNT_WINDOW``
inside a new-form query, ``SubWindows.over``): each row's sub-window within its trigger window (and
trigger group, and the query's PARTITION BY), found by window functions over the rows in time order,
so the run stays one Spark job. Each sub-window gets a number (``SUB_ID``) and its first and last row's
time (``SUB_WSTART``, ``SUB_WEND``: its ``_wstart`` and ``_wend``); rows of no sub-window (NULL states,
rows outside an event window) are dropped, and TRUE_FOR drops the sub-windows shorter than it, as the
trigger windows of the same names do (docs/dialects/tdengine.md, *A stream's query*)."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from cq_engine.durations import micros
from cq_engine.model import SUB_ID, SUB_WEND, SUB_WSTART, CountTrigger, EventTrigger, SessionTrigger, Stream
from cq_engine.parse.fragments import TIME_REF
from cq_engine.streams.windows.common import exact_col, lag_non_null

_T = "__cq_swd_t"
_NEW, _END, _PREV_END, _START, _WINDOW_END, _STATE = (f"__cq_swd_{n}" for n in ("new", "e", "pe", "s", "we", "st"))
_ALL, _ALL_AFTER = Window.unboundedPreceding, Window.unboundedFollowing
_NEVER = 2**62  # the end of a START row's window that never closes: it holds every later row


def with_data_sub_windows(stream: Stream, rows: DataFrame, ids: list[str]) -> DataFrame:
    """``rows`` with ``SUB_ID``, ``SUB_WSTART`` and ``SUB_WEND`` (``ids``: ``plan.query_partition``)."""
    assert stream.sub_windows is not None and stream.sub_windows.over is not None
    over = stream.sub_windows.over
    part = [exact_col(c) for c in ids]
    ordered = Window.partitionBy(*part).orderBy(F.col(TIME_REF))
    run = ordered.rowsBetween(_ALL, 0)
    rows = rows.withColumn(_T, F.unix_micros(F.col(TIME_REF)))
    t = F.col(_T)
    if isinstance(over, SessionTrigger):  # a gap larger than SESSION's starts a window
        rows = rows.withColumn(_NEW, F.coalesce(t - F.lag(t).over(ordered) > F.lit(micros(over.gap)), F.lit(True)))
        rows = rows.withColumn(SUB_ID, _count_of(_NEW, run))
    elif isinstance(over, EventTrigger):
        rows = _event(rows, over, ordered, run)
    elif isinstance(over, CountTrigger):
        rows = rows.withColumn(_NEW, F.row_number().over(ordered) - 1)  # the row's index
        index, n, m = F.col(_NEW), over.count, over.slide
        if m == n:
            rows = rows.withColumn(SUB_ID, F.floor(index / F.lit(n)).cast("long"))
        else:  # window j holds rows j*m .. j*m + n - 1: each row is in several (a generator alone in its column)
            first = F.greatest(F.lit(0), F.floor((index - F.lit(n - m)) / F.lit(m))).cast("long")
            rows = rows.withColumn(SUB_ID, F.explode(F.sequence(first, F.floor(index / F.lit(m)).cast("long"))))
    else:  # STATE_WINDOW: a run of equal non-NULL states
        rows = rows.withColumn(_STATE, F.expr(over.column)).filter(F.col(_STATE).isNotNull())
        changed = F.col(_STATE) != F.lag(_STATE).over(ordered)
        rows = rows.withColumn(_NEW, F.coalesce(changed, F.lit(True))).withColumn(SUB_ID, _count_of(_NEW, run))
    whole = Window.partitionBy(*part, F.col(SUB_ID))
    rows = rows.withColumns({SUB_WSTART: F.min(TIME_REF).over(whole), SUB_WEND: F.max(TIME_REF).over(whole)})
    if (true_for := getattr(over, "true_for", None)) is not None:
        span = F.unix_micros(F.col(SUB_WEND)) - F.unix_micros(F.col(SUB_WSTART))
        rows = rows.filter(span >= F.lit(micros(true_for)))
    return rows.drop(_T, _NEW, _END, _PREV_END, _START, _WINDOW_END, _STATE)


def _count_of(flag: str, frame) -> Column:
    return F.sum(F.col(flag).cast("long")).over(frame)


def _event(rows: DataFrame, over: EventTrigger, ordered, run) -> DataFrame:
    """A row meeting START WITH opens a window when none is open; the window closes at the first row
    from it on meeting END WITH (itself included). A START row is inside an open window when the
    window of the START row before it ends at or after it; a window that never closes is dropped."""
    t = F.col(_T)
    opens, closes = (F.coalesce(F.expr(c), F.lit(False)) for c in (over.start, over.end))
    end = F.first(F.when(closes, t), ignorenulls=True).over(ordered.rowsBetween(0, _ALL_AFTER))
    rows = rows.withColumn(_END, end)
    never = F.lit(_NEVER)
    rows = rows.withColumn(f"{_START}_c", opens)
    prev = lag_non_null(f"IF({_START}_c, coalesce({_END}, {_NEVER}), NULL)", 1)
    rows = rows.withColumn(_PREV_END, prev.over(ordered))
    starts = F.col(f"{_START}_c") & (F.col(_PREV_END).isNull() | (F.col(_PREV_END) < t))
    rows = rows.withColumn(_START, starts)
    rows = rows.withColumns(
        {
            SUB_ID: _count_of(_START, run),
            _WINDOW_END: F.last(F.when(F.col(_START), F.coalesce(F.col(_END), never)), ignorenulls=True).over(run),
        }
    )
    inside = F.col(_WINDOW_END).isNotNull() & (F.col(_WINDOW_END) < never) & (t <= F.col(_WINDOW_END))
    return rows.filter(inside).drop(f"{_START}_c")
