"""TDengine's multi-row functions (``Stream.series``, ``parse.tdengine.series``) over each (group,
window)'s rows in time order: window functions over the run's rows, so a stream with several result
rows per window stays one Spark job (docs/dialects/tdengine.md, *Multi-row functions*).

Each call gives a value and whether the row is kept; a row is written when any call keeps it, and a
call's value is NULL on the rows it does not keep (TDengine's rule for several DIFFs in one query).
Rows are ordered by their event time (``TIME_REF``), then by the calls' arguments, so a rerun of a
window computes the same rows."""

from __future__ import annotations

from functools import reduce
from itertools import pairwise

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from cq_engine.errors import CQError
from cq_engine.model import SeriesCall, Stream
from cq_engine.parse.fragments import TIME_REF
from cq_engine.streams.windows.common import exact_col, lag_non_null

_ALL = Window.unboundedPreceding
_OPERATORS = {"LT": "<", "GT": ">", "LE": "<=", "GE": ">=", "NE": "!=", "EQ": "="}
_INTEGERS = ("boolean", "tinyint", "smallint", "int", "bigint")
_BIGINT_WRAP = (9223372036854775808, 18446744073709551616)


class _Call:
    """One call's columns: ``stages`` computed in turn (a window function over an earlier one's
    result), then its value and whether a row is kept."""

    def __init__(self, call: SeriesCall, n: int, argument: str):
        self.call, self.n, self.argument = call, n, argument  # the argument's column (shared by equal ones)
        self.x = F.col(argument)
        self.stages: list[dict[str, Column]] = []
        self.value: Column = F.lit(None)
        self.keep: Column = F.lit(True)

    def name(self, what: str) -> str:
        return f"__cq_sr{self.n}_{what}"

    def stage(self, **columns: Column) -> list[Column]:
        self.stages.append({self.name(k): c for k, c in columns.items()})
        return [F.col(self.name(k)) for k in columns]


def with_series(stream: Stream, df: DataFrame, ids: list[str]) -> DataFrame:
    """``df`` (the run's rows of ``stream``'s query, ``ids`` its ``plan.query_partition``) with each
    multi-row function's column, and only the rows they keep; HISTOGRAM's a row per bin."""
    if not stream.series:
        return df
    part = [exact_col(c) for c in ids]
    arguments = {sql: f"__cq_sr_arg{j}" for j, sql in enumerate(dict.fromkeys(c.argument for c in stream.series))}
    calls = [_Call(c, n, arguments[c.argument]) for n, c in enumerate(stream.series)]
    df = df.withColumns({name: F.expr(sql) for sql, name in arguments.items()})
    order = [F.col(TIME_REF).asc(), *[F.col(name).asc_nulls_first() for name in arguments.values()]]
    typed = sorted({c.argument for c in calls if c.call.function in ("diff", "csum")})
    types = dict(df.select(*typed).dtypes) if typed else {}  # DIFF's result type is its argument's
    for c in calls:
        _BUILD[c.call.function](stream, c, part, order, types.get(c.argument, ""))
    for depth in range(max(len(c.stages) for c in calls)):
        stage = {k: v for c in calls if depth < len(c.stages) for k, v in c.stages[depth].items()}
        df = df.withColumns(stage)
    df = df.withColumns({c.name("keep"): c.keep for c in calls} | {c.name("value"): c.value for c in calls})
    df = df.filter(reduce(lambda a, b: a | b, [F.col(c.name("keep")) for c in calls]))
    df = df.withColumns({c.call.column: F.when(F.col(c.name("keep")), F.col(c.name("value"))) for c in calls})
    if stream.series[0].function == "histogram":
        df = df.withColumn(stream.series[0].column, F.explode(stream.series[0].column))
    return df.drop(*[col for col in df.columns if col.startswith("__cq_sr")])


def _ordered(part: list[Column], order: list[Column], *extra: Column) -> WindowSpec:
    return Window.partitionBy(*part, *extra).orderBy(*order)


