"""TDengine's INTERP in a stream's query (``Stream.interp``, ``parse.tdengine.interp``): per trigger window
(and group, and query partition) a row per time point of its range, each INTERP call's value there —
the row at that time, else FILL's: NULL, a constant, the previous / next row's value, or the line
between them. The points are a generated grid unioned with the run's rows and ordered with them, so
the previous and next rows are window functions: one Spark job per run (docs/dialects/tdengine.md,
*INTERP*)."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from cq_engine.durations import micros
from cq_engine.model import IROWTS, ISFILLED, Stream
from cq_engine.parse.fragments import TIME_REF
from cq_engine.streams.windows.common import exact_col
from cq_engine.streams.windows.tdengine import WEND, WSTART

_T, _POINT, _LO, _HI = "__cq_ip_t", "__cq_ip_point", "__cq_ip_lo", "__cq_ip_hi"


def with_interp(stream: Stream, df: DataFrame, ids: list[str]) -> DataFrame:
    """The time points of ``stream``'s INTERP over ``df`` (the run's rows; ``ids``: ``plan.query_partition``):
    their window-constant columns, ``IROWTS``, ``ISFILLED`` and each call's column."""
    ip = stream.interp
    assert ip is not None
    keys = list(dict.fromkeys(ids))
    args = {c.column: F.expr(c.argument) for c in ip.calls}
    # what the SELECT may read beside the calls: the window's and the group's constants
    constant = [
        c for c in df.columns if c not in keys and c != TIME_REF and (c.startswith("__cq_") or c in stream.partition_by)
    ]
    lo = F.unix_micros(F.expr(ip.start)) if ip.start else F.unix_micros(F.col(WSTART))
    hi = F.unix_micros(F.expr(ip.end)) if ip.end else F.unix_micros(F.col(WEND)) - 1  # RANGE is closed
    frame = df.groupBy(*[exact_col(k) for k in keys]).agg(
        *[F.first(exact_col(c)).alias(c) for c in constant], F.first(lo).alias(_LO), F.first(hi).alias(_HI)
    )
    every = micros(ip.every)
    points = F.when(F.col(_LO) <= F.col(_HI), F.sequence(F.col(_LO), F.col(_HI), F.lit(every)))
    grid = frame.withColumn(_T, F.explode(points)).drop(_LO, _HI).withColumn(_POINT, F.lit(True))
    rows = df.select(
        *[exact_col(k) for k in keys], F.unix_micros(F.col(TIME_REF)).alias(_T), *[v.alias(k) for k, v in args.items()]
    )
    both = rows.withColumn(_POINT, F.lit(False)).unionByName(grid, allowMissingColumns=True)
    ordered = Window.partitionBy(*[exact_col(k) for k in keys]).orderBy(F.col(_T), F.col(_POINT))
    before, after = ordered.rowsBetween(Window.unboundedPreceding, 0), ordered.rowsBetween(0, Window.unboundedFollowing)
    found: dict[str, Column] = {}
    for c in ip.calls:
        valid = ~F.col(_POINT) & (F.col(c.column).isNotNull() if c.params[0] else F.lit(True))
        row = F.when(valid, F.struct(F.col(_T).alias("t"), F.col(c.column).alias("v")))
        found[f"{c.column}_p"] = F.last(row, ignorenulls=True).over(before)
        found[f"{c.column}_n"] = F.first(row, ignorenulls=True).over(after)
    both = both.withColumns(found).filter(F.col(_POINT))
    exact = {c.column: F.coalesce(F.col(f"{c.column}_p.t") == F.col(_T), F.lit(False)) for c in ip.calls}
    values = {c.column: _filled(ip.fill, ip.fill_values, n, c.column, exact[c.column]) for n, c in enumerate(ip.calls)}
    out = both.withColumns(values)
    first = exact[ip.calls[0].column]
    if ip.fill == "none":  # a point without a row at its time has no output
        any_exact = exact[ip.calls[0].column]
        for c in ip.calls[1:]:
            any_exact = any_exact | exact[c.column]
        out = out.filter(any_exact)
    out = out.withColumns({IROWTS: F.timestamp_micros(F.col(_T)), ISFILLED: ~first})
    return out.drop(_T, _POINT, *found)


def _filled(fill: str, constants: tuple[str, ...], n: int, column: str, exact: Column) -> Column:
    p, q, t = F.col(f"{column}_p"), F.col(f"{column}_n"), F.col(_T)
    if fill == "prev":
        return p["v"]
    if fill == "next":
        return F.when(exact, p["v"]).otherwise(q["v"])
    if fill == "linear":
        line = p["v"] + (q["v"] - p["v"]) * (t - p["t"]) / (q["t"] - p["t"])
        return F.when(exact, p["v"].cast("double")).otherwise(line.cast("double"))
    other = F.expr(constants[n]) if fill == "value" else F.lit(None)
    return F.when(exact, p["v"]).otherwise(other)
