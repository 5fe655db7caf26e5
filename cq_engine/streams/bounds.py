"""The points around time windows that TDengine's TWA interpolates at the windows' bounds
(docs/dialects/tdengine.md, *TWA at window bounds*): for each argument of ``Stream.interpolated``
every trigger row gets the nearest non-NULL point of its group before it and after it
(``parse.tdengine.functions.bound_columns``), from which the window's aggregate picks the last point
before ``_twstart`` and the first at or after ``_twend``.

Within a run's read ``[lo, hi)`` these are window functions over the group's rows (``with_neighbours``,
lazy, planned with the run). A group's points outside the read are looked up when the run is computed
(``with_outside``): the last non-NULL point before ``lo`` and the first at or after ``hi``, in reads of
growing reach (one window length, then four times the last, ...) that skip files by their time
statistics and stop once every group with a point in the run has its neighbours, or at the table's
first / last row. Everything is read at the run's pinned version, so a window recomputed over the same
source version gets the same neighbours whatever range the run covers.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pyarrow as pa
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from cq_engine.context import EngineContext
from cq_engine.model import SlidingTrigger, Stream
from cq_engine.parse.tdengine.functions import bound_columns
from cq_engine.streams.plan import instant, prepare
from cq_engine.streams.timing import window_length
from cq_engine.streams.windows.common import exact_col

_GROWTH = 4
_K = "__cq_bk"  # the outside table's key columns, ``__cq_bk0``...
_NEED = "__cq_bneed"  # per argument: the group has a point in the read
_BEFORE, _AFTER = "__cq_bb", "__cq_ba"  # per argument: the point before the read, at or after its end


def _point(stream: Stream, x_sql: str, time_column: str) -> Column:
    """Argument ``x_sql`` of a row as a point (t µs, v double), NULL where it is NULL or the row fails
    a row-level WHERE (one reading no placeholder: it is applied before the aggregate)."""
    cond = f"({x_sql}) IS NOT NULL"
    if stream.form != "old" and stream.where and "__cq_" not in stream.where.lower():
        cond += f" AND coalesce(({stream.where}), false)"
    point = F.struct(F.unix_micros(exact_col(time_column)).alias("t"), F.expr(x_sql).cast("double").alias("v"))
    return F.when(F.expr(cond), point)


def with_neighbours(stream: Stream, rows: DataFrame, time_column: str) -> DataFrame:
    """``rows`` (a run's prepared trigger rows) with each TWA argument's points before and after each
    row, among ``rows``; NULL where the read holds none (``with_outside`` fills those in)."""
    if not stream.interpolated:
        return rows
    w = Window.partitionBy(*[exact_col(k) for k in stream.partition_by]).orderBy(exact_col(time_column))
    points = {f"__cq_bp{n}": _point(stream, x, time_column) for n, x in enumerate(stream.interpolated)}
    columns = {}
    for n, x in enumerate(stream.interpolated):
        b, a, p = *bound_columns(x), f"__cq_bp{n}"
        # One sort for both: lag/lead skipping NULLs (a frame to the partition's end would be
        # aggregated anew for every row).
        columns[b] = F.expr(f"lag({p}) IGNORE NULLS").over(w)
        columns[a] = F.expr(f"lead({p}) IGNORE NULLS").over(w)
    return rows.withColumns(points).withColumns(columns).drop(*points)


def with_outside(
    ctx: EngineContext, stream: Stream, windows: DataFrame, read: tuple[str, str, tuple[datetime, datetime], int]
) -> DataFrame:
    """``windows`` (rows from ``with_neighbours`` over ``read``: table, time column, range, version) with
    the points the read does not hold: before its range and at or after its end. Runs the Spark jobs
    that find them."""
    if not stream.interpolated:
        return windows
    assert isinstance(stream.trigger, SlidingTrigger)  # only INTERVAL / SLIDING windows interpolate
    table, time_column, read_range, version = read
    outside = _outside(
        ctx,
        stream,
        table=table,
        time_column=time_column,
        read_range=read_range,
        version=version,
        reach=window_length(stream.trigger),
    )
    if outside.num_rows == 0:
        return windows
    found = ctx.spark.createDataFrame(outside)
    on = [exact_col(k).eqNullSafe(F.col(f"{_K}{i}")) for i, k in enumerate(stream.partition_by)]
    joined = windows.join(F.broadcast(found), on=on, how="left") if on else windows.crossJoin(found)
    filled = {}
    for n, x in enumerate(stream.interpolated):
        b, a = bound_columns(x)
        filled[b] = F.coalesce(F.col(b), F.col(f"{_BEFORE}{n}"))
        filled[a] = F.coalesce(F.col(a), F.col(f"{_AFTER}{n}"))
    return joined.withColumns(filled).drop(*found.columns)


def _outside(
    ctx: EngineContext,
    stream: Stream,
    *,
    table: str,
    time_column: str,
    read_range: tuple[datetime, datetime],
    version: int,
    reach: timedelta,
) -> pa.Table:
    """Per group with a non-NULL point in ``read_range``: each argument's last point before the range
    (``_BEFORE``) and first at or after its end (``_AFTER``), keys as ``__cq_bk<i>``."""
    lo, hi = read_range
    xs, keys = stream.interpolated, list(stream.partition_by)
    span = ctx.storage.table_span(table, version=version, time_column=time_column)
    first_time, last_time = span[0], span[1]

    def read(a: datetime, b: datetime) -> DataFrame:
        df, _ = ctx.storage.read_range(ctx.spark, table, time_column=time_column, time_range=(a, b), version=version)
        return prepare(stream, df)

    names = [f"{_K}{i}" for i in range(len(keys))]
    key_types: list[pa.DataType] = []

    def grouped(df: DataFrame, aggs: list[Column]) -> dict[tuple, dict]:
        out = df.groupBy(*[exact_col(k).alias(c) for k, c in zip(keys, names)]).agg(*aggs).toArrow()
        key_types[:] = [out.schema.field(c).type for c in names]
        return {tuple(r[c] for c in names): r for r in out.to_pylist()}

    t = F.unix_micros(exact_col(time_column))
    lo_us, hi_us = F.unix_micros(instant(lo)), F.unix_micros(instant(hi))

    def nearest(n: int, x: str, *, forward: bool, cond: Column | None = None) -> Column:
        """Argument ``x``'s first point (``forward``) or last one among the rows ``cond`` keeps."""
        p = _point(stream, x, time_column)
        p = F.when(cond, p) if cond is not None else p
        pick = F.min_by if forward else F.max_by
        return pick(p, p.getField("t")).alias(f"{_AFTER if forward else _BEFORE}{n}")

    # One read around the range: which groups have points in it, and their nearest points within one reach.
    needs = [
        F.max(_point(stream, x, time_column).isNotNull() & (t >= lo_us) & (t < hi_us)).alias(f"{_NEED}{n}")
        for n, x in enumerate(xs)
    ]
    rows = grouped(
        read(lo - reach, hi + reach),
        [
            *needs,
            *[nearest(n, x, forward=False, cond=t < lo_us) for n, x in enumerate(xs)],
            *[nearest(n, x, forward=True, cond=t >= hi_us) for n, x in enumerate(xs)],
        ],
    )
    rows = {g: r for g, r in rows.items() if any(r[f"{_NEED}{n}"] for n in range(len(xs)))}

    def widen(prefix: str, edge: datetime, forward: bool) -> None:
        near, step = edge + reach if forward else edge - reach, reach
        while True:
            missing = [
                g
                for g, r in rows.items()
                if any(r[f"{_NEED}{n}"] and r[f"{prefix}{n}"] is None for n in range(len(xs)))
            ]
            if (
                not missing
                or first_time is None
                or last_time is None
                or (near > last_time if forward else near <= first_time)
            ):
                return
            step *= _GROWTH
            far = near + step if forward else near - step
            a, b = (near, far) if forward else (far, near)
            found = grouped(read(a, b), [nearest(n, x, forward=forward) for n, x in enumerate(xs)])
            for g in missing:
                for n in range(len(xs)):
                    if rows[g][f"{prefix}{n}"] is None and g in found:
                        rows[g][f"{prefix}{n}"] = found[g][f"{prefix}{n}"]
            near = far

    widen(_BEFORE, lo, forward=False)
    widen(_AFTER, hi, forward=True)
    point = pa.struct([("t", pa.int64()), ("v", pa.float64())])
    columns: dict[str, pa.Array] = {}
    for i, c in enumerate(names):
        columns[c] = pa.array([g[i] for g in rows], key_types[i])
    for prefix in (_BEFORE, _AFTER):
        for n in range(len(xs)):
            columns[f"{prefix}{n}"] = pa.array([r[f"{prefix}{n}"] for r in rows.values()], point)
    return pa.table(columns) if rows else pa.table({})
