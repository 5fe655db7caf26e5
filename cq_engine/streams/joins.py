"""A new-form query's joins in the run's one plan: the trigger rows of every window joined with the
tables (``Stream.joins``), each side's columns under ``model.join_column`` names, the join condition
as written; per window, as TDengine evaluates the query, since each trigger row carries its window.

TDengine's time-series joins match each trigger row with a few rows of the table, among the rows equal
on the ON's equalities (``Join.keys``), JLIMIT at most:
- LEFT ASOF JOIN: the nearest rows its time comparison allows. Each trigger row counts the table's rows
  on its side of the comparison (one running count over both tables' times, sorted once) and takes the
  JLIMIT rows numbered just below that count: an equi-join, never a row against every earlier row.
- LEFT WINDOW JOIN: the rows in [ts + start, ts + end] (WINDOW_OFFSET), earliest first: an equi-join on
  time buckets as wide as the window, then the bounds. Its aggregates group by the trigger row
  (``model.JOIN_ROW``)."""

from __future__ import annotations

import functools
from datetime import timedelta

import sqlglot
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from sqlglot import exp

from cq_engine.context import EngineContext
from cq_engine.model import JOIN_ROW, Join, Stream, join_column
from cq_engine.times import EARLIEST, LATEST

_T, _SIDE, _K, _IDX, _RANK, _BUCKET = "__cq_jt", "__cq_jside", "__cq_jk", "__cq_jidx", "__cq_jrank", "__cq_jbucket"


def _col(name: str) -> Column:
    return F.col(f"`{name.replace('`', '``')}`")


def with_joins(ctx: EngineContext, stream: Stream, q: Stream, rows: DataFrame, *, time_range) -> DataFrame:
    """``rows`` (the windowed trigger rows) joined with ``q``'s tables. A table whose ON equates its
    time column with the trigger rows' is read only over ``time_range`` (the run's read), a WINDOW
    join's table over it widened by WINDOW_OFFSET, else whole, at its latest version."""
    if not q.joins:
        return rows
    own = [c for c in rows.columns if not c.lower().startswith("__cq")]  # engine columns keep their names
    out = rows.select(*[_col(c).alias(join_column(0, c)) if c in own else _col(c) for c in rows.columns])
    trigger_time = join_column(0, ctx.source_time_column(stream.name, q.read_table, sink=stream.sink))
    for n, j in enumerate(q.joins, 1):
        time_column = ctx.source_time_column(stream.name, j.table, sink=stream.sink)
        theirs = join_column(n, time_column)
        read = None
        if j.kind in ("inner", "left") and _equates(j.on, trigger_time, theirs):
            read = time_range
        elif j.kind == "window" and time_range is not None and j.offsets is not None:
            start, end = time_range[0] + j.offsets[0], time_range[1] + j.offsets[1] + timedelta(microseconds=1)
            read = (max(start, EARLIEST), min(end, LATEST))  # offsets up to 100 years stay in range
        table, _ = ctx.storage.read_range(ctx.spark, j.table, time_column=time_column, time_range=read)
        table = table.select(*[_col(c).alias(join_column(n, c)) for c in table.columns])
        if j.kind in ("inner", "left"):
            out = out.join(table, on=F.expr(j.on), how=j.kind)
            continue
        out = out.withColumn(JOIN_ROW, F.monotonically_increasing_id())
        if j.limit == 0:  # JLIMIT 0: every trigger row, no row of the table
            out = out.join(table, on=F.lit(False), how="left")
        elif j.kind == "window":
            out = _window_join(out, table, j, trigger_time, theirs)
        else:
            out = _asof_join(out, table, j, *(j.asof or (trigger_time, theirs, ">=")))
        if j.kind == "asof":
            out = out.drop(JOIN_ROW)
    return out


def _keys_equal(j: Join, left: DataFrame, right: DataFrame) -> list[Column]:
    return [left[f"`{a}`"] == right[f"`{b}`"] for a, b in j.keys]


def _order(table: DataFrame, theirs: str, *, ascending: bool) -> list[Column]:
    """The table's rows by time, ties by their columns: the same rows win every rerun."""
    cols = [theirs, *[c for c in table.columns if c != theirs]]
    return [_col(c).asc() if ascending else _col(c).desc() for c in cols]


def _first(df: DataFrame, order: list[Column], limit: int | None, matched: str) -> DataFrame:
    """Each trigger row's first ``limit`` matches in ``order`` (a row without a match kept once)."""
    if limit is None:
        return df
    rank = F.row_number().over(Window.partitionBy(JOIN_ROW).orderBy(*order))
    return df.withColumn(_RANK, rank).filter((F.col(_RANK) <= limit) | _col(matched).isNull()).drop(_RANK)


