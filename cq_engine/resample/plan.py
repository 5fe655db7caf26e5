"""plan: a continuous query + the coverage of a run → one Spark DataFrame (one job, any window count).

Times become integer microseconds so window arithmetic is exact. Every window of the run is
``[anchor + k*step, anchor + k*step + interval)`` on one grid anchored at the coverage start.

IoTDB's rules (docs/dialects/iotdb.md): a NULL is an absent point; every window of every
known group is a row of the GROUP BY result (the groups are every value the source holds, not only
those present in the range); HAVING, then FILL, then OFFSET/LIMIT work on those rows, and only then
are rows whose values are all NULL left out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import sqlglot
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, NumericType, StringType
from sqlglot import exp

from cq_engine.catalog import referenced_columns
from cq_engine.durations import micros
from cq_engine.errors import CQError
from cq_engine.model import ContinuousQuery, TimeGrouping
from cq_engine.parse.fragments import TIME_REF, is_aggregate_sql
from cq_engine.resample.groups import Groups, GroupSource, add_empty_windows, empty_sql, join_cells
from cq_engine.resample.timing import Coverage
from cq_engine.times import EPOCH

_T, _K, _OWNER, _HAVING = "__cq_t", "__cq_k", "__cq_owner", "__cq_having"
_RN = "__cq_rn"


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


def group_columns(cq: ContinuousQuery) -> tuple[str, ...]:
    """The columns a row of ``cq``'s result is grouped by besides its window (ALIGN BY DEVICE adds ``device``)."""
    keys = list(cq.group_keys)
    if cq.align_by_device and not any(k.lower() == "device" for k in keys):
        keys.append("device")
    return tuple(keys)


def needs_groups(cq: ContinuousQuery) -> bool:
    """Do the rows of groups without data in a window matter (a count of 0, FILL, LIMIT's numbering)?
    Only then are the known groups asked for."""
    return bool(group_columns(cq)) and _needs_grid(cq)


def _needs_grid(cq: ContinuousQuery) -> bool:
    if not cq.is_aggregate:
        return False
    return (
        cq.fill is not None
        or cq.limit is not None
        or bool(cq.offset)
        or any(empty_sql(i.expression) != "NULL" for i in cq.select)
    )


def plan_query(
    spark: SparkSession,
    cq: ContinuousQuery,
    data: DataFrame,
    *,
    time_column: str,
    coverage: Coverage,
    groups: Groups = None,
) -> Plan:
    """The rows ``cq`` writes for ``coverage``; ``data`` holds at least the source rows it covers.
    ``groups``: every value of ``group_columns(cq)`` the source holds at the version read (None: the
    distinct ones of ``data``)."""
    lo0, every, length = micros(coverage.start - EPOCH), micros(coverage.every), micros(coverage.length)
    end, emit_end = micros(coverage.end - EPOCH), micros(coverage.emit_end - EPOCH)
    t = F.unix_micros(F.col(time_column))
    df = data.withColumn(_T, t).withColumn(TIME_REF, F.col(time_column))
    df = df.filter((F.col(_T) >= lo0) & (F.col(_T) < end) & _covered(F.col(_T), lo0, every, length))
    if cq.where:
        df = df.filter(F.expr(cq.where))
    keys = list(group_columns(cq))
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
        known = GroupSource(data, keys, groups)
        return _windowed(spark, cq, df, time_column, keys, grid, every, length, coverage.count, known)


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
    # A row of IoTDB's raw result exists where a series the SELECT reads has a point (s1 + s2 AS x
    # has a row where s1 alone has one); FILL and LIMIT work on those rows, and only then are rows
    # whose values are all NULL left out.
    series = [F.col(c).isNotNull() for c in _series_read(cq, keys)]
    if series:
        df = df.filter(F.greatest(*series) if len(series) > 1 else series[0])
    values = [F.expr(i.expression).alias(i.name) for i in cq.select]
    out = df.select(
        F.col(time_column),
        F.col(_T),
        *[F.col(k) for k in keys],
        *values,
        _owner(F.col(_T), lo0, every, count).alias(_OWNER),
    )
    if not series:  # constants only: a row where a value is
        out = _drop_empty(cq, out)
    if cq.fill is not None:
        out = _fill(out, cq, keys, order=_T)
    return _drop_empty(cq, _limit(cq, out, order=_T, keys=keys)).drop(_T, _OWNER)


def _series_read(cq: ContinuousQuery, keys: list[str]) -> list[str]:
    """The source columns the SELECT items read, besides the group columns (IoTDB's series)."""
    grouped = {k.lower() for k in keys}
    out: dict[str, str] = {}
    for item in cq.select:
        for column in sqlglot.parse_one(item.expression, read="spark").find_all(exp.Column):
            name = column.name
            if name.lower() not in grouped and not name.lower().startswith("__cq"):
                out.setdefault(name.lower(), name)
    return list(out.values())


