"""The rows of IoTDB's GROUP BY result that hold no source row: every window of every *known* group.

IoTDB takes a query's devices from its schema, so each window of each device is a row of the result,
empty or not: a count of 0 is written there, FILL reaches it, LIMIT numbers it. The known groups of a
run are the values of its group columns the source holds at the version read (``storage.groups``);
WHERE conditions naming only group columns pick among them, as IoTDB's FROM paths do. An empty
window's values are the select items over no rows (``empty_sql``): 0 for a count, NULL otherwise.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import reduce
from typing import TypeAlias

import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from sqlglot import exp

from cq_engine.parse.fragments import is_aggregate_call

_PRESENT = "__cq_present"
_COUNTS = (exp.Count, exp.CountIf, exp.ApproxDistinct)

# The known group values of a run: an Arrow table (from the engine's state), a Spark frame, or None
# (then the distinct keys of the frame ``plan_query`` is given).
Groups: TypeAlias = pa.Table | DataFrame | None


@dataclass(frozen=True)
class GroupSource:
    """Where the known group values come from (``Groups``), and the WHERE conditions that name only
    group columns: those pick the groups of the query (IoTDB's FROM paths), the others filter rows."""

    data: DataFrame
    keys: list[str]
    groups: Groups

    def python_rows(self, where: str | None) -> list[tuple] | None:
        """The group tuples, if known without Spark; [()] without group columns."""
        if not self.keys:
            return [()]
        if not isinstance(self.groups, pa.Table) or group_condition(where, self.keys) is not None:
            return None
        return list(zip(*[self.groups.column(k).to_pylist() for k in self.keys]))

    def frame(self, spark: SparkSession, where: str | None) -> DataFrame | None:
        """The groups as a Spark frame (None without group columns)."""
        if not self.keys:
            return None
        if isinstance(self.groups, pa.Table) and self.groups.num_rows == 0:
            # No group yet (an empty source): Spark Connect cannot infer a schema from an empty Arrow
            # table (CANNOT_INFER_EMPTY_SCHEMA), so the source's own group columns, no rows.
            frame = self.data.select(*[F.col(k) for k in self.keys]).limit(0)
        elif isinstance(self.groups, pa.Table):
            frame = spark.createDataFrame(self.groups.select(self.keys))  # a local relation: no Spark job
        elif self.groups is None:
            frame = self.data.select(*[F.col(k) for k in self.keys]).distinct()
        else:
            frame = self.groups
        condition = group_condition(where, self.keys)
        return frame if condition is None else frame.filter(F.expr(condition))


def join_cells(
    spark: SparkSession,
    agg: DataFrame,
    windows: DataFrame,
    known: GroupSource,
    *,
    where: str | None,
    empties: dict[str, str],
    having: tuple[str, str | None],
) -> DataFrame:
    """``agg`` (one row per window index and group that has rows) on every (window, known group):
    ``windows`` holds the window indexes (its one column is ``agg``'s first); where a cell has no row
    its select items (``empties``: name → SQL over no rows) and the HAVING column (``having``: name,
    HAVING's SQL or None) are their values over no rows."""
    window_column = windows.columns[0]
    cells = windows
    groups = known.frame(spark, where)
    if groups is not None:
        cells = cells.crossJoin(groups)
    sides = [window_column, *known.keys]
    right = agg.select(
        *[F.col(c).alias(f"__cq_j{n}") for n, c in enumerate(sides)],
        *[F.col(c) for c in agg.columns if c not in sides],
        F.lit(True).alias(_PRESENT),
    )
    # NULL is a group value like any other (a device column that is NULL): null-safe equality.
    condition = reduce(lambda a, b: a & b, [F.col(c).eqNullSafe(F.col(f"__cq_j{n}")) for n, c in enumerate(sides)])
    joined = cells.join(right, condition, "left").drop(*[f"__cq_j{n}" for n in range(len(sides))])
    missing = F.col(_PRESENT).isNull()
    name, having_sql = having
    for column, empty in [*empties.items(), *([(name, empty_sql(having_sql))] if having_sql else [])]:
        joined = joined.withColumn(column, F.when(missing, F.expr(empty)).otherwise(F.col(column)))
    return joined.drop(_PRESENT)


@functools.lru_cache(maxsize=1024)
def empty_sql(expression: str) -> str:
    """``expression`` (Spark SQL) over a window without rows: each aggregate call replaced by its
    value over no rows (0 for counts, NULL for the others), so ``count(a) + 1`` gives 1."""
    node = sqlglot.parse_one(expression, read="spark")

    def visit(n):
        if is_aggregate_call(n):
            return exp.Literal.number(0) if isinstance(n, _COUNTS) else exp.Null()
        return n

    return node.transform(visit).sql(dialect="spark")


@functools.lru_cache(maxsize=1024)
def _group_condition(where: str, keys: tuple[str, ...]) -> str | None:
    node = sqlglot.parse_one(where, read="spark")
    lowered = {k.lower() for k in keys}
    picked = []
    for part in node.flatten() if isinstance(node, exp.And) else [node]:
        names = {c.name.lower() for c in part.find_all(exp.Column)}
        if names and names <= lowered:
            picked.append(part.sql(dialect="spark"))
    return " AND ".join(f"({p})" for p in picked) or None


def group_condition(where: str | None, keys: list[str]) -> str | None:
    """The AND-ed conditions of WHERE that name group columns only (``device = 'd1'``)."""
    return None if not where or not keys else _group_condition(where, tuple(keys))


def add_empty_windows(
    table: pa.Table,
    *,
    time_column: str,
    keys: list[str],
    starts: list[int],
    groups: list[tuple],
    values: dict[str, int | None],
) -> pa.Table:
    """Add to a run's result (Arrow) the windows (``starts``, micros) of every known group it lacks,
    with constant ``values`` (a count's 0, else NULL); rows whose values are all NULL are not added."""
    seen_times = pc.cast(table.column(time_column), pa.int64()).to_pylist()
    key_rows = list(zip(*[table.column(k).to_pylist() for k in keys])) if keys else [()] * table.num_rows
    present = set(zip(seen_times, key_rows))
    missing = [(w, g) for w in starts for g in groups if (w, g) not in present]
    if not missing or not any(v is not None for v in values.values()):
        return table
    columns = {time_column: pa.array([w for w, _ in missing], pa.int64()).cast(table.schema.field(time_column).type)}
    for i, k in enumerate(keys):
        columns[k] = pa.array([g[i] for _, g in missing], table.schema.field(k).type)
    for field in table.schema:
        if field.name not in columns:
            columns[field.name] = pa.array([values.get(field.name)] * len(missing), field.type)
    return pa.concat_tables([table, pa.table({f.name: columns[f.name] for f in table.schema}, schema=table.schema)])
