"""TDengine's functions in a stream's expressions → Spark SQL, one lookup table (docs/dialects/tdengine.md,
*Functions*). Aggregates and selectors keep TDengine's definitions over a window's rows: NULLs skipped,
"first"/"last" by event time (the rows' time column, ``TIME_REF``), TWA and IRATE over the points in
time order (TWA in INTERVAL / SLIDING windows extended to the window's bounds, ``bound_columns``),
ELAPSED over the window. Duration literals (``1s``, ``10a``) are read here too.

Each translation gets the call's arguments as Spark SQL and returns Spark SQL; the result is parsed
back with sqlglot (Spark dialect) into the expression tree."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

import sqlglot
from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from cq_engine.durations import TDENGINE_UNITS
from cq_engine.model import placeholder_column
from cq_engine.parse.fragments import TIME_REF, to_spark

_T = f"unix_micros({TIME_REF})"
_WSTART, _WEND, _NOW = (placeholder_column(p) for p in ("_twstart", "_twend", "_tlocaltime"))
DURATION_PREFIX = "_"  # a duration literal is read as an identifier of the same length (offsets stay right)


@dataclass(frozen=True)
class Call:
    """One call being translated: its arguments (sqlglot nodes), the node itself and the stream's context."""

    name: str
    args: list[exp.Expr]
    node: exp.Expr
    time_window: bool  # INTERVAL / SLIDING / PERIOD: a window is a time span (ELAPSED covers it)
    placeholders: bool  # SELECT / WHERE: the run's placeholders (NOW → _tlocaltime) are columns here
    tz: str
    error: Callable[[exp.Expr, str], Exception]
    # INTERVAL / SLIDING windows over %%trows: TWA interpolates at their bounds. Registers an
    # argument's Spark SQL and returns ``bound_columns`` of it (None: no interpolation).
    bounds: Callable[[str], tuple[str, str]] | None = None

    def sql(self, i: int) -> str:
        return f"({to_spark(self.args[i])})"

    def micros(self, i: int, what: str) -> int:
        """Argument ``i``, a duration literal (``1s``), in microseconds."""
        arg = self.args[i]
        if not (isinstance(arg, exp.Interval) and arg.text("unit").upper() == "MICROSECOND"):
            raise self.error(arg, f"{self.name.upper()}: {what} must be a duration such as 1s or 10a")
        return int(arg.this.name)

    def number(self, i: int, what: str, lo: float | None = None, hi: float | None = None) -> float:
        arg = self.args[i]
        value = arg.this if isinstance(arg, exp.Neg) else arg
        if not (isinstance(value, exp.Literal) and not value.is_string):
            raise self.error(arg, f"{self.name.upper()}: {what} must be a number")
        number = float(value.name) * (-1 if isinstance(arg, exp.Neg) else 1)
        if (lo is not None and number < lo) or (hi is not None and number > hi):
            raise self.error(arg, f"{self.name.upper()}: {what} must be between {lo:g} and {hi:g}, got {number:g}")
        return number


def _points(c: Call) -> str:
    """The non-NULL points of argument 0 in time order: an array of (t µs, v double)."""
    x = c.sql(0)
    point = f"named_struct('t', {_T}, 'v', CAST({x} AS DOUBLE))"
    return f"array_sort(collect_list(IF({x} IS NULL, NULL, {point})))"


def bound_columns(x_sql: str) -> tuple[str, str]:
    """The per-row columns the plan gives TWA's argument ``x_sql`` in time windows (``streams.bounds``):
    the nearest non-NULL point (a struct of ``t`` µs and ``v`` double) of the group before the row,
    and after it."""
    h = hashlib.sha256(x_sql.encode()).hexdigest()[:12]
    return f"__cq_twa_{h}_before", f"__cq_twa_{h}_after"


def _let(value: str, var: str, body: str) -> str:
    """``body`` with ``var`` bound to ``value``, computed once (a one-element ``transform``)."""
    return f"element_at(transform(array({value}), {var} -> {body}), 1)"


