"""A cursor over sqlglot tokens that knows the file, for statement parsers and their errors."""

from __future__ import annotations

import bisect
import difflib
from dataclasses import dataclass
from datetime import timedelta

from sqlglot.tokens import Token, TokenType

from cq_engine.durations import IOTDB_UNITS, parse_duration
from cq_engine.errors import CQError, ParseError


@dataclass(frozen=True)
class SourceText:
    """A file's text with offset → line/col mapping."""

    text: str
    file: str

    def __post_init__(self) -> None:
        starts = [0] + [i + 1 for i, ch in enumerate(self.text) if ch == "\n"]
        object.__setattr__(self, "_line_starts", starts)

    def line_col(self, offset: int) -> tuple[int, int]:
        starts = self._line_starts  # type: ignore[attr-defined]
        line = bisect.bisect_right(starts, offset) - 1
        return line + 1, offset - starts[line] + 1

    def error(self, offset: int, message: str) -> ParseError:
        line, col = self.line_col(offset)
        return ParseError(message, file=self.file, line=line, col=col)


class Cursor:
    """Walks the tokens of one statement; ``end`` is the offset just after the statement."""

    def __init__(self, source: SourceText, tokens: list[Token], *, end: int):
        self.source, self.tokens, self.pos, self.end = source, tokens, 0, end

    # -- looking -------------------------------------------------------------------------------
    def peek(self, ahead: int = 0) -> Token | None:
        i = self.pos + ahead
        return self.tokens[i] if i < len(self.tokens) else None

    def at_type(self, token_type: TokenType, *, ahead: int = 0) -> bool:
        """True if there is a next token (``ahead`` further) and it is of this type."""
        tok = self.peek(ahead)
        return tok is not None and tok.token_type == token_type

    def at_end(self) -> bool:
        return self.pos >= len(self.tokens)

    def is_word(self, *words: str, ahead: int = 0) -> bool:
        """True if the next tokens are these keywords (case-insensitive, any token type)."""
        for i, word in enumerate(words):
            tok = self.peek(ahead + i)
            if tok is None or tok.text.upper() != word:
                return False
        return True

    # -- consuming -----------------------------------------------------------------------------
    def advance(self) -> Token:
        tok = self.peek()
        if tok is None:
            raise self.source.error(self.end, "unexpected end of statement")
        self.pos += 1
        return tok

    def match(self, *words: str) -> bool:
        if self.is_word(*words):
            self.pos += len(words)
            return True
        return False

    def expect(self, *words: str, what: str | None = None) -> Token:
        first = self.peek()
        if not self.match(*words):
            raise self.unexpected(f"expected {what or ' '.join(words)}")
        assert first is not None  # the words matched
        return first

    def identifier(self, what: str) -> Token:
        tok = self.peek()
        if tok is None or tok.token_type in _NOT_NAMES or not _is_name(tok.text):
            raise self.unexpected(f"expected {what}")
        self.pos += 1
        return tok

    def word(self, what: str) -> tuple[str, Token]:
        """Raw text of the next run of tokens with no space between them (``20s``, ``1d1h``,
        ``2021-05-11T22:18:40+08:00``), and its first token."""
        first = self.advance() if not self.at_end() else None
        if first is None:
            raise self.source.error(self.end, f"expected {what}")
        last = first
        while (
            (nxt := self.peek()) is not None
            and nxt.start == last.end + 1
            and nxt.token_type not in (TokenType.COMMA, TokenType.L_PAREN, TokenType.R_PAREN, TokenType.SEMICOLON)
        ):
            last = self.advance()
        return self.source.text[first.start : last.end + 1], first

    def table_name(self, what: str) -> Token:
        """``[db.]name``: the name's token (a database prefix is dropped)."""
        tok = self.identifier(what)
        if self.at_type(TokenType.DOT):
            self.advance()
            tok = self.identifier(what)
        return tok

    def duration(
        self, what: str, *, units: dict[str, int] = IOTDB_UNITS, positive: bool = True
    ) -> tuple[timedelta, Token]:
        """A duration literal (``20s``, ``1h30m``); errors point at it and quote it."""
        text, tok = self.word(what)
        try:
            value = parse_duration(text, units=units, what=what)
        except CQError as exc:
            raise self.error_at(tok, str(exc)) from None
        if positive and value <= timedelta(0):
            raise self.error_at(tok, f"{what} must be greater than 0, got {text!r}")
        return value, tok

    def group(self) -> tuple[Token, list[Token], Token]:
        """Consume a parenthesised group: its ``(``, the tokens inside it and its ``)``."""
        first = self.pos
        self.balanced()
        return self.tokens[first], self.tokens[first + 1 : self.pos - 1], self.tokens[self.pos - 1]

    def sub(self, tokens: list[Token], end: int) -> Cursor:
        """A cursor over some of this statement's tokens; ``end`` is where running out is reported."""
        return Cursor(self.source, tokens, end=end)

    def balanced(self) -> tuple[int, int]:
        """Consume a parenthesised group starting at ``(``; returns the offsets inside it."""
        open_tok = self.expect("(")
        depth = 1
        while depth:
            tok = self.advance()
            if tok.token_type in (TokenType.L_PAREN,):
                depth += 1
            elif tok.token_type == TokenType.R_PAREN:
                depth -= 1
        return open_tok.end + 1, tok.start

    # -- errors --------------------------------------------------------------------------------
    def error_at(self, tok: Token | None, message: str) -> ParseError:
        return self.source.error(tok.start if tok is not None else self.end, message)

    def unexpected(self, message: str) -> ParseError:
        tok = self.peek()
        found = f"found {tok.text!r}{suggest(tok.text)}" if tok is not None else "found the end of the statement"
        return self.error_at(tok, f"{message}, {found}")


