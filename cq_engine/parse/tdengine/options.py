"""``CREATE STREAM`` options (new ``OPTIONS(...)`` and the old form's clauses), column lists, TAGS."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from sqlglot.tokens import Token, TokenType

from cq_engine.durations import TDENGINE_UNITS
from cq_engine.errors import CQError
from cq_engine.model import EventType, SlidingTrigger, StreamOptions, TagDecl, WindowTrigger
from cq_engine.parse.cursor import Cursor, split_top
from cq_engine.parse.fragments import to_spark
from cq_engine.parse.options import ParseOptions
from cq_engine.parse.tables import column_type
from cq_engine.parse.tdengine.query import Scope
from cq_engine.parse.tdengine.triggers import PERIOD_UNITS
from cq_engine.times import parse_time

EVENT_TYPES: tuple[EventType, ...] = ("WINDOW_OPEN", "WINDOW_CLOSE")
OPTION_NAMES = (
    "WATERMARK",
    "EXPIRED_TIME",
    "IGNORE_DISORDER",
    "DELETE_RECALC",
    "DELETE_OUTPUT_TABLE",
    "FILL_HISTORY",
    "FILL_HISTORY_FIRST",
    "CALC_NOTIFY_ONLY",
    "LOW_LATENCY_CALC",
    "PRE_FILTER",
    "FORCE_OUTPUT",
    "MAX_DELAY",
    "EVENT_TYPE",
)
_FLAGS = {
    "IGNORE_DISORDER": "ignore_disorder",
    "DELETE_RECALC": "delete_recalc",
    "DELETE_OUTPUT_TABLE": "delete_output_table",
    "CALC_NOTIFY_ONLY": "calc_notify_only",
    "LOW_LATENCY_CALC": "low_latency_calc",
    "FORCE_OUTPUT": "force_output",
}
_OPTIONAL_ARGUMENT = ("FILL_HISTORY", "FILL_HISTORY_FIRST")


def _paren_args(cur: Cursor, rest: list[Token], name: str) -> list[Token] | None:
    """``(…)`` following an option's name as its inner tokens; None when there is none."""
    if not rest:
        return None
    sub = cur.sub(rest, rest[-1].end + 1)
    if rest[0].token_type != TokenType.L_PAREN:
        raise sub.unexpected(f"expected '(' or '|' after {name}")
    _, inner, _ = sub.group()
    if not sub.at_end():
        raise sub.unexpected(f"expected '|' or ')' after {name}(...)")
    return inner


def _one_duration(cur: Cursor, toks: list[Token], what: str, *, units=TDENGINE_UNITS, positive=True) -> timedelta:
    sub = cur.sub(toks, toks[-1].end + 1)
    value, _ = sub.duration(what, units=units, positive=positive)
    if not sub.at_end():
        raise sub.unexpected(f"expected one duration for {what}")
    return value


def _start_time(cur: Cursor, toks: list[Token], name: str, opts: ParseOptions):
    tok = toks[0]
    if len(toks) != 1 or tok.token_type not in (TokenType.STRING, TokenType.NUMBER):
        raise cur.error_at(tok, f"{name}(start_time) takes a quoted time or epoch milliseconds")
    try:
        return parse_time(tok.text, tz=opts.tz, what=f"{name} start time")
    except CQError as exc:
        raise cur.error_at(tok, str(exc)) from None


def event_types(cur: Cursor, keyword: Token, separator: TokenType) -> tuple[EventType, ...]:
    """``(WINDOW_OPEN|WINDOW_CLOSE)`` (new form) or ``('WINDOW_OPEN', 'WINDOW_CLOSE')`` (old form)."""
    if not cur.at_type(TokenType.L_PAREN):
        raise cur.unexpected(f"expected ({' | '.join(EVENT_TYPES)}) after {keyword.text.upper()}")
    open_tok, inner, _ = cur.group()
    sep = "|" if separator == TokenType.PIPE else ","
    seen: list[str] = []
    for part in split_top(inner, separator):
        tok = part[0] if part else open_tok
        value = tok.text.upper()
        if len(part) != 1 or value not in EVENT_TYPES:
            raise cur.error_at(tok, f"expected WINDOW_OPEN or WINDOW_CLOSE separated by '{sep}'")
        if value in seen:
            raise cur.error_at(tok, f"{value} given twice")
        seen.append(value)
    return tuple(e for e in EVENT_TYPES if e in seen)


