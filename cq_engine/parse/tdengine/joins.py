"""``FROM %%trows alias [INNER | LEFT [OUTER] | LEFT ASOF | LEFT WINDOW] JOIN table [AS] alias ...`` in a
new-form query.

Per trigger window the window's rows are joined with the tables, as TDengine evaluates the query per
window; every column names its side (``alias.col``), each side's columns become ``join_column(n, col)``
so the sides never clash. A LEFT ASOF JOIN's ON is one time comparison and equalities (``Join.asof``,
``Join.keys``), JLIMIT up to 1024; a LEFT WINDOW JOIN's ON holds equalities, WINDOW_OFFSET(a, b) its
time bounds. RIGHT, FULL, CROSS, SEMI and ANTI joins are refused at load with the reason."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta

from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from cq_engine.durations import TDENGINE_UNITS
from cq_engine.model import Join, JoinKind, join_column
from cq_engine.parse.cursor import split_top
from cq_engine.parse.fragments import is_aggregate, to_spark
from cq_engine.parse.tdengine.query import Scope, plain_select

_REFUSED = {
    "RIGHT": "a RIGHT join keeps the other table's rows that match no row of the window, which belong to no "
    "trigger window: join the other way round with LEFT JOIN",
    "FULL": "a FULL join keeps the other table's rows that match no row of the window, which belong to no "
    "trigger window: use LEFT JOIN",
    "CROSS": "a CROSS join pairs every row with every row: write JOIN ... ON the condition",
    "SEMI": "SEMI joins are not supported: use JOIN ... ON and the columns of %%trows",
    "ANTI": "ANTI joins are not supported: use LEFT JOIN ... ON and WHERE o.col IS NULL",
}
_JOIN_WORDS = ("JOIN", "INNER", "LEFT", "OUTER", "ASOF", "WINDOW", *_REFUSED)
_ASOF_OPERATORS: dict[type, str] = {exp.GTE: ">=", exp.GT: ">", exp.LTE: "<=", exp.LT: "<", exp.EQ: "="}
_FLIPPED = {">=": "<=", ">": "<", "<=": ">=", "<": ">", "=": "="}


def _is_alias(tok: Token | None) -> bool:
    return (
        tok is not None
        and tok.token_type in (TokenType.VAR, TokenType.IDENTIFIER)
        and tok.text.upper() not in ("ON", "WINDOW_OFFSET", "JLIMIT")
    )


def _starts_join(tok: Token) -> bool:
    return tok.text.upper() in _JOIN_WORDS


def has_join(scope: Scope, toks: list[Token]) -> bool:
    """``FROM %%trows alias JOIN ...`` (an alias, then a join word)."""
    if not toks or toks[0].start not in scope.marks or len(toks) < 4:
        return False
    rest = toks[3:]
    if rest[0].text.upper() == "AS":
        rest = rest[1:]
    return len(rest) > 1 and _is_alias(rest[0]) and _starts_join(rest[1])


@dataclass(frozen=True)
class Joined:
    """A joined table as written: its name token, kind, ON tokens, WINDOW_OFFSET and JLIMIT."""

    table: Token
    kind: JoinKind
    on: list[Token]
    word: Token  # the join's first word, where errors about the join point
    offsets: tuple[timedelta, timedelta] | None = None
    limit: int | None = None


def parse_joins(scope: Scope, toks: list[Token]) -> tuple[dict[str, int], list[Joined]]:
    """The join's sides by alias (0: the trigger rows) and each joined table as written; the ON
    conditions are resolved once every side is known (``join_conditions``)."""
    cur = scope.cur
    mark = scope.marks[toks[0].start]
    if mark.name.lower() != "trows":
        raise cur.error_at(toks[0], "a join reads FROM %%trows alias JOIN table alias ON ...")
    i = 3 + (toks[3].text.upper() == "AS")
    sides: dict[str, int] = {toks[i].text.lower(): 0}
    joined: list[Joined] = []
    i += 1
    while i < len(toks):
        words = []
        while i < len(toks) and toks[i].text.upper() in _JOIN_WORDS and toks[i].text.upper() != "JOIN":
            words.append(toks[i])
            i += 1
        for w in words:
            if w.text.upper() in _REFUSED:
                raise cur.error_at(w, _REFUSED[w.text.upper()])
        if i >= len(toks) or toks[i].text.upper() != "JOIN":
            raise cur.error_at(toks[i] if i < len(toks) else None, "expected JOIN, INNER JOIN or LEFT [OUTER] JOIN")
        word = words[0] if words else toks[i]
        kind = _kind(cur, words)
        i += 1
        sub = cur.sub(toks[i:], toks[-1].end + 1)
        table = sub.table_name("a table name after JOIN")
        i += sub.pos
        alias = table
        if i < len(toks) and toks[i].text.upper() == "AS":
            i += 1
        if i < len(toks) and _is_alias(toks[i]):
            alias = toks[i]
            i += 1
        if alias.text.lower() in sides:
            raise cur.error_at(alias, f"{alias.text!r} names two sides of the join: give each its own alias")
        sides[alias.text.lower()] = len(joined) + 1
        start, depth = i, 0
        while i < len(toks) and not (depth == 0 and _starts_join(toks[i])):
            depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(toks[i].token_type, 0)
            i += 1
        rest, limit = _limit(cur, kind, toks[start:i])
        offsets = None
        if kind == "window":
            rest, offsets = _window_offset(cur, rest, table)
        if rest and rest[0].text.upper() != "ON":
            raise cur.error_at(rest[0], f"expected ON after JOIN {table.text}{_suffix(kind)}")
        if not rest and kind in ("inner", "left"):
            raise cur.error_at(toks[i] if i < len(toks) else table, f"JOIN {table.text} needs ON condition")
        if rest and len(rest) == 1:
            raise cur.error_at(rest[0], "ON needs a condition")
        joined.append(Joined(table, kind, rest[1:], word, offsets, limit))
    windowed = next((j for j in joined if j.kind == "window"), None)
    if windowed is not None and len(joined) > 1:
        raise cur.error_at(windowed.word, "a WINDOW join must be the query's only join, as in TDengine")
    return sides, joined


def _kind(cur, words: list[Token]) -> JoinKind:
    said = [w.text.upper() for w in words]
    if said == ["LEFT", "ASOF"]:
        return "asof"
    if said == ["LEFT", "WINDOW"]:
        return "window"
    for special in ("ASOF", "WINDOW"):
        if special in said:
            raise cur.error_at(words[0], f"an {special} join keeps every trigger row: write LEFT {special} JOIN")
    if words and said not in (["INNER"], ["LEFT"], ["LEFT", "OUTER"]):
        raise cur.error_at(words[0], "expected JOIN, INNER JOIN, LEFT [OUTER] JOIN, LEFT ASOF JOIN or LEFT WINDOW JOIN")
    return "left" if "LEFT" in said else "inner"


def _suffix(kind: str) -> str:
    return {"asof": " (or JLIMIT n)", "window": " or WINDOW_OFFSET(start, end)"}.get(kind, "")


def _limit(cur, kind: str, rest: list[Token]) -> tuple[list[Token], int | None]:
    """``JLIMIT n`` at the end of an ASOF or WINDOW join (TDengine's range 0 to 1024; ASOF's default 1)."""
    at = next((k for k, t in enumerate(rest) if t.text.upper() == "JLIMIT"), None)
    if at is None:
        return rest, (1 if kind == "asof" else None)
    if kind not in ("asof", "window"):
        raise cur.error_at(rest[at], "JLIMIT belongs to LEFT ASOF and LEFT WINDOW joins")
    value = rest[at + 1] if at + 1 < len(rest) else None
    if value is None or len(rest) != at + 2 or not value.text.isdigit() or int(value.text) > 1024:
        raise cur.error_at(value or rest[at], "JLIMIT takes an integer from 0 to 1024 and ends the join")
    return rest[:at], int(value.text)


def _window_offset(cur, rest: list[Token], table: Token) -> tuple[list[Token], tuple[timedelta, timedelta]]:
    """``WINDOW_OFFSET(start, end)`` ending a WINDOW join: each trigger row's window [ts + start, ts + end]."""
    at = next((k for k, t in enumerate(rest) if t.text.upper() == "WINDOW_OFFSET"), None)
    if at is None:
        raise cur.error_at(table, f"a WINDOW join needs WINDOW_OFFSET(start, end) after JOIN {table.text}")
    group = rest[at + 1 :]
    if len(group) < 2 or group[0].token_type != TokenType.L_PAREN or group[-1].token_type != TokenType.R_PAREN:
        raise cur.error_at(rest[at], "expected WINDOW_OFFSET(start, end), e.g. WINDOW_OFFSET(-1s, 1s)")
    parts = split_top(group[1:-1])
    if len(parts) != 2 or not all(parts):
        raise cur.error_at(rest[at], "WINDOW_OFFSET takes two offsets: WINDOW_OFFSET(start, end)")
    start, end = (_offset(cur, p, group[-1]) for p in parts)
    if start > end:
        raise cur.error_at(parts[0][0], "WINDOW_OFFSET's start must not be after its end")
    return rest[:at], (start, end)


