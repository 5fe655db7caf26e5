"""A new-form query's joins in the run's one plan: the trigger rows of every window joined with the
tables (``Stream.joins``), each side's columns under ``model.join_column`` names, the join condition
as written; per window, as TDengine evaluates the query, since each trigger row carries its window.
A LEFT ASOF JOIN is Spark's as-of join (``DataFrame._joinAsOf``): each trigger row with the one nearest
row of the table its time comparison allows."""

from __future__ import annotations

import sqlglot
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from sqlglot import exp

from cq_engine.context import EngineContext
from cq_engine.model import Stream, join_column


def _col(name: str):
    return F.col(f"`{name.replace('`', '``')}`")


def with_joins(ctx: EngineContext, stream: Stream, q: Stream, rows: DataFrame, *, time_range) -> DataFrame:
    """``rows`` (the windowed trigger rows) joined with ``q``'s tables. A table whose ON equates its
    time column with the trigger rows' is read only over ``time_range`` (the run's read), else whole,
    at its latest version."""
    if not q.joins:
        return rows
    own = [c for c in rows.columns if not c.lower().startswith("__cq")]  # engine columns keep their names
    out = rows.select(*[_col(c).alias(join_column(0, c)) if c in own else _col(c) for c in rows.columns])
    trigger_time = join_column(0, ctx.source_time_column(stream.name, q.read_table, sink=stream.sink))
    for n, j in enumerate(q.joins, 1):
        time_column = ctx.source_time_column(stream.name, j.table, sink=stream.sink)
        equated = j.kind != "asof" and _equates(j.on, trigger_time, join_column(n, time_column))
        table, _ = ctx.storage.read_range(
            ctx.spark, j.table, time_column=time_column, time_range=time_range if equated else None
        )
        table = table.select(*[_col(c).alias(join_column(n, c)) for c in table.columns])
        if j.kind == "asof":  # the nearest row may lie before (after) the run's range: the whole table
            mine, theirs, op = j.asof or (trigger_time, join_column(n, time_column), ">=")
            out = out._joinAsOf(
                table,
                leftAsOfColumn=_col(mine),
                rightAsOfColumn=_col(theirs),
                on=None if j.on == "TRUE" else F.expr(j.on),
                how="left",
                allowExactMatches=op in (">=", "<="),
                direction="backward" if op in (">=", ">") else "forward",
            )
        else:
            out = out.join(table, on=F.expr(j.on), how=j.kind)
    return out


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
