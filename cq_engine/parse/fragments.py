"""Clause fragments parsed with sqlglot and rewritten to Spark SQL (IoTDB functions included)."""

from __future__ import annotations

from collections.abc import Callable

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError as SqlglotParseError

from cq_engine.parse.cursor import SourceText, suggest
from cq_engine.parse.safety import function_name, unsafe_expression
from cq_engine.parse.spark_functions import SPARK_AGGREGATES

# The planner exposes the source's event time under this name, so functions that need it
# (first_value, max_time...) can be written before the source table is known.
TIME_REF = "__cq_time"

IOTDB_TIME_NAMES = ("time", "timestamp")


def _time() -> exp.Column:
    return exp.column(TIME_REF)


def _non_null_time(arg: exp.Expression) -> exp.Expression:
    return exp.If(this=exp.Not(this=exp.Is(this=arg.copy(), expression=exp.Null())), true=_time(), false=exp.Null())


def _millis(t: exp.Expression) -> exp.Expression:
    return exp.Anonymous(this="UNIX_MILLIS", expressions=[t])


# IoTDB aggregate name → Spark expression builder over the (single) argument.
IOTDB_AGGREGATES: dict[str, Callable[[exp.Expression], exp.Expression]] = {
    "MAX_VALUE": lambda a: exp.Max(this=a),
    "MIN_VALUE": lambda a: exp.Min(this=a),
    # IoTDB's first/last *point*: a NULL is an absent point, so rows where the value is NULL have no
    # time to order by (MIN_BY/MAX_BY skip a NULL ordering).
    "FIRST_VALUE": lambda a: exp.Anonymous(this="MIN_BY", expressions=[a, _non_null_time(a)]),
    "LAST_VALUE": lambda a: exp.Anonymous(this="MAX_BY", expressions=[a, _non_null_time(a)]),
    # Largest absolute value keeping its sign; on a tie (5, -5) the positive one.
    "EXTREME": lambda a: exp.Anonymous(
        this="MAX_BY", expressions=[a, exp.Anonymous(this="STRUCT", expressions=[exp.Abs(this=a.copy()), a.copy()])]
    ),
    # IoTDB's times are INT64 milliseconds since the epoch: arithmetic and FILL work on them as numbers.
    "MAX_TIME": lambda a: exp.Max(this=_millis(_non_null_time(a))),
    "MIN_TIME": lambda a: exp.Min(this=_millis(_non_null_time(a))),
}


class Fragment:
    """A piece of a statement's text, parsed by sqlglot; errors map back to the file."""

    def __init__(self, source: SourceText, start: int, end: int):
        self.source, self.start, self.end = source, start, end
        self.text = source.text[start:end]

    @classmethod
    def of(cls, source: SourceText, tokens: list) -> Fragment:
        """The text from the first to the last of ``tokens``."""
        return cls(source, tokens[0].start, tokens[-1].end + 1)

    def parse(self, prefix: str) -> exp.Expression:
        sql = prefix + self.text
        try:
            parsed = sqlglot.parse_one(sql)
        except RecursionError:
            raise self.source.error(self.start, "the expression is nested too deeply to parse") from None
        except SqlglotParseError as err:
            info = err.errors[0] if err.errors else {}
            highlight = info.get("highlight") or ""
            offset = self._offset(prefix, int(info.get("line", 1)), int(info.get("col", 1)) - len(highlight))
            what = info.get("description", str(err)).split("\n")[0]
            near = highlight or self.text.strip()
            raise self.source.error(offset, f"{what} near {near!r}{suggest(highlight)}") from None
        if parsed is None:
            raise self.source.error(self.start, "empty clause")
        # sqlglot types parse_one with the nodes' base class; every parsed node is an Expression
        assert isinstance(parsed, exp.Expression)
        self._prefix = prefix
        if (unsafe := unsafe_expression(parsed)) is not None:
            node, why = unsafe
            word = function_name(node) or ""
            at = self.text.lower().find(word.lower()) if word else -1
            raise self.source.error(self.start + at, why) if at >= 0 else self.error(node, why)
        return parsed

    def _offset(self, prefix: str, line: int, col0: int) -> int:
        """File offset of a 0-based column on a line of ``prefix + text``."""
        lines = (prefix + self.text).split("\n")
        pos = sum(len(x) + 1 for x in lines[: line - 1]) + max(col0, 0)
        return min(self.end, max(self.start, self.start + pos - len(prefix)))

    def offset_of(self, node: exp.Expr) -> int:
        """File offset of a parsed node (its first identifier), or the fragment's start."""
        for ident in [node, *node.find_all(exp.Identifier)]:
            meta = getattr(ident, "_meta", None) or {}
            if "start" in meta:
                return self.start + meta["start"] - len(self._prefix)
        return self.start

    def written(self, node: exp.Expr) -> str | None:
        """The text of ``node``'s own first token as written (a function's name), when sqlglot kept it."""
        meta = getattr(node, "_meta", None) or {}
        if "start" not in meta or "end" not in meta:
            return None
        return self.text[meta["start"] - len(self._prefix) : meta["end"] - len(self._prefix) + 1]

    def error(self, node: exp.Expr, message: str):
        return self.source.error(self.offset_of(node), message)


def rewrite_iotdb_functions(node: exp.Expression, fragment: Fragment) -> exp.Expression:
    """Map IoTDB aggregate names to Spark ones; arity errors point at the call."""

    def visit(n: exp.Expression) -> exp.Expression:
        name = None
        if isinstance(n, exp.Anonymous):
            name = str(n.this).upper()
            args = list(n.expressions)
        elif isinstance(n, (exp.FirstValue, exp.LastValue)):
            name = "FIRST_VALUE" if isinstance(n, exp.FirstValue) else "LAST_VALUE"
            args = [n.this]
        if name in IOTDB_AGGREGATES:
            if len(args) != 1:
                raise fragment.error(n, f"{name.lower()} takes exactly one argument")
            return IOTDB_AGGREGATES[name](args[0].copy())
        return n

    return node.transform(visit)


def is_aggregate_call(node: exp.Expr) -> bool:
    """``node`` itself is an aggregate function call (sqlglot leaves some of Spark's, such as MIN_BY,
    MAX_BY and PERCENTILE, anonymous)."""
    return isinstance(node, exp.AggFunc) or (
        isinstance(node, exp.Anonymous) and str(node.this).lower() in SPARK_AGGREGATES
    )


def is_aggregate(node: exp.Expr) -> bool:
    return any(is_aggregate_call(n) for n in node.walk())


def under_aggregate(node: exp.Expr) -> bool:
    """``node`` lies inside an aggregate function call's arguments."""
    parent = node.parent
    while parent is not None and not is_aggregate_call(parent):
        parent = parent.parent
    return parent is not None


def is_aggregate_sql(sql: str) -> bool:
    """``is_aggregate`` of Spark SQL text."""
    return is_aggregate(sqlglot.parse_one(sql, read="spark"))


def to_spark(node: exp.Expr) -> str:
    return node.sql(dialect="spark")


def find_time_reference(node: exp.Expression, time_columns: tuple[str, ...]) -> exp.Column | None:
    lowered = {c.lower() for c in time_columns}
    return next((c for c in node.find_all(exp.Column) if c.name.lower() in lowered), None)
