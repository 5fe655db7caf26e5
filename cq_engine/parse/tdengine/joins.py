"""``FROM %%trows alias [INNER | LEFT [OUTER] | LEFT ASOF] JOIN table [AS] alias ON cond ...`` in a new-form query.

Per trigger window the window's rows are joined with the tables, as TDengine evaluates the query per
window; every column names its side (``alias.col``), each side's columns become ``join_column(n, col)``
so the sides never clash. A LEFT ASOF JOIN's ON is one time comparison and equalities (``Join.asof``),
JLIMIT 1. WINDOW joins (WINDOW_OFFSET), RIGHT, FULL and CROSS joins are refused at load with the reason."""

from __future__ import annotations

from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from cq_engine.model import Join, join_column
from cq_engine.parse.fragments import is_aggregate, to_spark
from cq_engine.parse.tdengine.query import Scope, plain_select

_REFUSED = {
    "RIGHT": "a RIGHT join keeps the other table's rows that match no row of the window, which belong to no "
    "trigger window: join the other way round with LEFT JOIN",
    "FULL": "a FULL join keeps the other table's rows that match no row of the window, which belong to no "
    "trigger window: use LEFT JOIN",
    "CROSS": "a CROSS join pairs every row with every row: write JOIN ... ON the condition",
    "WINDOW": "WINDOW joins (each row with the other table's rows in WINDOW_OFFSET) are not supported: "
    "use JOIN ... ON m.ts - 1s <= o.ts AND o.ts <= m.ts + 1s",
    "SEMI": "SEMI joins are not supported: use JOIN ... ON and the columns of %%trows",
    "ANTI": "ANTI joins are not supported: use LEFT JOIN ... ON and WHERE o.col IS NULL",
}
_JOIN_WORDS = ("JOIN", "INNER", "LEFT", "OUTER", "ASOF", *_REFUSED)
_ASOF_OPERATORS: dict[type, str] = {exp.GTE: ">=", exp.GT: ">", exp.LTE: "<=", exp.LT: "<", exp.EQ: "="}
_FLIPPED = {">=": "<=", ">": "<", "<=": ">=", "<": ">", "=": "="}


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
        said = [w.text.upper() for w in words]
        if said == ["LEFT", "ASOF"]:
            kind = "asof"
        elif "ASOF" in said:
            raise cur.error_at(words[0], "an ASOF join keeps every trigger row: write LEFT ASOF JOIN")
        elif words and said not in (["INNER"], ["LEFT"], ["LEFT", "OUTER"]):
            raise cur.error_at(words[0], "expected JOIN, INNER JOIN, LEFT [OUTER] JOIN or LEFT ASOF JOIN")
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
        if kind == "asof" and (i >= len(toks) or _starts_join(toks[i])):  # no ON: the time columns, >=
            joined.append((table, kind, []))
            continue
        if i >= len(toks) or toks[i].text.upper() != "ON":
            raise cur.error_at(toks[i] if i < len(toks) else table, f"JOIN {table.text} needs ON condition")
        on_tok, i = toks[i], i + 1
        start, depth = i, 0
        while i < len(toks) and not (depth == 0 and _starts_join(toks[i])):
            depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(toks[i].token_type, 0)
            i += 1
        if start == i:
            raise cur.error_at(on_tok, "ON needs a condition")
        on = toks[start:i]
        limit = next((k for k, t in enumerate(on) if t.text.upper() == "JLIMIT"), None)
        if limit is not None:
            if kind != "asof" or len(on) != limit + 2 or on[limit + 1].text != "1":
                raise cur.error_at(
                    on[limit], "JLIMIT other than 1 is not supported: Spark's as-of join matches the one nearest row"
                )
            on = on[:limit]
        joined.append((table, kind, on))
    return sides, joined


def join_conditions(scope: Scope, joined: list[tuple[Token, str, list[Token]]]) -> tuple[Join, ...]:
    """The joins with their ON conditions in Spark SQL (``scope.join_sides`` set)."""
    out = []
    for n, (table, kind, on) in enumerate(joined, 1):
        if kind == "asof":
            out.append(_asof(scope, table, on, n))
            continue
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


def _asof(scope: Scope, table: Token, on: list[Token], n: int) -> Join:
    """LEFT ASOF JOIN ... [ON time comparison [AND equalities]]: each trigger row with the one nearest row
    of the table the comparison allows (TDengine's JLIMIT 1), NULLs where none."""
    if not on:
        return Join(table=table.text, kind="asof", on="TRUE")
    frag = scope.fragment(on)
    cond = plain_select(frag, frag.parse("SELECT 1 WHERE "), "expressions", "where").args["where"].this
    resolved = scope.resolve(cond, frag, "WHERE").unnest()
    terms = list(resolved.flatten()) if isinstance(resolved, exp.And) else [resolved]
    mine, theirs = join_column(0, ""), join_column(n, "")
    asof, rest = None, []
    for term in terms:
        cols = [term.this, term.expression] if type(term) in _ASOF_OPERATORS else []
        names = sorted((c.name for c in cols if isinstance(c, exp.Column)), key=lambda c: not c.startswith(mine))
        if len(names) != 2 or not (names[0].startswith(mine) and names[1].startswith(theirs)):
            raise frag.error(
                cond,
                "an ASOF join's ON compares a column of each table: one time comparison (>=, >, <=, <), then equalities",
            )
        op = _ASOF_OPERATORS[type(term)]
        if op == "=":
            rest.append(to_spark(term))
            continue
        if asof is not None:
            raise frag.error(cond, "an ASOF join's ON holds one time comparison (>=, >, <=, <)")
        first = cols[0].name if isinstance(cols[0], exp.Column) else ""
        asof = (names[0], names[1], op if first == names[0] else _FLIPPED[op])
    return Join(table=table.text, kind="asof", on=" AND ".join(rest) or "TRUE", asof=asof)