def _offset(cur, part: list[Token], close: Token) -> timedelta:
    sign = {TokenType.DASH: -1, TokenType.PLUS: 1}.get(part[0].token_type)
    sub = cur.sub(part[1:] if sign else part, close.start)
    value, _ = sub.duration("WINDOW_OFFSET's offset", units=TDENGINE_UNITS, positive=False)
    if not sub.at_end():
        raise sub.unexpected("expected one duration such as -1s or 500a")
    return value * (sign or 1)


def join_conditions(scope: Scope, joined: list[Joined]) -> tuple[Join, ...]:
    """The joins with their ON conditions in Spark SQL (``scope.join_sides`` set)."""
    out = []
    for n, j in enumerate(joined, 1):
        if j.kind in ("asof", "window"):
            out.append(_grouped(scope, j, n))
            continue
        frag = scope.fragment(j.on)
        cond = plain_select(frag, frag.parse("SELECT 1 WHERE "), "expressions", "where").args["where"].this
        if is_aggregate(cond):
            raise frag.error(cond, "aggregates are not allowed in ON")
        if cond.find(exp.Select) is not None:
            raise frag.error(cond, "subqueries are not supported in ON")
        out.append(Join(table=j.table.text, kind=j.kind, on=to_spark(scope.resolve(cond, frag, "WHERE"))))
    return tuple(out)


