"""TDengine's multi-row functions in a new-form stream's SELECT (docs/dialects/tdengine.md, *Multi-row
functions*): ``DIFF``, ``CSUM``, ``MAVG``, ``DERIVATIVE``, ``STATECOUNT``, ``STATEDURATION`` (a value
per row, in time order) and the selections ``TOP``, ``BOTTOM``, ``TAIL``, ``UNIQUE``, ``SAMPLE`` (the
rows they choose) and ``HISTOGRAM`` (a row per bin). Each call is checked here and becomes a
``SeriesCall``; the select item reads its engine column, which ``streams.series`` computes over each
(group, window)'s rows with window functions: one Spark job for the run, as for an aggregate."""

from __future__ import annotations

import json
import math
from itertools import pairwise

from sqlglot import exp

from cq_engine.model import SeriesCall
from cq_engine.parse.fragments import is_aggregate, to_spark
from cq_engine.parse.tdengine.functions import Call

# name → (least, most arguments)
SERIES: dict[str, tuple[int, int]] = {
    "diff": (1, 2),
    "csum": (1, 1),
    "mavg": (2, 2),
    "derivative": (3, 3),
    "statecount": (3, 3),
    "stateduration": (3, 4),
    "top": (2, 2),
    "bottom": (2, 2),
    "tail": (2, 3),
    "unique": (1, 1),
    "sample": (2, 2),
    "histogram": (4, 4),
}
# They choose the rows (or, HISTOGRAM, make them): one of them alone among the multi-row functions.
SELECTIONS = ("top", "bottom", "tail", "unique", "sample", "histogram")
# Seed 000's old-form subquery "cannot use" these (the new form's query may).
OLD_FORM_REFUSED = (
    "leastsquares", "percentile", "top", "bottom", "elapsed", "interp", "derivative", "irate", "twa",
    "histogram", "diff", "statecount", "stateduration", "csum", "mavg", "sample", "tail", "unique", "mode",
)  # fmt: skip
COLUMN_PREFIX = "__cq_series_"
_OPERATORS = ("LT", "GT", "LE", "GE", "NE", "EQ")
_MAX_BINS = 1000


def series_call(call: Call, index: int) -> SeriesCall:
    """The checked call: its argument as Spark SQL and its parameters; the engine column is the
    query's ``index``-th."""
    name = call.name
    least, most = SERIES[name]
    upper = name.upper()
    if not least <= len(call.args) <= most:
        count = str(least) if least == most else f"{least} to {most}"
        raise call.error(call.node, f"{upper} takes {count} argument(s), got {len(call.args)}")
    x = call.args[0]
    if isinstance(x, exp.Star):
        raise call.error(call.node, f"{upper}(*) is not supported: name one column")
    if is_aggregate(x) or any(c.name.startswith(COLUMN_PREFIX) for c in x.find_all(exp.Column)):
        raise call.error(x, f"{upper}: its argument is a row's value, not an aggregate or another multi-row function")
    params: tuple = ()
    if name == "diff":
        params = (int(_integer(call, 1, "ignore_option", 0, 3)) if len(call.args) > 1 else 0,)
    elif name == "mavg":
        params = (_integer(call, 1, "k", 1, 1000),)
    elif name == "derivative":
        interval = call.micros(1, "the time interval")
        if interval < 1_000_000:
            raise call.error(call.args[1], f"{upper}: the time interval must be at least 1s")
        params = (interval, _integer(call, 2, "ignore_negative", 0, 1))
    elif name in ("statecount", "stateduration"):
        unit = call.micros(3, "the time unit") if len(call.args) > 3 else 1000  # the ms precision
        params = (_operator(call), call.number(2, "the value"), *([unit] if name == "stateduration" else []))
    elif name in ("top", "bottom"):
        params = (_integer(call, 1, "k", 1, 100),)
    elif name == "tail":
        params = (_integer(call, 1, "k", 1, 100), _integer(call, 2, "offset", 0, 100) if len(call.args) > 2 else 0)
    elif name == "sample":
        params = (_integer(call, 1, "k", 1, 1000),)
    elif name == "histogram":
        params = _histogram(call)
    return SeriesCall(column=f"{COLUMN_PREFIX}{index}", function=name, argument=to_spark(x), params=params)  # type: ignore[arg-type]


