"""The expressions of ``CREATE STREAM``: placeholders (``Scope``) and the subquery's clauses."""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from cq_engine.durations import micros
from cq_engine.model import (
    IROWTS,
    ISFILLED,
    PLACEHOLDERS,
    SUB_WEND,
    SUB_WSTART,
    SeriesCall,
    SubWindows,
    join_column,
    partition_placeholder,
    placeholder_column,
)
from cq_engine.parse.cursor import Cursor
from cq_engine.parse.fragments import Fragment, is_aggregate, to_spark
from cq_engine.parse.functions import check_functions
from cq_engine.parse.tdengine import functions as tdf
from cq_engine.parse.tdengine import series as tds

# Which trigger family offers which placeholder (seed 000's table; the old form has its own three).
WINDOW_PLACEHOLDERS = ("_twstart", "_twend", "_twduration", "_twrownum")
FAMILY_PLACEHOLDERS = {
    "window": WINDOW_PLACEHOLDERS,
    "sliding": ("_tprev_ts", "_tcurrent_ts", "_tnext_ts"),
    "period": ("_tprev_localtime", "_tnext_localtime"),
}
COMMON_PLACEHOLDERS = ("_tgrpid", "_tlocaltime")
OLD_PLACEHOLDERS = ("_wstart", "_wend", "_wduration")
# Where %%n and %%tbname may stand (seed 000 says SELECT and WHERE; TDengine's own examples also use
# them for the output subtable's name and tags, which is what they are for).
PERCENT_CLAUSES = ("SELECT", "WHERE", "TAGS", "OUTPUT_SUBTABLE", "NOTIFY ... WHERE")
_FAMILY_NAMES = {
    "window": "window triggers (INTERVAL ... SLIDING, SESSION, STATE_WINDOW, EVENT_WINDOW, COUNT_WINDOW)",
    "sliding": "SLIDING triggers without INTERVAL",
    "period": "PERIOD triggers",
}


@dataclass(frozen=True)
class Mark:
    """A ``%%name`` placeholder (``%%trows``, ``%%tbname``, ``%%1``) at ``offset``."""

    offset: int
    name: str
    token: Token

    @property
    def text(self) -> str:
        return "%%" + self.name


def find_marks(tokens: list[Token]) -> dict[int, Mark]:
    """The ``%%`` placeholders of a statement: ``%`` ``%`` name written without spaces."""
    marks = {}
    for a, b, c in zip(tokens, tokens[1:], tokens[2:]):
        if (
            a.token_type == b.token_type == TokenType.MOD
            and b.start == a.end + 1
            and c.start == b.end + 1
            and c.text.replace("_", "a").isalnum()
        ):
            marks[a.start] = Mark(a.start, c.text, a)
    return marks


