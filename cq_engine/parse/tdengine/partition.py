"""``PARTITION BY`` of ``CREATE STREAM`` and the old form's TAGS, whose values are the partition's.

New form: ``PARTITION BY col[, ...]`` names tbname and tag columns (the catalog checks which).
Old form (seed 000's second half, seed 002): items may be expressions with an alias, with or
without ``AS`` (``PARTITION BY tbname tname``, ``concat("tag-", tbname) AS cc``); the engine computes
them before windowing, so the rest of the statement can use the aliases as columns."""

from __future__ import annotations

from dataclasses import replace

from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from cq_engine.model import PLACEHOLDERS, TagDecl
from cq_engine.parse.cursor import Cursor, split_top
from cq_engine.parse.fragments import is_aggregate, to_spark
from cq_engine.parse.tdengine.query import Scope, plain_select


def partition_names(cur: Cursor, keyword: Token, toks: list[Token]) -> tuple[str, ...]:
    """The new form's ``PARTITION BY col[, ...]``: column names only."""
    names: list[str] = []
    for part in split_top(toks):
        tok = part[0] if part else keyword
        if (
            len(part) != 1
            or tok.token_type in (TokenType.STRING, TokenType.NUMBER)
            or not tok.text.replace("_", "a").isalnum()
        ):
            text = cur.source.text[part[0].start : part[-1].end + 1] if part else ""
            raise cur.error_at(tok, f"PARTITION BY takes column names (no expressions or aliases), found {text!r}")
        if tok.text.lower() in PLACEHOLDERS:
            raise cur.error_at(tok, f"{tok.text} is a placeholder, not a column: PARTITION BY takes column names")
        _unique(cur, tok, tok.text, names)
        names.append(tok.text)
    return tuple(names)


def old_partition(
    scope: Scope, keyword: Token, toks: list[Token]
) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The old form's ``PARTITION BY item[, ...]``: the groups' names, and (alias, Spark SQL) for each
    item that is aliased or an expression."""
    cur = scope.cur
    names: list[str] = []
    exprs: list[tuple[str, str]] = []
    for part in split_top(toks):
        if not part:
            raise cur.error_at(keyword, "empty item in PARTITION BY")
        frag = scope.fragment(part)
        nodes = plain_select(frag, frag.parse("SELECT "), "expressions").expressions
        text = cur.source.text[part[0].start : part[-1].end + 1]
        if len(nodes) != 1:
            raise frag.error(nodes[-1], f"expected one PARTITION BY item (expr [AS name]), found {text!r}")
        node = nodes[0]
        body = node.this if isinstance(node, exp.Alias) else node
        if is_aggregate(body):
            raise cur.error_at(part[0], "aggregates are not allowed in PARTITION BY")
        resolved = scope.resolve(body, frag, "PARTITION BY")
        if isinstance(node, exp.Alias):
            name = node.alias
            exprs.append((name, to_spark(resolved)))
        elif isinstance(resolved, exp.Column) and not resolved.table:
            name = resolved.name
        else:
            raise cur.error_at(part[0], f"give the PARTITION BY expression a name: {text} AS name")
        _unique(cur, part[0], name, names)
        names.append(name)
    return tuple(names), tuple(exprs)


def _unique(cur: Cursor, tok: Token, name: str, names: list[str]) -> None:
    if name.lower() in (n.lower() for n in names):
        raise cur.error_at(tok, f"PARTITION BY names {name!r} twice")


def old_tags(cur: Cursor, tags: tuple[TagDecl, ...], keyword: Token, names: tuple[str, ...]) -> tuple[TagDecl, ...]:
    """The old form's ``TAGS (name type, ...)`` take the values of PARTITION BY's items: by name when
    every tag is named after one (seed 000's ``TAGS(cc ...) ... PARTITION BY ... AS cc``), else by
    position (seed 002: "不指定则按位置顺序对应")."""
    if not names:
        raise cur.error_at(
            keyword,
            "the old form's TAGS take their values from PARTITION BY, and the query has none: "
            "add PARTITION BY to the query",
        )
    by_name = {n.lower(): n for n in names}
    if all(t.name.lower() in by_name for t in tags):
        return tuple(replace(t, expression=by_name[t.name.lower()]) for t in tags)
    if len(tags) == len(names):
        return tuple(replace(t, expression=n) for t, n in zip(tags, names))
    raise cur.error_at(
        keyword,
        f"TAGS names {len(tags)} tag(s) but PARTITION BY has {len(names)} item(s) "
        f"({', '.join(names)}): name the tags after the PARTITION BY items or aliases, "
        "or give one tag per item",
    )
