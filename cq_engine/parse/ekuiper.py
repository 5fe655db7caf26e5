"""eKuiper (seed 003): stream declarations and rules with window functions.

``CREATE STREAM name (col TYPE, ...) WITH (DATASOURCE="table", TIMESTAMP="ts", ...)`` declares the
Delta table ``DATASOURCE`` (default: ``name``) as a source that rules call ``name``; its TIMESTAMP
field is the event time (stored as a timestamp; ``cq ingest`` takes epoch milliseconds for it).

``CREATE RULE [IF NOT EXISTS] name INTO sink [WITH (lateTolerance = ms)] AS SELECT ... FROM stream
[WHERE ...] GROUP BY [col, ...,] window [FILTER (WHERE ...)] [OVER (WHEN ...)] [HAVING ...]`` becomes a
``Stream`` (``form="ekuiper"``) whose windows are the window function's over the whole stream, each
window's rows split by the GROUP BY columns (``Stream.group_by``), as eKuiper computes them; the sink
gets ``window_start`` and ``window_end`` first.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import sqlglot
from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from cq_engine.durations import bounded, micros
from cq_engine.errors import CQError
from cq_engine.model import (
    Column,
    CountTrigger,
    EkSessionTrigger,
    EkSlidingTrigger,
    SelectItem,
    SlidingTrigger,
    SourceLocation,
    Stream,
    StreamOptions,
    TableDecl,
    placeholder_column,
)
from cq_engine.parse.cursor import Cursor, split_top
from cq_engine.parse.fragments import Fragment, is_aggregate, is_aggregate_sql, to_spark, under_aggregate
from cq_engine.parse.functions import check_functions
from cq_engine.parse.options import ParseOptions
from cq_engine.parse.tables import column_type
from cq_engine.parse.tdengine.select import derived_name

UNITS = {
    "DD": timedelta(days=1),
    "HH": timedelta(hours=1),
    "MI": timedelta(minutes=1),
    "SS": timedelta(seconds=1),
    "MS": timedelta(milliseconds=1),
}
WINDOWS = ("TUMBLINGWINDOW", "HOPPINGWINDOW", "SLIDINGWINDOW", "SESSIONWINDOW", "COUNTWINDOW")
_ARITY = {
    "TUMBLINGWINDOW": (2, 2),
    "HOPPINGWINDOW": (3, 3),
    "SLIDINGWINDOW": (2, 3),
    "SESSIONWINDOW": (3, 3),
    "COUNTWINDOW": (1, 2),
}
_USAGE = {
    "TUMBLINGWINDOW": "TUMBLINGWINDOW(unit, size)",
    "HOPPINGWINDOW": "HOPPINGWINDOW(unit, size, hop)",
    "SLIDINGWINDOW": "SLIDINGWINDOW(unit, size[, delay])",
    "SESSIONWINDOW": "SESSIONWINDOW(unit, max_duration, timeout)",
    "COUNTWINDOW": "COUNTWINDOW(count[, interval])",
}
_CLAUSES = ("FROM", "WHERE", "GROUP BY", "FILTER", "OVER", "HAVING")
WINDOW_START, WINDOW_END = "window_start", "window_end"
ROW_TIME = placeholder_column("_ekrowtime")  # a row's event time (run.py adds it): the first row's values
_OPTIONS = ("LATETOLERANCE",)  # a rule's WITH (...): eKuiper's rule options that apply to a batch engine


def has_window_function(cur: Cursor) -> bool:
    """``CREATE STREAM name INTO sink AS SELECT ... GROUP BY ..., TUMBLINGWINDOW(...)``: a stream whose
    SELECT groups by an eKuiper window function (parsed as a rule)."""
    words = [t.text.upper() for t in cur.tokens[cur.pos :]]
    head = words[3:] if words[:3] == ["IF", "NOT", "EXISTS"] else words
    return head[1:2] == ["INTO"] and ("GROUP BY" in words or "GROUP" in words) and any(w in WINDOWS for w in words)


def is_ekuiper_stream(cur: Cursor) -> bool:
    """``CREATE STREAM name (`` (a column list) is eKuiper's; TDengine's has a trigger after the name."""
    nxt = cur.peek(1)
    return nxt is not None and nxt.token_type == TokenType.L_PAREN


def parse_ekuiper_stream(cur: Cursor, opts: ParseOptions, start: Token) -> TableDecl:
    name = cur.identifier("a stream name")
    cur.expect("(", what="'(' and the stream's fields")
    columns: list[tuple[Token, str]] = []
    while True:
        col = cur.identifier("a field name")
        columns.append((col, _field_type(cur)))
        if cur.match(","):
            continue
        cur.expect(")", what="',' or ')'")
        break
    props: dict[str, tuple[str, Token]] = {}
    if cur.match("WITH"):
        _, inner, _ = cur.group()
        for part in split_top(inner):
            if len(part) != 3 or part[1].token_type != TokenType.EQ:
                raise cur.error_at(part[0] if part else None, 'WITH takes KEY="value" pairs, such as DATASOURCE="demo"')
            props[part[0].text.upper()] = (part[2].text, part[2])
    if not cur.at_end():
        raise cur.unexpected("expected WITH (...) or the end of CREATE STREAM")
    fields = {c.text.lower(): c.text for c, _ in columns}
    if "TIMESTAMP" not in props:
        raise cur.error_at(
            name, f'stream {name.text!r} needs TIMESTAMP="field" in WITH (...): windows run on event time'
        )
    ts_text, ts_tok = props["TIMESTAMP"]
    if ts_text.lower() not in fields:
        raise cur.error_at(
            ts_tok,
            f"TIMESTAMP names {ts_text!r}, which is not a field of {name.text!r} "
            f"(fields: {', '.join(fields.values())})",
        )
    time_column = fields[ts_text.lower()]
    table = props.get("DATASOURCE", (name.text, name))[0]
    line, column = cur.source.line_col(start.start)
    return TableDecl(
        name=table,
        time_column=time_column,
        if_not_exists=False,
        columns=tuple(Column(name=c.text, type="timestamp" if c.text == time_column else t) for c, t in columns),
        location=SourceLocation(cur.source.file, line, column),
        alias=name.text,
        sql=" ".join(cur.source.text[start.start : cur.end].split()),
    )


# eKuiper's field types (its data_types.md) as Delta types: ``float`` is a 64-bit float (eKuiper has no
# double), ``datetime`` a timestamp, ``bytea`` bytes; ``ARRAY(type)`` and ``STRUCT(name type, ...)``
# nest them. Other Spark/TDengine type names are accepted too.
_EK_TYPES = {
    "bigint": "bigint",
    "float": "double",
    "string": "string",
    "datetime": "timestamp",
    "boolean": "boolean",
    "bytea": "binary",
}


def _field_type(cur: Cursor) -> str:
    tok = cur.peek()
    word = tok.text.lower() if tok is not None else ""
    nxt = cur.peek(1)
    if word in ("array", "struct") and nxt is not None and nxt.token_type == TokenType.L_PAREN:
        cur.advance()
        _, inner, close = cur.group()
        sub = cur.sub(inner, close.start)
        if word == "array":
            element = _field_type(sub)
            if not sub.at_end():
                raise sub.unexpected("ARRAY takes one element type, such as ARRAY(BIGINT)")
            return f"array<{element}>"
        fields = []
        while True:
            field = sub.identifier("a field name in STRUCT(name type, ...)")
            fields.append(f"{field.text}:{_field_type(sub)}")
            if sub.at_end():
                break
            sub.expect(",", what="',' or ')' in STRUCT(name type, ...)")
        return f"struct<{','.join(fields)}>"
    if word in _EK_TYPES:
        cur.advance()
        return _EK_TYPES[word]
    return column_type(cur)


def parse_rule(cur: Cursor, opts: ParseOptions, start: Token) -> Stream:
    """``CREATE RULE`` (and ``CREATE STREAM ... INTO ... AS`` a SELECT grouped by a window function)."""
    if_not_exists = cur.match("IF", "NOT", "EXISTS")
    name = cur.table_name("a rule name")
    into = cur.expect("INTO", what="INTO sink (where the rule's results go)")
    sink = cur.table_name("a table name after INTO").text
    late = _rule_options(cur) if cur.match("WITH") else None
    cur.expect("AS", what="AS SELECT ...")
    query = cur.tokens[cur.pos :]
    cur.pos = len(cur.tokens)
    if not query or query[0].text.upper() != "SELECT":
        raise cur.error_at(query[0] if query else into, "expected SELECT after AS")
    clauses = _clauses(cur, query)
    from_cur = cur.sub(clauses["FROM"][1], cur.end)
    source = from_cur.table_name("a stream name after FROM").text
    if not from_cur.at_end():
        raise from_cur.unexpected("FROM takes one stream, then WHERE, GROUP BY or HAVING")
    if "GROUP BY" not in clauses:
        raise cur.error_at(query[0], "a rule needs GROUP BY with a window function: " + ", ".join(_USAGE.values()))
    keys, trigger, wtok = _group_by(cur, opts, *clauses["GROUP BY"])
    # eKuiper drops rows older than the watermark (latest event time - lateTolerance); here they are
    # reported as ignored instead of recomputing the windows they fall in (the default).
    options = StreamOptions() if late is None else StreamOptions(watermark=late, ignore_disorder=True)
    if "FILTER" in clauses:
        options = replace(options, pre_filter=_condition(cur, clauses["FILTER"], "WHERE", "FILTER"))
    if "OVER" in clauses:
        if not isinstance(trigger, EkSlidingTrigger):
            raise cur.error_at(clauses["OVER"][0], "OVER (WHEN ...) only follows SLIDINGWINDOW")
        trigger = replace(trigger, over=_condition(cur, clauses["OVER"], "WHEN", "OVER"))
    items = _items(cur, clauses["SELECT"][1])
    where = _expression(cur, clauses["WHERE"][1], "WHERE") if "WHERE" in clauses else None
    having = None
    if "HAVING" in clauses:
        having = _having(cur, clauses["HAVING"], items)
        if not any(i.is_aggregate for i in items) and not is_aggregate_sql(having):
            raise cur.error_at(clauses["HAVING"][0], "HAVING needs an aggregate (in it or in SELECT)")
    line, col = cur.source.line_col(start.start)
    del wtok
    stream = Stream(
        name=name.text,
        trigger=trigger,
        trigger_table=source,
        source=source,
        sink=sink,
        select=items,
        group_by=keys,
        where=where,
        having=having,
        options=options,
        form="ekuiper",
        if_not_exists=if_not_exists,
        location=SourceLocation(cur.source.file, line, col),
        sql=" ".join(cur.source.text[start.start : cur.end].split()),
    )
    return first_row_values(stream)


def first_row_values(stream: Stream) -> Stream:
    """An aggregate rule's columns outside aggregates that are not GROUP BY columns take the value of
    the window group's first row, as in eKuiper (``min_by(col, ROW_TIME)``; rows at the same time:
    any of them). A rule with GROUP BY columns is aggregate, as eKuiper's ``WithAggFields`` says: one
    row per window group (without, an aggregate HAVING keeps or drops a window's rows: eKuiper emits
    them all). The catalog calls it again once ``SELECT *`` is expanded."""
    if not (stream.is_aggregate or stream.group_by):
        return stream
    keys = {k.lower() for k in stream.group_by}

    def first(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, exp.Column) or node.name.lower() in keys or node.name.lower().startswith("__cq_"):
            return node
        if under_aggregate(node):
            return node
        return exp.Anonymous(this="MIN_BY", expressions=[node.copy(), exp.column(ROW_TIME)])

    def rewrite(sql: str) -> str:
        return to_spark(sqlglot.parse_one(sql, read="spark").transform(first))

    items = tuple(replace(i, expression=rewrite(i.expression)) for i in stream.select)
    items = tuple(replace(i, is_aggregate=is_aggregate_sql(i.expression)) for i in items)
    having = rewrite(stream.having) if stream.having else None
    return replace(stream, select=items, having=having)


_INTEGER_TYPES = frozenset({"tinyint", "smallint", "int", "bigint"})


def integer_averages(stream: Stream, table: TableDecl) -> Stream:
    """eKuiper's ``avg`` of integers is an integer: ``funcs_agg.go`` divides the int64 total by the
    count (Go's division, toward zero), so qty 1 and 2 average 1. Each ``avg(x)`` whose argument is
    integral over ``table``'s declared columns becomes ``sum(x) div count(x)`` (Java's division, also
    toward zero), a bigint; NULLs are left out of both, as eKuiper's ``getCount`` does."""
    types = {c.name.lower(): c.type.lower() for c in table.columns}

    def integral(n: exp.Expression) -> bool:
        if isinstance(n, exp.Paren):
            return integral(n.this)
        if isinstance(n, exp.Column):
            return types.get(n.name.lower()) in _INTEGER_TYPES
        if isinstance(n, exp.Literal):
            return not n.is_string and n.this.lstrip("-").isdigit()
        if isinstance(n, (exp.Add, exp.Sub, exp.Mul, exp.Mod)):
            return integral(n.this) and integral(n.expression)
        if isinstance(n, exp.Neg):
            return integral(n.this)
        if isinstance(n, exp.Cast):
            return n.to.sql(dialect="spark").lower() in _INTEGER_TYPES
        return False

    def visit(n: exp.Expr) -> exp.Expr:
        if isinstance(n, exp.Avg) and integral(n.this):
            count = exp.Count(this=n.this.copy())
            return exp.IntDiv(
                this=exp.Sum(this=n.this.copy()), expression=exp.Nullif(this=count, expression=exp.Literal.number(0))
            )
        return n

    def rewrite(sql: str) -> str:
        return to_spark(sqlglot.parse_one(sql, read="spark").transform(visit))

    items = tuple(
        replace(i, expression=rewrite(i.expression)) if "avg" in i.expression.lower() else i for i in stream.select
    )
    having = rewrite(stream.having) if stream.having and "avg" in stream.having.lower() else stream.having
    return replace(stream, select=items, having=having)