class Scope:
    """What one stream's expressions may reference: its trigger's placeholders, its PARTITION BY.

    sqlglot reads ``%%name`` as ``__name`` (same length, so error offsets stay right); placeholders
    become engine columns (``placeholder_column``), ``%%n`` and ``%%tbname`` the column holding the
    trigger group's n-th PARTITION BY value (``partition_placeholder``)."""

    def __init__(self, cur: Cursor, marks: dict[int, Mark], form: str):
        self.cur, self.marks, self.form = cur, marks, form
        self.family = "old" if form == "old" else "window"
        self.label = ""
        self.interval_window = False
        self.partition_by: tuple[str, ...] = ()
        self.group_by: tuple[str, ...] = ()  # the new form's query: GROUP BY / PARTITION BY columns
        self.groups_rows = False  # GROUP BY (one row per group), not PARTITION BY (the rows kept)
        self.used: set[int] = set()
        self.aliases: tuple[str, ...] = ()  # the query's FROM table or subquery: ``alias.col`` is ``col``
        self.join_sides: dict[str, int] = {}  # a join's aliases → side (``model.join_column``)
        self.window_join = False  # a LEFT WINDOW JOIN: aggregates group each trigger row's matches
        self.sub_windows: SubWindows | None = None  # the query's INTERVAL: _wstart... are its sub-window's
        self.tz = "UTC"  # CQ_TIMEZONE: TODAY(), TO_ISO8601, TIMETRUNCATE by day
        self.durations = tdf.durations(cur.tokens)  # 1s, 10a: offset -> (end, microseconds)
        # TWA's arguments interpolated at the bounds of INTERVAL / SLIDING windows over %%trows
        self.interpolates = False
        self.interpolated: list[str] = []
        self.series: list[SeriesCall] = []  # the query's multi-row functions (``parse.tdengine.series``)
        self.interp_mode = False  # the query has RANGE / EVERY: INTERP, _irowts and _isfilled are its
        self.interp_calls: list[SeriesCall] = []
        # UNIQUE(...) is a keyword to sqlglot: read as an identifier of the same length, by offset
        self.renamed = {
            a.start: a.end
            for a, b in zip(cur.tokens, cur.tokens[1:])
            if a.text.lower() == "unique" and b.token_type == TokenType.L_PAREN
        }

    def fragment(self, toks: list[Token]) -> Fragment:
        frag = Fragment.of(self.cur.source, toks)
        text = list(frag.text)
        for offset in self.marks:
            if frag.start <= offset < frag.end - 1:
                text[offset - frag.start : offset - frag.start + 2] = "__"
        for offset, (end, _) in self.durations.items():  # an identifier of the same length, found by offset
            if frag.start <= offset and end < frag.end:
                text[offset - frag.start : end - frag.start + 1] = tdf.DURATION_PREFIX + "0" * (end - offset)
        for offset, end in self.renamed.items():
            if frag.start <= offset and end < frag.end:
                text[offset - frag.start : end - frag.start + 1] = _UNIQUE
        frag.text = "".join(text)
        return frag

    def parse_expression(self, toks: list[Token], clause: str, at: Token) -> tuple[exp.Expression, Fragment]:
        """One expression as written (placeholders not resolved) and its fragment."""
        if not toks:
            raise self.cur.error_at(at, f"{clause} needs an expression")
        frag = self.fragment(toks)
        parsed = plain_select(frag, frag.parse("SELECT "), "expressions")
        if len(parsed.expressions) != 1 or isinstance(parsed.expressions[0], exp.Alias):
            raise frag.error(parsed.expressions[-1], f"{clause} takes one expression")
        return parsed.expressions[0], frag

    def expression(self, toks: list[Token], clause: str, at: Token) -> exp.Expression:
        """One expression (``PRE_FILTER(...)``, ``STATE_WINDOW(...)``...), placeholders resolved."""
        node, frag = self.parse_expression(toks, clause, at)
        return self.resolve(node, frag, clause)

    def condition(self, toks: list[Token], clause: str, at: Token) -> str:
        node = self.expression(toks, clause, at)
        if is_aggregate(node):
            raise self.cur.error_at(toks[0], f"aggregates are not allowed in {clause}")
        return to_spark(node)

    def resolve(self, node: exp.Expression, frag: Fragment, clause: str) -> exp.Expression:
        if (query := node.find(exp.Select)) is not None:
            raise frag.error(query, f"subqueries are not supported in a stream's {clause}")

        def visit(n: exp.Expression) -> exp.Expression:
            if isinstance(n, exp.Column) and n.table:
                qualifier = n.table.lower()
                if qualifier in self.join_sides:
                    side = exp.column(join_column(self.join_sides[qualifier], n.name))
                    if "start" in n.args["table"].meta:  # errors point at alias.col as written
                        side.this.meta["start"] = n.args["table"].meta["start"]
                    return side
                if qualifier in (a.lower() for a in self.aliases):
                    n = exp.Column(this=n.this)
                elif self.form == "new":
                    known = ", ".join([*self.aliases, *self.join_sides]) or "none: name the column alone"
                    raise frag.error(n, f"{n.table!r} is not a table of this query (its tables: {known})")
            if not isinstance(n, exp.Column) or n.table:
                return n
            if n.this.args.get("quoted"):  # TDengine: "text" is a string like 'text' (identifiers use `...`)
                return exp.Literal.string(n.name)
            offset = frag.offset_of(n)
            if offset in self.durations:
                duration = tdf.interval(self.durations[offset][1])
                duration._meta = getattr(n.this, "_meta", None)  # errors point at the literal
                return duration
            if offset in self.marks:
                self.used.add(offset)
                return exp.column(self._percent(self.marks[offset], clause))
            if self.sub_windows is not None and n.name.lower() in OLD_PLACEHOLDERS:
                if clause not in ("SELECT", "HAVING", "ORDER BY"):
                    raise frag.error(
                        n, f"{n.name} (the query's sub-window) can only be used in SELECT, HAVING and ORDER BY"
                    )
                return sub_placeholder(n.name, self.sub_windows)
            if n.name.lower() in ("_irowts", "_isfilled"):
                if not self.interp_mode or clause != "SELECT":
                    raise frag.error(n, f"{n.name} is INTERP's: it needs EVERY(...) in the query, and SELECT")
                return exp.column(IROWTS if n.name.lower() == "_irowts" else ISFILLED)
            if n.name.lower() in PLACEHOLDERS:
                self.check_placeholder(n.name, offset, clause)
                return exp.column(placeholder_column(n.name))
            return n

        return self._functions(node.transform(visit), frag, clause)

    def _functions(self, tree: exp.Expr, frag: Fragment, clause: str) -> exp.Expression:
        """TDengine's functions translated (innermost first), then every name resolved (``parse.functions``)."""
        for node in reversed(list(tree.walk(bfs=False))):
            name = self._tdengine_name(node, frag) if isinstance(node, exp.Func) else None
            if name is not None and self.form == "old" and name in tds.OLD_FORM_REFUSED:
                raise frag.error(
                    node,
                    f"{name.upper()}() cannot be used in the old form's query (TDengine's old syntax lists it among "
                    "the functions its subquery cannot use); the new form (CREATE STREAM name trigger ... AS "
                    "query) allows it",
                )
            if isinstance(node, exp.Cast) and not isinstance(node, exp.TryCast):
                new = tdf.cast(node, frag.error)
            elif name in tds.SERIES:
                new = self._series(name, node, frag, clause)
            elif name == "interp" and self.interp_mode:
                new = self._interp(node, frag, clause)
            elif name in tdf.FUNCTIONS:
                call = tdf.Call(
                    name=name,
                    args=_arguments(node),
                    node=node,
                    time_window=self.interval_window or self.family in ("sliding", "period"),
                    placeholders=clause == "SELECT" or (clause == "WHERE" and self.form != "old"),
                    tz=self.tz,
                    error=frag.error,
                    bounds=self.bound_columns if self.interpolates else None,
                )
                new = tdf.translate(call)
            else:
                continue
            if node is tree:
                tree = new
            elif new is not node:
                node.replace(new)
        check_functions(tree, frag.error, dialect="TDengine", refused=tdf.REFUSED, own=tuple(tdf.FUNCTIONS))
        assert isinstance(tree, exp.Expression)  # parsed SQL: sqlglot types it with the base class
        return tree

    def bound_columns(self, x_sql: str) -> tuple[str, str]:
        if x_sql not in self.interpolated:
            self.interpolated.append(x_sql)
        return tdf.bound_columns(x_sql)

    def _series(self, name: str, node: exp.Expr, frag: Fragment, clause: str) -> exp.Expression:
        """A multi-row function: checked, registered, and read as its engine column."""
        if clause != "SELECT":
            raise frag.error(
                node, f"{name.upper()}() gives rows of its own and can only be used in SELECT, not in {clause}"
            )
        call = tdf.Call(
            name=name, args=_arguments(node), node=node, time_window=False, placeholders=True, tz=self.tz,
            error=frag.error,
        )  # fmt: skip
        self.series.append(tds.series_call(call, len(self.series)))
        return exp.column(self.series[-1].column)

    def _interp(self, node: exp.Expr, frag: Fragment, clause: str) -> exp.Expression:
        """INTERP(x[, ignore_null_values]) of a query with EVERY(...): its value at each time point."""
        args = _arguments(node)
        if clause != "SELECT":
            raise frag.error(node, f"INTERP() can only be used in SELECT, not in {clause}")
        call = tdf.Call(
            name="interp", args=args, node=node, time_window=False, placeholders=True, tz=self.tz, error=frag.error
        )
        if not 1 <= len(args) <= 2 or isinstance(args[0], exp.Star):
            raise frag.error(node, "INTERP takes a column and, optionally, ignore_null_values (0 or 1)")
        if is_aggregate(args[0]) or any(c.name.startswith("__cq_") for c in args[0].find_all(exp.Column)):
            raise frag.error(args[0], "INTERP: its argument is a row's value, not an aggregate or a placeholder")
        ignore = int(call.number(1, "ignore_null_values", 0, 1)) if len(args) > 1 else 0
        column = f"__cq_interp_{len(self.interp_calls)}"
        self.interp_calls.append(
            SeriesCall(column=column, function="interp", argument=to_spark(args[0]), params=(ignore,))
        )
        return exp.column(column)

    @staticmethod
    def _tdengine_name(node: exp.Func, frag: Fragment) -> str | None:
        written = (frag.written(node) or "").lower()
        known = (*tdf.FUNCTIONS, *tds.SERIES, *tds.OLD_FORM_REFUSED)
        name = written if written in known else tdf.call_name(node)
        name = "unique" if name == _UNIQUE else name
        return name if name in known else None

    def _percent(self, mark: Mark, clause: str) -> str:
        at = mark.token
        if self.form == "old":
            raise self.cur.error_at(at, f"{mark.text}: %% placeholders belong to the new CREATE STREAM form")
        if mark.name.lower() == "trows":
            raise self.cur.error_at(at, f"%%trows can only be used in FROM, not in {clause}")
        if clause not in PERCENT_CLAUSES:
            raise self.cur.error_at(at, f"{mark.text} can only be used in {_percent_clauses(mark)}, not in {clause}")
        return partition_placeholder(self.partition_index(mark))

    def partition_index(self, mark: Mark) -> int:
        """The 1-based PARTITION BY position ``%%n`` / ``%%tbname`` stands for."""
        at, name = mark.token, mark.name.lower()
        if name == "tbname":
            lowered = [p.lower() for p in self.partition_by]
            if "tbname" not in lowered:
                raise self.cur.error_at(at, "%%tbname needs PARTITION BY tbname")
            return lowered.index("tbname") + 1
        if not name.isdigit():
            raise self.cur.error_at(at, f"unknown placeholder {mark.text!r} (known: %%trows, %%tbname, %%1, %%2, ...)")
        n = int(name)
        if not 1 <= n <= len(self.partition_by):
            raise self.cur.error_at(
                at,
                f"{mark.text} refers to PARTITION BY column {n}, but PARTITION BY names "
                f"{len(self.partition_by)} column(s)",
            )
        return n

    def partition_name(self, mark: Mark) -> str:
        """A result column written ``%%n`` is named after the n-th PARTITION BY column (``%%tbname``: tbname)."""
        return "tbname" if mark.name.lower() == "tbname" else self.partition_by[self.partition_index(mark) - 1]

    def check_placeholder(self, name: str, offset: int, clause: str) -> None:
        lowered = name.lower()
        err = self.cur.source.error
        if self.form == "old":
            if lowered not in OLD_PLACEHOLDERS:
                raise err(
                    offset,
                    f"{name} belongs to the new CREATE STREAM form; the old form offers {', '.join(OLD_PLACEHOLDERS)}",
                )
        elif lowered in OLD_PLACEHOLDERS:
            raise err(offset, f"{name} belongs to the old CREATE STREAM form; use _tw{lowered[2:]}")
        elif lowered not in COMMON_PLACEHOLDERS + FAMILY_PLACEHOLDERS[self.family]:
            owner = next(f for f, names in FAMILY_PLACEHOLDERS.items() if lowered in names)
            offered = COMMON_PLACEHOLDERS + FAMILY_PLACEHOLDERS[self.family]
            raise err(
                offset,
                f"{name} is a placeholder of {_FAMILY_NAMES[owner]}, not of this {self.label} trigger "
                f"(it offers {', '.join(offered)}, %%n, %%tbname, %%trows)",
            )
        if clause not in ("SELECT", "WHERE", "RANGE"):
            raise err(offset, f"{name} can only be used in SELECT, WHERE and RANGE, not in {clause}")
        if self.form == "old" and clause == "WHERE":  # it filters the rows before they are windowed
            raise err(offset, f"{name} cannot be used in the old form's WHERE, which filters rows before windowing")

    def check_all_used(self) -> None:
        """A ``%%`` placeholder no clause took (in a table name, an alias...) is misplaced."""
        for offset, mark in sorted(self.marks.items()):
            if offset not in self.used:
                raise self.cur.error_at(mark.token, f"{mark.text} can only be used in {_percent_clauses(mark)}")