def parse_options(cur: Cursor, scope: Scope, opts: ParseOptions) -> tuple[StreamOptions, dict[str, Token]]:
    """The new form's ``OPTIONS(opt | opt ...)``; each option at most once."""
    keyword = cur.advance()
    if not cur.at_type(TokenType.L_PAREN):
        raise cur.unexpected("expected '(' after OPTIONS")
    _, inner, close = cur.group()
    fields: dict = {}
    seen: dict[str, Token] = {}
    ignored = scope.family in ("sliding", "period")  # seed 000: MAX_DELAY, EVENT_TYPE do not apply there
    for part in split_top(inner, TokenType.PIPE):
        if not part:
            raise cur.error_at(close if not inner else keyword, "empty option in OPTIONS(...)")
        tok, name = part[0], part[0].text.upper()
        if name not in OPTION_NAMES:
            raise cur.error_at(tok, f"unknown stream option {tok.text!r} (known: {', '.join(OPTION_NAMES)})")
        if name in seen:
            raise cur.error_at(tok, f"{name} given twice")
        seen[name] = tok
        args = _paren_args(cur, part[1:], name)
        if name in _FLAGS:
            if args is not None:
                raise cur.error_at(part[1], f"{name} takes no argument")
            fields[_FLAGS[name]] = True
            continue
        if args is not None and not args:
            raise cur.error_at(part[1], f"{name}() needs an argument")
        if name in _OPTIONAL_ARGUMENT:
            other = "FILL_HISTORY_FIRST" if name == "FILL_HISTORY" else "FILL_HISTORY"
            if other in seen:
                raise cur.error_at(tok, f"{name} cannot be used with {other}")
            if scope.family == "period":
                raise cur.error_at(tok, f"{name} cannot be used with a PERIOD trigger: it computes no history")
            fields[name.lower()] = True
            if args is not None:
                fields["history_start"] = _start_time(cur, args, name, opts)
            continue
        if args is None:
            raise cur.error_at(tok, f"{name} needs an argument: {name}(...)")
        if name == "WATERMARK":
            fields["watermark"] = _one_duration(cur, args, name, positive=False)
        elif name == "EXPIRED_TIME":
            fields["expired_time"] = _one_duration(cur, args, name, units=PERIOD_UNITS)
        elif name == "PRE_FILTER":
            fields["pre_filter"] = scope.condition(args, "PRE_FILTER", tok)
        elif name == "MAX_DELAY":
            delay = _one_duration(cur, args, name, units=PERIOD_UNITS)
            if not ignored:
                fields.update(max_delay=delay, trigger_mode="max_delay")
        else:
            sub = cur.sub(part[1:], part[-1].end + 1)
            events = event_types(sub, tok, TokenType.PIPE)
            if not ignored:
                fields["event_types"] = events
    return StreamOptions(**fields), seen


# --- the old form's clauses -----------------------------------------------------------------------

OLD_OPTIONS = ("TRIGGER", "WATERMARK", "IGNORE EXPIRED", "IGNORE UPDATE", "DELETE_MARK", "FILL_HISTORY")
_MODES = ("AT_ONCE", "WINDOW_CLOSE", "MAX_DELAY", "FORCE_WINDOW_CLOSE", "CONTINUOUS_WINDOW_CLOSE")


@dataclass
class OldOptions:
    """The old form's options as written: values, and the token of each one given."""

    fields: dict = field(default_factory=dict)
    flags: dict = field(default_factory=lambda: {"IGNORE EXPIRED": 1, "IGNORE UPDATE": 1, "FILL_HISTORY": 0})
    tokens: dict = field(default_factory=dict)
    mode: str = "WINDOW_CLOSE"


def zero_one(cur: Cursor, name: str) -> int:
    tok = cur.peek()
    if tok is None or tok.text not in ("0", "1"):
        raise cur.unexpected(f"{name} takes 0 or 1")
    cur.advance()
    return int(tok.text)


def parse_old_options(cur: Cursor) -> OldOptions:
    """``TRIGGER ... | WATERMARK t | IGNORE EXPIRED 0|1 | IGNORE UPDATE 0|1 | DELETE_MARK t | FILL_HISTORY 0|1``,
    in any order, each once."""
    old = OldOptions()
    while True:
        name = next((o for o in OLD_OPTIONS if cur.is_word(*o.split())), None)
        if name is None:
            return old
        tok = cur.peek()
        if name in old.tokens:
            raise cur.error_at(tok, f"{name} given twice")
        old.tokens[name] = tok
        cur.match(*name.split())
        if name == "TRIGGER":
            mode_tok = cur.peek()
            mode = mode_tok.text.upper() if mode_tok is not None else ""
            if mode not in _MODES:
                raise cur.unexpected(f"TRIGGER takes {', '.join(_MODES)}")
            cur.advance()
            old.mode, old.tokens["mode"] = mode, mode_tok
            old.fields["trigger_mode"] = mode.lower()
            if mode == "MAX_DELAY":
                delay, dtok = cur.duration("MAX_DELAY", units=TDENGINE_UNITS)
                if delay < timedelta(seconds=5):
                    raise cur.error_at(dtok, "MAX_DELAY must be at least 5s")
                old.fields["max_delay"] = delay
            elif mode == "CONTINUOUS_WINDOW_CLOSE":
                every = timedelta(minutes=60)
                if cur.at_type(TokenType.NUMBER):
                    every, _ = cur.duration("CONTINUOUS_WINDOW_CLOSE recalculation period", units=TDENGINE_UNITS)
                old.fields["recalc_every"] = every
        elif name == "WATERMARK":
            old.fields["watermark"], _ = cur.duration("WATERMARK", units=TDENGINE_UNITS, positive=False)
        elif name == "DELETE_MARK":
            old.fields["delete_mark"], _ = cur.duration("DELETE_MARK", units=TDENGINE_UNITS)
        else:
            old.flags[name] = zero_one(cur, name)
            if name == "FILL_HISTORY" and old.flags[name] == 1:
                cur.match("ASYNC")  # seed 000: only makes CREATE return early in TDengine; nothing to do here


