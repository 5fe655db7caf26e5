"""``CREATE (CONTINUOUS QUERY | CQ)``: IoTDB's continuous query in the table model (seed 004)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from cq_engine.durations import format_duration
from cq_engine.errors import CQError
from cq_engine.model import (
    ContinuousQuery,
    Fill,
    Resample,
    SelectItem,
    SourceLocation,
    TableDecl,
    TimeGrouping,
    TimeoutPolicy,
)
from cq_engine.parse.cursor import Cursor, suggest
from cq_engine.parse.fragments import (
    IOTDB_AGGREGATES,
    IOTDB_TIME_NAMES,
    Fragment,
    find_time_reference,
    is_aggregate,
    rewrite_iotdb_functions,
    to_spark,
    under_aggregate,
)
from cq_engine.parse.functions import check_functions
from cq_engine.parse.options import ParseOptions
from cq_engine.times import EPOCH, parse_time


def parse_continuous_query(cur: Cursor, opts: ParseOptions, start: Token) -> ContinuousQuery:
    name_tok = cur.identifier("a continuous query name")
    header = _parse_header(cur, opts)
    cur.expect("BEGIN", what="BEGIN (the query body)")
    body_start = cur.pos
    opens: list[Token] = []
    cases, end_tok = 0, None
    while (tok := cur.peek()) is not None:
        if tok.token_type in _OPEN:
            opens.append(tok)
        elif tok.token_type in _CLOSE and opens:
            opens.pop()
        elif tok.token_type == TokenType.CASE:
            cases += 1
        elif tok.text.upper() == "END":
            if cases:
                cases -= 1
            elif not opens:
                end_tok = tok
                break
        cur.advance()
    if end_tok is None:
        if opens:
            raise cur.error_at(opens[-1], f"unclosed {opens[-1].text!r}")
        raise cur.source.error(cur.end, "expected END to close the BEGIN of the query body")
    body = _parse_body(cur, cur.tokens[body_start : cur.pos], opts)
    cur.advance()
    if not cur.at_end():
        raise cur.unexpected("expected ';' or the end of the file after END")

    every = header.every
    if every is None:
        if body.time_grouping is None:
            raise cur.error_at(name_tok, "a continuous query needs GROUP BY (interval) or RESAMPLE EVERY")
        every = body.time_grouping.interval
    if every < opts.min_every:
        raise cur.error_at(
            header.every_tok,
            f"EVERY {format_duration(every)} is below the minimum {format_duration(opts.min_every)} (CQ_MIN_EVERY)",
        )
    start_offset = header.start_offset if header.start_offset is not None else every
    end_offset = header.end_offset or timedelta(0)
    if start_offset <= end_offset:
        raise cur.error_at(
            header.range_tok,
            f"RANGE start offset {format_duration(start_offset)} must be "
            f"greater than the end offset {format_duration(end_offset)}",
        )
    if every > start_offset:  # IoTDB's CreateContinuousQueryStatement.semanticCheck
        raise cur.error_at(
            header.range_tok or header.every_tok or body.grouping_tok,
            f"RANGE start offset {format_duration(start_offset)} is smaller than EVERY {format_duration(every)}: "
            "the start time offset should be greater than or equal to every interval (IoTDB's rule)",
        )
    if body.time_grouping is not None and body.time_grouping.interval > start_offset:
        raise cur.error_at(
            body.grouping_tok,
            f"GROUP BY interval {format_duration(body.time_grouping.interval)}"
            f" is larger than the RANGE start offset {format_duration(start_offset)}",
        )
    line, col = cur.source.line_col(start.start)
    return ContinuousQuery(
        name=name_tok.text,
        resample=Resample(
            every=every, start_offset=start_offset, end_offset=end_offset, boundary=header.boundary or EPOCH
        ),
        timeout_policy=header.timeout_policy,
        location=SourceLocation(cur.source.file, line, col),
        sql=" ".join(cur.source.text[start.start : cur.end].split()),
        **body.fields,
    )


@dataclass
class _Header:
    every: timedelta | None = None
    every_tok: Token | None = None
    start_offset: timedelta | None = None
    end_offset: timedelta | None = None
    range_tok: Token | None = None
    boundary: datetime | None = None
    timeout_policy: TimeoutPolicy = "BLOCKED"


def _parse_header(cur: Cursor, opts: ParseOptions) -> _Header:
    h = _Header()
    seen: set[str] = set()
    if cur.match("RESAMPLE"):
        while cur.is_word("EVERY") or cur.is_word("BOUNDARY") or cur.is_word("RANGE"):
            tok = cur.advance()
            key = tok.text.upper()
            if key in seen:
                raise cur.error_at(tok, f"{key} given twice")
            seen.add(key)
            if key == "EVERY":
                h.every, h.every_tok = cur.duration("EVERY interval")
            elif key == "RANGE":
                h.range_tok = tok
                h.start_offset, _ = cur.duration("RANGE start offset")
                if cur.match(","):
                    h.end_offset, _ = cur.duration("RANGE end offset", positive=False)
            else:
                text, btok = cur.word("BOUNDARY time")
                try:
                    h.boundary = parse_time(text.strip("'\""), tz=opts.tz, what="BOUNDARY")
                except CQError as exc:
                    raise cur.error_at(btok, str(exc)) from None
        if not seen:
            raise cur.unexpected("expected EVERY, BOUNDARY or RANGE after RESAMPLE")
    if cur.match("TIMEOUT"):
        cur.expect("POLICY")
        tok = cur.advance()
        if tok.text.upper() not in ("BLOCKED", "DISCARD"):
            raise cur.error_at(tok, f"TIMEOUT POLICY must be BLOCKED or DISCARD, got {tok.text!r}")
        h.timeout_policy = "BLOCKED" if tok.text.upper() == "BLOCKED" else "DISCARD"
    return h


# A GROUP BY's rejected "[start, end)" closes a bracket with a paren, so both count alike.
_OPEN = (TokenType.L_PAREN, TokenType.L_BRACKET)
_CLOSE = (TokenType.R_PAREN, TokenType.R_BRACKET)

# Body clauses in the order IoTDB allows them; the key is the text of the clause's first token(s).
_CLAUSES = ("SELECT", "INTO", "FROM", "WHERE", "GROUP BY", "HAVING", "FILL", "LIMIT", "OFFSET", "ALIGN")
# IoTDB's series limits, which its SELECT ... INTO refuses (QueryStatement.semanticCheck).
_SERIES_CLAUSES = ("SLIMIT", "SOFFSET")


@dataclass
class _Body:
    fields: dict
    time_grouping: TimeGrouping | None
    grouping_tok: Token | None


def _split_clauses(cur: Cursor, tokens: list[Token]) -> dict[str, tuple[Token, list[Token]]]:
    clauses: dict[str, tuple[Token, list[Token]]] = {}
    depth, current, last_index = 0, None, -1
    for tok in tokens:
        word = tok.text.upper()
        if depth == 0 and word in _SERIES_CLAUSES:
            raise cur.error_at(
                tok,
                f"{word} is not supported in a continuous query: IoTDB's SELECT ... INTO refuses it "
                f"(select into: {word.lower()} clauses are not supported)",
            )
        if depth == 0 and word in _CLAUSES:
            index = _CLAUSES.index(word)
            if word in clauses:
                raise cur.error_at(tok, f"{word} given twice")
            if index < last_index:
                raise cur.error_at(tok, f"{word} must come before {_CLAUSES[last_index]}")
            current, last_index = word, index
            clauses[word] = (tok, [])
            continue
        if current is None:
            raise cur.error_at(tok, f"expected SELECT, found {tok.text!r}")
        if tok.token_type in _OPEN:
            depth += 1
        elif tok.token_type in _CLOSE:
            depth -= 1
        elif depth == 0 and tok.token_type == TokenType.ORDER_BY:
            raise cur.error_at(tok, "ORDER BY is not allowed in a continuous query (results are written by time)")
        clauses[current][1].append(tok)
    for name in ("SELECT", "INTO", "FROM"):
        if name not in clauses:
            raise cur.error_at(tokens[0] if tokens else None, f"the query body needs a {name} clause")
    for name, (tok, toks) in clauses.items():
        if not toks and name != "ALIGN":
            raise cur.error_at(tok, f"{name} needs an argument")
    return clauses


def _fragment(cur: Cursor, toks: list[Token]) -> Fragment:
    return Fragment.of(cur.source, toks)


def _check_functions(node: exp.Expression, frag: Fragment) -> None:
    check_functions(node, frag.error, dialect="IoTDB", own=tuple(n.lower() for n in IOTDB_AGGREGATES))


def _parse_body(cur: Cursor, tokens: list[Token], opts: ParseOptions) -> _Body:
    clauses = _split_clauses(cur, tokens)
    sink, sink_columns = _parse_into(cur, *clauses["INTO"])
    source = _single_name(cur, *clauses["FROM"], what="a source table name after FROM")
    fields: dict = {"source": source, "sink": sink}

    select_frag = _fragment(cur, clauses["SELECT"][1])
    select = select_frag.parse("SELECT ")
    items = list(select.expressions)
    stars = any(_is_count_star(i.this if isinstance(i, exp.Alias) else i) for i in items)
    if stars:
        fields["into_columns"] = sink_columns
    if sink_columns is not None and len(sink_columns) != len(items) and not stars:
        raise cur.error_at(clauses["INTO"][0], f"INTO lists {len(sink_columns)} columns but SELECT has {len(items)}")
    select_items = []
    bodies: list[exp.Expression] = []
    texts = _item_texts(cur, clauses["SELECT"][1])
    taken: set[str] = set()
    for i, item in enumerate(items):
        if isinstance(item, exp.Star) or item.find(exp.Star) is item:
            raise select_frag.error(item, "SELECT * is not supported: name the columns")
        body = item.this if isinstance(item, exp.Alias) else item
        if _is_count_star(body):  # one count per series of the source (``expand_count_star``)
            alias = item.alias if isinstance(item, exp.Alias) else ""
            select_items.append(SelectItem(expression=COUNT_STAR, name=alias, is_aggregate=True))
            bodies.append(body)
            continue
        name = (
            sink_columns[i]
            if sink_columns and not stars
            else (item.alias_or_name if isinstance(item, (exp.Alias, exp.Column)) else "")
        )
        if not name:
            name = _unique(default_name(texts[i] if len(texts) == len(items) else to_spark(item)), taken)
        if name.lower() in taken:
            raise select_frag.error(item, f"output column {name!r} is named twice: give one of them AS another name")
        taken.add(name.lower())
        body = rewrite_iotdb_functions(body, select_frag)
        _check_functions(body, select_frag)
        bodies.append(body)
        select_items.append(SelectItem(expression=to_spark(body), name=name, is_aggregate=is_aggregate(body)))
    fields["select"] = tuple(select_items)

    if "WHERE" in clauses:
        frag = _fragment(cur, clauses["WHERE"][1])
        where = frag.parse("SELECT 1 WHERE ").args["where"].this
        if (ref := find_time_reference(where, IOTDB_TIME_NAMES)) is not None:
            raise frag.error(
                ref, f"a time filter ({ref.sql()!r}) is not allowed in WHERE: each firing sets the time range itself"
            )
        if is_aggregate(where):
            raise frag.error(where, "aggregates are not allowed in WHERE (use HAVING)")
        _check_functions(where, frag)
        fields["where"] = to_spark(where)

    time_grouping, grouping_tok = None, None
    if "GROUP BY" in clauses:
        clause_tok, toks = clauses["GROUP BY"]
        time_grouping, keys, grouping_tok = _parse_group_by(cur, clause_tok, toks)
        fields["time_grouping"], fields["group_keys"] = time_grouping, keys

    having, having_frag = None, None
    if "HAVING" in clauses:
        frag = having_frag = _fragment(cur, clauses["HAVING"][1])
        having = rewrite_iotdb_functions(frag.parse("SELECT 1 HAVING ").args["having"].this, frag)
        _check_functions(having, frag)
        if not is_aggregate(having):  # IoTDB's QueryStatement.semanticCheck, in its order
            raise frag.error(having, "Expression of HAVING clause must to be an Aggregation (IoTDB's rule)")
        if not any(is_aggregate(b) for b in bodies):
            raise frag.error(
                having, "Expression of HAVING clause can not be used in NonAggregationQuery (IoTDB's rule)"
            )
        fields["having"] = to_spark(having)
    if "FILL" in clauses:
        fields["fill"] = _parse_fill(cur, *clauses["FILL"])
    if "LIMIT" in clauses:
        fields["limit"] = _count(cur, *clauses["LIMIT"])
    if "OFFSET" in clauses:
        fields["offset"] = _count(cur, *clauses["OFFSET"])
    if "ALIGN" in clauses:
        tok, toks = clauses["ALIGN"]
        if [t.text.upper() for t in toks] != ["BY", "DEVICE"]:
            raise cur.error_at(tok, "expected ALIGN BY DEVICE")
        fields["align_by_device"] = True
    grouped = {k.lower() for k in fields.get("group_keys", ())} | ({"device"} if "align_by_device" in fields else set())
    if time_grouping is not None or any(is_aggregate(b) for b in bodies):  # else row-wise (seed 004's cq5)
        _check_grouped(select_frag, bodies, grouped)
        if having is not None and having_frag is not None:
            _check_grouped(having_frag, [having], grouped)
    return _Body(fields, time_grouping, grouping_tok)


COUNT_STAR = "COUNT(*)"  # a SELECT item ``count(*)`` until the catalog knows the source's series


def _is_count_star(node: exp.Expression) -> bool:
    return isinstance(node, exp.Count) and isinstance(node.this, exp.Star)


def expand_count_star(cq: ContinuousQuery, table: TableDecl) -> ContinuousQuery:
    """IoTDB expands ``count(*)`` to ``count`` of every series the FROM path holds: here every column
    of the declared source but its time column, ``device``, tags and GROUP BY columns, each its own
    output column (``count_<column>``); an INTO column list names the expanded items positionally
    and must match their number, as IoTDB's SELECT ... INTO requires."""
    if not any(i.expression == COUNT_STAR for i in cq.select):
        return cq
    skip = {table.time_column.lower(), "device", *(k.lower() for k in cq.group_keys)}
    series = [c.name for c in table.columns if not c.is_tag and c.name.lower() not in skip]
    items: list[SelectItem] = []
    taken = {i.name.lower() for i in cq.select if i.expression != COUNT_STAR}
    for item in cq.select:
        if item.expression != COUNT_STAR:
            items.append(item)
            continue
        if len(series) != 1 and item.name and cq.into_columns is None:
            raise CQError(
                f"{cq.name!r}: count(*) AS {item.name} counts {len(series)} series of {table.name!r} "
                f"({', '.join(series)}): an alias names one column (IoTDB's rule); drop AS or list INTO columns"
            )
        for column in series:
            name = item.name if len(series) == 1 and item.name else _unique(f"count_{column.lower()}", taken)
            taken.add(name.lower())
            items.append(SelectItem(expression=f"count(`{column}`)", name=name, is_aggregate=True))
    if cq.into_columns is not None:
        if len(cq.into_columns) != len(items):
            raise CQError(
                f"{cq.name!r}: INTO lists {len(cq.into_columns)} columns but SELECT has {len(items)} once count(*) "
                f"is one count per series of {table.name!r}: the number of source paths and the number of "
                "target paths should be the same (IoTDB's rule)"
            )
        items = [replace(i, name=n) for i, n in zip(items, cq.into_columns)]
    return replace(cq, select=tuple(items))