def _diff(stream: Stream, c: _Call, part, order, typ: str) -> None:
    """DIFF(x[, ignore_option]): x minus the previous non-NULL value, NULL without either; options 1
    and 3 make a negative difference NULL, 2 and 3 drop the rows whose difference is NULL."""
    (prev,) = c.stage(prev=F.last(c.x, ignorenulls=True).over(_ordered(part, order).rowsBetween(_ALL, -1)))
    x, p = c.argument, c.name("prev")
    if typ in _INTEGERS:  # BIGINT, wrapping as TDengine's int64 arithmetic; the sign is the true one's
        d = f"CAST({x} AS DECIMAL(22, 0)) - CAST({p} AS DECIMAL(22, 0))"
        lo, span = _BIGINT_WRAP
        value = F.expr(f"CAST(pmod({d} + {lo}, {span}) - {lo} AS BIGINT)")
        negative = F.expr(f"{d} < 0")
    elif typ in ("float", "double") or typ.startswith("decimal"):
        value = c.x.cast("double") - prev.cast("double")
        negative = value < 0
    elif typ.startswith("timestamp"):  # milliseconds, as TDengine's TIMESTAMP arithmetic
        value = (F.unix_millis(c.x) - F.unix_millis(prev)).cast("bigint")
        negative = value < 0
    else:
        raise CQError(f"stream {stream.name}: DIFF({c.call.argument}) needs a number, BOOL or TIMESTAMP, not {typ}")
    (option,) = c.call.params
    if option in (1, 3):
        value = F.when(~negative, value)
    c.value = value
    c.keep = F.lit(True) if option in (0, 1) else value.isNotNull()


def _csum(stream: Stream, c: _Call, part, order, typ: str) -> None:
    """CSUM(x): the running sum of the non-NULL values (BIGINT or DOUBLE), on non-NULL rows; an
    infinite or NaN sum is NULL."""
    summed = F.try_sum(c.x) if typ in _INTEGERS else F.sum(c.x)  # an integer overflow: NULL, not an error
    (total,) = c.stage(total=summed.over(_ordered(part, order).rowsBetween(_ALL, 0)))
    as_double = total.cast("double")
    c.value = F.when(~(F.isnan(as_double) | (F.abs(as_double) == float("inf"))), total)
    c.keep = c.x.isNotNull()


def _mavg(stream: Stream, c: _Call, part, order, typ: str) -> None:
    """MAVG(x, k): the mean of the last k non-NULL values, from the k-th one on: the running sum less
    its value k non-NULL rows back, as TDengine keeps it (one sort with the other calls)."""
    (k,) = c.call.params
    run = _ordered(part, order).rowsBetween(_ALL, 0)
    total, count = c.stage(total=F.sum(c.x.cast("double")).over(run), count=F.count(c.x).over(run))
    x, t = c.argument, c.name("total")
    (back,) = c.stage(back=lag_non_null(f"IF({x} IS NULL, NULL, {t})", k).over(_ordered(part, order)))
    c.value = (total - F.coalesce(back, F.lit(0.0))) / F.lit(float(k))
    c.keep = c.x.isNotNull() & (count >= k)


def _derivative(stream: Stream, c: _Call, part, order, typ: str) -> None:
    """DERIVATIVE(x, interval, ignore_negative): the rate of change per ``interval`` between each
    non-NULL point and the one before it; ignore_negative 1 drops negative rates."""
    interval, ignore_negative = c.call.params
    w, x, t = _ordered(part, order), c.argument, f"unix_micros({TIME_REF})"
    pv, pt = c.stage(pv=lag_non_null(x, 1).over(w), pt=lag_non_null(f"IF({x} IS NULL, NULL, {t})", 1).over(w))
    dt = F.expr(t) - pt
    rate = F.try_divide((c.x.cast("double") - pv.cast("double")) * F.lit(float(interval)), dt.cast("double"))
    c.value = rate
    c.keep = c.x.isNotNull() & pv.isNotNull() & (dt != 0) & (F.lit(ignore_negative == 0) | (rate >= 0))