def old_stream_options(cur: Cursor, old: OldOptions, trigger: WindowTrigger, label: str) -> StreamOptions:
    """Map the old form's options onto ``StreamOptions`` and check the trigger modes' limits."""
    interval = isinstance(trigger, SlidingTrigger) and trigger.interval is not None
    mode_tok = old.tokens.get("mode")
    if old.mode == "FORCE_WINDOW_CLOSE":
        if not isinstance(trigger, SlidingTrigger) or not interval or trigger.sliding != trigger.interval:
            this = "a SLIDING different from the INTERVAL" if interval else label
            raise cur.error_at(
                mode_tok,
                f"TRIGGER FORCE_WINDOW_CLOSE only supports INTERVAL windows without a different SLIDING, not {this}",
            )
        for name, needed in (("FILL_HISTORY", 0), ("IGNORE EXPIRED", 1), ("IGNORE UPDATE", 1)):
            if old.flags[name] != needed:
                raise cur.error_at(
                    old.tokens[name],
                    f"{name} {old.flags[name]} cannot be used with TRIGGER "
                    "FORCE_WINDOW_CLOSE (it needs FILL_HISTORY 0, IGNORE EXPIRED 1 "
                    "and IGNORE UPDATE 1)",
                )
    if old.mode == "CONTINUOUS_WINDOW_CLOSE" and not interval:
        raise cur.error_at(mode_tok, f"TRIGGER CONTINUOUS_WINDOW_CLOSE only supports INTERVAL windows, not {label}")
    # IGNORE UPDATE: seed 000 says its default is 1, seed 002 says 0; seed 000 (the newer reference) wins.
    return StreamOptions(
        ignore_disorder=old.flags["IGNORE EXPIRED"] == 1,
        delete_recalc=old.flags["IGNORE UPDATE"] == 0,
        fill_history=old.flags["FILL_HISTORY"] == 1,
        **old.fields,
    )


# --- INTO's column list and TAGS ------------------------------------------------------------------


def parse_column_list(cur: Cursor) -> tuple[tuple[str, ...], Token]:
    open_tok, inner, close = cur.group()
    names: list[str] = []
    for part in split_top(inner):
        sub = cur.sub(part, part[-1].end + 1 if part else close.start)
        tok = sub.identifier("a column name")
        if sub.is_word("PRIMARY KEY"):
            raise sub.error_at(sub.peek(), "PRIMARY KEY in a stream's column list (a composite key) is not supported")
        if not sub.at_end():
            raise sub.unexpected("expected ',' or ')' in the column list")
        if tok.text.lower() in (n.lower() for n in names):
            raise cur.error_at(tok, f"column {tok.text!r} is listed twice")
        names.append(tok.text)
    return tuple(names), open_tok


def parse_tags(cur: Cursor, scope: Scope) -> tuple[tuple[TagDecl, ...], Token]:
    """New form: ``TAGS (name type [COMMENT 'x'] AS expr, ...)``; old form: without ``AS expr``."""
    keyword = cur.advance()
    if not cur.at_type(TokenType.L_PAREN):
        raise cur.unexpected("expected '(' after TAGS")
    _, inner, close = cur.group()
    tags: list[TagDecl] = []
    for part in split_top(inner):
        sub = cur.sub(part, part[-1].end + 1 if part else close.start)
        name = sub.identifier("a tag name")
        if name.text.lower() in (t.name.lower() for t in tags):
            raise sub.error_at(name, f"tag {name.text!r} is declared twice")
        ttype = column_type(sub)
        comment = sub.advance().text if sub.match("COMMENT") else None
        expression = None
        if scope.form == "new":
            as_tok = sub.expect("AS", what="AS expr (the tag's value)")
            expression = to_spark(scope.expression(sub.tokens[sub.pos :], "TAGS", as_tok))
        elif not sub.at_end():
            raise sub.unexpected("expected ',' or ')' (the old form's TAGS take no AS expr)")
        tags.append(TagDecl(name=name.text, type=ttype, expression=expression, comment=comment))
    return tuple(tags), keyword


def parse_subtable(cur: Cursor, scope: Scope) -> str:
    """``OUTPUT_SUBTABLE(expr)`` / the old form's ``SUBTABLE(expr)``."""
    keyword = cur.advance()
    if not cur.at_type(TokenType.L_PAREN):
        raise cur.unexpected(f"expected '(' after {keyword.text.upper()}")
    _, inner, _ = cur.group()
    return to_spark(scope.expression(inner, keyword.text.upper(), keyword))
