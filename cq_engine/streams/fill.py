"""FILL over a query's INTERVAL sub-windows (``Stream.sub_windows``), in the run's one plan.

Per trigger window (or PERIOD tick) and query partition holding rows, every sub-window starting in the
trigger's range ``[start, end)`` is given a row: those without rows are added with their constant items
(``_wstart``, placeholders, the group's columns) and each aggregate filled as TDengine's FILL says —
NULL, VALUE (the given constants in order), PREV / NEXT (the nearest non-NULL value before / after),
LINEAR (interpolated in time between them; NULL at either end)."""

from __future__ import annotations

from functools import reduce

import sqlglot
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from sqlglot import exp

from cq_engine.durations import micros
from cq_engine.model import SUB_WSTART, Stream
from cq_engine.streams.windows.common import floor_div
from cq_engine.streams.windows.tdengine import WEND, WSTART, exact_col

FILLED = "__cq_filled"
_K = "__cq_fill_k"
_NUMERIC = ("tinyint", "smallint", "int", "bigint", "float", "double", "decimal")


def with_fill(stream: Stream, out: DataFrame, *, ids: list[str], columns: list[tuple[str, str, str]]) -> DataFrame:
    """``out`` (one row per trigger window, partition and sub-window with rows; ``columns``: each result
    column's (name, Spark SQL, kind): ``constant`` (over the group's keys), ``aggregate`` (an item FILL
    fills) or ``other`` (an output column not over the keys: NULL)) with the missing sub-windows filled."""
    w = stream.sub_windows
    assert w is not None and w.fill != "none"
    size, off = micros(w.interval), micros(w.offset)
    parts = [*ids, *stream.group_by]
    on = [*parts, SUB_WSTART]
    first = -floor_div(F.lit(off) - F.unix_micros(F.col(WSTART)), size)  # the first start >= the range's
    last = floor_div(F.unix_micros(F.col(WEND)) - F.lit(1 + off), size)
    grid = out.select(*[exact_col(c) for c in parts]).distinct()
    grid = grid.withColumn(_K, F.explode(F.sequence(first, last)))
    grid = grid.withColumn(SUB_WSTART, F.timestamp_micros(F.lit(off) + F.col(_K) * F.lit(size))).drop(_K)
    left, right = grid.alias("__cq_fl"), out.select(*[exact_col(c) for c in on]).alias("__cq_fr")
    same = [F.col(f"__cq_fl.`{c}`").eqNullSafe(F.col(f"__cq_fr.`{c}`")) for c in on]
    missing = left.join(right, on=reduce(lambda a, b: a & b, same), how="left_anti")
    types = dict(out.dtypes)
    values = iter(w.fill_values)
    filled = []
    for name, sql, kind in columns:
        if kind == "constant":
            value = F.expr(sql) if _names(sql) <= {c.lower() for c in grid.columns} else F.lit(None)
        elif kind == "aggregate" and w.fill == "value":  # as many values as aggregates (checked at load)
            value = F.expr(next(values))
        else:
            value = F.lit(None)
        filled.append(value.cast(types[name]).alias(name))
    checks = [F.lit(True).alias(c) for c in out.columns if c.startswith("__cq_in_range")]
    rows = missing.select(*[exact_col(c) for c in on], *filled, *checks)
    both = out.withColumn(FILLED, F.lit(False)).unionByName(rows.withColumn(FILLED, F.lit(True)))
    if w.fill in ("prev", "next", "linear"):
        order = Window.partitionBy(*[exact_col(c) for c in parts]).orderBy(SUB_WSTART)
        for name, _, kind in columns:
            aggregate = kind == "aggregate"
            if aggregate and (w.fill != "linear" or types[name].startswith(_NUMERIC)):
                value = _nearest(F.col(name), w.fill, order).cast(types[name])
                both = both.withColumn(name, F.when(F.col(FILLED), value).otherwise(F.col(name)))
            elif aggregate:  # LINEAR of a non-numeric aggregate: nothing to interpolate
                both = both.withColumn(name, F.when(F.col(FILLED), F.lit(None)).otherwise(F.col(name)))
    return both.drop(FILLED)


def _nearest(c: Column, mode: str, order) -> Column:
    before = order.rowsBetween(Window.unboundedPreceding, 0)
    after = order.rowsBetween(0, Window.unboundedFollowing)
    if mode == "prev":
        return F.last(c, ignorenulls=True).over(before)
    if mode == "next":
        return F.first(c, ignorenulls=True).over(after)
    t = F.unix_micros(F.col(SUB_WSTART))
    pt = F.last(F.when(c.isNotNull(), t), ignorenulls=True).over(before)
    nt = F.first(F.when(c.isNotNull(), t), ignorenulls=True).over(after)
    pv, nv = F.last(c, ignorenulls=True).over(before), F.first(c, ignorenulls=True).over(after)
    return F.when(nt > pt, pv + (nv - pv) * (t - pt) / (nt - pt))


def _names(sql: str) -> set[str]:
    return {c.name.lower() for c in sqlglot.parse_one(sql, read="spark").find_all(exp.Column)}
