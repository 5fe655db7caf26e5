"""A new-form stream's query made of queries: ``FROM (SELECT ...) [AS alias]`` and ``UNION ALL``.

Each query of such a statement is a ``Stream`` of the same trigger (``Stream.subquery``,
``Stream.union``); here are the token-level pieces: the branches of a ``UNION ALL``, the subquery of a
FROM, and the rule that the outer query names only its subquery's result columns (as in TDengine)."""

from __future__ import annotations

from dataclasses import fields, replace

import sqlglot
from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from cq_engine.model import Stream
from cq_engine.parse.cursor import Cursor
from cq_engine.parse.fragments import TIME_REF

_UNION_ALL = (
    "UNION removes duplicate rows, which a stream's windows cannot do across runs: write UNION ALL "
    "(each query's rows kept)"
)


def split_union(cur: Cursor, tokens: list[Token]) -> list[list[Token]]:
    """The queries of ``q1 UNION ALL q2 ...`` at the top level of ``tokens`` (one: no UNION); a query
    in parentheses is its own, with its ORDER BY / LIMIT."""
    parts: list[list[Token]] = [[]]
    depth, i = 0, 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.token_type in (TokenType.L_PAREN, TokenType.L_BRACKET):
            depth += 1
        elif tok.token_type in (TokenType.R_PAREN, TokenType.R_BRACKET):
            depth -= 1
        elif depth == 0 and tok.text.upper() == "UNION":
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            if nxt is None or nxt.text.upper() != "ALL":
                raise cur.error_at(tok, _UNION_ALL)
            if not parts[-1]:
                raise cur.error_at(tok, "UNION ALL needs a query before it")
            parts.append([])
            i += 2
            continue
        parts[-1].append(tok)
        i += 1
    if not parts[-1]:
        raise cur.error_at(tokens[-1] if tokens else None, "UNION ALL needs a query after it")
    if len(parts) == 1:
        return parts
    out = []
    for part in parts:
        inner = _parenthesized(part)
        if inner is None:
            _no_union_order(cur, part)
        out.append(inner if inner is not None else part)
    return out


def _parenthesized(toks: list[Token]) -> list[Token] | None:
    """``( query )``'s query, or None."""
    if toks[0].token_type != TokenType.L_PAREN or toks[-1].token_type != TokenType.R_PAREN:
        return None
    depth = 0
    for n, tok in enumerate(toks):
        depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(tok.token_type, 0)
        if depth == 0 and n < len(toks) - 1:
            return None  # (a) ... (b): not one group
    return toks[1:-1]


def _no_union_order(cur: Cursor, toks: list[Token]) -> None:
    """ORDER BY / LIMIT after the last query of a UNION ALL order the union's rows, not that query's."""
    depth = 0
    for tok in toks:
        depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(tok.token_type, 0)
        if depth == 0 and tok.text.upper() in ("ORDER BY", "LIMIT", "SLIMIT"):
            raise cur.error_at(
                tok,
                f"{tok.text.upper()} in a UNION ALL: to rank the union's rows write "
                "SELECT ... FROM (q1 UNION ALL q2) ORDER BY ... LIMIT n; to rank one query's, put it in parentheses",
            )


def subquery(cur: Cursor, toks: list[Token]) -> tuple[list[Token], str | None] | None:
    """``FROM ( query ) [[AS] alias]``: the query's tokens and the alias (None: FROM names a table)."""
    if not toks or toks[0].token_type != TokenType.L_PAREN:
        return None
    depth, j = 0, 0
    for j, tok in enumerate(toks):  # noqa: B007 (j: the closing parenthesis, after the loop)
        depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(tok.token_type, 0)
        if depth == 0:
            break
    inner, rest = toks[1:j], toks[j + 1 :]
    if not inner:
        raise cur.error_at(toks[0], "a subquery in FROM needs a query: FROM (SELECT ...)")
    if rest and rest[0].text.upper() == "AS":
        rest = rest[1:]
        if not rest:
            raise cur.error_at(toks[j], "AS after a subquery needs an alias")
    if len(rest) > 1 or (rest and rest[0].token_type not in (TokenType.VAR, TokenType.IDENTIFIER)):
        at = rest[1] if len(rest) > 1 else rest[0]
        raise cur.error_at(
            at, f"a subquery in FROM takes an alias at most (joins are not supported), found {at.text!r}"
        )
    return inner, (rest[0].text if rest else None)