def _line_mean(points: str) -> str:
    """The mean of the line through ``points`` (an array of (t, v) in time order): the trapezoids'
    area over the span from the first point to the last; one point (or one instant): its value."""
    b = "__cq_line"
    head_tail = f"slice({b}, 1, greatest(size({b}) - 1, 0)), slice({b}, 2, greatest(size({b}) - 1, 0))"
    area = (
        f"aggregate(zip_with({head_tail}, (p, q) -> (p.v + q.v) / 2 * (q.t - p.t)), "
        "CAST(0 AS DOUBLE), (acc, s) -> acc + s)"
    )
    first, last = f"element_at({b}, 1)", f"element_at({b}, -1)"
    mean = (
        f"CASE WHEN size({b}) = 0 THEN CAST(NULL AS DOUBLE) WHEN {last}.t = {first}.t THEN {last}.v "
        f"ELSE {area} / ({last}.t - {first}.t) END"
    )
    return _let(points, b, mean)


def _at(p: str, q: str, t: str) -> str:
    """The value at time ``t`` of the line through points ``p`` and ``q`` (``q.t`` may be ``t``)."""
    return f"IF({q}.t = {t}, {q}.v, {p}.v + ({q}.v - {p}.v) * ({t} - {p}.t) / ({q}.t - {p}.t))"


def _twa(c: Call) -> str:
    """TDengine's TWA (docs/dialects/tdengine.md, Functions; tests/tdengine_reference.py ``twa``)."""
    if c.bounds is None:  # data-shaped windows, PERIOD, a query reading another table: first to last point
        return _line_mean(_points(c))
    x = to_spark(c.args[0])
    if "__cq_" in x.lower():
        raise c.error(
            c.args[0],
            "TWA: in INTERVAL and SLIDING windows its argument is also read outside the window "
            "(to interpolate at the bounds), so it cannot use placeholders",
        )
    before, after = c.bounds(x)
    ws, we = f"unix_micros({_WSTART})", f"unix_micros({_WEND})"
    s = "__cq_w"
    a, first, last = f"{s}.a", f"element_at({s}.a, 1)", f"element_at({s}.a, -1)"
    none = f"slice({a}, 1, 0)"
    start = f"IF({s}.p IS NULL OR {first}.t <= {s}.ws, {none}, array(named_struct('t', {s}.ws, 'v', {_at(f'{s}.p', first, f'{s}.ws')})))"
    end = f"IF({s}.n IS NULL, {none}, array(named_struct('t', {s}.we, 'v', {_at(last, f'{s}.n', f'{s}.we')})))"
    window = (
        f"named_struct('a', {_points(c)}, "
        f"'p', max_by({before}, IF({before}['t'] < {ws}, {before}['t'], NULL)), "
        f"'n', min_by({after}, IF({after}['t'] >= {we}, {after}['t'], NULL)), 'ws', {ws}, 'we', {we})"
    )
    return _let(window, s, _line_mean(f"IF(size({a}) = 0, {a}, concat({start}, {a}, {end}))"))


def _irate(c: Call) -> str:
    a = _points(c)
    last, prev = f"element_at({a}, -1)", f"element_at({a}, -2)"
    rise = f"IF({last}.v >= {prev}.v, {last}.v - {prev}.v, {last}.v)"
    return (
        f"CASE WHEN size({a}) = 0 THEN CAST(NULL AS DOUBLE) WHEN size({a}) = 1 THEN CAST(0 AS DOUBLE) "
        f"ELSE {rise} / (({last}.t - {prev}.t) / 1000000.0) END"
    )


def _elapsed(c: Call) -> str:
    unit = c.micros(1, "the time unit") if len(c.args) > 1 else 1000  # TDengine's default: the ms precision
    if c.time_window:
        span = f"max(unix_micros({_WEND})) - min(unix_micros({_WSTART}))"
    else:
        span = f"unix_micros(max({c.sql(0)})) - unix_micros(min({c.sql(0)}))"
    return f"CAST({span} AS DOUBLE) / {unit}"


