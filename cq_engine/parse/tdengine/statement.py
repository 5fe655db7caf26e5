"""``CREATE STREAM``: TDengine streams in the new form (seed 000) and the old form (seed 000's second
half, seed 002), both parsed into one ``Stream``.

New form: ``CREATE STREAM [IF NOT EXISTS] [db.]name trigger [FROM table] [PARTITION BY cols]
[OPTIONS(...)] [NOTIFY(...) ...] [INTO table] [OUTPUT_SUBTABLE(expr)] [(cols)] [TAGS (...)]
[AS SELECT ... FROM %%trows | table [WHERE ...]]``.
Old form: ``CREATE STREAM [IF NOT EXISTS] name [TRIGGER ...] [WATERMARK t] [IGNORE EXPIRED 0|1]
[IGNORE UPDATE 0|1] [DELETE_MARK t] [FILL_HISTORY 0|1] [INTO table [(cols)] [TAGS (...)]
[SUBTABLE(expr)]] AS SELECT ... FROM table [WHERE ...] [PARTITION BY cols] window [NOTIFY ...]``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from sqlglot.tokens import Token, TokenType

from cq_engine.model import DATA_SHAPED, SlidingTrigger, SourceLocation, Stream, TableDecl
from cq_engine.parse.cursor import Cursor
from cq_engine.parse.ekuiper import has_window_function, is_ekuiper_stream, parse_ekuiper_stream, parse_rule
from cq_engine.parse.options import ParseOptions
from cq_engine.parse.tdengine.clauses import group_clause, having_clause, limit_clause, order_clause
from cq_engine.parse.tdengine.compose import (
    check_outer,
    check_qualified,
    row_columns,
    split_union,
    subquery,
    with_layers,
)
from cq_engine.parse.tdengine.interp import interp, interp_clauses
from cq_engine.parse.tdengine.joins import check_window_join, has_join, join_conditions, parse_joins
from cq_engine.parse.tdengine.notify import notify_where, parse_notify, parse_old_notify
from cq_engine.parse.tdengine.options import (
    old_stream_options,
    parse_column_list,
    parse_old_options,
    parse_options,
    parse_subtable,
    parse_tags,
)
from cq_engine.parse.tdengine.partition import old_partition, old_tags, partition_names
from cq_engine.parse.tdengine.query import Scope, find_marks, from_clause, split_query, where_clause
from cq_engine.parse.tdengine.select import check_series, select_items
from cq_engine.parse.tdengine.subwindows import fill_clause, sub_windows
from cq_engine.parse.tdengine.triggers import NEW_TRIGGERS, parse_trigger, parse_window

# The new form's clauses after the trigger, in the order they must come ("(" is INTO's column list).
_HEADER = ("FROM", "PARTITION BY", "OPTIONS", "NOTIFY", "INTO", "OUTPUT_SUBTABLE", "(", "TAGS", "AS")
_WINDOW_USAGE = (
    "INTERVAL(i) [SLIDING(s)], SESSION(ts_col, gap), STATE_WINDOW(col), "
    "EVENT_WINDOW START WITH c1 END WITH c2 or COUNT_WINDOW(n)"
)
# Without INTO the results are only notified; without either they would go nowhere.
_NO_OUTPUT = "a stream needs INTO table or NOTIFY(...): without either its results go nowhere"


def parse_create_stream(cur: Cursor, opts: ParseOptions, start: Token) -> Stream | TableDecl:
    """The whole statement (after ``CREATE STREAM``); eKuiper's (a field list after the name) declares a
    source table instead."""
    if is_ekuiper_stream(cur):
        return parse_ekuiper_stream(cur, opts, start)
    if has_window_function(cur):
        return parse_rule(cur, opts, start)
    if_not_exists = cur.match("IF", "NOT", "EXISTS")
    name_tok = cur.table_name("a stream name")
    nxt = cur.peek()
    form: Literal["new", "old"] = "new" if nxt is not None and nxt.text.upper() in NEW_TRIGGERS else "old"
    scope = Scope(cur, find_marks(cur.tokens), form)
    scope.tz = getattr(opts.tz, "key", None) or str(opts.tz)  # CQ_TIMEZONE, for TODAY(), TIMETRUNCATE(ts, 1d)...
    fields: dict = {}
    if form == "new":
        _new_form(cur, opts, scope, name_tok, fields)
    else:
        _old_form(cur, scope, name_tok, fields)
    scope.check_all_used()
    line, col = cur.source.line_col(start.start)
    inner, union = fields.pop("subquery", None), fields.pop("union", ())
    top = Stream(
        name=name_tok.text,
        form=form,
        if_not_exists=if_not_exists,
        location=SourceLocation(cur.source.file, line, col),
        sql=" ".join(cur.source.text[start.start : cur.end].split()),
        **fields,
    )
    return with_layers(top, inner, union)


def _header_partition(cur: Cursor) -> tuple[str, ...]:
    keyword = cur.advance()
    toks, depth = [], 0
    while (tok := cur.peek()) is not None:
        word = tok.text.upper()
        if depth == 0 and word in _HEADER and word not in ("(", "PARTITION BY"):
            alias = word == "AS" and (after := cur.peek(1)) is not None and after.text.upper() != "SELECT"
            if not alias:
                break
        depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(tok.token_type, 0)
        toks.append(cur.advance())
    return partition_names(cur, keyword, toks)


def _new_form(cur: Cursor, opts: ParseOptions, scope: Scope, name_tok: Token, f: dict) -> None:
    f["trigger"], trigger_tok = parse_trigger(cur, scope)
    done, query, notify_where_toks = _new_header(cur, opts, scope, f)
    label, notify = scope.label, f.get("notify")
    if "FROM" not in done and scope.family != "period":
        raise cur.error_at(trigger_tok, f"the {label} trigger needs a trigger table: add FROM table after it")
    if notify is not None and not notify.events:
        if scope.family == "window":
            raise cur.error_at(done["NOTIFY"], f"NOTIFY needs ON (WINDOW_OPEN|WINDOW_CLOSE) with the {label} trigger")
        # Seed 000: SLIDING without INTERVAL and PERIOD need no ON; each trigger closes its span.
        f["notify"] = notify = replace(notify, events=("WINDOW_CLOSE",))
    if "CALC_NOTIFY_ONLY" in done and notify is None:
        raise cur.error_at(done["CALC_NOTIFY_ONLY"], "CALC_NOTIFY_ONLY needs NOTIFY(...)")
    for key in ("OUTPUT_SUBTABLE", "(", "TAGS"):
        if key in done and "INTO" not in done:
            raise cur.error_at(done[key], f"{'a column list' if key == '(' else key} needs INTO table")
    if "INTO" not in done and notify is None:
        raise cur.error_at(name_tok, _NO_OUTPUT)
    if query is None and "INTO" in done:
        raise cur.error_at(done["INTO"], "INTO needs AS SELECT ...: the query computes what is written")
    if query is not None:
        _new_query(cur, scope, query, f, done.get("("))
        if f.get("union"):
            shaping = (
                ("OUTPUT_SUBTABLE", [f.get("output_subtable")]),
                ("TAGS", [t.expression for t in f.get("tags", ())]),
            )
            for key, sqls in shaping:
                if any(row_columns(sql) for sql in sqls if sql):
                    raise cur.error_at(
                        done[key],
                        f"{key} of a UNION ALL stream names the trigger group's values as %%n or %%tbname: "
                        "the queries' rows have no other column in common",
                    )
    if notify_where_toks:
        names = tuple(i.name for i in f.get("select", ()))
        assert notify is not None  # NOTIFY's WHERE came with the NOTIFY clause
        f["notify"] = replace(notify, where=notify_where(scope, notify_where_toks, names))
    for key in ("trigger_table", "source", "sink"):
        f.setdefault(key, None)


def _new_header(
    cur: Cursor, opts: ParseOptions, scope: Scope, f: dict
) -> tuple[dict[str, Token], list[Token] | None, list[Token] | None]:
    """The clauses after the trigger, in ``_HEADER`` order: the keyword of each one given (and of the
    options checked later), the query's tokens (after AS) and NOTIFY's WHERE tokens."""
    done: dict[str, Token] = {}
    query, notify_where_toks, last = None, None, -1
    while (tok := cur.peek()) is not None:
        key = "(" if tok.token_type == TokenType.L_PAREN else tok.text.upper()
        if key not in _HEADER:
            later = ["(columns)" if k == "(" else k for k in _HEADER[last + 1 :]]
            raise cur.unexpected(f"expected {', '.join(later)} or the end of the statement")
        if key in done:
            raise cur.error_at(tok, f"{key} given twice")
        if _HEADER.index(key) < last:
            raise cur.error_at(tok, f"{key} must come before {_HEADER[last]}")
        done[key], last = tok, _HEADER.index(key)
        if key == "AS":
            cur.advance()
            query, cur.pos = cur.tokens[cur.pos :], len(cur.tokens)
        elif key == "FROM":
            cur.advance()
            f["trigger_table"] = cur.table_name("a trigger table name after FROM").text
        elif key == "PARTITION BY":
            scope.partition_by = f["partition_by"] = _header_partition(cur)
        elif key == "OPTIONS":
            f["options"], given = parse_options(cur, scope, opts)
            if "CALC_NOTIFY_ONLY" in given:
                done["CALC_NOTIFY_ONLY"] = given["CALC_NOTIFY_ONLY"]
            if "DELETE_OUTPUT_TABLE" in given and "tbname" not in (p.lower() for p in scope.partition_by):
                raise cur.error_at(given["DELETE_OUTPUT_TABLE"], "DELETE_OUTPUT_TABLE needs PARTITION BY tbname")
        elif key == "NOTIFY":
            f["notify"], notify_where_toks = parse_notify(cur)
        elif key == "INTO":
            cur.advance()
            f["sink"] = cur.table_name("a table name after INTO").text
        elif key == "OUTPUT_SUBTABLE":
            f["output_subtable"] = parse_subtable(cur, scope)
        elif key == "(":
            f["sink_columns"], _ = parse_column_list(cur)
        else:
            f["tags"], _ = parse_tags(cur, scope)
    return done, query, notify_where_toks


def _new_query(cur: Cursor, scope: Scope, query: list[Token], f: dict, columns_tok: Token | None) -> None:
    """``AS query [UNION ALL query ...]``, each ``SELECT ... FROM %%trows | %%tbname | table |
    (query) [WHERE ...] ...``."""
    f.update(_queries(cur, scope, query, f, columns_tok, layer="top"))


def _queries(cur: Cursor, scope: Scope, tokens: list[Token], f: dict, columns_tok, *, layer: str) -> dict:
    """A query and its UNION ALL branches (under ``union``) as fields of a ``Stream``; ``layer`` is
    ``top`` (the stream's: its first column is the sink's time column) or ``inner`` (a subquery's)."""
    branches = split_union(cur, tokens)
    composed = layer != "top" or len(branches) > 1
    first = _one_query(cur, scope, branches[0], f, columns_tok, layer=layer, composed=composed)
    rest = [_one_query(cur, scope, b, f, None, layer=layer, composed=True) for b in branches[1:]]
    for branch, q in zip(branches[1:], rest):
        if len(q["select"]) != len(first["select"]):
            raise cur.error_at(
                branch[0],
                f"the queries of a UNION ALL give the same number of columns: this one gives "
                f"{len(q['select'])}, the first {len(first['select'])}",
            )
        if layer == "top" and q["key_bound"] != first["key_bound"]:
            raise cur.error_at(
                branch[0],
                "the queries of a UNION ALL take the same kind of first column (the sink's time column): "
                "all a window placeholder, or all a row's own timestamp",
            )
    if rest:
        first["union"] = rest
    return first


def _one_query(cur: Cursor, scope: Scope, tokens: list[Token], f: dict, columns_tok, *, layer: str, composed: bool):
    clauses = split_query(cur, tokens, form="new")
    q: dict = {}
    saved = (
        scope.group_by, scope.groups_rows, scope.interpolated, scope.aliases, scope.join_sides, scope.sub_windows,
        scope.series, scope.interp_mode, scope.interp_calls, scope.window_join,
    )  # fmt: skip
    scope.group_by, scope.groups_rows, scope.interpolated, scope.aliases, scope.join_sides = (), False, [], (), {}
    scope.sub_windows, scope.series, scope.interp_mode, scope.interp_calls = None, [], False, []
    scope.window_join = False
    sub = _from(cur, scope, clauses["FROM"], f, q)
    _query(scope, clauses, q, f, columns_tok, sink_time=layer == "top")
    if (composed or q.get("joins")) and scope.interpolated:
        raise cur.error_at(
            clauses["SELECT"][1][0],
            "TWA over %%trows in INTERVAL / SLIDING windows interpolates at the window's bounds, "
            "which a subquery, a join or a UNION ALL branch does not have: use it in a query of its own",
        )
    if sub is not None:
        outer = [t for t in tokens if not clauses["FROM"][1][0].start <= t.start <= clauses["FROM"][1][-1].end]
        check_outer(cur, q, q["subquery"], outer)
    if q.get("joins"):
        check_qualified(cur, q, tokens)
    if scope.window_join:
        check_window_join(cur, clauses, q)
    (
        scope.group_by, scope.groups_rows, scope.interpolated, scope.aliases, scope.join_sides, scope.sub_windows,
        scope.series, scope.interp_mode, scope.interp_calls, scope.window_join,
    ) = saved  # fmt: skip
    return q


def _from(cur: Cursor, scope: Scope, clause: tuple[Token, list[Token]], f: dict, q: dict):
    """FROM into ``q``: its ``reads`` and ``source``, a subquery's fields, a join's; the subquery's
    tokens and alias, if it is one."""
    toks = clause[1]
    sub = subquery(cur, toks)
    if sub is not None:
        q["subquery"] = _queries(cur, scope, sub[0], f, None, layer="inner")
        q["reads"], q["source"] = "query", _leaf(q["subquery"])["source"]
        scope.aliases = (sub[1],) if sub[1] else ()
        return sub
    if has_join(scope, toks):
        scope.used.add(toks[0].start)
        scope.join_sides, joined = parse_joins(scope, toks)
        scope.window_join = any(j.kind == "window" for j in joined)
        q["joins"] = join_conditions(scope, joined)
        source, is_placeholder, tok = "trows", True, toks[0]
    else:
        source, is_placeholder, tok = from_clause(scope, *clause)
    if is_placeholder:
        if source == "tbname" and "tbname" not in (p.lower() for p in scope.partition_by):
            raise cur.error_at(tok, "FROM %%tbname (each group's own table) needs PARTITION BY tbname")
        q["reads"], trigger_table = source, f.get("trigger_table")
        if trigger_table is None:
            raise cur.error_at(
                tok, f"FROM {scope.marks[tok.start].text} needs a trigger table: add FROM table after the trigger"
            )
        source = trigger_table
    else:
        q["reads"] = "table"  # each trigger reads its span of another table
        scope.aliases = (source,)  # table.col is col
    q["source"] = source
    return None


def _fill_fits(scope: Scope, clauses: dict, f: dict, at: Token) -> None:
    """FILL needs the trigger's range (time windows, PERIOD) and comes without HAVING / LIMIT / SLIMIT,
    whose order with the filled rows is not built."""
    if f["trigger"].kind in DATA_SHAPED:
        raise scope.cur.error_at(at, f"FILL needs a trigger window of fixed range, not {scope.label}'s")
    for word in ("HAVING", "LIMIT", "SLIMIT"):
        if word in clauses:
            raise scope.cur.error_at(clauses[word][0], f"{word} with FILL is not supported")


def _leaf(q: dict) -> dict:
    """The first query reading a table among ``q`` and its subqueries."""
    return _leaf(q["subquery"]) if q.get("subquery") is not None else q


def _query(scope: Scope, clauses: dict, q: dict, f: dict, columns_tok: Token | None, *, sink_time: bool = True) -> None:
    """The clauses of one query into ``q`` (``f``: the statement's fields, for its trigger and sink)."""
    if "WINDOW" in clauses and scope.form == "new":  # the old form's is its trigger
        wtok, wtoks = clauses["WINDOW"]
        scope.sub_windows = q["sub_windows"] = sub_windows(scope, [wtok, *wtoks])
        if "GROUP BY" in clauses:
            raise scope.cur.error_at(
                clauses["GROUP BY"][0], f"a query with {wtok.text.upper()} takes PARTITION BY, not GROUP BY"
            )
    interp_fields = None
    if ("EVERY" in clauses or "RANGE" in clauses) and scope.form == "new":
        interp_fields = interp_clauses(scope, clauses, f)
    elif "FILL" in clauses and scope.form == "new":
        ftok, ftoks = clauses["FILL"]
        if scope.sub_windows is None:
            raise scope.cur.error_at(ftok, "FILL needs INTERVAL(...) in the query: it fills the query's sub-windows")
        scope.sub_windows = q["sub_windows"] = fill_clause(scope, scope.sub_windows, ftoks, ftok)
        _fill_fits(scope, clauses, f, ftok)
    if "WHERE" in clauses:
        q["where"] = where_clause(scope, clauses["WHERE"][1])
    for word in ("PARTITION BY", "GROUP BY"):
        if word in clauses and scope.form == "new":
            scope.group_by = q["group_by"] = group_clause(scope, word, clauses[word][1])
            scope.groups_rows = word == "GROUP BY"
            q["partitions_query"] = word == "PARTITION BY"
    # TDengine's interval operator interpolates TWA at a time window's bounds from the rows around it;
    # a query reading another table is a plain aggregate over what its WHERE selects.
    scope.interpolates = (scope.interval_window or scope.family == "sliding") and q.get("reads", "trows") == "trows"
    if scope.interpolates and q.get("joins"):
        twa = next((t for t in clauses["SELECT"][1] if t.text.lower() == "twa"), None)
        if twa is not None:
            raise scope.cur.error_at(
                twa,
                "TWA over %%trows in INTERVAL / SLIDING windows interpolates at the window's bounds from "
                "the trigger rows around it, which a join query does not have: use it in a query of its own",
            )
    q["select"], q["key_bound"] = select_items(
        scope,
        clauses["SELECT"][1],
        sink_columns=f.get("sink_columns") if columns_tok is not None else None,
        columns_tok=columns_tok,
        sink_time=sink_time,
    )
    scope.interpolates = False
    if scope.interpolated:
        q["interpolated"] = tuple(scope.interpolated)
    if scope.series:
        q["series"] = tuple(scope.series)
        check_series(scope, clauses, q)
    if interp_fields is not None:
        q["interp"] = interp(scope, clauses, q, interp_fields)
        scope.interp_mode = False
    if scope.sub_windows is not None and not any(i.is_aggregate for i in q["select"]):
        raise scope.cur.error_at(
            clauses["WINDOW"][0],
            f"a query's {clauses['WINDOW'][0].text.upper()} aggregates each sub-window's rows: its SELECT needs an aggregate",
        )
    aggregates = sum(i.is_aggregate for i in q["select"])
    if (
        scope.sub_windows is not None
        and scope.sub_windows.fill == "value"
        and len(scope.sub_windows.fill_values) != aggregates
    ):
        raise scope.cur.error_at(
            clauses["FILL"][0],
            f"FILL(VALUE, ...) gives {len(scope.sub_windows.fill_values)} value(s) for the query's {aggregates} aggregate(s)",
        )
    if scope.form == "new":
        _after_select(scope, clauses, q, f)


def _after_select(scope: Scope, clauses: dict, q: dict, f: dict) -> None:
    """HAVING, ORDER BY, SLIMIT and LIMIT of the new form's query, and the rule for a row's own time
    as the sink's time column."""
    items, grouped = q["select"], scope.partition_by + scope.group_by
    if "HAVING" in clauses:
        q["having"] = having_clause(scope, clauses["HAVING"][1], items, grouped)
    if "ORDER BY" in clauses:
        q["order_by"] = order_clause(scope, clauses["ORDER BY"][1], items, grouped)
    for word, count, skip in (("LIMIT", "limit", "offset"), ("SLIMIT", "slimit", "soffset")):
        if word in clauses:
            q[count], q[skip] = limit_clause(scope, word, clauses[word][1])
    if "SLIMIT" in clauses and not scope.group_by:
        raise scope.cur.error_at(clauses["SLIMIT"][0], "SLIMIT needs GROUP BY or PARTITION BY in the query")
    if q["key_bound"] != "row":
        return
    at = clauses["SELECT"][1][0]
    trig = f["trigger"]
    if isinstance(trig, SlidingTrigger) and trig.interval is not None and trig.sliding < trig.interval:
        raise scope.cur.error_at(
            at,
            "a row's own timestamp as the sink's time column needs windows that do not overlap "
            "(SLIDING equal to INTERVAL): a row of two windows could not be told apart when one is recomputed",
        )
    options = f.get("options")
    if options is not None and options.force_output:
        raise scope.cur.error_at(
            at, "FORCE_OUTPUT needs a window placeholder as the first column: an empty window has no row time"
        )


def _old_form(cur: Cursor, scope: Scope, name_tok: Token, f: dict) -> None:
    start_pos = cur.pos
    old = parse_old_options(cur)
    columns_tok = tags_tok = None
    if cur.is_word("INTO"):
        cur.advance()
        f["sink"] = cur.table_name("a table name after INTO").text
        if cur.at_type(TokenType.L_PAREN):
            f["sink_columns"], columns_tok = parse_column_list(cur)
        if cur.is_word("TAGS"):
            f["tags"], tags_tok = parse_tags(cur, scope)
        if cur.is_word("SUBTABLE"):
            f["output_subtable"] = parse_subtable(cur, scope)
    if not cur.is_word("AS"):
        if cur.pos == start_pos:
            raise cur.unexpected(
                f"expected a trigger ({', '.join(NEW_TRIGGERS)}), or the old form's TRIGGER, "
                "WATERMARK, IGNORE EXPIRED, IGNORE UPDATE, DELETE_MARK, FILL_HISTORY, INTO or AS"
            )
        raise cur.unexpected("expected AS and the stream's query" if "sink" in f else "expected INTO or AS")
    cur.advance()
    clauses = split_query(cur, cur.tokens[cur.pos :], form="old")
    cur.pos = len(cur.tokens)
    source, _, _ = from_clause(scope, *clauses["FROM"])
    f["trigger_table"] = f["source"] = source
    if "PARTITION BY" in clauses:
        names, f["partition_exprs"] = old_partition(scope, *clauses["PARTITION BY"])
        scope.partition_by = f["partition_by"] = names
    if tags_tok is not None:
        f["tags"] = old_tags(cur, f["tags"], tags_tok, scope.partition_by)
    if "WINDOW" not in clauses:
        raise cur.error_at(
            clauses["SELECT"][0], f"a stream needs a window clause at the end of its query: {_WINDOW_USAGE}"
        )
    wtok, wtoks = clauses["WINDOW"]
    window = [wtok, *wtoks]
    f["trigger"], _ = parse_window(cur.sub(window, window[-1].end + 1), scope)
    f["options"] = old_stream_options(cur, old, f["trigger"], scope.label)
    _query(scope, clauses, f, f, columns_tok)
    if "NOTIFY" in clauses:
        ntok, ntoks = clauses["NOTIFY"]
        f["notify"] = parse_old_notify(cur.sub([ntok, *ntoks], cur.end))
    if "sink" not in f and "notify" not in f:
        raise cur.error_at(name_tok, _NO_OUTPUT)
    f.setdefault("sink", None)
