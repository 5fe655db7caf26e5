"""``INTERVAL(i[, offset]) [SLIDING(s)]`` inside a new-form stream's query: per trigger window, the rows
read are aggregated per sub-window (TDengine's "every minute, the last hour per 10 s"), ``FILL(...)``
giving the sub-windows without rows; or SESSION, STATE_WINDOW, EVENT_WINDOW and COUNT_WINDOW over the
rows in time order (``streams.subwindows``). ``_wstart``, ``_wend`` and ``_wduration`` are the
sub-window's."""

from __future__ import annotations

from dataclasses import replace

from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from cq_engine.model import CountTrigger, EventTrigger, SessionTrigger, StateTrigger, SubFill, SubWindows
from cq_engine.parse.cursor import split_top
from cq_engine.parse.fragments import to_spark
from cq_engine.parse.tdengine.query import Scope
from cq_engine.parse.tdengine.triggers import (
    count_window,
    event_window,
    interval_sliding,
    session_window,
    state_window,
    true_for,
)


def sub_windows(scope: Scope, window: list[Token]) -> SubWindows:
    """The query's window clause (its tokens, keyword first): INTERVAL [SLIDING], or a data-shaped
    window in TDengine's query syntax (``EVENT_WINDOW START WITH c1 END WITH c2``, no parentheses)."""
    cur = scope.cur.sub(window, window[-1].end + 1)
    keyword = cur.advance()
    word = keyword.text.upper()
    if word == "SLIDING":
        raise cur.error_at(keyword, "SLIDING needs INTERVAL(...) before it in a query's window clause")
    if word == "INTERVAL":
        interval, offset, sliding = interval_sliding(cur, keyword)
        out = SubWindows(interval=interval, sliding=sliding, offset=offset)
    elif word == "SESSION":
        over: SessionTrigger | StateTrigger | EventTrigger | CountTrigger = session_window(cur, keyword)
        out = SubWindows(over=over)
    elif word == "STATE_WINDOW":
        state = state_window(cur, scope, keyword)
        out = SubWindows(over=replace(state, true_for=true_for(cur, scope)))
    elif word == "EVENT_WINDOW":
        rest = cur.tokens[cur.pos :]
        ends = next((i for i, t in enumerate(rest) if t.text.upper() == "TRUE_FOR"), len(rest))
        event = event_window(cur, scope, rest[:ends], keyword)
        cur.pos += ends
        out = SubWindows(over=replace(event, true_for=true_for(cur, scope)))
    else:
        count = count_window(cur, scope, keyword)
        if count.columns:
            raise cur.error_at(keyword, "COUNT_WINDOW(n, ..., column) inside a query is not supported: count every row")
        out = SubWindows(over=count)
    if not cur.at_end():
        raise cur.unexpected("expected the end of the query's window clause")
    return out


_FILL_MODES = ("NONE", "NULL", "VALUE", "PREV", "NEXT", "LINEAR")
_FILLS: dict[str, SubFill] = {
    "NONE": "none",
    "NULL": "null",
    "VALUE": "value",
    "PREV": "prev",
    "NEXT": "next",
    "LINEAR": "linear",
}


def fill_clause(scope: Scope, windows: SubWindows, toks: list[Token], at: Token) -> SubWindows:
    """``FILL(NONE | NULL | VALUE, v, ... | PREV | NEXT | LINEAR)`` of the query's sub-windows."""
    cur = scope.cur
    if not toks or toks[0].token_type != TokenType.L_PAREN or toks[-1].token_type != TokenType.R_PAREN:
        raise cur.error_at(at, f"expected FILL({' | '.join(_FILL_MODES)})")
    parts = split_top(toks[1:-1])
    if any(not p for p in parts):
        raise cur.error_at(at, "FILL(...) has an empty argument")
    mode = parts[0][0].text.upper() if parts else ""
    if mode in ("NULL_F", "VALUE_F"):
        raise cur.error_at(parts[0][0], f"FILL({mode}) (sub-windows of a window without rows) is not supported")
    if mode not in _FILL_MODES or len(parts[0]) != 1:
        raise cur.error_at(parts[0][0] if parts and parts[0] else at, f"expected FILL({' | '.join(_FILL_MODES)})")
    if windows.over is not None:
        raise cur.error_at(
            at, f"FILL needs INTERVAL(...) in the query, not {windows.kind.upper()}: it fills time slots"
        )
    if windows.sliding != windows.interval:
        raise cur.error_at(at, "FILL over sub-windows with SLIDING smaller than INTERVAL is not supported")
    values = []
    for part in parts[1:]:
        node, frag = scope.parse_expression(part, "FILL(VALUE, ...)", part[0])
        if not isinstance(node, (exp.Literal, exp.Neg, exp.Null, exp.Boolean)):
            raise frag.error(node, "FILL(VALUE, ...) takes constants")
        values.append(to_spark(node))
    if (mode == "VALUE") != bool(values):
        raise cur.error_at(parts[0][0], "FILL(VALUE, v1, ...) takes values, and only VALUE does")
    return replace(windows, fill=_FILLS[mode], fill_values=tuple(values))