def _percent(c: Call, i: int) -> str:
    return repr(c.number(i, "the percentile p", 0, 100) / 100)


def _percentile(c: Call) -> str:
    if len(c.args) == 2:
        return f"percentile({c.sql(0)}, {_percent(c, 1)})"
    ps = ", ".join(_percent(c, i) for i in range(1, len(c.args)))
    return f"to_json(percentile({c.sql(0)}, array({ps})))"


def _apercentile(c: Call) -> str:
    if len(c.args) == 3:
        algo = c.args[2]
        if not (isinstance(algo, exp.Literal) and algo.is_string and algo.name.lower() in ("default", "t-digest")):
            raise c.error(algo, "APERCENTILE: the algorithm is 'default' or 't-digest'")
    return f"percentile({c.sql(0)}, {_percent(c, 1)})"  # exact: an approximation with no error


def _leastsquares(c: Call) -> str:
    a = _points(c)
    start, step = c.number(1, "start_val"), c.number(2, "step_val")
    n = f"CAST(size({a}) AS DOUBLE)"
    sx = f"({n} * {start!r} + {step!r} * {n} * ({n} - 1) / 2)"
    sxx = (
        f"({n} * {start * start!r} + 2 * {start * step!r} * {n} * ({n} - 1) / 2"
        f" + {step * step!r} * ({n} - 1) * {n} * (2 * {n} - 1) / 6)"
    )
    sy = f"aggregate({a}, CAST(0 AS DOUBLE), (acc, e) -> acc + e.v)"
    sxy = (
        f"aggregate(transform({a}, (e, i) -> ({start!r} + i * {step!r}) * e.v), CAST(0 AS DOUBLE), (acc, z) -> acc + z)"
    )
    p00 = f"({sxx} - {sx} * ({sx} / {n}))"
    p02 = f"({sxy} - {sy} * ({sx} / {n}))"
    slope = f"{p02} / {p00}"
    intercept = f"({sy} - {p02} * ({sx} / {p00})) / {n}"
    body = f"format_string('{{slop:%.6f, intercept:%.6f}}', {slope}, {intercept})"
    return f"CASE WHEN size({a}) = 0 OR {p00} = 0 THEN CAST(NULL AS STRING) ELSE {body} END"


def _spread(c: Call) -> str:
    x = c.sql(0)
    scale = f"IF(typeof(max({x})) LIKE 'timestamp%', 1000, 1)"  # a TIMESTAMP's spread is in milliseconds
    return f"(CAST(max({x}) AS DOUBLE) - CAST(min({x}) AS DOUBLE)) * {scale}"


def _as_timestamp(sql: str) -> str:
    """A TIMESTAMP, or TDengine's epoch milliseconds (BIGINT), as a TIMESTAMP."""
    return (
        f"CASE WHEN typeof({sql}) LIKE 'timestamp%' OR typeof({sql}) IN ('string', 'date') "
        f"THEN CAST({sql} AS TIMESTAMP) ELSE timestamp_millis(CAST({sql} AS BIGINT)) END"
    )


def _offset(ts: str, tz: str) -> str:
    """``+hh:mm``: the UTC offset of time zone ``tz`` at ``ts``."""
    minutes = f"CAST((unix_micros(from_utc_timestamp({ts}, '{tz}')) - unix_micros({ts})) / 60000000 AS INT)"
    return f"format_string('%s%02d:%02d', IF({minutes} < 0, '-', '+'), abs({minutes}) div 60, abs({minutes}) % 60)"


