"""Triggers of ``CREATE STREAM``: the new form's ``trigger_type`` and the old form's window clause."""

from __future__ import annotations

from datetime import timedelta

from sqlglot.tokens import Token, TokenType

from cq_engine.durations import TDENGINE_UNITS
from cq_engine.model import (
    PLACEHOLDERS,
    CountTrigger,
    EventTrigger,
    PeriodTrigger,
    SessionTrigger,
    SlidingTrigger,
    StateTrigger,
    WindowTrigger,
)
from cq_engine.parse.cursor import Cursor, split_top
from cq_engine.parse.fragments import is_aggregate, to_spark
from cq_engine.parse.tdengine.query import Scope

PERIOD_UNITS = {u: TDENGINE_UNITS[u] for u in "asmhd"}  # a s m h d, as seed 000 lists them
OFFSET_UNITS = {u: TDENGINE_UNITS[u] for u in "asmh"}
NEW_TRIGGERS = ("PERIOD", "INTERVAL", "SLIDING", "SESSION", "STATE_WINDOW", "EVENT_WINDOW", "COUNT_WINDOW")

_PERIOD_MIN, _PERIOD_MAX = timedelta(milliseconds=10), timedelta(days=3650)
_COUNT_MAX = 2147483647


def _args(cur: Cursor, keyword: Token, usage: str, *, most: int | None) -> tuple[list[list[Token]], Token]:
    """The comma-separated arguments of ``keyword(...)`` and its ``)``."""
    if not cur.at_type(TokenType.L_PAREN):
        raise cur.unexpected(f"expected {usage}")
    _, inner, close = cur.group()
    parts = split_top(inner)
    if any(not p for p in parts) or (most is not None and len(parts) > most):
        raise cur.error_at(keyword, f"expected {usage}")
    return parts, close


def _duration(
    cur: Cursor, part: list[Token], close: Token, what: str, *, units=TDENGINE_UNITS, positive: bool = True
) -> tuple[timedelta, Token]:
    sub = cur.sub(part, close.start)
    value, tok = sub.duration(what, units=units, positive=positive)
    if not sub.at_end():
        raise sub.unexpected(f"expected one duration for {what}")
    return value, tok


def _integer(cur: Cursor, part: list[Token], what: str, low: int, high: int) -> int:
    tok = part[0]
    if len(part) != 1 or not tok.text.isdigit():
        raise cur.error_at(tok, f"{what} must be an integer, got {cur.source.text[tok.start : part[-1].end + 1]!r}")
    value = int(tok.text)
    if not low <= value <= high:
        raise cur.error_at(tok, f"{what} must be between {low} and {high}, got {value}")
    return value


def _column_name(cur: Cursor, part: list[Token], what: str) -> str:
    tok = part[0]
    if (
        len(part) != 1
        or tok.token_type in (TokenType.STRING, TokenType.NUMBER)
        or not tok.text.replace("_", "a").isalnum()
    ):
        raise cur.error_at(tok, f"expected {what} (a column name)")
    if tok.text.lower() in PLACEHOLDERS:
        raise cur.error_at(
            tok, f"{tok.text} is a placeholder, not a column: placeholders can only be used in SELECT and WHERE"
        )
    return tok.text


def true_for(cur: Cursor, scope: Scope) -> timedelta | None:
    if not cur.is_word("TRUE_FOR"):
        return None
    keyword = cur.advance()
    if scope.form == "old":
        raise cur.error_at(keyword, "TRUE_FOR belongs to the new form's STATE_WINDOW/EVENT_WINDOW triggers")
    parts, close = _args(cur, keyword, "TRUE_FOR(duration)", most=1)
    return _duration(cur, parts[0], close, "TRUE_FOR")[0]