_UNIQUE = "_uniq_"  # UNIQUE, renamed (``Scope.renamed``)


def _arguments(node: exp.Expr) -> list[exp.Expr]:
    return [a for a in (node.this, node.args.get("expression"), *node.expressions) if isinstance(a, exp.Expr)]


def sub_placeholder(name: str, windows: SubWindows) -> exp.Expression:
    """``_wstart`` / ``_wend`` / ``_wduration`` of a query's sub-window, over ``SUB_WSTART``."""
    start = exp.column(SUB_WSTART)
    if name.lower() == "_wstart":
        return start
    if windows.over is not None:  # a data-shaped sub-window: from its first row to its last
        if name.lower() == "_wend":
            return exp.column(SUB_WEND)
        span = sqlglot.parse_one(f"(unix_micros({SUB_WEND}) - unix_micros({SUB_WSTART})) div 1000", read="spark")
        assert isinstance(span, exp.Expression)  # parsed SQL
        return span
    size = micros(windows.interval)
    if name.lower() == "_wend":
        end = exp.Add(this=exp.func("unix_micros", start), expression=exp.Literal.number(size))
        out = exp.func("timestamp_micros", end)
        assert isinstance(out, exp.Expression)  # a call, built by sqlglot
        return out
    return exp.Literal.number(size // 1000)  # _wduration: milliseconds


def _percent_clauses(mark: Mark) -> str:
    if mark.name.lower() == "trows":
        return "FROM"
    return (
        ("FROM, " if mark.name.lower() == "tbname" else "")
        + ", ".join(PERCENT_CLAUSES[:-1])
        + " and "
        + PERCENT_CLAUSES[-1]
    )


def plain_select(frag: Fragment, parsed: exp.Expression, *keys: str) -> exp.Select:
    """``parsed`` must be a plain SELECT with only ``keys`` set (no GROUP BY slipping through)."""
    if not isinstance(parsed, exp.Select):
        raise frag.source.error(frag.start, f"unexpected {type(parsed).__name__.upper()} in a stream's query")
    for key, value in parsed.args.items():
        if value and key not in keys:
            node = value if isinstance(value, exp.Expression) else None
            where = frag.offset_of(node) if node is not None else frag.start
            raise frag.source.error(where, f"unexpected {key.upper()} in a stream's query")
    return parsed


# --- the subquery's clauses -----------------------------------------------------------------------

_WINDOW_WORDS = ("INTERVAL", "SLIDING", "SESSION", "STATE_WINDOW", "COUNT_WINDOW", "EVENT_WINDOW")
_ORDER = ("SELECT", "FROM", "WHERE", "PARTITION BY", "WINDOW", "NOTIFY")
# The new form's query is any TDengine query (seed 000): these clauses, in this order.
_NEW_ORDER = (
    "SELECT", "FROM", "WHERE", "PARTITION BY", "RANGE", "EVERY", "WINDOW", "FILL", "GROUP BY", "HAVING",
    "ORDER BY", "SLIMIT", "LIMIT",
)  # fmt: skip
_NEW_REJECTED = {
    "UNION": "UNION is not supported in a stream's query",
}
# The old form's subquery is seed 000's SELECT ... FROM ... [WHERE] [PARTITION BY] window_clause.
_REJECTED = {
    "GROUP BY": "GROUP BY is not allowed in a stream's query: the trigger's windows group the rows",
    "ORDER BY": "ORDER BY is not allowed in a stream's query: results are written by time",
    "HAVING": "HAVING is not supported in a stream's query",
    "LIMIT": "LIMIT is not supported in a stream's query",
    "SLIMIT": "SLIMIT is not supported in a stream's query",
    "FILL": "FILL is not supported in a stream's query",
    "UNION": "UNION is not supported in a stream's query",
}
_OLD_FORM_NOTE = " (the old form's query is SELECT ... FROM ... [WHERE] [PARTITION BY] window; the new form takes it)"


def _clause_word(tokens: list[Token], i: int) -> str | None:
    tok = tokens[i]
    word = tok.text.upper()
    nxt = tokens[i + 1] if i + 1 < len(tokens) else None
    followed_by_paren = nxt is not None and nxt.token_type == TokenType.L_PAREN
    if word in ("FROM", "WHERE", "PARTITION BY", "GROUP BY", "ORDER BY", "HAVING", "LIMIT", "SLIMIT", "UNION"):
        return word
    if (
        word in ("INTERVAL", "SLIDING", "SESSION", "STATE_WINDOW", "COUNT_WINDOW", "NOTIFY", "FILL", "RANGE", "EVERY")
        and followed_by_paren
    ):
        return word
    if word == "EVENT_WINDOW":
        return word
    return None


def split_query(cur: Cursor, tokens: list[Token], *, form: str) -> dict[str, tuple[Token, list[Token]]]:
    """The subquery's clauses by name (window keywords all land in ``WINDOW``), checking their order."""
    if not tokens or tokens[0].text.upper() != "SELECT":
        raise cur.error_at(tokens[0] if tokens else None, "expected SELECT after AS")
    clauses: dict[str, tuple[Token, list[Token]]] = {"SELECT": (tokens[0], [])}
    current, depth, cases = "SELECT", 0, 0
    for i in range(1, len(tokens)):
        tok = tokens[i]
        word = _clause_word(tokens, i) if depth == 0 and cases == 0 else None
        if word in _WINDOW_WORDS:
            word = None if current == "WINDOW" else "WINDOW"  # new form: the query's sub-windows
        order = _NEW_ORDER if form == "new" else _ORDER
        if form == "old" and word in ("RANGE", "EVERY"):
            raise cur.error_at(tok, f"{word} (INTERP's) belongs to the new form's query")
        if form == "new" and word in _NEW_REJECTED:
            raise cur.error_at(tok, _NEW_REJECTED[word])
        if form == "old" and word in _REJECTED:
            raise cur.error_at(tok, _REJECTED[word] + (_OLD_FORM_NOTE if word not in ("FILL", "UNION") else ""))
        if word is not None:
            if form == "new" and word == "NOTIFY":
                raise cur.error_at(tok, f"{word} belongs before AS in the new form (after the trigger's FROM table)")
            if word in clauses:
                raise cur.error_at(tok, f"{word} given twice")
            if form == "new" and {word, current} == {"PARTITION BY", "GROUP BY"}:
                raise cur.error_at(tok, "a query takes PARTITION BY or GROUP BY, not both")
            if order.index(word) < order.index(current):
                said = tok.text.upper() if word == "WINDOW" else word  # INTERVAL, SESSION...
                raise cur.error_at(tok, f"{said} must come before {current}")
            current = word
            clauses[word] = (tok, [])
            continue
        if tok.token_type in (TokenType.L_PAREN, TokenType.L_BRACKET):
            depth += 1
        elif tok.token_type in (TokenType.R_PAREN, TokenType.R_BRACKET):
            depth -= 1
        elif tok.token_type == TokenType.CASE:
            cases += 1
        elif tok.token_type == TokenType.END and cases:
            cases -= 1
        clauses[current][1].append(tok)
    if "FROM" not in clauses:
        raise cur.error_at(tokens[0], "the stream's query needs a FROM clause")
    for name, (tok, toks) in clauses.items():
        if not toks and name != "WINDOW":
            raise cur.error_at(tok, f"{name} needs an argument")
    return clauses


def from_clause(scope: Scope, clause: Token, toks: list[Token]) -> tuple[str, bool, Token]:
    """``FROM %%trows`` / ``%%tbname`` / ``[db.]table`` → (name, is a placeholder, token)."""
    first = toks[0]
    if first.start in scope.marks and len(toks) > 3:
        raise scope.cur.error_at(
            toks[3], f"FROM {scope.marks[first.start].text} takes no alias or join, found {toks[3].text!r}"
        )
    if first.start in scope.marks:
        mark = scope.marks[first.start]
        scope.used.add(first.start)
        if scope.form == "old":
            raise scope.cur.error_at(first, f"{mark.text}: %% placeholders belong to the new CREATE STREAM form")
        if mark.name.lower() not in ("trows", "tbname"):
            raise scope.cur.error_at(first, f"FROM takes %%trows or a table name, not {mark.text!r}")
        return mark.name.lower(), True, first
    sub = scope.cur.sub(toks, toks[-1].end + 1)
    tok = sub.table_name("a table name after FROM")
    if not sub.at_end():
        raise sub.unexpected("FROM takes one table (joins, subqueries and aliases are not supported)")
    return tok.text, False, tok


def where_clause(scope: Scope, toks: list[Token]) -> str:
    frag = scope.fragment(toks)
    cond = plain_select(frag, frag.parse("SELECT 1 WHERE "), "expressions", "where").args["where"].this
    if is_aggregate(cond):
        raise frag.error(cond, "aggregates are not allowed in WHERE")
    return to_spark(scope.resolve(cond, frag, "WHERE"))
