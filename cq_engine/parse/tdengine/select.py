"""The result columns of a ``CREATE STREAM`` query: their names, Spark SQL and the sink's time column."""

from __future__ import annotations

import re

import sqlglot
from sqlglot import exp
from sqlglot.tokens import Token

from cq_engine.model import PLACEHOLDERS, KeyBound, SelectItem, StateTrigger, joined_column
from cq_engine.parse.cursor import split_top
from cq_engine.parse.fragments import Fragment, is_aggregate, to_spark, under_aggregate
from cq_engine.parse.tdengine.query import Scope, plain_select
from cq_engine.parse.tdengine.series import SELECTIONS

# The first result column: the sink's time column, per family → {placeholder: key bound}.
_KEYS: dict[str, dict[str, KeyBound]] = {
    "window": {"_twstart": "start", "_twend": "end"},
    "old": {"_wstart": "start", "_wend": "end"},
    "sliding": {"_tprev_ts": "start", "_tcurrent_ts": "end"},
    "period": {"_tlocaltime": "tick"},
}
_KEY_WORDS = {
    "window": "the window start (_twstart)",
    "old": "the window start (_wstart)",
    "sliding": "the previous trigger time (_tprev_ts) or this trigger's time (_tcurrent_ts)",
    "period": "the trigger time (_tlocaltime)",
}


def derived_name(text: str) -> str:
    """``count(*)`` → ``count``, ``avg(voltage)`` → ``avg_voltage``."""
    lowered = re.sub(r"\(\s*\*\s*\)", "", text).lower()
    return re.sub(r"[^a-z0-9_]+", "_", lowered).rstrip("_")


def select_items(
    scope: Scope,
    toks: list[Token],
    *,
    sink_columns: tuple[str, ...] | None,
    columns_tok: Token | None,
    sink_time: bool = True,
) -> tuple[tuple[SelectItem, ...], KeyBound]:
    """The result columns and the bound the first one (the sink's time column) carries; a subquery's
    (``sink_time=False``) first column is a column like the others."""
    cur = scope.cur
    parts = split_top(toks)
    for part in parts:
        if not part:
            raise cur.error_at(toks[0], "empty item in SELECT")
    frag = scope.fragment(toks)
    nodes = plain_select(frag, frag.parse("SELECT "), "expressions").expressions
    if len(nodes) != len(parts):
        raise cur.error_at(toks[0], "cannot split the SELECT list into items")
    if sink_columns is not None and len(sink_columns) != len(nodes):
        raise cur.error_at(
            columns_tok, f"the column list names {len(sink_columns)} columns but SELECT has {len(nodes)}"
        )
    key_bound = _first_column(scope, frag, nodes[0], parts[0]) if sink_time else "start"
    items: list[SelectItem] = []
    nodes_resolved: list[exp.Expression] = []
    seen: dict[str, int] = {}
    for i, (node, part) in enumerate(zip(nodes, parts)):
        body = node.this if isinstance(node, exp.Alias) else node
        if isinstance(body, exp.Star) or body.find(exp.Star) is body:
            raise frag.error(node, "SELECT * is not supported in a stream: name the columns")
        if sink_columns is not None:
            name = sink_columns[i]
        elif isinstance(node, exp.Alias):
            name = node.alias
        elif isinstance(body, exp.Column) and not body.table and (mark := scope.marks.get(frag.offset_of(body))):
            name = None  # %%n / %%tbname: named after the column it stands for, once resolve() checked it
        elif isinstance(body, exp.Column) and not body.this.args.get("quoted"):
            name = body.name
        else:
            name = derived_name(cur.source.text[part[0].start : part[-1].end + 1])
        resolved = scope.resolve(body, frag, "SELECT")
        if name is None:
            assert mark is not None  # a name is left open only for a %%n / %%tbname item
            name = scope.partition_name(mark)
        if not name:
            raise cur.error_at(part[0], "this select item needs a name: add AS name")
        if (prev := seen.get(name.lower())) is not None:
            at = columns_tok if sink_columns is not None else part[0]
            raise cur.error_at(
                at, f"two result columns are named {name!r} (items {prev} and {i + 1}): give one an alias with AS name"
            )
        seen[name.lower()] = i + 1
        items.append(SelectItem(expression=to_spark(resolved), name=name, is_aggregate=is_aggregate(resolved)))
        nodes_resolved.append(resolved)
    _check_grouping(scope, frag, nodes_resolved)
    return tuple(items), key_bound


def _check_grouping(scope: Scope, frag: Fragment, nodes: list[exp.Expression]) -> None:
    """An aggregated query yields one row per (group, window): a column outside every aggregate must be
    one of the group's (PARTITION BY) or a placeholder, as in TDengine."""
    if not any(is_aggregate(n) for n in nodes) and not scope.groups_rows:
        return
    grouped = {p.lower() for p in scope.partition_by + scope.group_by}
    over = scope.sub_windows.over if scope.sub_windows is not None else None
    if isinstance(over, StateTrigger):  # a state window's rows share its state
        grouped.add(over.column.strip("`").lower())
    aliases = {side: alias for alias, side in scope.join_sides.items()}
    for node in nodes:
        for col in node.find_all(exp.Column):
            name, side = col.name.lower(), joined_column(col.name)
            if under_aggregate(col) or name in grouped:
                continue
            if side is None and name.startswith("__cq"):  # an engine column (a placeholder's)
                continue
            if side is not None and side[0] == 0 and scope.window_join:  # one trigger row per aggregate
                continue
            shown = col.name if side is None else f"{aliases.get(side[0], '?')}.{side[1]}"
            raise frag.error(
                col,
                f"column {shown!r} is not inside an aggregate: the query is aggregated (one row per "
                f"{'trigger row' if scope.window_join else 'window'}{' and group' if grouped else ''}), so select "
                f"it through an aggregate such as last({shown}), or "
                f"{'GROUP BY' if scope.form == 'new' else 'PARTITION BY'} it",
            )