def event_window(cur: Cursor, scope: Scope, toks: list[Token], at: Token) -> EventTrigger:
    """``START WITH c1 END WITH c2``."""
    usage = "EVENT_WINDOW START WITH condition END WITH condition"
    if len(toks) < 2 or [t.text.upper() for t in toks[:2]] != ["START", "WITH"]:
        raise cur.error_at(toks[0] if toks else at, f"expected {usage}")
    depth, cases, split = 0, 0, None
    for i, tok in enumerate(toks[2:], start=2):
        if tok.token_type == TokenType.L_PAREN:
            depth += 1
        elif tok.token_type == TokenType.R_PAREN:
            depth -= 1
        elif tok.token_type == TokenType.CASE:
            cases += 1
        elif tok.token_type == TokenType.END and cases:
            cases -= 1
        elif (
            tok.token_type == TokenType.END and depth == 0 and i + 1 < len(toks) and toks[i + 1].text.upper() == "WITH"
        ):
            split = i
            break
    if split is None:
        raise cur.error_at(at, f"expected {usage}: END WITH is missing")
    start = scope.condition(toks[2:split], "EVENT_WINDOW", toks[1])
    end = scope.condition(toks[split + 2 :], "EVENT_WINDOW", toks[split + 1])
    return EventTrigger(start=start, end=end)


def state_window(cur: Cursor, scope: Scope, keyword: Token) -> StateTrigger:
    parts, _ = _args(cur, keyword, "STATE_WINDOW(column)", most=1)
    node = scope.expression(parts[0], "STATE_WINDOW", keyword)
    if is_aggregate(node):
        raise cur.error_at(parts[0][0], "aggregates are not allowed in STATE_WINDOW")
    return StateTrigger(column=to_spark(node))


def count_window(cur: Cursor, scope: Scope, keyword: Token) -> CountTrigger:
    new = scope.form == "new"
    usage = "COUNT_WINDOW(count[, sliding][, column, ...])" if new else "COUNT_WINDOW(count[, sliding])"
    parts, _ = _args(cur, keyword, usage, most=None if new else 2)
    count = _integer(cur, parts[0], "COUNT_WINDOW count", 2, _COUNT_MAX)
    rest = parts[1:]
    slide = count
    if rest and rest[0][0].token_type == TokenType.NUMBER:
        slide = _integer(cur, rest[0], "COUNT_WINDOW sliding", 1, count)
        rest = rest[1:]
    columns = tuple(_column_name(cur, p, "a COUNT_WINDOW column") for p in rest)
    return CountTrigger(count=count, slide=slide, columns=columns)


def session_window(cur: Cursor, keyword: Token) -> SessionTrigger:
    parts, close = _args(cur, keyword, "SESSION(ts_column, gap)", most=2)
    if len(parts) != 2:
        raise cur.error_at(keyword, "expected SESSION(ts_column, gap)")
    ts_column = _column_name(cur, parts[0], "the time column of SESSION(ts_column, gap)")
    gap, _ = _duration(cur, parts[1], close, "SESSION gap")
    return SessionTrigger(gap=gap, ts_column=ts_column)


def _interval(cur: Cursor, keyword: Token) -> tuple[timedelta, timedelta, Token]:
    parts, close = _args(cur, keyword, "INTERVAL(interval[, offset])", most=2)
    interval, itok = _duration(cur, parts[0], close, "INTERVAL")
    offset = timedelta(0)
    if len(parts) == 2:
        offset, otok = _duration(cur, parts[1], close, "INTERVAL offset", positive=False)
        if offset >= interval:
            raise cur.error_at(
                otok,
                f"the INTERVAL offset must be smaller than the interval "
                f"{cur.source.text[itok.start : parts[0][-1].end + 1]}",
            )
    return interval, offset, itok


def interval_sliding(cur: Cursor, keyword: Token) -> tuple[timedelta, timedelta, timedelta]:
    """``INTERVAL(i[, offset]) [SLIDING(s)]`` after the INTERVAL keyword: (i, offset, s); s is i without
    SLIDING (the old form's window clause, a new-form query's sub-windows)."""
    interval, offset, _ = _interval(cur, keyword)
    sliding = interval
    if cur.is_word("SLIDING"):
        skw = cur.advance()
        parts, close = _args(cur, skw, "SLIDING(sliding)", most=1)
        sliding, stok = _duration(cur, parts[0], close, "SLIDING")
        _sliding_within(cur, sliding, stok, interval)
    return interval, offset, sliding


def _sliding_within(cur: Cursor, sliding: timedelta, stok: Token, interval: timedelta) -> None:
    if sliding > interval:
        raise cur.error_at(stok, "SLIDING must not be greater than INTERVAL")