def _window_join(rows: DataFrame, table: DataFrame, j: Join, mine: str, theirs: str) -> DataFrame:
    """Each trigger row with the table's rows in [ts + start, ts + end], joined on time buckets as wide
    as that window: a trigger row's window starts in one bucket, which holds the table's rows of that
    bucket and the next (each table row in two); then bounded exactly."""
    start, end = j.offsets or (timedelta(0), timedelta(0))
    width = max(_us(end - start), 1)
    left = rows.withColumn(_BUCKET, F.floor((F.unix_micros(_col(mine)) + _us(start)) / width))
    own = F.floor(F.unix_micros(_col(theirs)) / width)
    right = table.withColumn(_BUCKET, F.explode(F.array(own - 1, own)))
    t, lt = F.unix_micros(right[f"`{theirs}`"]), F.unix_micros(left[f"`{mine}`"])
    cond = [left[_BUCKET] == right[_BUCKET], *_keys_equal(j, left, right), t >= lt + _us(start), t <= lt + _us(end)]
    joined = left.join(right, on=cond, how="left").drop(left[_BUCKET]).drop(right[_BUCKET])
    return _first(joined, _order(table, theirs, ascending=True), j.limit, theirs)


def _us(d: timedelta) -> int:
    return d // timedelta(microseconds=1)


def _asof_join(rows: DataFrame, table: DataFrame, j: Join, mine: str, theirs: str, op: str) -> DataFrame:
    """Each trigger row with the JLIMIT nearest rows of ``table`` that ``mine op theirs`` allows."""
    table = table.filter(_col(theirs).isNotNull())
    if op == "=":
        joined = rows.join(
            table, on=[*_keys_equal(j, rows, table), rows[f"`{mine}`"] == table[f"`{theirs}`"]], how="left"
        )
        return _first(joined, _order(table, theirs, ascending=True), j.limit, theirs)
    backward = op in (">=", ">")  # the table's rows at or before the trigger row's time
    # at equal times the table's row counts before the trigger row when the comparison allows equality
    mine_first = op in (">", "<")
    keys = [f"{_K}{i}" for i in range(len(j.keys))]
    left = rows.select("*", *[_col(a).alias(k) for (a, _), k in zip(j.keys, keys)], _col(mine).alias(_T))
    left = left.withColumn(_SIDE, F.lit(0 if mine_first else 1))
    right = table.select(*[_col(b).alias(k) for (_, b), k in zip(j.keys, keys)], _col(theirs).alias(_T))
    right = right.withColumn(_SIDE, F.lit(1 if mine_first else 0))
    tables_side = 1 if mine_first else 0
    order = [F.col(_T).asc() if backward else F.col(_T).desc(), F.col(_SIDE).asc()]
    counted = Window.partitionBy(*keys).orderBy(*order)  # RANGE frame: equal (time, side) rows count together
    both = left.unionByName(right, allowMissingColumns=True)
    before = F.sum(F.when(F.col(_SIDE) == tables_side, 1).otherwise(0)).over(counted)
    null_key = functools.reduce(lambda a, b: a | b, [F.col(k).isNull() for k in keys], F.lit(False))
    mark = F.when(F.col(_T).isNotNull() & ~null_key, before)
    n = j.limit or 1
    counted_rows = both.withColumn(_IDX, mark).filter(F.col(_SIDE) != tables_side)  # a generator takes no window
    idx = F.when(F.col(_IDX) >= 1, F.sequence(F.greatest(F.col(_IDX) - n + 1, F.lit(1)), F.col(_IDX)))
    trigger = counted_rows.withColumn(_IDX, F.explode_outer(idx))
    trigger = trigger.drop(_T, _SIDE, *keys)
    # numbered from the farthest: a trigger row takes the JLIMIT numbers below its count
    numbered = Window.partitionBy(*[_col(b) for _, b in j.keys]).orderBy(*_order(table, theirs, ascending=backward))
    indexed = table.withColumn(_IDX, F.row_number().over(numbered))
    cond = [trigger[_IDX] == indexed[_IDX], *_keys_equal(j, trigger, indexed)]
    return trigger.join(indexed, on=cond, how="left").drop(trigger[_IDX]).drop(indexed[_IDX])


def _equates(on: str, a: str, b: str) -> bool:
    """``on`` holds ``a = b`` (either way round) as a top-level AND term."""
    tree = sqlglot.parse_one(on, read="spark").unnest()
    terms = tree.flatten() if isinstance(tree, exp.And) else [tree]
    pair = {a.lower(), b.lower()}
    return any(
        isinstance(t, exp.EQ)
        and all(isinstance(s, exp.Column) for s in (t.this, t.expression))
        and {t.this.name.lower(), t.expression.name.lower()} == pair
        for t in terms
    )