# A row's own timestamp as the sink time column: the column, or one of these aggregates of it.
_ROW_TIME_AGGREGATES = ("first", "last", "min", "max", "last_row")


def _row_time(scope: Scope, frag: Fragment, body: exp.Expression) -> bool:
    """``body`` is a timestamp of the rows read: a plain column (its type is checked against the
    table at load, ``catalog``) or FIRST / LAST / MIN / MAX / LAST_ROW of one."""
    if isinstance(body, exp.Column):
        own = not body.table or body.table.lower() in scope.join_sides  # a join's side: alias.ts
        return own and frag.offset_of(body) not in scope.marks and body.name.lower() not in PLACEHOLDERS
    name = (frag.written(body) or "").split("(")[0].strip().lower()
    args = list(body.iter_expressions())
    return name in _ROW_TIME_AGGREGATES and len(args) == 1 and _row_time(scope, frag, args[0])


def _first_column(scope: Scope, frag: Fragment, node: exp.Expression, part: list[Token]) -> KeyBound:
    body = node.this if isinstance(node, exp.Alias) else node
    keys = dict(_KEYS[scope.family])
    if scope.family in ("window", "old") and not scope.interval_window:
        keys = {k: v for k, v in keys.items() if v == "start"}
    if scope.interp_mode and isinstance(body, exp.Column) and body.name.lower() == "_irowts":
        return "row"  # INTERP's time point: within the trigger's range, checked per run
    if scope.sub_windows is not None and isinstance(body, exp.Column) and body.name.lower() == "_wstart":
        return "row"  # the query's sub-window start: a time within the trigger's range, checked per run
    if isinstance(body, exp.Column) and not body.table and body.name.lower() in PLACEHOLDERS:
        scope.check_placeholder(body.name, frag.offset_of(body), "SELECT")  # the wrong trigger's: say so
    if isinstance(body, exp.Column) and not body.table and body.name.lower() in keys:
        return keys[body.name.lower()]
    if scope.form == "new" and _row_time(scope, frag, body):
        return "row"
    want = _KEY_WORDS[scope.family]
    if scope.family in ("window", "old"):
        end = "_twend" if scope.family == "window" else "_wend"
        want += f" or, for INTERVAL windows, the window end ({end})"
    if scope.form == "new":
        want += ", or a timestamp column of the rows read (ts, first(ts), last(ts), min(ts), max(ts))"
    text = scope.cur.source.text[part[0].start : part[-1].end + 1]
    raise scope.cur.error_at(
        part[0], f"the first column of a stream's result is the sink's time column: it must be {want}, found {text!r}"
    )


def check_series(scope: Scope, clauses: dict, q: dict) -> None:
    """A query with multi-row functions (``q["series"]``) gives rows of its own: no aggregates, GROUP BY
    or sub-windows beside them, one selection (TOP, TAIL, HISTOGRAM...) alone, HISTOGRAM's rows only
    with the window's and the group's values."""
    series, items = q["series"], q["select"]
    toks = clauses["SELECT"][1]

    def at(name: str) -> Token:
        return next((t for t in toks if t.text.lower() == name), toks[0])

    first = series[0].function
    if any(i.is_aggregate for i in items):
        raise scope.cur.error_at(
            at(first),
            f"{first.upper()}() gives rows of its own, so it cannot be mixed with aggregates in one query: "
            "aggregate its result in an outer query over a subquery",
        )
    for word, why in (
        ("GROUP BY", "GROUP BY gives one row per group; PARTITION BY keeps the rows (and orders them per partition)"),
        ("WINDOW", "the query's sub-windows aggregate their rows"),
        ("HAVING", "HAVING filters aggregated rows"),
    ):
        if word in clauses:
            raise scope.cur.error_at(clauses[word][0], f"{word} with {first.upper()}(): {why}")
    picked = next((c for c in series if c.function in SELECTIONS), None)
    if picked is not None and len(series) > 1:
        other = next(c for c in series if c is not picked)
        raise scope.cur.error_at(
            at(picked.function),
            f"{picked.function.upper()}() chooses the rows of the result, so it cannot be combined with "
            f"{other.function.upper()}() in one query",
        )
    if picked is not None and picked.function == "histogram":
        grouped = {p.lower() for p in scope.partition_by + scope.group_by}
        for item in items:
            for col in sqlglot.parse_one(item.expression, read="spark").find_all(exp.Column):
                if not col.name.lower().startswith("__cq") and col.name.lower() not in grouped:
                    raise scope.cur.error_at(
                        at("histogram"),
                        f"HISTOGRAM() gives a row per bin: column {col.name!r} has no value there (select the "
                        "window's placeholders and the group's columns beside it)",
                    )