def _rule_options(cur: Cursor) -> timedelta:
    """``WITH (lateTolerance = ms)`` (eKuiper's rule option, in milliseconds) → the tolerance."""
    _, inner, _ = cur.group()
    late = None
    for part in split_top(inner):
        if len(part) != 3 or part[1].token_type != TokenType.EQ or part[0].text.upper() not in _OPTIONS:
            raise cur.error_at(
                part[0] if part else None,
                "a rule's WITH takes lateTolerance = milliseconds, such as WITH (lateTolerance = 1000)",
            )
        text = part[2].text
        if not (text.isascii() and text.isdigit() and int(text) < 2**53):
            raise cur.error_at(part[2], f"lateTolerance must be a whole number of milliseconds, not {text!r}")
        late = timedelta(milliseconds=int(text))
    if late is None:
        raise cur.error_at(cur.tokens[cur.pos - 1], "WITH (...) is empty: WITH (lateTolerance = milliseconds)")
    return late


def _having(cur: Cursor, clause: tuple[Token, list[Token]], items: tuple[SelectItem, ...]) -> str:
    """HAVING, with the SELECT's aliases replaced by their expressions (eKuiper lets HAVING name them)."""
    node = _parse(cur, clause[1])
    if isinstance(node, exp.Alias):
        raise cur.error_at(clause[1][0], "HAVING takes a condition, not an alias")
    aliases = {i.name.lower(): i.expression for i in items if i.expression != "*"}

    def swap(n: exp.Expr) -> exp.Expr:
        if isinstance(n, exp.Column) and not n.table and n.name.lower() in aliases:
            sql = aliases[n.name.lower()]
            if sql.strip("`").lower() != n.name.lower():
                return exp.Paren(this=sqlglot.parse_one(sql, read="spark"))
        return n

    return to_spark(node.transform(swap))


