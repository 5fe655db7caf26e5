"""plan: a continuous query + the coverage of a run → one Spark DataFrame (one job, any window count).

Times become integer microseconds so window arithmetic is exact. Every window of the run is
``[anchor + k*step, anchor + k*step + interval)`` on one grid anchored at the coverage start.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, NumericType, StringType

from cq_engine.catalog import referenced_columns
from cq_engine.durations import micros
from cq_engine.errors import CQError
from cq_engine.model import ContinuousQuery, TimeGrouping
from cq_engine.parse.fragments import TIME_REF, is_aggregate_sql
from cq_engine.resample.timing import Coverage
from cq_engine.times import EPOCH

_T, _K, _OWNER, _HAVING = "__cq_t", "__cq_k", "__cq_owner", "__cq_having"


def _as_is(table: pa.Table) -> pa.Table:
    return table


@dataclass(frozen=True)
class Plan:
    """The Spark job of a run, plus a cheap Arrow step that completes its result."""

    frame: DataFrame
    columns: tuple[str, ...]  # the frame's columns, known without asking Spark (a Connect round trip)
    complete: Callable[[pa.Table], pa.Table] = _as_is

    @property
    def spark_only(self) -> bool:
        """Is ``frame`` the whole result (no Arrow step), so Spark can write it itself?"""
        return self.complete is _as_is

    def to_arrow(self) -> pa.Table:
        """Run the one Spark job and complete its result."""
        return self.complete(self.frame.toArrow())


@dataclass(frozen=True)
class _Grid:
    anchor: int  # micros
    step: int
    interval: int
    windows: int  # k in [0, windows)


def grouping_of(cq: ContinuousQuery, cov: Coverage) -> TimeGrouping | None:
    """GROUP BY (interval, step), or for aggregates without it one window per firing range."""
    if cq.time_grouping is not None:
        return cq.time_grouping
    if cq.is_aggregate:
        return TimeGrouping(interval=cov.length, step=cov.every)
    return None


def plan_query(
    spark: SparkSession, cq: ContinuousQuery, data: DataFrame, *, time_column: str, coverage: Coverage
) -> Plan:
    """The rows ``cq`` writes for ``coverage``; ``data`` holds at least the source rows it covers."""
    lo0, every, length = micros(coverage.start - EPOCH), micros(coverage.every), micros(coverage.length)
    end, emit_end = micros(coverage.end - EPOCH), micros(coverage.emit_end - EPOCH)
    t = F.unix_micros(F.col(time_column))
    df = data.withColumn(_T, t).withColumn(TIME_REF, F.col(time_column))
    df = df.filter((F.col(_T) >= lo0) & (F.col(_T) < end) & _covered(F.col(_T), lo0, every, length))
    if cq.where:
        df = df.filter(F.expr(cq.where))
    keys = list(cq.group_keys)
    if cq.align_by_device and not any(k.lower() == "device" for k in keys):
        keys.append("device")
    grouping = grouping_of(cq, coverage)
    if grouping is None:
        frame = _row_wise(cq, df, time_column, keys, lo0, every, coverage.count, emit_end)
        return Plan(frame, _output_columns(cq, time_column, keys))
    else:
        step, interval = micros(grouping.step), micros(grouping.interval)
        windows = -(-(min(end, emit_end) - lo0) // step)
        if cq.time_grouping is None:  # one window per firing range
            windows = min(windows, coverage.count)
        grid = _Grid(lo0, step, interval, windows)
        return _windowed(spark, cq, df, time_column, keys, grid, every, length, coverage.count)


def _covered(x, lo0: int, every: int, length: int):
    """Whether micros ``x`` (a Spark column, or an int) lies in some firing range: ranges shorter
    than EVERY leave gaps."""
    if isinstance(x, int):
        return length >= every or (x - lo0) % every < length
    if length >= every:
        return F.lit(True)
    return F.pmod(x - F.lit(lo0), F.lit(every)) < F.lit(length)


def _owner(x: Column, lo0: int, every: int, count: int) -> Column:
    """Index of the last firing whose range starts at or before ``x``: the one whose write stays."""
    return F.least(F.lit(count - 1), F.floor((x - F.lit(lo0)) / F.lit(every)).cast("long"))


def _row_wise(cq, df, time_column, keys, lo0, every, count, emit_end) -> DataFrame:
    df = df.filter(F.col(_T) < emit_end)
    values = [F.expr(i.expression).alias(i.name) for i in cq.select]
    out = df.select(
        F.col(time_column), *[F.col(k) for k in keys], *values, _owner(F.col(_T), lo0, every, count).alias(_OWNER)
    )
    return _finish(cq, out, time_column, keys)


def _windowed(spark, cq, df, time_column, keys, grid: _Grid, every, length, count) -> Plan:
    rel = F.col(_T) - F.lit(grid.anchor)
    if grid.step == grid.interval:
        df = df.withColumn(_K, F.floor(rel / grid.step).cast("long"))
    else:
        # A row belongs to every window k with k*step <= rel < k*step + interval.
        k_min = F.greatest(F.lit(0), F.ceil((rel - F.lit(grid.interval - 1)) / grid.step)).cast("long")
        k_max = F.floor(rel / grid.step).cast("long")
        df = df.filter(k_min <= k_max).withColumn(_K, F.explode(F.sequence(k_min, k_max)))
    ws = F.lit(grid.anchor) + F.col(_K) * F.lit(grid.step)
    # Windows start inside a firing's range: with gaps between ranges, none starts in a gap.
    df = df.filter((F.col(_K) < grid.windows) & _covered(ws, grid.anchor, every, length))

    aggs = [F.expr(i.expression).alias(i.name) for i in cq.select]
    having_in_agg = cq.having is not None and is_aggregate_sql(cq.having)
    if having_in_agg:
        aggs.append(F.expr(cq.having).alias(_HAVING))
    agg = df.groupBy(F.col(_K), *[F.col(k) for k in keys]).agg(*aggs)  # Column objects: no Connect round trip

    counts = [i.name for i in cq.select if i.expression.upper().startswith("COUNT(")]
    # Empty windows exist in IoTDB's output (count 0, or a value FILL can reach). Where only counts
    # need them, they are added to the (small) result in Arrow: a grid join in Spark would scan the
    # source a second time.
    complete_in_arrow = bool(counts) and cq.fill is None and cq.having is None and cq.limit is None and not cq.offset
    if cq.fill is not None or (counts and not complete_in_arrow):
        grid_ws = F.lit(grid.anchor) + F.col("id") * F.lit(grid.step)
        windows = spark.range(grid.windows).filter(_covered(grid_ws, grid.anchor, every, length))
        windows = windows.select(F.col("id").alias(_K))
        if keys:
            windows = windows.crossJoin(df.select(*keys).distinct())
        agg = windows.join(agg, on=[_K, *keys], how="left")
        for name in counts:
            agg = agg.withColumn(name, F.coalesce(F.col(name), F.lit(0).cast("long")))
    if having_in_agg:
        agg = agg.filter(F.col(_HAVING)).drop(_HAVING)
    elif cq.having:
        agg = agg.filter(F.expr(cq.having))

    agg = agg.withColumn(_OWNER, _owner(ws, grid.anchor, every, count))
    if cq.fill is not None:
        agg = _fill(agg, cq, keys)
    out = agg.select(
        F.timestamp_micros(ws).alias(time_column),
        *[F.col(k) for k in keys],
        *[F.col(i.name) for i in cq.select],
        F.col(_OWNER),
    )
    out = _finish(cq, out, time_column, keys)
    columns = _output_columns(cq, time_column, keys)
    if not complete_in_arrow:
        return Plan(out, columns)
    starts = [
        w for w in (grid.anchor + k * grid.step for k in range(grid.windows)) if _covered(w, grid.anchor, every, length)
    ]
    return Plan(
        out,
        columns,
        lambda table: _zero_counts(table, time_column=time_column, keys=keys, starts=starts, counts=counts),
    )


def _zero_counts(
    table: pa.Table, *, time_column: str, keys: list[str], starts: list[int], counts: list[str]
) -> pa.Table:
    """Add the empty windows of every group present: counts 0, other values NULL."""
    if table.num_rows == 0:
        return table
    seen_times = pc.cast(table.column(time_column), pa.int64()).to_pylist()
    key_rows = list(zip(*[table.column(k).to_pylist() for k in keys])) if keys else [()] * table.num_rows
    present = set(zip(seen_times, key_rows))
    groups = list(dict.fromkeys(key_rows))
    missing = [(w, g) for w in starts for g in groups if (w, g) not in present]
    if not missing:
        return table
    columns = {time_column: pa.array([w for w, _ in missing], pa.int64()).cast(table.schema.field(time_column).type)}
    for i, k in enumerate(keys):
        columns[k] = pa.array([g[i] for _, g in missing], table.schema.field(k).type)
    for field in table.schema:
        if field.name not in columns:
            value = 0 if field.name in counts else None
            columns[field.name] = pa.array([value] * len(missing), field.type)
    extra = pa.table({f.name: columns[f.name] for f in table.schema}, schema=table.schema)
    return pa.concat_tables([table, extra])


def _fill(agg: DataFrame, cq: ContinuousQuery, keys: list[str]) -> DataFrame:
    fill = cq.fill
    assert fill is not None  # called for a FILL clause only
    order = Window.partitionBy(*keys, _OWNER).orderBy(_K)
    before = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    after = order.rowsBetween(Window.currentRow, Window.unboundedFollowing)
    types = {f.name: f.dataType for f in agg.schema.fields}
    for item in cq.select:
        c, dtype = F.col(item.name), types[item.name]
        if fill.kind == "previous":
            agg = agg.withColumn(item.name, F.last(c, ignorenulls=True).over(before))
        elif fill.kind == "linear":
            if not isinstance(dtype, NumericType):
                continue  # IoTDB interpolates numbers only
            k = F.col(_K)
            prev_v, next_v = F.last(c, True).over(before), F.first(c, True).over(after)
            prev_k = F.last(F.when(c.isNotNull(), k), True).over(before)
            next_k = F.first(F.when(c.isNotNull(), k), True).over(after)
            interp = prev_v + (next_v - prev_v) * (k - prev_k) / (next_k - prev_k)
            agg = agg.withColumn(item.name, F.coalesce(c, interp.cast(dtype)))
        elif _fill_fits(fill.value, dtype):
            agg = agg.withColumn(item.name, F.coalesce(c, F.lit(fill.value).cast(dtype)))
    return agg


def _fill_fits(value, dtype) -> bool:
    """IoTDB fills a column with a constant only when the types agree."""
    if isinstance(value, bool):
        return isinstance(dtype, BooleanType)
    if isinstance(value, (int, float)):
        return isinstance(dtype, NumericType)
    return isinstance(dtype, StringType)


def _output_columns(cq: ContinuousQuery, time_column: str, keys: list[str]) -> tuple[str, ...]:
    return (time_column, *keys, *[i.name for i in cq.select])


def _finish(cq: ContinuousQuery, out: DataFrame, time_column: str, keys: list[str]) -> DataFrame:
    """Drop all-null rows, apply LIMIT/OFFSET per firing, and drop engine columns."""
    names = [i.name for i in cq.select]
    if names:
        out = out.filter(
            F.greatest(*[F.col(n).isNotNull() for n in names]) if len(names) > 1 else F.col(names[0]).isNotNull()
        )
    if cq.limit is not None or cq.offset:
        order = [*keys, time_column] if cq.align_by_device else [time_column, *keys]
        rn = F.row_number().over(Window.partitionBy(_OWNER).orderBy(*order))
        out = out.withColumn("__cq_rn", rn).filter(F.col("__cq_rn") > cq.offset)
        if cq.limit is not None:
            out = out.filter(F.col("__cq_rn") <= cq.offset + cq.limit)
        out = out.drop("__cq_rn")
    return out.drop(_OWNER)


def check_columns(cq: ContinuousQuery, columns: list[str], *, table: str) -> None:
    """A clear error when the source lacks a column the query names."""
    known = {c.lower() for c in columns}
    need = referenced_columns(cq) | ({"device"} if cq.align_by_device else set())
    missing = sorted(need - known)
    if missing:
        raise CQError(f"{cq.name}: table {table!r} has no column {missing[0]!r} (columns: {', '.join(columns)})")
