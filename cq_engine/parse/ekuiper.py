"""eKuiper (seed 003): stream declarations and rules with window functions.

``CREATE STREAM name (col TYPE, ...) WITH (DATASOURCE="table", TIMESTAMP="ts", ...)`` declares the
Delta table ``DATASOURCE`` (default: ``name``) as a source that rules call ``name``; its TIMESTAMP
field is the event time (stored as a timestamp; ``cq ingest`` takes epoch milliseconds for it).

``CREATE RULE [IF NOT EXISTS] name INTO sink AS SELECT ... FROM stream [WHERE ...] GROUP BY [col, ...,]
window [FILTER (WHERE ...)] [OVER (WHEN ...)] [HAVING ...]`` becomes a ``Stream`` (``form="ekuiper"``)
whose windows are the window function's; the sink gets ``window_start`` and ``window_end`` first.
"""

from __future__ import annotations

from datetime import datetime, timedelta

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
from cq_engine.parse.fragments import Fragment, is_aggregate, to_spark
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
    "SESSIONWINDOW": "SESSIONWINDOW(unit, timeout, max_duration)",
    "COUNTWINDOW": "COUNTWINDOW(count[, interval])",
}
_CLAUSES = ("FROM", "WHERE", "GROUP BY", "FILTER", "OVER", "HAVING")
WINDOW_START, WINDOW_END = "window_start", "window_end"


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
        columns.append((col, column_type(cur)))
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


def parse_rule(cur: Cursor, opts: ParseOptions, start: Token) -> Stream:
    """``CREATE RULE`` (and ``CREATE STREAM ... INTO ... AS`` a SELECT grouped by a window function)."""
    if_not_exists = cur.match("IF", "NOT", "EXISTS")
    name = cur.table_name("a rule name")
    into = cur.expect("INTO", what="INTO sink (where the rule's results go)")
    sink = cur.table_name("a table name after INTO").text
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
    options = StreamOptions()
    if "FILTER" in clauses:
        options = StreamOptions(pre_filter=_condition(cur, clauses["FILTER"], "WHERE", "FILTER"))
    if "OVER" in clauses:
        if not isinstance(trigger, EkSlidingTrigger):
            raise cur.error_at(clauses["OVER"][0], "OVER (WHEN ...) only follows SLIDINGWINDOW")
        trigger = EkSlidingTrigger(
            size=trigger.size, delay=trigger.delay, over=_condition(cur, clauses["OVER"], "WHEN", "OVER")
        )
    items = _items(cur, clauses["SELECT"][1])
    where = _expression(cur, clauses["WHERE"][1], "WHERE") if "WHERE" in clauses else None
    having = _expression(cur, clauses["HAVING"][1], "HAVING") if "HAVING" in clauses else None
    if having and not any(i.is_aggregate for i in items) and not is_aggregate(_parse(cur, clauses["HAVING"][1])):
        raise cur.error_at(clauses["HAVING"][0], "HAVING needs an aggregate (in it or in SELECT)")
    line, col = cur.source.line_col(start.start)
    del wtok
    return Stream(
        name=name.text,
        trigger=trigger,
        trigger_table=source,
        source=source,
        sink=sink,
        select=items,
        partition_by=keys,
        where=where,
        having=having,
        options=options,
        form="ekuiper",
        if_not_exists=if_not_exists,
        location=SourceLocation(cur.source.file, line, col),
        sql=" ".join(cur.source.text[start.start : cur.end].split()),
    )


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
    return _placeholders(parsed.expressions[0])


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
    items = [
        SelectItem(expression=placeholder_column("_twstart"), name=WINDOW_START, is_aggregate=False),
        SelectItem(expression=placeholder_column("_twend"), name=WINDOW_END, is_aggregate=False),
    ]
    seen = {WINDOW_START: 0, WINDOW_END: 0}
    for part in split_top(toks):
        if not part:
            raise cur.error_at(toks[0], "empty item in SELECT")
        if len(part) == 1 and part[0].token_type == TokenType.STAR:
            items.append(
                SelectItem(expression="*", name="*", is_aggregate=False)
            )  # the catalog expands it to the fields
            continue
        node = _parse(cur, part)
        body = node.this if isinstance(node, exp.Alias) else node
        if isinstance(node, exp.Alias):
            name = node.alias
        elif isinstance(body, exp.Column):
            name = body.name
        else:
            name = derived_name(cur.source.text[part[0].start : part[-1].end + 1])
        if name.lower() in seen:
            raise cur.error_at(part[0], f"two result columns are named {name!r}: give one an alias with AS name")
        seen[name.lower()] = len(items)
        items.append(SelectItem(expression=to_spark(body), name=name, is_aggregate=is_aggregate(body)))
    return tuple(items)


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
    if fn == "TUMBLINGWINDOW":
        return SlidingTrigger(sliding=sizes[0], interval=sizes[0], interval_offset=_natural(unit, opts))
    if fn == "HOPPINGWINDOW":
        if sizes[1] > sizes[0]:
            raise cur.error_at(args[2][0], "HOPPINGWINDOW's hop must not exceed its size")
        return SlidingTrigger(sliding=sizes[1], interval=sizes[0], interval_offset=_natural(unit, opts))
    if fn == "SLIDINGWINDOW":
        return EkSlidingTrigger(size=sizes[0], delay=sizes[1] if len(sizes) > 1 else timedelta(0))
    return EkSessionTrigger(timeout=sizes[0], max_duration=sizes[1])


def _natural(unit: timedelta, opts: ParseOptions) -> timedelta:
    """Windows end on natural time (seed 003): multiples of their size from the epoch, and day windows at
    local midnight of ``CQ_TIMEZONE`` (its standard offset: a day window stays 24 h across DST)."""
    if unit < timedelta(days=1):
        return timedelta(0)
    offset = datetime(2001, 1, 15, tzinfo=opts.tz).utcoffset() or timedelta(0)
    return -offset % timedelta(days=1)


def _positive_int(cur: Cursor, part: list[Token], what: str) -> int:
    """A positive integer below 2**31 (a count Spark holds in an int)."""
    text = part[0].text if len(part) == 1 and part[0].token_type == TokenType.NUMBER else ""
    if not (text.isascii() and text.isdigit() and 1 <= int(text) < 2**31):
        raise cur.error_at(part[0] if part else None, f"the {what} must be a positive integer below 2147483648")
    return int(text)
