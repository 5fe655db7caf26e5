"""A query made of queries in the one plan of a run: ``FROM (SELECT ...)`` and ``UNION ALL``.

Each query is a ``Stream`` of the same trigger (``Stream.subquery``, ``Stream.union``) evaluated by
``plan.evaluate`` over the rows it reads, every window of the run at once: a subquery's result rows
keep their window's (and trigger group's) columns, so the outer query groups them by window as it
would the trigger rows; the branches of a UNION ALL are unioned by position, then given the output
columns (subtable, tags, group id) once. The whole is still one Spark plan per run.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cq_engine.durations import micros
from cq_engine.model import SUB_WSTART, Stream
from cq_engine.parse.fragments import TIME_REF
from cq_engine.streams.output import shaping_columns
from cq_engine.streams.plan import GROUP, WINDOW_CONSTANTS, aggregated, evaluate, partition_columns, query_partition
from cq_engine.streams.subwindows import with_data_sub_windows
from cq_engine.streams.windows.common import floor_div

# The rows a query reading a table sees: (rows, whether its WHERE is applied already, as a join's).
RowsOf = Callable[[Stream], tuple[DataFrame, bool]]
_WINDOW = sorted(WINDOW_CONSTANTS)
_K = "__cq_sw_k"


def query_result(
    stream: Stream,
    rows_of: RowsOf,
    *,
    keep: list[str],
    window_columns: list[str] | None = None,
    shaped: bool = True,
) -> DataFrame:
    """``stream``'s result rows over every window of the run (``plan.evaluate``'s columns)."""
    if not stream.union:
        return _one(stream, rows_of, keep=keep, window_columns=window_columns, shaped=shaped)
    names = [i.name for i in stream.select]
    parts = []
    for q in (stream, *stream.union):
        part = _one(q, rows_of, keep=keep, window_columns=window_columns, shaped=False)
        renamed = {i.name: n for i, n in zip(q.select, names)}
        parts.append(part.select(*[F.col(f"`{c}`").alias(renamed.get(c, c)) for c in part.columns]))
    common = [c for c in parts[0].columns if all(c in p.columns for p in parts[1:])]
    out = reduce(lambda a, b: a.unionByName(b), [p.select(*[f"`{c}`" for c in common]) for p in parts])
    if not shaped:
        return out
    # a UNION's output columns name only the trigger group's values (checked at load): row expressions
    shaping = {name: F.expr(sql) for name, sql in shaping_columns(stream)}
    items = [f"`{n}`" for n in names]
    return out.select(*items, *[c.alias(n) for n, c in shaping.items()], *_rest(out, names))


def _rest(df: DataFrame, names: list[str]) -> list[str]:
    return [f"`{c}`" for c in df.columns if c not in names]


def _one(stream: Stream, rows_of: RowsOf, *, keep: list[str], window_columns, shaped: bool) -> DataFrame:
    if stream.subquery is None:
        rows, joined = rows_of(stream)
        rows = with_sub_windows(stream, rows)
        return evaluate(stream, rows, keep=keep, window_columns=window_columns, where=not joined, shaped=shaped)
    inner = stream.subquery
    # what the outer query groups by or reads of the rows under it: the window's and group's columns
    carry = [*keep, *_WINDOW, *partition_columns(stream), GROUP, *(window_columns or [])]
    if not any(aggregated(q) for q in (inner, *inner.union)):
        carry.append(TIME_REF)  # the subquery's rows keep their own time (FIRST, LAST... over them)
    rows = query_result(inner, rows_of, keep=list(dict.fromkeys(carry)), window_columns=window_columns, shaped=False)
    return evaluate(stream, with_sub_windows(stream, rows), keep=keep, window_columns=window_columns, shaped=shaped)


def with_sub_windows(stream: Stream, rows: DataFrame) -> DataFrame:
    """Each row's sub-windows of the query's INTERVAL (``SUB_WSTART``), aligned as INTERVAL triggers are
    (``windows.tdengine``): every start k * sliding + offset with start <= t < start + interval; a row
    of several sub-windows (SLIDING < INTERVAL) is one row per sub-window."""
    w = stream.sub_windows
    if w is None:
        return rows
    if w.over is not None:  # SESSION, STATE_WINDOW, EVENT_WINDOW, COUNT_WINDOW over the rows in time order
        return with_data_sub_windows(stream, rows, query_partition(stream, rows))
    i, s, off = micros(w.interval), micros(w.sliding), micros(w.offset)
    rel = F.unix_micros(F.col(TIME_REF)) - F.lit(off)
    k_max = floor_div(rel, s)
    if s == i:
        rows = rows.withColumn(_K, k_max)
    else:  # a generator stands alone in its column
        k_min = floor_div(rel - F.lit(i), s) + F.lit(1)
        rows = rows.filter(k_min <= k_max).withColumn(_K, F.explode(F.sequence(k_min, k_max)))
    return rows.withColumn(SUB_WSTART, F.timestamp_micros(F.lit(off) + F.col(_K) * F.lit(s))).drop(_K)
