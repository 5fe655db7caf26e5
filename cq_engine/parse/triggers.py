"""``CREATE [STATELESS | STATEFUL] TRIGGER name BEFORE | AFTER INSERT ON pattern AS 'module:Class'
[WITH ("k" = "v", ...)]``: IoTDB's trigger (seed 004) with a Python class and a table pattern."""

from __future__ import annotations

import re
from typing import Literal

from sqlglot.tokens import Token, TokenType

from cq_engine.model import SourceLocation, TriggerDef
from cq_engine.parse.cursor import Cursor
from cq_engine.parse.options import ParseOptions

_PATTERN = re.compile(r"[A-Za-z0-9_*]+")
_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_TARGET = re.compile(rf"({_DOTTED}):([A-Za-z_]\w*)|({_DOTTED})\.([A-Za-z_]\w*)")
_QUOTED = (TokenType.STRING, TokenType.IDENTIFIER)


def parse_create_trigger(cur: Cursor, opts: ParseOptions, start: Token) -> TriggerDef:
    # Reached through CREATE [STATELESS | STATEFUL] TRIGGER: the word before TRIGGER says which.
    stateful = cur.tokens[cur.pos - 2].text.upper() == "STATEFUL"
    name_tok = cur.identifier("a trigger name")
    event_tok = cur.peek()
    if not (cur.match("BEFORE") or cur.match("AFTER")):
        raise cur.unexpected("expected BEFORE INSERT or AFTER INSERT")
    assert event_tok is not None  # BEFORE or AFTER matched
    event: Literal["before", "after"] = "before" if event_tok.text.upper() == "BEFORE" else "after"
    if not cur.match("INSERT"):
        raise cur.unexpected("only INSERT events can fire a trigger: expected INSERT")
    cur.expect("ON", what="ON and a table pattern")
    pattern = _pattern(cur)
    cur.expect("AS", what="AS 'module:Class'")
    target = _target(cur)
    if cur.is_word("USING"):
        raise cur.error_at(
            cur.peek(),
            "USING URI is not supported: the class is imported from CQ_TRIGGER_PATH "
            "(default: the parent of CQ_SQL_DIR) or the installed packages",
        )
    attributes = _attributes(cur) if cur.match("WITH") else ()
    if not cur.at_end():
        raise cur.unexpected("expected WITH (...) or the end of CREATE TRIGGER")
    line, col = cur.source.line_col(start.start)
    return TriggerDef(
        name=name_tok.text,
        stateful=stateful,
        event=event,
        pattern=pattern,
        target=target,
        attributes=attributes,
        location=SourceLocation(cur.source.file, line, col),
        sql=" ".join(cur.source.text[start.start : cur.end].split()),
    )


def _pattern(cur: Cursor) -> str:
    """A table name with ``*`` wildcards (IoTDB's ``**`` means the same), bare or quoted."""
    tok = cur.peek()
    if tok is not None and tok.token_type in _QUOTED:
        text = cur.advance().text
    else:
        text, tok = cur.word("a table pattern")
    if not _PATTERN.fullmatch(text):
        raise cur.error_at(
            tok,
            f"bad table pattern {text!r}: a table name in which * matches any characters "
            "(letters, digits, _ and *; tables have no '.' path)",
        )
    return re.sub(r"\*+", "*", text)


def _target(cur: Cursor) -> str:
    """``'package.module:Class'`` (or IoTDB's ``'package.module.Class'``), normalised to the colon form."""
    tok = cur.peek()
    if tok is None or tok.token_type != TokenType.STRING:
        raise cur.unexpected("expected the trigger class as a string: AS 'package.module:Class'")
    cur.advance()
    match = _TARGET.fullmatch(tok.text.strip())
    if match is None:
        raise cur.error_at(tok, f"bad trigger class {tok.text!r}: expected 'package.module:Class'")
    module, cls = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
    return f"{module}:{cls}"


def _attributes(cur: Cursor) -> tuple[tuple[str, str], ...]:
    """``("k" = "v", ...)``: keys and values quoted either way, or bare words and numbers."""
    cur.expect("(", what="'(' and the trigger's attributes")
    seen: dict[str, Token] = {}
    values = []
    while True:
        key_tok = cur.peek()
        if key_tok is None or key_tok.token_type in (TokenType.COMMA, TokenType.R_PAREN, TokenType.EQ):
            raise cur.unexpected('expected an attribute "key" = "value"')
        cur.advance()
        if key_tok.text in seen:
            raise cur.error_at(key_tok, f"attribute {key_tok.text!r} is given twice")
        seen[key_tok.text] = key_tok
        cur.expect("=", what=f"'=' after attribute {key_tok.text!r}")
        value_tok = cur.peek()
        if value_tok is not None and value_tok.token_type in _QUOTED:
            value = cur.advance().text
        else:
            value, _ = cur.word(f"a value for attribute {key_tok.text!r}")
        values.append((key_tok.text, value))
        if cur.match(","):
            continue
        cur.expect(")", what="',' or ')'")
        return tuple(values)