def _windowed(spark, cq, df, time_column, keys, grid: _Grid, every, length, count, known: GroupSource) -> Plan:
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

    empties = {i.name: empty_sql(i.expression) for i in cq.select}
    starts = [
        w for w in (grid.anchor + k * grid.step for k in range(grid.windows)) if _covered(w, grid.anchor, every, length)
    ]
    groups = known.python_rows(cq.where)
    # Empty windows of every known group are rows, as in IoTDB: they count 0, FILL reaches them and
    # LIMIT numbers them. Where only constant values (a count's 0) need them, they are added to the
    # (small) result in Arrow; otherwise a grid of (window, group) is joined in Spark.
    complete_in_arrow = (
        _needs_grid(cq)
        and groups is not None
        and cq.fill is None
        and cq.having is None
        and cq.limit is None
        and not cq.offset
        and all(v in ("NULL", "0") for v in empties.values())
    )
    if _needs_grid(cq) and not complete_in_arrow:
        grid_ws = F.lit(grid.anchor) + F.col("id") * F.lit(grid.step)
        windows = spark.range(grid.windows).filter(_covered(grid_ws, grid.anchor, every, length))
        having = cq.having if having_in_agg else None
        agg = join_cells(
            spark,
            agg,
            windows.select(F.col("id").alias(_K)),
            known,
            where=cq.where,
            empties=empties,
            having=(_HAVING, having),
        )
    if having_in_agg:
        agg = agg.filter(F.col(_HAVING)).drop(_HAVING)
    elif cq.having:
        agg = agg.filter(F.expr(cq.having))

    agg = agg.withColumn(_OWNER, _owner(ws, grid.anchor, every, count))
    if cq.fill is not None:
        agg = _fill(agg, cq, keys, order=_K)
    numbered = None
    if count > 1 and cq.having is None and cq.time_grouping is not None:
        numbered = (-(-length // grid.step), every // grid.step)
    agg = _limit(cq, agg, order=_K, keys=keys, grid=numbered)
    out = agg.select(
        F.timestamp_micros(ws).alias(time_column),
        *[F.col(k) for k in keys],
        *[F.col(i.name) for i in cq.select],
    )
    out = _drop_empty(cq, out)
    columns = _output_columns(cq, time_column, keys)
    if not complete_in_arrow:
        return Plan(out, columns)
    assert groups is not None
    values = {name: (0 if v == "0" else None) for name, v in empties.items()}
    return Plan(
        out,
        columns,
        lambda table: add_empty_windows(
            table, time_column=time_column, keys=keys, starts=starts, groups=groups, values=values
        ),
    )


def _fill(agg: DataFrame, cq: ContinuousQuery, keys: list[str], *, order: str) -> DataFrame:
    """FILL inside each group and firing, in ``order`` (the window index, or the row time)."""
    fill = cq.fill
    assert fill is not None  # called for a FILL clause only
    window = Window.partitionBy(*keys, _OWNER).orderBy(order)
    before = window.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    after = window.rowsBetween(Window.currentRow, Window.unboundedFollowing)
    types = {f.name: f.dataType for f in agg.schema.fields}
    for item in cq.select:
        c, dtype = F.col(item.name), types[item.name]
        if fill.kind == "previous":
            agg = agg.withColumn(item.name, F.last(c, ignorenulls=True).over(before))
        elif fill.kind == "linear":
            if not isinstance(dtype, NumericType):
                continue  # IoTDB interpolates numbers only
            k = F.col(order)
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


def _limit(
    cq: ContinuousQuery, out: DataFrame, *, order: str, keys: list[str], grid: tuple[int, int] | None = None
) -> DataFrame:
    """OFFSET/LIMIT per firing over IoTDB's rows: with ALIGN BY DEVICE one row per (device, time),
    device by device; otherwise one row per time holding every group (IoTDB's time-aligned result).
    ``grid`` (windows per firing, steps per EVERY): the run covers several firings with every window of
    every group present, so a row's number in its firing is arithmetic, counting the firing's windows
    that a later firing's range holds (they are the later firing's rows here)."""
    if cq.limit is None and not cq.offset:
        return out
    if cq.align_by_device and grid is not None:
        per_firing, steps = grid
        device = F.dense_rank().over(Window.partitionBy(_OWNER).orderBy(*keys)) - 1
        rn = device * per_firing + (F.col(_K) - F.col(_OWNER) * steps) + 1
    elif cq.align_by_device:
        rn = F.row_number().over(Window.partitionBy(_OWNER).orderBy(*keys, order))
    else:
        rn = F.dense_rank().over(Window.partitionBy(_OWNER).orderBy(order))
    out = out.withColumn(_RN, rn).filter(F.col(_RN) > cq.offset)
    if cq.limit is not None:
        out = out.filter(F.col(_RN) <= cq.offset + cq.limit)
    return out.drop(_RN)


def _drop_empty(cq: ContinuousQuery, out: DataFrame) -> DataFrame:
    """Leave out rows whose selected values are all NULL (IoTDB writes no point for a NULL)."""
    names = [i.name for i in cq.select]
    if not names:
        return out
    return out.filter(
        F.greatest(*[F.col(n).isNotNull() for n in names]) if len(names) > 1 else F.col(names[0]).isNotNull()
    )


def check_columns(cq: ContinuousQuery, columns: list[str], *, table: str) -> None:
    """A clear error when the source lacks a column the query names."""
    known = {c.lower() for c in columns}
    need = referenced_columns(cq) | ({"device"} if cq.align_by_device else set())
    missing = sorted(need - known)
    if missing:
        raise CQError(f"{cq.name}: table {table!r} has no column {missing[0]!r} (columns: {', '.join(columns)})")