def parse_trigger(cur: Cursor, scope: Scope) -> tuple[WindowTrigger, Token]:
    """The new form's trigger; sets the scope's family (which placeholders are allowed)."""
    keyword = cur.advance()
    word = keyword.text.upper()
    scope.label, scope.family = word, "window"
    trigger: WindowTrigger
    if word == "PERIOD":
        scope.family = "period"
        parts, close = _args(cur, keyword, "PERIOD(period[, offset])", most=2)
        period, ptok = _duration(cur, parts[0], close, "PERIOD", units=PERIOD_UNITS)
        if not _PERIOD_MIN <= period <= _PERIOD_MAX:
            raise cur.error_at(
                ptok,
                f"PERIOD must be between 10a and 3650d, got {cur.source.text[ptok.start : parts[0][-1].end + 1]!r}",
            )
        offset = timedelta(0)
        if len(parts) == 2:
            offset, _ = _duration(cur, parts[1], close, "PERIOD offset", units=OFFSET_UNITS, positive=False)
        trigger = PeriodTrigger(period=period, offset=offset)
    elif word in ("INTERVAL", "SLIDING"):
        interval, ioffset = None, timedelta(0)
        if word == "INTERVAL":
            interval, ioffset, _ = _interval(cur, keyword)
            if not cur.is_word("SLIDING"):
                raise cur.unexpected("expected SLIDING(sliding[, offset]) after INTERVAL(...) in a trigger")
            keyword = cur.advance()
        parts, close = _args(cur, keyword, "SLIDING(sliding[, offset])", most=2)
        sliding, stok = _duration(cur, parts[0], close, "SLIDING")
        offset = timedelta(0)
        if len(parts) == 2:
            offset, _ = _duration(cur, parts[1], close, "SLIDING offset", units=OFFSET_UNITS, positive=False)
        if interval is not None:
            _sliding_within(cur, sliding, stok, interval)
            offset = timedelta(0)  # seed 000: with INTERVAL, the sliding offset has no effect
            scope.interval_window = True
        else:
            scope.family = "sliding"
        trigger = SlidingTrigger(sliding=sliding, interval=interval, interval_offset=ioffset, sliding_offset=offset)
    elif word == "SESSION":
        trigger = session_window(cur, keyword)
    elif word == "STATE_WINDOW":
        state = state_window(cur, scope, keyword)
        trigger = StateTrigger(column=state.column, true_for=true_for(cur, scope))
    elif word == "EVENT_WINDOW":
        if not cur.at_type(TokenType.L_PAREN):
            raise cur.unexpected("expected EVENT_WINDOW(START WITH condition END WITH condition)")
        _, inner, _ = cur.group()
        event = event_window(cur, scope, inner, keyword)
        trigger = EventTrigger(start=event.start, end=event.end, true_for=true_for(cur, scope))
    else:
        trigger = count_window(cur, scope, keyword)
    return trigger, keyword


def parse_window(cur: Cursor, scope: Scope) -> tuple[WindowTrigger, Token]:
    """The old form's window clause (the tokens of the subquery's WINDOW clause)."""
    keyword = cur.advance()
    word = keyword.text.upper()
    scope.label = word
    trigger: WindowTrigger
    if word == "INTERVAL":
        interval, ioffset, sliding = interval_sliding(cur, keyword)
        scope.interval_window = True
        trigger = SlidingTrigger(sliding=sliding, interval=interval, interval_offset=ioffset)
    elif word == "SLIDING":
        raise cur.error_at(keyword, "SLIDING needs INTERVAL(...) before it in the old form's window clause")
    elif word == "SESSION":
        trigger = session_window(cur, keyword)
    elif word == "STATE_WINDOW":
        trigger = state_window(cur, scope, keyword)
        true_for(cur, scope)
    elif word == "EVENT_WINDOW":
        trigger = event_window(cur, scope, cur.tokens[cur.pos :], keyword)
        cur.pos = len(cur.tokens)
    else:
        trigger = count_window(cur, scope, keyword)
    if not cur.at_end():
        raise cur.unexpected("expected NOTIFY or the end of the statement after the window clause")
    return trigger, keyword