def _check_grouped(frag: Fragment, bodies: list[exp.Expression], grouped: set[str]) -> None:
    """An aggregating continuous query yields one row per time window (and group): a column outside
    every aggregate must be a GROUP BY column (or ``device`` with ALIGN BY DEVICE)."""
    for body in bodies:
        for col in body.find_all(exp.Column):
            name = col.name.lower()
            if not under_aggregate(col) and name not in grouped and not name.startswith("__cq"):
                raise frag.error(
                    col,
                    f"column {col.name!r} is not inside an aggregate: a continuous query yields one row per "
                    f"time window{' and group' if grouped else ''}; use an aggregate such as last_value({col.name}) "
                    "or GROUP BY it",
                )


def default_name(text: str) -> str:
    """The output column of a SELECT item without ``AS`` or an INTO column list. IoTDB names it after
    its expression (``count(root.ln.d1.s1)``); here the item's text as written, lower-cased, with every
    run of characters other than letters, digits and ``_`` made one ``_``, and trimmed of ``_``:
    ``count(s1)`` → ``count_s1``, ``avg(a) * 2`` → ``avg_a_2``. A name that would start with a digit
    gets ``_`` in front; one with nothing left is ``expr``; at most 64 characters."""
    name = re.sub(r"\W+", "_", text.lower()).strip("_")[:64].rstrip("_")
    if not name:
        return "expr"
    return f"_{name}" if name[0].isdigit() else name