def _to_iso8601(c: Call) -> str:
    ts = _as_timestamp(c.sql(0))
    if len(c.args) == 2:
        zone = c.args[1]
        if not (isinstance(zone, exp.Literal) and zone.is_string):
            raise c.error(zone, "TO_ISO8601: the time zone must be a string such as '+08:00'")
        tz = zone.name.replace("'", "")
        suffix = f"'{tz}'"
    else:
        tz, suffix = c.tz, _offset(ts, c.tz)
    local = f"date_format(from_utc_timestamp({ts}, '{tz}'), \"yyyy-MM-dd'T'HH:mm:ss.SSS\")"
    return f"concat({local}, {suffix})"


def _timetruncate(c: Call) -> str:
    ts, unit = _as_timestamp(c.sql(0)), c.micros(1, "the time unit")
    local = len(c.args) < 3 or c.number(2, "use_current_timezone", 0, 1) == 1
    day = TDENGINE_UNITS["d"] // 1000
    if unit % day == 0 and local:  # 1d, 1w: by the local calendar (CQ_TIMEZONE)
        t = f"unix_micros(from_utc_timestamp({ts}, '{c.tz}'))"
        return f"to_utc_timestamp(timestamp_micros({t} - pmod({t}, {unit})), '{c.tz}')"
    t = f"unix_micros({ts})"
    return f"timestamp_micros({t} - pmod({t}, {unit}))"


def _now(c: Call) -> str:
    return _NOW if c.placeholders else "current_timestamp()"


def _today(c: Call) -> str:
    return f"to_utc_timestamp(date_trunc('DAY', from_utc_timestamp({_now(c)}, '{c.tz}')), '{c.tz}')"


def _log(c: Call) -> str:
    return f"ln({c.sql(0)})" if len(c.args) == 1 else f"log({c.sql(1)}, {c.sql(0)})"  # TDengine: LOG(x, base)


def _same(spark: str) -> Callable[[Call], str]:
    return lambda c: f"{spark}({', '.join(c.sql(i) for i in range(len(c.args)))})"


# name → (least, most arguments, translation)
FUNCTIONS: dict[str, tuple[int, int, Callable[[Call], str]]] = {
    "spread": (1, 1, _spread),
    "twa": (1, 1, _twa),
    "elapsed": (1, 2, _elapsed),
    "irate": (1, 1, _irate),
    "first": (1, 1, lambda c: f"min_by({c.sql(0)}, IF({c.sql(0)} IS NULL, NULL, {TIME_REF}))"),
    "last": (1, 1, lambda c: f"max_by({c.sql(0)}, IF({c.sql(0)} IS NULL, NULL, {TIME_REF}))"),
    "last_row": (1, 1, lambda c: f"max_by({c.sql(0)}, {TIME_REF})"),
    "apercentile": (2, 3, _apercentile),
    "percentile": (2, 11, _percentile),
    "stddev": (1, 1, _same("stddev_pop")),  # TDengine's STDDEV is the population's
    "std": (1, 1, _same("stddev_pop")),
    "stddev_pop": (1, 1, _same("stddev_pop")),
    "stddev_samp": (1, 1, _same("stddev_samp")),
    "variance": (1, 1, _same("var_pop")),
    "var_pop": (1, 1, _same("var_pop")),
    "var_samp": (1, 1, _same("var_samp")),
    "mode": (1, 1, _same("mode")),
    "leastsquares": (3, 3, _leastsquares),
    "hyperloglog": (1, 1, lambda c: f"approx_count_distinct({c.sql(0)})"),
    "to_iso8601": (1, 2, _to_iso8601),
    "timetruncate": (2, 3, _timetruncate),
    "now": (0, 0, _now),
    "today": (0, 0, _today),
    "log": (1, 2, _log),
}
# TDengine functions the engine does not compute, and why (the multi-row ones: ``parse.tdengine.series``).
REFUSED: dict[str, str] = {
    "interp": "it takes EVERY(...) (and RANGE(...), FILL(...)) in the query: SELECT _irowts, interp(x) ... EVERY(1s)",
    "fill_forward": "it returns a series over each window's rows, which the engine does not compute",
    "cols": "name the columns of the row a selector picks with first(col) / last(col) instead",
    "group_concat": "use concat_ws(sep, collect_list(expr))",
    "timezone": "use the CQ_TIMEZONE setting",
}