def row_columns(sql: str) -> list[str]:
    """The columns Spark SQL names, engine columns (placeholders, ``%%n``, ``TIME_REF``) left out."""
    names = [c.name for c in sqlglot.parse_one(sql, read="spark").find_all(exp.Column)]
    return [n for n in dict.fromkeys(names) if n != TIME_REF and not n.lower().startswith("__cq")]


def outer_columns(q: dict) -> list[str]:
    """The columns an outer query names."""
    sqls = [i.expression for i in q["select"]] + [q.get("where"), q.get("having")]
    sqls += [k.expression for k in q.get("order_by", ())]
    return list(dict.fromkeys([n for sql in sqls if sql for n in row_columns(sql)] + list(q.get("group_by", ()))))


def check_outer(cur: Cursor, q: dict, inner: dict, toks: list[Token]) -> None:
    """The outer query names only its subquery's result columns, and reads rows' own times (FIRST,
    LAST, TWA...) only from a subquery that keeps its rows."""
    outputs = {i.name.lower() for i in inner["select"]}
    for name in outer_columns(q):
        if name.lower() not in outputs:
            at = next((t for t in toks if t.text.lower() == name.lower()), toks[0])
            raise cur.error_at(
                at,
                f"column {name!r} is not a result column of the subquery in FROM "
                f"(it gives {', '.join(i.name for i in inner['select'])})",
            )
    sqls = [i.expression for i in q["select"]] + [q.get("having") or ""]
    timed = any(TIME_REF in sql for sql in sqls) or q.get("sub_windows") is not None
    if timed and any(aggregates(b) for b in (inner, *inner.get("union", ()))):
        raise cur.error_at(
            toks[0],
            "a function of the rows' time order (FIRST, LAST, TWA, ..., INTERVAL) over a subquery needs "
            "the subquery's own rows, but it aggregates them",
        )


def check_qualified(cur: Cursor, q: dict, toks: list[Token]) -> None:
    """Every column of a join query names its side (``alias.col``): the sides share column names."""
    names = outer_columns(q) + [n for j in q["joins"] for n in row_columns(j.on)]
    for name in [n for n in names if not n.lower().startswith("__cq")]:
        at = next((t for t in toks if t.text.lower() == name.lower()), toks[0])
        raise cur.error_at(at, f"column {name!r} of a join query names its table: alias.{name}")


def aggregates(q: dict) -> bool:
    """The query gives one row per window (and group), not rows of its own (``plan.evaluate``)."""
    items = q["select"]
    return any(i.is_aggregate for i in items) or bool(q.get("group_by") and not q.get("partitions_query"))


# A query's own fields of a ``Stream``; the others (trigger, partition, sink...) are the statement's.
_QUERY_FIELDS = (
    "reads",
    "source",
    "where",
    "group_by",
    "partitions_query",
    "select",
    "key_bound",
    "interpolated",
    "having",
    "order_by",
    "limit",
    "offset",
    "slimit",
    "soffset",
    "joins",
    "sub_windows",
    "series",
    "interp",
)
_DEFAULTS = {f.name: f.default for f in fields(Stream) if f.name in _QUERY_FIELDS}


def with_layers(top: Stream, inner: dict | None, union: list[dict] | tuple = ()) -> Stream:
    """``top`` with its FROM subquery and UNION ALL branches as Streams of its trigger: a subquery
    writes nothing (no output shaping), no layer but the top notifies."""

    def layer(q: dict, *, shaped: bool) -> Stream:
        own = {k: v for k, v in q.items() if k in _QUERY_FIELDS}
        base = replace(top, **{**_DEFAULTS, **own}, notify=None, subquery=None, union=())
        if not shaped:
            base = replace(base, output_subtable=None, tags=(), sink_columns=None)
        return with_layers(base, q.get("subquery"), q.get("union", ()))

    sub = layer(inner, shaped=False) if inner is not None else None
    return replace(top, subquery=sub, union=tuple(layer(q, shaped=True) for q in union))
