"""The expressions of ``CREATE STREAM``: placeholders, the subquery's clauses and its result columns."""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from ..model import PLACEHOLDERS, KeyBound, SelectItem, placeholder_column
from .cursor import Cursor, split_top
from .fragments import Fragment, is_aggregate, to_spark

# Which trigger family offers which placeholder (seed 000's table; the old form has its own three).
WINDOW_PLACEHOLDERS = ("_twstart", "_twend", "_twduration", "_twrownum")
FAMILY_PLACEHOLDERS = {
    "window": WINDOW_PLACEHOLDERS,
    "sliding": ("_tprev_ts", "_tcurrent_ts", "_tnext_ts"),
    "period": ("_tprev_localtime", "_tnext_localtime"),
}
COMMON_PLACEHOLDERS = ("_tgrpid", "_tlocaltime")
OLD_PLACEHOLDERS = ("_wstart", "_wend", "_wduration")
_FAMILY_NAMES = {"window": "window triggers (INTERVAL ... SLIDING, SESSION, STATE_WINDOW, EVENT_WINDOW, COUNT_WINDOW)",
                 "sliding": "SLIDING triggers without INTERVAL", "period": "PERIOD triggers"}
# The first result column: the sink's time column, per family → {placeholder: key bound}.
_KEYS: dict[str, dict[str, KeyBound]] = {
    "window": {"_twstart": "start", "_twend": "end"}, "old": {"_wstart": "start", "_wend": "end"},
    "sliding": {"_tprev_ts": "start", "_tcurrent_ts": "end"}, "period": {"_tlocaltime": "tick"},
}
_KEY_WORDS = {"window": "the window start (_twstart)", "old": "the window start (_wstart)",
              "sliding": "the previous trigger time (_tprev_ts) or this trigger's time (_tcurrent_ts)",
              "period": "the trigger time (_tlocaltime)"}


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
        if (a.token_type == b.token_type == TokenType.MOD and b.start == a.end + 1 and c.start == b.end + 1
                and c.text.replace("_", "a").isalnum()):
            marks[a.start] = Mark(a.start, c.text, a)
    return marks