def translate(call: Call) -> exp.Expr:
    """The Spark expression of a TDengine function call in ``FUNCTIONS``."""
    least, most, build = FUNCTIONS[call.name]
    if not least <= len(call.args) <= most:
        count = str(least) if least == most else f"{least} to {most}"
        raise call.error(call.node, f"{call.name.upper()} takes {count} argument(s), got {len(call.args)}")
    if any(isinstance(a, exp.Star) for a in call.args):
        raise call.error(call.node, f"{call.name.upper()}(*) is not supported: name one column")
    return sqlglot.parse_one(build(call), read="spark")


def call_name(node: exp.Expr) -> str | None:
    """The name of a call sqlglot did not recognise (its name as written is looked up first)."""
    return str(node.this).lower() if isinstance(node, exp.Anonymous) else None


_T_STRING = {exp.DType.BINARY, exp.DType.NCHAR, exp.DType.VARCHAR, exp.DType.CHAR, exp.DType.NVARCHAR, exp.DType.TEXT}
_T_WIDER = {
    exp.DType.UTINYINT: "SMALLINT",
    exp.DType.USMALLINT: "INT",
    exp.DType.UINT: "BIGINT",
    exp.DType.UBIGINT: "DECIMAL(20, 0)",
}
_T_NUMBER = {exp.DType.TINYINT, exp.DType.SMALLINT, exp.DType.INT, exp.DType.BIGINT, exp.DType.FLOAT, exp.DType.DOUBLE}
_T_SAME = _T_NUMBER | {exp.DType.BOOLEAN, exp.DType.DECIMAL, exp.DType.DATE}


def cast(node: exp.Cast, error: Callable[[exp.Expr, str], Exception]) -> exp.Expr:
    """TDengine's CAST: its string types are strings, unsigned integers widen, and a TIMESTAMP is epoch
    milliseconds when cast from or to a number."""
    to, x = node.to, f"({to_spark(node.this)})"
    if to.this in _T_STRING:
        sql = f"CAST({x} AS STRING)"
    elif to.this == exp.DType.VARBINARY:
        sql = f"CAST({x} AS BINARY)"
    elif to.this in _T_WIDER:
        sql = f"CAST({x} AS {_T_WIDER[to.this]})"
    elif to.this == exp.DType.TIMESTAMP:
        sql = _as_timestamp(x)
    elif to.this in _T_NUMBER:
        target = to.sql(dialect="spark")
        sql = (
            f"CASE WHEN typeof({x}) LIKE 'timestamp%' THEN CAST(unix_millis(CAST({x} AS TIMESTAMP)) AS {target}) "
            f"ELSE CAST({x} AS {target}) END"
        )
    elif to.this in _T_SAME:
        return node
    else:
        raise error(node, f"CAST to {to.sql()} is not supported (docs/dialects/tdengine.md, Functions)")
    return sqlglot.parse_one(sql, read="spark")


def durations(tokens: list[Token]) -> dict[int, tuple[int, int]]:
    """Duration literals (``1s``, ``10a``: a number and a TDengine unit written together) by offset:
    (end offset, microseconds). Nanoseconds must add up to whole microseconds."""
    out = {}
    for a, b in pairwise(tokens):
        unit = b.text.lower()
        if (
            a.token_type == TokenType.NUMBER
            and a.text.isdigit()
            and b.token_type == TokenType.VAR
            and b.start == a.end + 1
            and unit in TDENGINE_UNITS
        ):
            ns = int(a.text) * TDENGINE_UNITS[unit]
            if ns % 1000 == 0:
                out[a.start] = (b.end, ns // 1000)
    return out


def interval(us: int) -> exp.Expression:
    """A duration literal: an INTERVAL Spark adds to timestamps; translations read its microseconds."""
    return exp.Interval(this=exp.Literal.string(str(us)), unit=exp.var("MICROSECOND"))