def _state(stream: Stream, c: _Call, part, order, typ: str) -> None:
    """STATECOUNT(x, op, v) / STATEDURATION(x, op, v[, unit]): on every row, how many consecutive rows
    (how long, in units, since the first of them) meet ``x op v``; -1 on a row that does not, NULL on
    a NULL row (which leaves the run as it is). A run starts on a row meeting it whose previous
    non-NULL row did not."""
    op, value = c.call.params[:2]
    cond_sql = f"{c.argument} {_OPERATORS[op]} {value!r}"
    cond = F.expr(cond_sql)
    w = _ordered(part, order)
    run = w.rowsBetween(_ALL, 0)
    count, before = c.stage(count=F.count(F.when(cond, 1)).over(run), before=lag_non_null(cond_sql, 1).over(w))
    starts = cond & F.coalesce(~before, F.lit(True))
    t = F.unix_micros(F.col(TIME_REF))
    if c.call.function == "statecount":
        (first,) = c.stage(first=F.last(F.when(starts, count), ignorenulls=True).over(run))
        inside = (count - first + 1).cast("bigint")
    else:
        (first,) = c.stage(first=F.last(F.when(starts, t), ignorenulls=True).over(run))
        inside = F.call_function("div", t - first, F.lit(c.call.params[2])).cast("bigint")
    c.value = F.when(c.x.isNull(), None).when(cond, inside).otherwise(F.lit(-1).cast("bigint"))


def _selection(stream: Stream, c: _Call, part, order, typ: str) -> None:
    """TOP / BOTTOM (the k largest / smallest non-NULL values, the earliest of equal ones), TAIL (the
    last k rows before the last ``offset``), UNIQUE (each value's first row; NULL once), SAMPLE (k
    non-NULL rows, chosen by a hash of their time: the same ones in every run)."""
    f, params, x = c.call.function, c.call.params, c.x
    if f in ("top", "bottom"):
        by = x.desc_nulls_last() if f == "top" else x.asc_nulls_last()
        (rank,) = c.stage(rank=F.row_number().over(Window.partitionBy(*part).orderBy(by, *order)))
        c.keep = x.isNotNull() & (rank <= params[0])
    elif f == "tail":
        k, skip = params
        back = Window.partitionBy(*part).orderBy(F.col(TIME_REF).desc(), x.desc_nulls_last())
        (rank,) = c.stage(rank=F.row_number().over(back))
        c.keep = (rank > skip) & (rank <= skip + k)
    elif f == "unique":
        (rank,) = c.stage(rank=F.row_number().over(_ordered(part, order, x)))
        c.keep = rank == 1
    else:
        hashed = Window.partitionBy(*part, x.isNull()).orderBy(F.xxhash64(F.col(TIME_REF)), *order)
        (rank,) = c.stage(rank=F.row_number().over(hashed))
        c.keep = x.isNotNull() & (rank <= params[0])
    c.value = x


def _histogram(stream: Stream, c: _Call, part, order, typ: str) -> None:
    """HISTOGRAM(x, type, bins, normalized): on each window's first row, every bin ``(lower, upper]``
    as TDengine's JSON text with the count (normalized: the share) of the values in it; a window
    without a non-NULL value has no rows. ``with_series`` explodes the bins into rows."""
    edges, normalized = c.call.params
    n = len(edges) - 1
    below = f"size(filter(array({', '.join(_double(e) for e in edges)}), e -> e < {c.argument}))"
    (index,) = c.stage(index=F.expr(f"IF({below} BETWEEN 1 AND {n}, {below}, NULL)"))
    whole = Window.partitionBy(*part)
    c.stage(
        bins=F.collect_list(index).over(whole),
        values=F.count(c.x).over(whole),
        rank=F.row_number().over(_ordered(part, order)),
    )
    prefixes = ", ".join(f'\'{{"lower_bin":{lo:g}, "upper_bin":{hi:g}, "count":\'' for lo, hi in pairwise(edges))
    bins = c.name("bins")
    count = f"size(filter({bins}, j -> j = i))"
    shown = (
        f"format_string('%f', IF(size({bins}) = 0, CAST(0 AS DOUBLE), {count} / size({bins})))"
        if normalized
        else f"CAST({count} AS STRING)"
    )
    c.value = F.expr(f"transform(sequence(1, {n}), i -> concat(element_at(array({prefixes}), i), {shown}, '}}'))")
    c.keep = (F.col(c.name("rank")) == 1) & (F.col(c.name("values")) > 0)


def _double(e: float) -> str:
    return (
        "double('inf')" if e == float("inf") else "double('-inf')" if e == float("-inf") else f"CAST({e!r} AS DOUBLE)"
    )


_BUILD = {
    "diff": _diff,
    "csum": _csum,
    "mavg": _mavg,
    "derivative": _derivative,
    "statecount": _state,
    "stateduration": _state,
    "top": _selection,
    "bottom": _selection,
    "tail": _selection,
    "unique": _selection,
    "sample": _selection,
    "histogram": _histogram,
}