class Scope:
    """What one stream's expressions may reference: its trigger's placeholders, its PARTITION BY.

    sqlglot reads ``%%name`` as ``__name`` (same length, so error offsets stay right); placeholders
    become engine columns (``placeholder_column``), ``%%n`` the n-th PARTITION BY column."""

    def __init__(self, cur: Cursor, marks: dict[int, Mark], form: str):
        self.cur, self.marks, self.form = cur, marks, form
        self.family = "old" if form == "old" else "window"
        self.label = ""
        self.interval_window = False
        self.partition_by: tuple[str, ...] = ()
        self.used: set[int] = set()

    def fragment(self, toks: list[Token]) -> Fragment:
        frag = Fragment.of(self.cur.source, toks)
        text = list(frag.text)
        for offset in self.marks:
            if frag.start <= offset < frag.end - 1:
                text[offset - frag.start : offset - frag.start + 2] = "__"
        frag.text = "".join(text)
        return frag

    def parse_expression(self, toks: list[Token], clause: str, at: Token) -> tuple[exp.Expression, Fragment]:
        """One expression as written (placeholders not resolved) and its fragment."""
        if not toks:
            raise self.cur.error_at(at, f"{clause} needs an expression")
        frag = self.fragment(toks)
        parsed = _only(frag, frag.parse("SELECT "), "expressions")
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
            if not isinstance(n, exp.Column) or n.table:
                return n
            offset = frag.offset_of(n)
            if offset in self.marks:
                self.used.add(offset)
                return exp.column(self._percent(self.marks[offset], clause))
            if n.name.lower() in PLACEHOLDERS:
                self.check_placeholder(n.name, offset, clause)
                return exp.column(placeholder_column(n.name))
            return n

        return node.transform(visit)

    def _percent(self, mark: Mark, clause: str) -> str:
        at = mark.token
        if self.form == "old":
            raise self.cur.error_at(at, f"{mark.text}: %% placeholders belong to the new CREATE STREAM form")
        name = mark.name.lower()
        if name == "trows":
            raise self.cur.error_at(at, f"%%trows can only be used in FROM, not in {clause}")
        if clause not in ("SELECT", "WHERE"):
            where = "FROM, SELECT and WHERE" if name == "tbname" else "SELECT and WHERE"
            raise self.cur.error_at(at, f"{mark.text} can only be used in {where}, not in {clause}")
        if name == "tbname":
            if "tbname" not in (p.lower() for p in self.partition_by):
                raise self.cur.error_at(at, "%%tbname needs PARTITION BY tbname")
            return "tbname"
        if not name.isdigit():
            raise self.cur.error_at(at, f"unknown placeholder {mark.text!r} (known: %%trows, %%tbname, %%1, %%2, ...)")
        n = int(name)
        if not 1 <= n <= len(self.partition_by):
            raise self.cur.error_at(at, f"{mark.text} refers to PARTITION BY column {n}, but PARTITION BY names "
                                        f"{len(self.partition_by)} column(s)")
        return self.partition_by[n - 1]

    def check_placeholder(self, name: str, offset: int, clause: str) -> None:
        lowered = name.lower()
        err = self.cur.source.error
        if self.form == "old":
            if lowered not in OLD_PLACEHOLDERS:
                raise err(offset, f"{name} belongs to the new CREATE STREAM form; the old form offers "
                                  f"{', '.join(OLD_PLACEHOLDERS)}")
        elif lowered in OLD_PLACEHOLDERS:
            raise err(offset, f"{name} belongs to the old CREATE STREAM form; use _tw{lowered[2:]}")
        elif lowered not in COMMON_PLACEHOLDERS + FAMILY_PLACEHOLDERS[self.family]:
            owner = next(f for f, names in FAMILY_PLACEHOLDERS.items() if lowered in names)
            offered = COMMON_PLACEHOLDERS + FAMILY_PLACEHOLDERS[self.family]
            raise err(offset, f"{name} is a placeholder of {_FAMILY_NAMES[owner]}, not of this {self.label} trigger "
                              f"(it offers {', '.join(offered)}, %%n, %%tbname, %%trows)")
        if clause not in ("SELECT", "WHERE"):
            raise err(offset, f"{name} can only be used in SELECT and WHERE, not in {clause}")

    def check_all_used(self) -> None:
        """A ``%%`` placeholder no clause took (in a table name, an alias...) is misplaced."""
        for offset, mark in sorted(self.marks.items()):
            if offset not in self.used:
                where = {"trows": "FROM", "tbname": "FROM, SELECT and WHERE"}.get(mark.name.lower(), "SELECT and WHERE")
                raise self.cur.error_at(mark.token, f"{mark.text} can only be used in {where}")


def _only(frag: Fragment, parsed: exp.Expression, *keys: str) -> exp.Select:
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
_REJECTED = {"GROUP BY": "GROUP BY is not allowed in a stream's query: the trigger's windows group the rows",
             "ORDER BY": "ORDER BY is not allowed in a stream's query: results are written by time",
             "HAVING": "HAVING is not supported in a stream's query", "LIMIT": "LIMIT is not supported in a stream's query",
             "SLIMIT": "SLIMIT is not supported in a stream's query", "FILL": "FILL is not supported in a stream's query",
             "UNION": "UNION is not supported in a stream's query"}


def _clause_word(tokens: list[Token], i: int) -> str | None:
    tok = tokens[i]
    word = tok.text.upper()
    nxt = tokens[i + 1] if i + 1 < len(tokens) else None
    followed_by_paren = nxt is not None and nxt.token_type == TokenType.L_PAREN
    if word in ("FROM", "WHERE", "PARTITION BY", "GROUP BY", "ORDER BY", "HAVING", "LIMIT", "SLIMIT", "UNION"):
        return word
    if word in ("INTERVAL", "SLIDING", "SESSION", "STATE_WINDOW", "COUNT_WINDOW", "NOTIFY", "FILL") and followed_by_paren:
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
            if current == "WINDOW":
                word = None
            elif form == "new":
                raise cur.error_at(tok, f"a stream's query takes no window clause ({tok.text}): "
                                        "the trigger before INTO/AS defines the windows")
            else:
                word = "WINDOW"
        if word in _REJECTED:
            raise cur.error_at(tok, _REJECTED[word])
        if word is not None:
            if form == "new" and word in ("PARTITION BY", "NOTIFY"):
                raise cur.error_at(tok, f"{word} belongs before AS in the new form (after the trigger's FROM table)")
            if word in clauses:
                raise cur.error_at(tok, f"{word} given twice")
            if _ORDER.index(word) < _ORDER.index(current):
                raise cur.error_at(tok, f"{word} must come before {current}")
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
        raise scope.cur.error_at(toks[3], f"FROM {scope.marks[first.start].text} takes no alias or join, "
                                          f"found {toks[3].text!r}")
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
    cond = _only(frag, frag.parse("SELECT 1 WHERE "), "expressions", "where").args["where"].this
    if is_aggregate(cond):
        raise frag.error(cond, "aggregates are not allowed in WHERE")
    return to_spark(scope.resolve(cond, frag, "WHERE"))