def _clauses(cur: Cursor, query: list[Token]) -> dict[str, tuple[Token, list[Token]]]:
    clauses: dict[str, tuple[Token, list[Token]]] = {"SELECT": (query[0], [])}
    current, depth, order = "SELECT", 0, ("SELECT", *_CLAUSES)
    i = 1
    while i < len(query):
        tok = query[i]
        word = tok.text.upper()
        nxt = query[i + 1] if i + 1 < len(query) else None
        if depth == 0 and word == "GROUP" and nxt is not None and nxt.text.upper() == "BY":
            word, i = "GROUP BY", i + 1
        if (
            depth == 0
            and word in _CLAUSES
            and (word not in ("FILTER", "OVER") or current == "GROUP BY" or current in ("FILTER", "OVER"))
        ):
            if word in clauses:
                raise cur.error_at(tok, f"{word} given twice")
            if order.index(word) < order.index(current):
                raise cur.error_at(tok, f"{word} must come before {current}")
            clauses[word], current = (tok, []), word
            i += 1
            continue
        if word in ("ORDER", "LIMIT") and depth == 0:
            raise cur.error_at(tok, f"{word} is not supported in a rule: each window's result is written by its start")
        depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(tok.token_type, 0)
        clauses[current][1].append(tok)
        i += 1
    if "FROM" not in clauses:
        raise cur.error_at(query[0], "the rule's query needs FROM stream")
    for word, (tok, toks) in clauses.items():
        if not toks:
            raise cur.error_at(tok, f"{word} needs an argument")
    return clauses


