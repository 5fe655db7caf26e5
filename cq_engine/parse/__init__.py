"""parse: ``.sql`` text → frozen IR. Statement parsers are looked up by their leading keywords."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from pathlib import Path

from sqlglot.errors import TokenError
from sqlglot.tokens import Token, Tokenizer, TokenType

from cq_engine.errors import CQError, ParseError
from cq_engine.model import ContinuousQuery, Stream, TableDecl, TriggerDef
from cq_engine.names import name_problem, shorten
from cq_engine.parse.cursor import Cursor, SourceText, split_statements
from cq_engine.parse.directives import apply_directives
from cq_engine.parse.ekuiper import parse_rule
from cq_engine.parse.iotdb import parse_continuous_query
from cq_engine.parse.options import ParseOptions
from cq_engine.parse.tables import parse_create_table
from cq_engine.parse.tdengine.statement import parse_create_stream
from cq_engine.parse.triggers import parse_create_trigger

Statement = ContinuousQuery | Stream | TableDecl | TriggerDef
StatementParser = Callable[[Cursor, ParseOptions, Token], Statement]

# Leading keywords → parser; the longest match wins. Dialects add entries here.
STATEMENT_PARSERS: dict[tuple[str, ...], StatementParser] = {
    ("CREATE", "CONTINUOUS", "QUERY"): parse_continuous_query,
    ("CREATE", "CQ"): parse_continuous_query,
    ("CREATE", "STREAM"): parse_create_stream,
    ("CREATE", "RULE"): parse_rule,
    ("CREATE", "TABLE"): parse_create_table,
    # IoTDB triggers: [STATELESS | STATEFUL] is optional (default STATELESS).
    ("CREATE", "TRIGGER"): parse_create_trigger,
    ("CREATE", "STATELESS", "TRIGGER"): parse_create_trigger,
    ("CREATE", "STATEFUL", "TRIGGER"): parse_create_trigger,
}

# Commands that act on running state belong to the CLI, not to definition files.
COMMANDS = {
    ("DROP", "TRIGGER"): "cq drop NAME",
    ("SHOW", "TRIGGERS"): "cq triggers",
    ("DROP",): "cq drop",
    ("SHOW",): "cq show",
    ("RECALCULATE",): "cq recalculate",
    ("START",): "cq start",
    ("STOP",): "cq stop",
    ("PAUSE",): "cq pause",
    ("RESUME",): "cq resume",
}


def parse_text(text: str, *, file: str = "<string>", options: ParseOptions | None = None) -> list[Statement]:
    """Parse every statement of one file; the first error raises ``ParseError`` (file:line:col)."""
    opts = options or ParseOptions()
    source = SourceText(text, file)
    try:
        tokens = Tokenizer().tokenize(text)
    except TokenError as exc:
        # sqlglot's cause names where an unclosed quote starts: "Missing ' from <line>:<offset>".
        missing = re.match(r"Missing (.+) from \d+:(\d+)$", str(exc.__cause__ or ""))
        if missing and int(missing[2]) < len(text):
            raise source.error(
                int(missing[2]),
                f"unclosed {missing[1]}: the text runs to the end of the file without its closing quote",
            ) from None
        raise source.error(len(text.rstrip()), f"cannot tokenize: {str(exc)[:200]}") from None
    statements = []
    for stmt_tokens, end in split_statements(source, tokens):
        cur = Cursor(source, stmt_tokens, end=end)
        try:
            statements.append(_parse_statement(cur, opts))
        except RecursionError:  # the nesting limit should prevent it; never a traceback if not
            raise cur.error_at(stmt_tokens[0], "the statement is nested too deeply to parse") from None
    return statements


def _parse_statement(cur: Cursor, opts: ParseOptions) -> Statement:
    start = cur.peek()
    if start is None:
        raise cur.source.error(cur.end, "empty statement")
    _check_tokens(cur)
    for words in sorted(STATEMENT_PARSERS, key=len, reverse=True):
        if cur.match(*words):
            statement = STATEMENT_PARSERS[words](cur, opts, start)
            _check_names(cur, statement)
            return apply_directives(cur, start, statement)
    for words, command in COMMANDS.items():
        if cur.is_word(*words):
            raise cur.error_at(start, f"{' '.join(words)} is a command, not a definition: use `{command}`")
    raise cur.error_at(
        start,
        f"unknown statement starting with {start.text!r} "
        "(expected CREATE CONTINUOUS QUERY, CREATE CQ, CREATE STREAM, CREATE RULE, CREATE TABLE "
        "or CREATE TRIGGER)",
    )


# Names that become paths (tables, definitions, triggers); columns only need printable identifiers.
_NAME_FIELDS = ("name", "alias", "source", "sink", "trigger_table")


def _check_names(cur: Cursor, statement: Statement) -> None:
    """The name rule (``cq_engine.names``) for every name a statement declares or reads, whatever
    the dialect or quoting; the error points at the name where it is written."""
    for field in _NAME_FIELDS:
        name = getattr(statement, field, None)
        if not name or (problem := name_problem(name)) is None:
            continue
        tok = next((t for t in cur.tokens if t.text == name), cur.tokens[0])
        raise cur.error_at(tok, f"bad {field.replace('_', ' ')} {shorten(name)!r}: {problem}")


# Parentheses nested deeper than this are refused: sqlglot parses recursively (about 50 levels exhaust
# Python's stack), and no definition needs more.
MAX_NESTING = 20
MAX_NUMBER_DIGITS = 30


def _check_tokens(cur: Cursor) -> None:
    """Before any statement parser runs: no identifier (quoted ones included) holds control or bidi
    characters, which hide what the text says; no absurdly long number; no deep nesting."""
    depth = 0
    for tok in cur.tokens:
        if tok.token_type in (TokenType.L_PAREN, TokenType.L_BRACKET):
            depth += 1
            if depth > MAX_NESTING:
                raise cur.error_at(tok, f"parentheses nested deeper than {MAX_NESTING} levels")
        elif tok.token_type in (TokenType.R_PAREN, TokenType.R_BRACKET):
            depth = max(0, depth - 1)
        elif tok.token_type == TokenType.NUMBER and len(tok.text) > MAX_NUMBER_DIGITS:
            raise cur.error_at(tok, f"number {tok.text[:40]!r}... has more than {MAX_NUMBER_DIGITS} digits")
        if "STRING" in tok.token_type.name:  # a string's text is data (a URL, a message)
            continue
        bad = next((ch for ch in tok.text if unicodedata.category(ch) in ("Cc", "Cf")), None)
        if bad is not None:
            raise cur.error_at(tok, f"identifier {tok.text!r} holds the control character U+{ord(bad):04X}")


def parse_file(path: str | Path, *, options: ParseOptions | None = None) -> list[Statement]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ParseError(f"cannot read file: {exc}", file=str(path)) from None
    return parse_text(text, file=str(path), options=options)


def sql_files(path: str | Path) -> list[Path]:
    """The ``.sql`` files of a directory (recursively, sorted), or the file itself."""
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise CQError(f"{p}: no such file or directory")
    return sorted(p.rglob("*.sql"))


__all__ = ["STATEMENT_PARSERS", "ParseOptions", "parse_file", "parse_text", "sql_files"]