def _integer(call: Call, i: int, what: str, lo: int, hi: int) -> int:
    value = call.number(i, what, lo, hi)
    if value != int(value):
        raise call.error(call.args[i], f"{call.name.upper()}: {what} must be a whole number, got {value:g}")
    return int(value)


def _string(call: Call, i: int, what: str) -> str:
    arg = call.args[i]
    if not (isinstance(arg, exp.Literal) and arg.is_string):
        raise call.error(arg, f"{call.name.upper()}: {what} must be a string")
    return arg.name


def _operator(call: Call) -> str:
    op = _string(call, 1, "the comparison").upper()
    if op not in _OPERATORS:
        raise call.error(
            call.args[1], f"{call.name.upper()}: the comparison is one of {', '.join(_OPERATORS)}, got {op!r}"
        )
    return op


def _histogram(call: Call) -> tuple:
    """(the bins' edges, normalized): ``user_input`` edges as given, ``linear_bin`` / ``log_bin`` edges
    from start, width or factor and count, with ``infinity`` adding -inf and +inf."""
    kind = _string(call, 1, "bin_type").lower()
    text = _string(call, 2, "bin_description")
    at = call.args[2]
    fail = lambda why: call.error(at, f"HISTOGRAM: {why}")
    try:
        spec = json.loads(text)
    except ValueError:
        raise fail(f"bin_description is not JSON: {text!r}") from None
    if kind == "user_input":
        if not isinstance(spec, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in spec):
            raise fail("user_input's bin_description is an array of numbers, such as '[1, 3, 5, 7]'")
        edges = [float(v) for v in spec]
        if len(edges) < 2 or len(edges) > _MAX_BINS + 1:
            raise fail(f"user_input gives 2 to {_MAX_BINS + 1} bin edges, got {len(edges)}")
        if any(b <= a for a, b in pairwise(edges)):
            raise fail("user_input's bin edges must be strictly increasing")
    elif kind in ("linear_bin", "log_bin"):
        step_key = "width" if kind == "linear_bin" else "factor"
        if not isinstance(spec, dict) or not {"start", step_key, "count", "infinity"} <= set(spec):
            raise fail(f"{kind}'s bin_description is an object with start, {step_key}, count and infinity")
        start, step, count, infinity = spec["start"], spec[step_key], spec["count"], spec["infinity"]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (start, step, count)):
            raise fail(f"{kind}: start, {step_key} and count are numbers")
        if not isinstance(infinity, bool):
            raise fail(f"{kind}: infinity is true or false")
        if count != int(count) or not 1 <= count <= _MAX_BINS:
            raise fail(f"{kind}: count is a whole number from 1 to {_MAX_BINS}, got {count}")
        if kind == "linear_bin":
            if step == 0:
                raise fail("linear_bin: width cannot be 0")
            edges = [float(start) + i * float(step) for i in range(int(count) + 1)]
        else:
            if start == 0 or step <= 0 or step == 1:
                raise fail("log_bin: start cannot be 0, and factor is a positive number other than 1")
            edges = [float(start) * float(step) ** i for i in range(int(count) + 1)]
        edges.sort()  # a negative width or a factor below 1 counts down
        if infinity:
            edges = [-math.inf, *edges, math.inf]
        if any(math.isinf(e) for e in edges[1:-1]) or any(b <= a for a, b in pairwise(edges)):
            raise fail(f"{kind}: the bins overflow or coincide")
    else:
        raise call.error(call.args[1], f"HISTOGRAM: bin_type is 'user_input', 'linear_bin' or 'log_bin', got {kind!r}")
    return tuple(edges), _integer(call, 3, "normalized", 0, 1)