def _parse(cur: Cursor, toks: list[Token]) -> exp.Expression:
    frag = Fragment.of(cur.source, toks)
    parsed = frag.parse("SELECT ")
    if not isinstance(parsed, exp.Select) or len(parsed.expressions) != 1:
        raise cur.error_at(toks[0], "expected one expression")
    node = _placeholders(parsed.expressions[0])
    check_functions(node, frag.error, dialect="eKuiper")
    return node


def _placeholders(node: exp.Expression) -> exp.Expression:
    """``window_start()`` / ``window_end()`` → the window's bounds."""

    def visit(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Anonymous) and str(n.this).lower() in (WINDOW_START, WINDOW_END) and not n.expressions:
            return exp.column(placeholder_column("_tw" + str(n.this).lower()[len("window_") :]))
        return n

    return node.transform(visit)


def _expression(cur: Cursor, toks: list[Token], clause: str) -> str:
    node = _parse(cur, toks)
    if isinstance(node, exp.Alias):
        raise cur.error_at(toks[0], f"{clause} takes a condition, not an alias")
    if is_aggregate(node):  # WHERE filters each window's rows: aggregates belong in HAVING
        raise cur.error_at(toks[0], f"aggregates are not allowed in {clause}: filter the window's result with HAVING")
    return to_spark(node)