def _unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name_2``, ``name_3``... when an earlier item has it (a derived name never fails)."""
    out, n = name, 1
    while out.lower() in taken:
        n += 1
        out = f"{name}_{n}"
    return out


def _split_commas(toks: list[Token]) -> list[list[Token]]:
    """``toks`` split at the commas outside parentheses."""
    parts: list[list[Token]] = [[]]
    depth = 0
    for tok in toks:
        if tok.token_type in _OPEN:
            depth += 1
        elif tok.token_type in _CLOSE:
            depth -= 1
        if tok.token_type == TokenType.COMMA and depth == 0:
            parts.append([])
        else:
            parts[-1].append(tok)
    return parts


def _item_texts(cur: Cursor, toks: list[Token]) -> list[str]:
    """The text of each SELECT item as written."""
    return [cur.source.text[part[0].start : part[-1].end + 1] if part else "" for part in _split_commas(toks)]


def _single_name(cur: Cursor, clause: Token, toks: list[Token], *, what: str) -> str:
    if (
        len(toks) > 1
        and toks[0].token_type not in (TokenType.STRING, TokenType.NUMBER)
        and (hint := suggest(toks[1].text))
    ):
        # ``FROM ln GROPU BY (1m)``: the mistake is the misspelled clause, not the table name.
        raise cur.error_at(toks[1], f"unexpected {toks[1].text!r} after {toks[0].text!r}{hint}")
    if len(toks) != 1 or toks[0].token_type in (TokenType.STRING, TokenType.NUMBER):
        hint = " (the table model writes and reads one table; IoTDB paths are not tables)" if len(toks) > 1 else ""
        raise cur.error_at(toks[0] if toks else clause, f"expected {what}{hint}")
    return toks[0].text


def _parse_into(cur: Cursor, clause: Token, toks: list[Token]) -> tuple[str, tuple[str, ...] | None]:
    if len(toks) > 1 and toks[1].token_type == TokenType.L_PAREN:
        if toks[-1].token_type != TokenType.R_PAREN:
            raise cur.error_at(toks[-1], "INTO takes one table: table or table(col, ...)")
        inner = toks[2:-1]
        names = [t.text for t in inner if t.token_type != TokenType.COMMA]
        if not names or len(names) * 2 - 1 != len(inner) or any(t.token_type == TokenType.L_PAREN for t in inner):
            raise cur.error_at(toks[1], "INTO table(col, ...) expects a list of column names")
        return _single_name(cur, clause, toks[:1], what="a sink table name"), tuple(names)
    return _single_name(cur, clause, toks, what="a sink table name after INTO"), None


def _parse_group_by(
    cur: Cursor, clause: Token, toks: list[Token]
) -> tuple[TimeGrouping | None, tuple[str, ...], Token | None]:
    parts = _split_commas(toks)
    time_grouping, interval_tok, keys = None, None, []
    for part in parts:
        if not part:
            raise cur.error_at(clause, "empty item in GROUP BY")
        if part[0].token_type == TokenType.L_PAREN:
            if time_grouping is not None:
                raise cur.error_at(part[0], "GROUP BY takes one time interval")
            time_grouping, interval_tok = _time_grouping(cur, part)
        elif part[0].text.upper() == "LEVEL":
            raise cur.error_at(
                part[0], "GROUP BY LEVEL has no meaning in the table model: group by a column such as device"
            )
        elif len(part) == 1 and part[0].token_type not in (TokenType.NUMBER, TokenType.STRING):
            keys.append(part[0].text)
        else:
            raise cur.error_at(part[0], "expected a column name or (interval[, step]) in GROUP BY")
    return time_grouping, tuple(keys), interval_tok


def _time_grouping(cur: Cursor, part: list[Token]) -> tuple[TimeGrouping, Token]:
    inner = part[1:-1]
    if part[-1].token_type != TokenType.R_PAREN:
        raise cur.error_at(part[0], "expected (interval[, step]) in GROUP BY")
    bracket = next((t for t in inner if t.token_type == TokenType.L_BRACKET), None)
    if bracket is not None:
        raise cur.error_at(
            bracket,
            "GROUP BY in a continuous query takes no [start, end) range: each firing supplies its own time range",
        )
    sub = Cursor(cur.source, inner, end=part[-1].start)
    interval, interval_tok = sub.duration("GROUP BY interval")
    step = interval
    if sub.match(","):
        step, _ = sub.duration("GROUP BY sliding step")
    if not sub.at_end():
        raise sub.unexpected("expected ')' after the GROUP BY interval")
    return TimeGrouping(interval=interval, step=step), interval_tok


def _parse_fill(cur: Cursor, clause: Token, toks: list[Token]) -> Fill:
    if len(toks) < 3 or toks[0].token_type != TokenType.L_PAREN or toks[-1].token_type != TokenType.R_PAREN:
        raise cur.error_at(clause, "expected FILL(PREVIOUS | LINEAR | constant)")
    inner = toks[1:-1]
    text = cur.source.text[inner[0].start : inner[-1].end + 1].strip()
    upper = text.upper()
    if upper in ("PREVIOUS", "LINEAR"):
        return Fill(kind="previous" if upper == "PREVIOUS" else "linear")
    if upper in ("TRUE", "FALSE"):
        return Fill(kind="constant", value=upper == "TRUE")
    if len(inner) == 1 and inner[0].token_type == TokenType.STRING:
        return Fill(kind="constant", value=inner[0].text)
    try:
        value = float(text) if any(c in text for c in ".eE") else int(text)
    except ValueError:
        raise cur.error_at(inner[0], f"FILL takes PREVIOUS, LINEAR or a constant, got {text!r}") from None
    return Fill(kind="constant", value=value)


def _count(cur: Cursor, clause: Token, toks: list[Token]) -> int:
    if len(toks) != 1 or not toks[0].text.isdigit():
        raise cur.error_at(toks[0] if toks else clause, f"{clause.text.upper()} takes a non-negative integer")
    return int(toks[0].text)
