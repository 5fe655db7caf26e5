"""eKuiper's SLIDINGWINDOW and SESSIONWINDOW (seed 003) for ``windows.tdengine.assign_windows``.

Same contract as the TDengine windows: one row per (input row, window containing it) in one lazy
Spark plan (window functions, ``sequence`` + ``explode``, one equi-join; no UDFs, no actions).
Times are integer microseconds (``T_US``); ``T`` below is ``close_until``. As for TDengine's SESSION
here, rows may still arrive at times >= ``T`` (except where their group has a row: times are unique
per group): a window is closed once no such row could join it.

* ``EkSlidingTrigger(size, delay, over)``: every triggering row (``over`` true; NULL is false; all
  rows without ``over``) at time t has the window ``(t - size, t + delay]`` of its group's rows.
  ``WSTART = t - size``, ``WEND = t + delay``; closed iff ``WEND < T``, or ``WEND <= T`` and a row
  lies at ``WEND`` (times are unique per group, so none can arrive there): with ``delay = 0`` this is
  ``t <= T``. Computed as an equi-join of the triggering rows to the group's rows on the keys and a
  time bucket of width ``size + delay`` (each window spans at most two buckets: it is exploded into
  them), filtered by the range.
* ``EkSessionTrigger(timeout, max_duration)``: consecutive rows at most ``timeout`` apart share a
  window; a window starting at s is also cut at ``c(s)``, the first multiple of D = max_duration
  from the UTC epoch with ``c >= s + D``: the first row at or after c starts a new window. ``WSTART``
  = first row, ``WEND = min(last + timeout, c)`` (the timeout's end, or the cut if sooner), closed iff
  ``last + timeout < T`` (a row at ``last + timeout`` would still join) or ``c <= T`` (or
  ``c - 1 = T`` is the last row's time: no row can arrive there).

  Closed form of the cuts (no iteration): split time into blocks ``[jD, (j+1)D)``. A window starting
  at s in block j ends at ``(j+1)D`` if s is exactly ``jD`` (one block) and at ``(j+2)D`` otherwise
  (two blocks), and the next window starts at the first row of the next non-empty block it does not
  cover. So within a gap session, with x_j = "block j's first row starts a window" over its
  non-empty blocks: x_j = 1 when j is the session's first block, block j-1 is empty, or block j-1's
  first row lies exactly on ``(j-1)D`` ("reset" blocks); otherwise block j-1 is covered by the
  window of block j-1 or j-2, and x_j = not x_{j-1}. Hence x_j = ``(j - p) even`` with p the latest
  reset block at or before j, and a row of block j belongs to the window starting in block j if x_j
  else j-1: three passes of window functions over the group's rows ordered by time.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
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
    check_positive,
    exact_col,
    floor_div,
    ordered,
    per_window,
    running,
    window_stats,
)

_TT, _BKT, _TBKT = "__cq_ek_tt", "__cq_ek_bkt", "__cq_ek_tbkt"
_NEW, _BLK, _FIB, _RESET, _WBLK = "__cq_ek_new", "__cq_ek_blk", "__cq_ek_fib", "__cq_ek_reset", "__cq_ek_wblk"


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
    lo, hi = F.col(_TT) - F.lit(size - 1), F.col(_TT) + F.lit(delay)  # the window is [lo, hi] in micros
    trig_rows = trig_rows.select(*[exact_col(k).alias(a) for k, a in zip(keys, kcols)], F.col(T_US).alias(_TT))
    trig_rows = trig_rows.withColumn(_TBKT, F.explode(F.sequence(floor_div(lo, width), floor_div(hi, width))))
    rows = df.withColumn(_BKT, floor_div(F.col(T_US), width))
    cond = [exact_col(k).eqNullSafe(F.col(a)) for k, a in zip(keys, kcols)]
    cond += [F.col(_BKT) == F.col(_TBKT), F.col(T_US) >= lo, F.col(T_US) <= hi]
    out = rows.join(trig_rows, on=cond, how="inner").drop(_BKT, _TBKT, *kcols)
    w = per_window(keys, _TT)
    out = out.withColumns(
        {
            WS_US: F.col(_TT) - F.lit(size),
            WE_US: F.col(_TT) + F.lit(delay),
            LAST_US: F.max(T_US).over(w),
            WROWS: F.count(F.lit(1)).over(w),
        }
    )
    closed = (F.col(WE_US) < F.lit(until)) | ((F.col(WE_US) <= F.lit(until)) & (F.col(LAST_US) == F.col(WE_US)))
    return out.withColumn(WCLOSED, closed)


def ek_session(df: DataFrame, trig: EkSessionTrigger, keys: list[str], until: int) -> DataFrame:
    timeout, d = micros(trig.timeout), micros(trig.max_duration)
    check_positive(timeout, "timeout")
    check_positive(d, "max_duration")
    o = ordered(keys)
    before = o.rowsBetween(Window.unboundedPreceding, -1)
    t = F.col(T_US)
    prev = F.lag(T_US).over(o)
    df = df.withColumns({_NEW: prev.isNull() | (t - prev > F.lit(timeout)), _BLK: floor_div(t, d)})
    prev_blk = F.lag(_BLK).over(o)
    df = df.withColumns(
        {
            SEG: F.sum(F.col(_NEW).cast("long")).over(running(keys)),
            "__cq_ek_pblk": prev_blk,
            _FIB: F.col(_NEW) | (prev_blk != F.col(_BLK)),
        }
    )
    # for a block's first row: whether the previous block's first row lies on its boundary
    prev_bnd = F.last(F.when(F.col(_FIB), F.pmod(t, F.lit(d)) == 0), ignorenulls=True).over(before)
    reset = F.col(_FIB) & (F.col(_NEW) | (F.col("__cq_ek_pblk") != F.col(_BLK) - F.lit(1)) | prev_bnd)
    df = df.withColumn(_RESET, reset)
    p = F.last(F.when(F.col(_RESET), F.col(_BLK)), ignorenulls=True).over(running(keys))
    df = df.withColumn(
        _WBLK, F.when(F.pmod(F.col(_BLK) - p, F.lit(2)) == 0, F.col(_BLK)).otherwise(F.col(_BLK) - F.lit(1))
    )
    df = window_stats(df, keys, SEG, _WBLK)
    cut = (floor_div(F.col(WS_US) - F.lit(1), d) + F.lit(2)) * F.lit(d)  # first multiple of d >= start + d
    end = F.col(LAST_US) + F.lit(timeout)
    T = F.lit(until)
    # the last instant a row could join at is min(last + timeout, cut - 1): closed once before T, or
    # at T and taken by the window's last row (times are unique per group)
    closed = (end < T) | (cut <= T) | ((cut - F.lit(1) == T) & (F.col(LAST_US) == T))
    return df.withColumns({WE_US: F.least(end, cut), WCLOSED: closed}).drop(
        _NEW, _BLK, "__cq_ek_pblk", _FIB, _RESET, _WBLK
    )