def _condition(cur: Cursor, clause: tuple[Token, list[Token]], word: str, name: str) -> str:
    """``FILTER (WHERE cond)`` / ``OVER (WHEN cond)``."""
    keyword, toks = clause
    if (
        len(toks) < 3
        or toks[0].token_type != TokenType.L_PAREN
        or toks[-1].token_type != TokenType.R_PAREN
        or toks[1].text.upper() != word
    ):
        raise cur.error_at(keyword, f"{name} takes ({word} condition)")
    node = _parse(cur, toks[2:-1])
    if is_aggregate(node):
        raise cur.error_at(toks[2], f"aggregates are not allowed in {name}")
    return to_spark(node)


def _items(cur: Cursor, toks: list[Token]) -> tuple[SelectItem, ...]:
    """The automatic ``window_start`` / ``window_end`` columns, then the selected items. A selected
    ``window_start()`` / ``window_end()`` (under its alias, if any) is that automatic column: one
    column per meaning, and the sink's time column stays the window start."""
    auto = {
        "_twstart": SelectItem(expression=placeholder_column("_twstart"), name=WINDOW_START, is_aggregate=False),
        "_twend": SelectItem(expression=placeholder_column("_twend"), name=WINDOW_END, is_aggregate=False),
    }
    items: list[SelectItem] = []
    taken: set[str] = set()
    for part in split_top(toks):
        if not part:
            raise cur.error_at(toks[0], "empty item in SELECT")
        if len(part) == 1 and part[0].token_type == TokenType.STAR:
            items.append(SelectItem(expression="*", name="*", is_aggregate=False))  # the catalog expands it
            continue
        node = _parse(cur, part)
        body = node.this if isinstance(node, exp.Alias) else node
        bound = body.name[len("__cq") :] if isinstance(body, exp.Column) and body.name in _BOUNDS else None
        if bound is not None and bound in taken:
            raise cur.error_at(part[0], f"{_BOUNDS[body.name]}() is selected twice")
        if isinstance(node, exp.Alias):
            name = node.alias
        elif isinstance(body, exp.Column) and bound is None:
            name = body.name
        else:
            name = derived_name(cur.source.text[part[0].start : part[-1].end + 1])
        if bound is not None:
            taken.add(bound)
            name = name if isinstance(node, exp.Alias) else auto[bound].name
            auto[bound] = replace(auto[bound], name=name)
            continue
        items.append(SelectItem(expression=to_spark(body), name=name, is_aggregate=is_aggregate(body)))
    out = [*auto.values(), *items]
    seen: set[str] = set()
    for item in out:
        if item.name != "*" and item.name.lower() in seen:
            raise cur.error_at(toks[0], f"two result columns are named {item.name!r}: give one an alias with AS name")
        seen.add(item.name.lower())
    return tuple(out)


_BOUNDS = {placeholder_column("_twstart"): "window_start", placeholder_column("_twend"): "window_end"}


