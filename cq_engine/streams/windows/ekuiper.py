"""eKuiper's SLIDINGWINDOW and SESSIONWINDOW (seed 003, as eKuiper's ``internal/topo/node`` computes
them in event time) for ``windows.tdengine.assign_windows``.

Same contract as the TDengine windows: one row per (input row, window containing it) in one lazy
Spark plan (window functions, ``sequence`` + ``explode``, one equi-join; no UDFs, no actions).
Times are integer microseconds (``T_US``); ``T`` below is ``close_until``: the rows before it are all
there, rows may still arrive at T or later (several at the same time: equal timestamps are ordinary).
An eKuiper rule's windows are the whole stream's (``keys`` is empty; its GROUP BY splits each window's
rows when the SELECT is evaluated), but any ``keys`` work.

* ``EkSlidingTrigger(size, delay, over)``: every triggering row (``over`` true; NULL is false; all
  rows without ``over``) has a window of its own, even when rows share its time t (``WSEQ`` tells
  them apart): the rows in ``[t - size, t]`` without a delay, ``[t - size, t + delay)`` with one
  (eKuiper's ``handleInputs``: a row exactly ``size`` before the trigger is in, one exactly at
  ``t + delay`` is not). ``WSTART = t - size``, ``WEND = t + delay``; closed once ``WEND <= T``
  (eKuiper emits the window when the watermark reaches ``t + delay``). Computed as an equi-join of
  the triggering rows to the rows on the keys and a time bucket of width ``size + delay`` (each
  window spans at most two buckets: it is exploded into them), filtered by the range.
* ``EkSessionTrigger(timeout, max_duration D, offset o)``: consecutive rows at most ``timeout``
  apart share a window; a window whose first row lies in block ``[o + jD, o + (j+1)D)`` is also cut
  at the check point ``c = o + (j+2)D``, the first one *after* start + D (eKuiper's
  ``getNextSessionWindow`` cuts only a window that already exceeds D at a check point): rows from c
  on start a new window. ``WEND = min(last + timeout, c)``. eKuiper reports the window after a cut as
  starting at the check point, so ``WSTART`` is c then (else the first row); ``start_column`` (a
  resumed run's frontier) gives the first window's when it lies on a check point before the first
  row. Closed once the next row is there (at or before T) or ``last + timeout < T``.

  Closed form of the cuts (no iteration): a window starting in block j covers blocks j and j+1, and
  the next one starts at the first row of the next non-empty block. So within a gap session, with
  x_j = "block j's first row starts a window" over its non-empty blocks: x_j = 1 when j is the
  session's first block or block j-1 is empty ("reset" blocks), else x_j = not x_{j-1}. Hence
  x_j = ``(j - p) even`` with p the latest reset block at or before j, and a row of block j belongs
  to the window starting in block j if x_j else j-1: passes of window functions over the rows
  ordered by time.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cq_engine.durations import micros
from cq_engine.model import EkSessionTrigger, EkSlidingTrigger
from cq_engine.streams.windows.common import (
    LAST_US,
    SEG,
    T_US,
    WCLOSED,
    WE_US,
    WROWS,
    WS_US,
    WSEQ,
    check_positive,
    exact_col,
    floor_div,
    ordered,
    per_window,
    running,
    window_stats,
)

_TT, _BKT, _TBKT = "__cq_ek_tt", "__cq_ek_bkt", "__cq_ek_tbkt"
_NEW, _BLK, _RESET, _WBLK, _NEXT = "__cq_ek_new", "__cq_ek_blk", "__cq_ek_reset", "__cq_ek_wblk", "__cq_ek_next"
_CUT, _CUT_AT = "__cq_ek_cut", "__cq_ek_cut_at"


def ek_sliding(df: DataFrame, trig: EkSlidingTrigger, keys: list[str], until: int) -> DataFrame:
    size, delay = micros(trig.size), micros(trig.delay)
    check_positive(size, "size")
    if delay < 0:
        raise ValueError(f"delay must not be negative: {trig.delay!r}")
    width = size + delay
    trig_rows = df
    if trig.over is not None:
        trig_rows = trig_rows.filter(F.coalesce(F.expr(trig.over).cast("boolean"), F.lit(False)))
    kcols = [f"__cq_ek_k{i}" for i in range(len(keys))]
    lo, hi = F.col(_TT) - F.lit(size), F.col(_TT) + F.lit(delay)
    trig_rows = trig_rows.select(
        *[exact_col(k).alias(a) for k, a in zip(keys, kcols)],
        F.col(T_US).alias(_TT),
        F.monotonically_increasing_id().alias(WSEQ),  # one window per triggering row, equal times too
    )
    trig_rows = trig_rows.withColumn(_TBKT, F.explode(F.sequence(floor_div(lo, width), floor_div(hi, width))))
    rows = df.withColumn(_BKT, floor_div(F.col(T_US), width))
    cond = [exact_col(k).eqNullSafe(F.col(a)) for k, a in zip(keys, kcols)]
    upper = F.col(T_US) <= hi if delay == 0 else F.col(T_US) < hi  # the trigger's own time is in
    cond += [F.col(_BKT) == F.col(_TBKT), F.col(T_US) >= lo, upper]
    out = rows.join(trig_rows, on=cond, how="inner").drop(_BKT, _TBKT, *kcols)
    w = per_window(keys, WSEQ)
    out = out.withColumns(
        {
            WS_US: F.col(_TT) - F.lit(size),
            WE_US: F.col(_TT) + F.lit(delay),
            LAST_US: F.max(T_US).over(w),
            WROWS: F.count(F.lit(1)).over(w),
        }
    )
    return out.withColumn(WCLOSED, F.col(WE_US) <= F.lit(until)).drop(_TT)


def ek_session(
    df: DataFrame, trig: EkSessionTrigger, keys: list[str], until: int, start_column: str | None = None
) -> DataFrame:
    timeout, d, o = micros(trig.timeout), micros(trig.max_duration), micros(trig.offset)
    check_positive(timeout, "timeout")
    check_positive(d, "max_duration")
    order = ordered(keys)
    t = F.col(T_US)
    prev = F.lag(T_US).over(order)
    df = df.withColumns(
        {
            _NEW: prev.isNull() | (t - prev > F.lit(timeout)),
            _BLK: floor_div(t - F.lit(o), d),
            _NEXT: F.lead(T_US).over(order),
        }
    )
    prev_blk = F.lag(_BLK).over(order)
    df = df.withColumns(
        {
            SEG: F.sum(F.col(_NEW).cast("long")).over(running(keys)),
            _RESET: F.col(_NEW) | (prev_blk < F.col(_BLK) - F.lit(1)),
        }
    )
    p = F.last(F.when(F.col(_RESET), F.col(_BLK)), ignorenulls=True).over(running(keys))
    df = df.withColumn(
        _WBLK, F.when(F.pmod(F.col(_BLK) - p, F.lit(2)) == 0, F.col(_BLK)).otherwise(F.col(_BLK) - F.lit(1))
    )
    df = window_stats(df, keys, SEG, _WBLK)
    w = per_window(keys, SEG, _WBLK)
    cut = F.lit(o) + (F.col(_WBLK) + F.lit(2)) * F.lit(d)  # the first check point after start + D
    end = F.col(LAST_US) + F.lit(timeout)
    nxt = F.max(_NEXT).over(w)  # the next window's first row (rows of one time share a window)
    T = F.lit(until)
    df = df.withColumns(
        {
            WE_US: F.least(end, cut),
            _CUT: cut < end,  # eKuiper's "ticked": the window ended at its check point
            _CUT_AT: cut,
            WCLOSED: ((nxt > F.col(LAST_US)) & (nxt <= T)) | (end < T),
        }
    )
    # The window after a cut starts at the check point (eKuiper's triggerTime); its first row's
    # previous row is the cut window's last.
    first = prev < F.col(WS_US)  # the window's first row(s), after the previous window's last
    after_cut = F.when(first & F.lag(_CUT).over(order), F.lag(_CUT_AT).over(order))
    start = F.max(after_cut).over(w)
    if start_column is not None:  # resumed at a check point: the window there followed a cut
        resumed = F.first(F.unix_micros(exact_col(start_column))).over(per_window(keys))
        on_grid = (resumed < F.col(WS_US)) & (F.pmod(resumed - F.lit(o), F.lit(d)) == 0)
        start = F.coalesce(start, F.when(on_grid & (F.col(WS_US) == F.min(T_US).over(per_window(keys))), resumed))
    return df.withColumn(WS_US, F.coalesce(start, F.col(WS_US))).drop(_NEW, _BLK, _RESET, _WBLK, _NEXT, _CUT, _CUT_AT)