def derived_name(text: str) -> str:
    """``count(*)`` → ``count``, ``avg(voltage)`` → ``avg_voltage``."""
    lowered = re.sub(r"\(\s*\*\s*\)", "", text).lower()
    return re.sub(r"[^a-z0-9_]+", "_", lowered).rstrip("_")


def select_items(scope: Scope, toks: list[Token], *, sink_columns: tuple[str, ...] | None,
                 columns_tok: Token | None) -> tuple[tuple[SelectItem, ...], KeyBound]:
    """The result columns and the bound the first one (the sink's time column) carries."""
    cur = scope.cur
    parts = split_top(toks)
    for part in parts:
        if not part:
            raise cur.error_at(toks[0], "empty item in SELECT")
    frag = scope.fragment(toks)
    nodes = _only(frag, frag.parse("SELECT "), "expressions").expressions
    if len(nodes) != len(parts):
        raise cur.error_at(toks[0], "cannot split the SELECT list into items")
    if sink_columns is not None and len(sink_columns) != len(nodes):
        raise cur.error_at(columns_tok, f"the column list names {len(sink_columns)} columns but SELECT has {len(nodes)}")
    key_bound = _first_column(scope, frag, nodes[0], parts[0])
    items, seen = [], {}
    for i, (node, part) in enumerate(zip(nodes, parts)):
        body = node.this if isinstance(node, exp.Alias) else node
        if isinstance(body, exp.Star) or body.find(exp.Star) is body:
            raise frag.error(node, "SELECT * is not supported in a stream: name the columns")
        if sink_columns is not None:
            name = sink_columns[i]
        elif isinstance(node, exp.Alias):
            name = node.alias
        elif isinstance(body, exp.Column) and not body.table and frag.offset_of(body) in scope.marks:
            name = None  # %%n / %%tbname: named after the column it stands for, below
        elif isinstance(body, exp.Column):
            name = body.name
        else:
            name = derived_name(cur.source.text[part[0].start : part[-1].end + 1])
        resolved = scope.resolve(body, frag, "SELECT")
        if name is None:
            name = resolved.name
        if not name:
            raise cur.error_at(part[0], "this select item needs a name: add AS name")
        if (prev := seen.get(name.lower())) is not None:
            at = columns_tok if sink_columns is not None else part[0]
            raise cur.error_at(at, f"two result columns are named {name!r} (items {prev} and {i + 1}): "
                                   "give one an alias with AS name")
        seen[name.lower()] = i + 1
        items.append(SelectItem(expression=to_spark(resolved), name=name, is_aggregate=is_aggregate(resolved)))
    return tuple(items), key_bound


def _first_column(scope: Scope, frag: Fragment, node: exp.Expression, part: list[Token]) -> KeyBound:
    body = node.this if isinstance(node, exp.Alias) else node
    keys = dict(_KEYS[scope.family])
    if scope.family in ("window", "old") and not scope.interval_window:
        keys = {k: v for k, v in keys.items() if v == "start"}
    if isinstance(body, exp.Column) and not body.table and body.name.lower() in PLACEHOLDERS:
        scope.check_placeholder(body.name, frag.offset_of(body), "SELECT")  # the wrong trigger's: say so
    if isinstance(body, exp.Column) and not body.table and body.name.lower() in keys:
        return keys[body.name.lower()]
    want = _KEY_WORDS[scope.family]
    if scope.family in ("window", "old"):
        end = "_twend" if scope.family == "window" else "_wend"
        want += f" or, for INTERVAL windows, the window end ({end})"
    text = scope.cur.source.text[part[0].start : part[-1].end + 1]
    raise scope.cur.error_at(part[0], f"the first column of a stream's result is the sink's time column: it must be "
                                      f"{want}, found {text!r}")