def _group_by(cur: Cursor, opts: ParseOptions, keyword: Token, toks: list[Token]):
    keys: list[str] = []
    window = None
    for part in split_top(toks):
        first = part[0] if part else keyword
        if part and part[0].text.upper() in WINDOWS and len(part) > 1 and part[1].token_type == TokenType.L_PAREN:
            if window is not None:
                raise cur.error_at(first, "GROUP BY takes one window function")
            window = (_window(cur, opts, part), first)
            continue
        if len(part) != 1 or not part[0].text.replace("_", "a").isalnum():
            raise cur.error_at(
                first, "GROUP BY takes column names and one window function: " + ", ".join(_USAGE.values())
            )
        keys.append(part[0].text)
    if window is None:
        raise cur.error_at(keyword, "GROUP BY needs a window function: " + ", ".join(_USAGE.values()))
    return tuple(keys), window[0], window[1]


def _window(cur: Cursor, opts: ParseOptions, part: list[Token]):
    fn = part[0].text.upper()
    sub = cur.sub(part[1:], part[-1].end + 1)
    _, inner, _close = sub.group()
    if not sub.at_end():
        raise sub.unexpected(f"{fn}(...) ends here")
    args = split_top(inner)
    lo, hi = _ARITY[fn]
    if not inner or not lo <= len(args) <= hi:
        raise cur.error_at(part[0], f"{fn} takes {lo if lo == hi else f'{lo} or {hi}'} arguments: {_USAGE[fn]}")
    if not all(args):
        raise cur.error_at(part[1], f"{fn} has an empty argument: {_USAGE[fn]}")
    if fn == "COUNTWINDOW":
        count = _positive_int(cur, args[0], "count")
        interval = _positive_int(cur, args[1], "interval") if len(args) > 1 else count
        if interval > count:
            raise cur.error_at(args[1][0], f"COUNTWINDOW's interval ({interval}) must not exceed its count ({count})")
        return CountTrigger(count=count, slide=interval, ekuiper=True)
    unit_tok = args[0][0]
    unit = UNITS.get(unit_tok.text.upper()) if len(args[0]) == 1 else None
    if unit is None:
        raise cur.error_at(unit_tok, f"unknown time unit {unit_tok.text!r} (DD, HH, MI, SS or MS)")
    sizes = []
    for a in args[1:]:
        n = _positive_int(cur, a, "size")
        try:
            sizes.append(bounded(micros(unit) * n, what=f"{fn} size", text=f"{n} {unit_tok.text}"))
        except CQError as exc:
            raise cur.error_at(a[0], str(exc)) from None
    anchor = _local_midnight(opts)
    if fn == "TUMBLINGWINDOW":
        return SlidingTrigger(sliding=sizes[0], interval=sizes[0], interval_offset=anchor % sizes[0])
    if fn == "HOPPINGWINDOW":
        if sizes[1] > sizes[0]:
            raise cur.error_at(args[2][0], "HOPPINGWINDOW's hop must not exceed its size")
        # windows end at the hop's multiples: they start `size` earlier
        return SlidingTrigger(sliding=sizes[1], interval=sizes[0], interval_offset=(anchor - sizes[0]) % sizes[1])
    if fn == "SLIDINGWINDOW":
        return EkSlidingTrigger(size=sizes[0], delay=sizes[1] if len(sizes) > 1 else timedelta(0))
    # eKuiper reads SESSIONWINDOW(unit, length, interval) as (max duration, timeout)
    return EkSessionTrigger(timeout=sizes[1], max_duration=sizes[0], offset=anchor % sizes[0])


def _local_midnight(opts: ParseOptions) -> timedelta:
    """Where natural time starts: eKuiper aligns windows (and session check points) in its time zone,
    on multiples of the size from the start of the local day, hour, minute... (ends at 10, 20, 30 s;
    an hour window in +05:30 ends at hh:30 UTC; a day window at local midnight). Here: multiples of the
    size from local midnight of ``CQ_TIMEZONE``'s standard offset (a day window stays 24 h across DST);
    the same whenever the size divides the unit above it."""
    offset = datetime(2001, 1, 15, tzinfo=opts.tz).utcoffset() or timedelta(0)
    return -offset % timedelta(days=1)


def _positive_int(cur: Cursor, part: list[Token], what: str) -> int:
    """A positive integer below 2**31 (a count Spark holds in an int)."""
    text = part[0].text if len(part) == 1 and part[0].token_type == TokenType.NUMBER else ""
    if not (text.isascii() and text.isdigit() and 1 <= int(text) < 2**31):
        raise cur.error_at(part[0] if part else None, f"the {what} must be a positive integer below 2147483648")
    return int(text)
