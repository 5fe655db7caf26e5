"""``FROM %%trows alias [INNER | LEFT [OUTER]] JOIN table [AS] alias ON cond ...`` in a new-form query.

Per trigger window the window's rows are joined with the tables, as TDengine evaluates the query per
window; every column names its side (``alias.col``), each side's columns become ``join_column(n, col)``
so the sides never clash. ASOF and WINDOW joins (nearest-row matching, JLIMIT, WINDOW_OFFSET), RIGHT,
FULL and CROSS joins are refused at load with the reason."""

from __future__ import annotations

from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from cq_engine.model import Join
from cq_engine.parse.fragments import is_aggregate, to_spark
from cq_engine.parse.tdengine.query import Scope, plain_select

_REFUSED = {
    "RIGHT": "a RIGHT join keeps the other table's rows that match no row of the window, which belong to no "
    "trigger window: join the other way round with LEFT JOIN",
    "FULL": "a FULL join keeps the other table's rows that match no row of the window, which belong to no "
    "trigger window: use LEFT JOIN",
    "CROSS": "a CROSS join pairs every row with every row: write JOIN ... ON the condition",
    "ASOF": "ASOF joins (each row with the nearest row of the other table, JLIMIT) are not supported: "
    "use JOIN ... ON an exact condition",
    "WINDOW": "WINDOW joins (each row with the other table's rows in WINDOW_OFFSET) are not supported: "
    "use JOIN ... ON m.ts - 1s <= o.ts AND o.ts <= m.ts + 1s",
    "SEMI": "SEMI joins are not supported: use JOIN ... ON and the columns of %%trows",
    "ANTI": "ANTI joins are not supported: use LEFT JOIN ... ON and WHERE o.col IS NULL",
}
_JOIN_WORDS = ("JOIN", "INNER", "LEFT", "OUTER", *_REFUSED)


def _is_alias(tok: Token | None) -> bool:
    return tok is not None and tok.token_type in (TokenType.VAR, TokenType.IDENTIFIER) and tok.text.upper() != "ON"


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


def parse_joins(scope: Scope, toks: list[Token]) -> tuple[dict[str, int], list[tuple[Token, str, list[Token]]]]:
    """The join's sides by alias (0: the trigger rows) and each joined table's (name token, kind, ON
    tokens); the ON conditions are resolved once every side is known (``join_conditions``)."""
    cur = scope.cur
    mark = scope.marks[toks[0].start]
    if mark.name.lower() != "trows":
        raise cur.error_at(toks[0], "a join reads FROM %%trows alias JOIN table alias ON ...")
    i = 3 + (toks[3].text.upper() == "AS")
    sides: dict[str, int] = {toks[i].text.lower(): 0}
    joined: list[tuple[Token, str, list[Token]]] = []
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
        kind = "left" if any(w.text.upper() == "LEFT" for w in words) else "inner"
        if words and [w.text.upper() for w in words] not in (["INNER"], ["LEFT"], ["LEFT", "OUTER"]):
            raise cur.error_at(words[0], "expected JOIN, INNER JOIN or LEFT [OUTER] JOIN")
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
        if i >= len(toks) or toks[i].text.upper() != "ON":
            raise cur.error_at(toks[i] if i < len(toks) else table, f"JOIN {table.text} needs ON condition")
        on_tok, i = toks[i], i + 1
        start, depth = i, 0
        while i < len(toks) and not (depth == 0 and _starts_join(toks[i])):
            depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(toks[i].token_type, 0)
            i += 1
        if start == i:
            raise cur.error_at(on_tok, "ON needs a condition")
        joined.append((table, kind, toks[start:i]))
    return sides, joined


def join_conditions(scope: Scope, joined: list[tuple[Token, str, list[Token]]]) -> tuple[Join, ...]:
    """The joins with their ON conditions in Spark SQL (``scope.join_sides`` set)."""
    out = []
    for table, kind, on in joined:
        frag = scope.fragment(on)
        cond = plain_select(frag, frag.parse("SELECT 1 WHERE "), "expressions", "where").args["where"].this
        if is_aggregate(cond):
            raise frag.error(cond, "aggregates are not allowed in ON")
        if cond.find(exp.Select) is not None:
            raise frag.error(cond, "subqueries are not supported in ON")
        out.append(
            Join(
                table=table.text,
                kind="left" if kind == "left" else "inner",
                on=to_spark(scope.resolve(cond, frag, "WHERE")),
            )
        )
    return tuple(out)