# Keywords of the three dialects' statements, for "did you mean ...?" on a misspelled one.
KEYWORDS = (
    "SELECT",
    "FROM",
    "WHERE",
    "GROUP",
    "BY",
    "HAVING",
    "ORDER",
    "LIMIT",
    "OFFSET",
    "INTO",
    "FILL",
    "ALIGN",
    "DEVICE",
    "PARTITION",
    "INTERVAL",
    "SLIDING",
    "SESSION",
    "STATE_WINDOW",
    "EVENT_WINDOW",
    "COUNT_WINDOW",
    "PERIOD",
    "TRIGGER",
    "WATERMARK",
    "OPTIONS",
    "NOTIFY",
    "TAGS",
    "BEGIN",
    "END",
    "RESAMPLE",
    "EVERY",
    "BOUNDARY",
    "RANGE",
    "TIMEOUT",
    "POLICY",
    "CREATE",
    "CONTINUOUS",
    "QUERY",
    "STREAM",
    "RULE",
    "TABLE",
    "WITH",
    "FILTER",
    "OVER",
    "WHEN",
    "BEFORE",
    "AFTER",
    "INSERT",
    "TUMBLINGWINDOW",
    "HOPPINGWINDOW",
    "SLIDINGWINDOW",
    "SESSIONWINDOW",
    "COUNTWINDOW",
)


def suggest(word: str) -> str:
    """`` (did you mean GROUP?)`` when ``word`` looks like a misspelled keyword, else ``''``."""
    upper = word.upper()
    if not upper.replace("_", "A").isalpha() or upper in KEYWORDS or len(upper) < 3:
        return ""
    match = difflib.get_close_matches(upper, KEYWORDS, n=1, cutoff=0.75)
    return f" (did you mean {match[0]}?)" if match else ""


_NOT_NAMES = {
    TokenType.STRING,
    TokenType.NUMBER,
    TokenType.L_PAREN,
    TokenType.R_PAREN,
    TokenType.COMMA,
    TokenType.SEMICOLON,
}


def _is_name(text: str) -> bool:
    return text.replace("_", "a").isalnum() and not text[0].isdigit()


def split_top(tokens: list[Token], separator: TokenType = TokenType.COMMA) -> list[list[Token]]:
    """Split tokens on ``separator`` outside parentheses (one empty part for no tokens)."""
    parts: list[list[Token]] = [[]]
    depth = 0
    for tok in tokens:
        if tok.token_type in (TokenType.L_PAREN, TokenType.L_BRACKET):
            depth += 1
        elif tok.token_type in (TokenType.R_PAREN, TokenType.R_BRACKET):
            depth -= 1
        if tok.token_type == separator and depth == 0:
            parts.append([])
        else:
            parts[-1].append(tok)
    return parts


def split_statements(source: SourceText, tokens: list[Token]) -> list[tuple[list[Token], int]]:
    """Split a file's tokens on top-level ``;``; returns (tokens, end offset) per statement."""
    out: list[tuple[list[Token], int]] = []
    current: list[Token] = []
    depth = 0
    for tok in tokens:
        if tok.token_type == TokenType.SEMICOLON and depth == 0:
            if current:
                out.append((current, tok.start))
            current = []
            continue
        if tok.token_type == TokenType.L_PAREN:
            depth += 1
        elif tok.token_type == TokenType.R_PAREN:
            depth = max(0, depth - 1)
        current.append(tok)
    if current:
        out.append((current, len(source.text)))
    return out
