"""``NOTIFY`` of ``CREATE STREAM``: the new form's ``NOTIFY(...) [ON (...)] [WHERE ...] [NOTIFY_OPTIONS(...)]``
and the old form's ``NOTIFY (...) ON (...) [NOTIFY_HISTORY 0|1] [ON_FAILURE DROP|PAUSE]``."""

from __future__ import annotations

from urllib.parse import urlsplit

from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from cq_engine.model import EventType, Notify, OnFailure
from cq_engine.parse.cursor import Cursor, split_top
from cq_engine.parse.fragments import to_spark
from cq_engine.parse.tdengine.options import event_types, zero_one
from cq_engine.parse.tdengine.query import Scope


def _urls(cur: Cursor, keyword: Token) -> tuple[str, ...]:
    if not cur.at_type(TokenType.L_PAREN):
        raise cur.unexpected("expected NOTIFY('ws://host:port/path', ...)")
    open_tok, inner, _ = cur.group()
    urls = []
    for part in split_top(inner):
        tok = part[0] if part else open_tok
        quoted = tok.token_type == TokenType.STRING or (
            tok.token_type == TokenType.IDENTIFIER and cur.source.text[tok.start] == '"'
        )
        if len(part) != 1 or not quoted:
            raise cur.error_at(tok, "NOTIFY takes quoted addresses such as 'ws://localhost:8080/notify'")
        try:
            url = urlsplit(tok.text)
            ok = url.scheme in ("ws", "wss") and bool(url.hostname) and url.port is not None
        except ValueError:
            ok = False
        if not ok:
            raise cur.error_at(
                tok,
                f"NOTIFY address {tok.text!r} must be a websocket URL with host and port, "
                "such as 'ws://localhost:8080/notify'",
            )
        urls.append(tok.text)
    return tuple(urls)


_WHERE_ENDS = ("NOTIFY_OPTIONS", "INTO", "OUTPUT_SUBTABLE", "TAGS", "AS")


def parse_notify(cur: Cursor) -> tuple[Notify, list[Token] | None]:
    """New form: ``NOTIFY(url, ...) [ON (events)] [WHERE cond] [NOTIFY_OPTIONS(...)]``; the WHERE's
    tokens come back unparsed (it names result columns, known after the query)."""
    keyword = cur.advance()
    urls = _urls(cur, keyword)
    events: tuple[EventType, ...] = ()
    if cur.is_word("ON"):
        events = event_types(cur, cur.advance(), TokenType.PIPE)
    where = None
    if cur.is_word("WHERE"):
        where_tok, depth, where = cur.advance(), 0, []
        while (tok := cur.peek()) is not None and not (depth == 0 and tok.text.upper() in _WHERE_ENDS):
            depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(tok.token_type, 0)
            where.append(cur.advance())
        if not where:
            raise cur.error_at(where_tok, "WHERE needs a condition")
    history = False
    on_failure: OnFailure = "drop"
    if cur.is_word("NOTIFY_OPTIONS"):
        opt_kw = cur.advance()
        if not cur.at_type(TokenType.L_PAREN):
            raise cur.unexpected("expected NOTIFY_OPTIONS(NOTIFY_HISTORY | ON_FAILURE_PAUSE)")
        _, inner, _ = cur.group()
        seen: set[str] = set()
        for part in split_top(inner, TokenType.PIPE):
            tok = part[0] if part else opt_kw
            value = tok.text.upper()
            if len(part) != 1 or value not in ("NOTIFY_HISTORY", "ON_FAILURE_PAUSE"):
                raise cur.error_at(tok, "NOTIFY_OPTIONS takes NOTIFY_HISTORY and/or ON_FAILURE_PAUSE separated by '|'")
            if value in seen:
                raise cur.error_at(tok, f"{value} given twice")
            seen.add(value)
        history, on_failure = "NOTIFY_HISTORY" in seen, "pause" if "ON_FAILURE_PAUSE" in seen else "drop"
    return Notify(urls=urls, events=events, history=history, on_failure=on_failure), where


def notify_where(scope: Scope, toks: list[Token], names: tuple[str, ...]) -> str:
    """NOTIFY's WHERE may name the result's columns, the group's ``%%n`` and constants (seed 000)."""
    node, frag = scope.parse_expression(toks, "NOTIFY ... WHERE", toks[0])
    resolved = scope.resolve(node, frag, "NOTIFY ... WHERE")
    known = {n.lower() for n in names}
    for col in node.find_all(exp.Column):
        placeholder = frag.offset_of(col) in scope.marks or col.this.args.get("quoted")  # %%n, "string"
        if not placeholder and col.name.lower() not in known:
            raise frag.error(
                col,
                f"NOTIFY ... WHERE can only use the result's columns ({', '.join(names)}) "
                f"and constants, not {col.name!r}",
            )
    return to_spark(resolved)


def parse_old_notify(cur: Cursor) -> Notify:
    """Old form: ``NOTIFY (urls) ON ('WINDOW_OPEN', ...) [NOTIFY_HISTORY 0|1] [ON_FAILURE DROP|PAUSE]``."""
    keyword = cur.advance()
    urls = _urls(cur, keyword)
    on = cur.expect("ON", what="ON ('WINDOW_OPEN', 'WINDOW_CLOSE') after NOTIFY (...)")
    events = event_types(cur, on, TokenType.COMMA)
    history, seen = 0, set()
    on_failure: OnFailure = "pause"  # seed 000: ON_FAILURE defaults to PAUSE
    while (tok := cur.peek()) is not None:
        name = tok.text.upper()
        if name not in ("NOTIFY_HISTORY", "ON_FAILURE"):
            raise cur.unexpected("expected NOTIFY_HISTORY 0|1, ON_FAILURE DROP|PAUSE or the end of the statement")
        if name in seen:
            raise cur.error_at(tok, f"{name} given twice")
        seen.add(name)
        cur.advance()
        if name == "NOTIFY_HISTORY":
            history = zero_one(cur, name)
        else:
            value = cur.peek()
            if value is None or value.text.upper() not in ("DROP", "PAUSE"):
                raise cur.unexpected("ON_FAILURE takes DROP or PAUSE")
            on_failure = "pause" if cur.advance().text.upper() == "PAUSE" else "drop"
    return Notify(urls=urls, events=events, history=bool(history), on_failure=on_failure)