def _grouped(scope: Scope, j: Joined, n: int) -> Join:
    """LEFT ASOF JOIN ... [ON time comparison [AND equalities]] [JLIMIT n]: each trigger row with the
    nearest rows of the table the comparison allows, NULLs where none. LEFT WINDOW JOIN ... [ON
    equalities] WINDOW_OFFSET(a, b) [JLIMIT n]: each trigger row with the table's rows in [ts + a, ts + b].
    The equalities group the rows joined (TDengine's grouping conditions)."""
    base = Join(table=j.table.text, kind=j.kind, on="TRUE", limit=j.limit, offsets=j.offsets)
    if not j.on:
        return base
    frag = scope.fragment(j.on)
    cond = plain_select(frag, frag.parse("SELECT 1 WHERE "), "expressions", "where").args["where"].this
    resolved = scope.resolve(cond, frag, "WHERE").unnest()
    terms = list(resolved.flatten()) if isinstance(resolved, exp.And) else [resolved]
    mine, theirs = join_column(0, ""), join_column(n, "")
    asof, keys, rest = None, [], []
    allowed = "one time comparison (>=, >, <=, <), then equalities" if j.kind == "asof" else "equalities"
    for term in terms:
        cols = [term.this, term.expression] if type(term) in _ASOF_OPERATORS else []
        names = sorted((c.name for c in cols if isinstance(c, exp.Column)), key=lambda c: not c.startswith(mine))
        if len(names) != 2 or not (names[0].startswith(mine) and names[1].startswith(theirs)):
            raise frag.error(cond, f"an {j.kind.upper()} join's ON compares a column of each table: {allowed}")
        op = _ASOF_OPERATORS[type(term)]
        if op == "=":
            keys.append((names[0], names[1]))
            rest.append(to_spark(term))
            continue
        if j.kind == "window":
            raise frag.error(cond, "a WINDOW join's ON holds equalities only: WINDOW_OFFSET bounds the time")
        if asof is not None:
            raise frag.error(cond, "an ASOF join's ON holds one time comparison (>=, >, <=, <)")
        first = cols[0].name if isinstance(cols[0], exp.Column) else ""
        asof = (names[0], names[1], op if first == names[0] else _FLIPPED[op])
    return replace(base, on=" AND ".join(rest) or "TRUE", asof=asof, keys=tuple(keys))


_WINDOW_JOIN_REFUSED = {
    "GROUP BY": "each trigger row is its own group",
    "PARTITION BY": "each trigger row is its own group",
    "WINDOW": "each trigger row has its own window",
    "SLIMIT": "each trigger row is its own group",
}


def check_window_join(cur, clauses: dict, q: dict) -> None:
    """TDengine's rules for a WINDOW join's query: no GROUP BY, PARTITION BY, window clause or SLIMIT
    (aggregates group each trigger row's matches), HAVING over aggregates only, no multi-row function."""
    for clause, why in _WINDOW_JOIN_REFUSED.items():
        if clause in clauses:
            tok = clauses[clause][0]
            raise cur.error_at(tok, f"a WINDOW join's query takes no {tok.text.upper()}: {why}")
    if "HAVING" in clauses and not any(i.is_aggregate for i in q["select"]):
        raise cur.error_at(clauses["HAVING"][0], "HAVING in a WINDOW join's query filters its aggregates: select one")
    if q.get("series") or q.get("interp") is not None:
        raise cur.error_at(
            clauses["SELECT"][0], "multi-row functions and INTERP are not supported over a WINDOW join's rows"
        )
