"""The new form's query clauses after WHERE: PARTITION BY / GROUP BY, HAVING, ORDER BY, SLIMIT, LIMIT.

Each is evaluated per trigger window (and trigger partition group), as TDengine evaluates the query
once per window: GROUP BY and PARTITION BY split the window's rows into several result rows, LIMIT
keeps the first rows of each window by ORDER BY (of each query partition under PARTITION BY), SLIMIT
the first groups of each window.
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from cq_engine.model import OrderKey, SelectItem
from cq_engine.parse.fragments import is_aggregate, to_spark, under_aggregate
from cq_engine.parse.tdengine.query import Scope, plain_select


def group_clause(scope: Scope, word: str, toks: list[Token]) -> tuple[str, ...]:
    """``GROUP BY`` / ``PARTITION BY`` column names (tbname, tags or any column of the rows read)."""
    frag = scope.fragment(toks)
    parsed = plain_select(frag, frag.parse("SELECT 1 GROUP BY "), "expressions", "group")
    names: list[str] = []
    for node in parsed.args["group"].expressions:
        if not isinstance(node, exp.Column) or frag.offset_of(node) in scope.marks:
            raise frag.error(node, f"{word} in a stream's query takes column names")
        if node.table and scope.join_sides:
            node = scope.resolve(node, frag, word)  # a join's side: alias.col
        if not isinstance(node, exp.Column) or node.table:
            raise frag.error(node, f"{word} in a stream's query takes column names")
        if node.name.lower() in (n.lower() for n in names):
            raise frag.error(node, f"{node.name!r} is named twice in {word}")
        names.append(node.name)
    return tuple(names)


def _with_aliases(node: exp.Expression, items: tuple[SelectItem, ...]) -> exp.Expression:
    """A result column's name (``AS a``) in HAVING / ORDER BY stands for its expression, as in TDengine."""
    by_name = {i.name.lower(): i.expression for i in items}

    def swap(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Column) and not n.table and n.name.lower() in by_name:
            return exp.maybe_parse(by_name[n.name.lower()], dialect="spark")
        return n

    return node.transform(swap)


def having_clause(scope: Scope, toks: list[Token], items: tuple[SelectItem, ...], grouped: tuple[str, ...]) -> str:
    """``HAVING cond``: over each (window, group)'s aggregates; it needs an aggregated or grouped query."""
    frag = scope.fragment(toks)
    cond = plain_select(frag, frag.parse("SELECT 1 HAVING "), "expressions", "having").args["having"].this
    aggregated = any(i.is_aggregate for i in items) or is_aggregate(cond)
    if not aggregated and not grouped:
        raise frag.error(cond, "HAVING needs an aggregated query or GROUP BY: it filters each group's row")
    resolved = scope.resolve(cond, frag, "HAVING")
    _check_grouped(frag, cond, resolved, items, grouped, "HAVING")
    return to_spark(_with_aliases(resolved, items))


def _check_grouped(frag, at: exp.Expression, node: exp.Expression, items, grouped, clause: str) -> None:
    """In an aggregated query a column outside aggregates is a group's (or a result alias)."""
    names = {i.name.lower() for i in items}
    for col in node.find_all(exp.Column):
        name = col.name.lower()
        if name.startswith("__cq") or under_aggregate(col) or name in names:
            continue
        if name not in {g.lower() for g in grouped}:
            raise frag.error(
                at, f"column {col.name!r} in {clause} is not inside an aggregate nor a GROUP BY / PARTITION BY column"
            )


def order_clause(
    scope: Scope, toks: list[Token], items: tuple[SelectItem, ...], grouped: tuple[str, ...]
) -> tuple[OrderKey, ...]:
    """``ORDER BY expr|alias|position [ASC|DESC] [NULLS FIRST|LAST], ...`` (TDengine's default: NULLs
    first ascending, last descending)."""
    frag = scope.fragment(toks)
    parsed = plain_select(frag, frag.parse("SELECT 1 ORDER BY "), "expressions", "order")
    keys = []
    for ordered in parsed.args["order"].expressions:
        node = ordered.this
        descending = bool(ordered.args.get("desc"))
        nulls_first = bool(ordered.args.get("nulls_first"))  # sqlglot's default ordering is TDengine's
        if isinstance(node, exp.Literal) and not node.is_string:
            position = int(node.name) if node.name.isdigit() else 0
            if not 1 <= position <= len(items):
                raise frag.error(node, f"ORDER BY {node.name}: the query has {len(items)} result column(s)")
            sql = items[position - 1].expression
        else:
            resolved = scope.resolve(node, frag, "ORDER BY")
            if any(i.is_aggregate for i in items) or scope.groups_rows:
                _check_grouped(frag, node, resolved, items, grouped, "ORDER BY")
            sql = to_spark(_with_aliases(resolved, items))
        keys.append(OrderKey(sql, descending, nulls_first))
    return tuple(keys)


def limit_clause(scope: Scope, word: str, toks: list[Token]) -> tuple[int, int]:
    """``LIMIT n [OFFSET m]`` / ``SLIMIT n [SOFFSET m]`` → (n, m)."""
    cur = scope.cur
    skip = "OFFSET" if word == "LIMIT" else "SOFFSET"
    shape = [t.token_type == TokenType.NUMBER or (i == 1 and t.text.upper() == skip) for i, t in enumerate(toks)]
    if len(toks) not in (1, 3) or not all(shape):
        raise cur.error_at(toks[0], f"{word} takes a row count and optionally {skip} m: {word} n [{skip} m]")
    numbers = toks[::2]
    for t in numbers:
        if not t.text.isdigit():
            raise cur.error_at(t, f"{word} takes whole numbers, found {t.text!r}")
    return int(numbers[0].text), int(numbers[1].text) if len(numbers) > 1 else 0
