"""``CREATE TABLE [IF NOT EXISTS] name (col TYPE [TIMESTAMP KEY], ...) [TAGS (tag TYPE, ...)]``.

A table declared with TAGS is a TDengine super table: it gets a ``tbname STRING`` tag unless it
declares one."""

from __future__ import annotations

import re

from sqlglot.tokens import Token, TokenType

from cq_engine.model import Column, SourceLocation, TableDecl
from cq_engine.parse.cursor import Cursor
from cq_engine.parse.options import ParseOptions

# Dialect type names (TDengine, IoTDB, Spark) → Spark SQL type names.
_TYPES = {
    "timestamp": "timestamp",
    "bool": "boolean",
    "boolean": "boolean",
    "tinyint": "tinyint",
    "smallint": "smallint",
    "int": "int",
    "integer": "int",
    "int32": "int",
    "bigint": "bigint",
    "int64": "bigint",
    "long": "bigint",
    "float": "float",
    "double": "double",
    "varchar": "string",
    "nchar": "string",
    "binary": "string",
    "text": "string",
    "string": "string",
    "varbinary": "binary",
    "blob": "binary",
    "date": "date",
    "decimal": "decimal",
}
# Unsigned TDengine integers widen so every value fits.
_UNSIGNED = {"tinyint": "smallint", "smallint": "int", "int": "bigint", "bigint": "decimal(20,0)"}


def parse_create_table(cur: Cursor, opts: ParseOptions, start: Token) -> TableDecl:
    if_not_exists = cur.match("IF", "NOT", "EXISTS")
    name_tok = cur.identifier("a table name")
    columns, time_column = _column_list(cur, tags=False)
    if cur.match("TAGS"):
        tags, _ = _column_list(cur, tags=True)
        # A super table: one Delta table whose rows carry their subtable's name (docs/dialects/index.md, Tables).
        if not any(c.name.lower() == "tbname" for c in columns + tags):
            tags.insert(0, Column(name="tbname", type="string", is_tag=True))
        columns += tags
    if not cur.at_end():
        raise cur.unexpected("expected TAGS (...) or the end of CREATE TABLE")
    names = [c.name.lower() for c in columns]
    dupe = next((n for n in names if names.count(n) > 1), None)
    if dupe:
        raise cur.error_at(name_tok, f"table {name_tok.text!r} declares column {dupe!r} twice")
    if time_column is None:
        time_column = next((c.name for c in columns if c.type == "timestamp" and not c.is_tag), None)
    if time_column is None:
        raise cur.error_at(name_tok, f"table {name_tok.text!r} needs a TIMESTAMP column for event time")
    line, col = cur.source.line_col(start.start)
    return TableDecl(
        name=name_tok.text,
        columns=tuple(columns),
        time_column=time_column,
        if_not_exists=if_not_exists,
        location=SourceLocation(cur.source.file, line, col),
        sql=" ".join(cur.source.text[start.start : cur.end].split()),
    )


def _column_list(cur: Cursor, *, tags: bool) -> tuple[list[Column], str | None]:
    start, end = cur.pos, None
    cur.expect("(", what="'(' and a column list")
    columns, time_column = [], None
    while True:
        name = cur.identifier("a column name")
        ctype = column_type(cur)
        if cur.match("TIMESTAMP", "KEY") or cur.match("PRIMARY KEY"):  # sqlglot: one token
            if tags or ctype != "timestamp":
                raise cur.error_at(name, f"only a TIMESTAMP column can be the time key, not {name.text!r}")
            time_column = name.text
        columns.append(Column(name=name.text, type=ctype, is_tag=tags))
        if cur.match(","):
            continue
        end = cur.expect(")", what="',' or ')'")
        break
    del start, end
    return columns, time_column


def column_type(cur: Cursor) -> str:
    """A dialect type name (with its arguments) at the cursor → a Spark SQL type name."""
    tok = cur.advance()
    word = tok.text.lower()
    if word not in _TYPES:
        raise cur.error_at(tok, f"unknown column type {tok.text!r} (known: {', '.join(sorted(set(_TYPES)))})")
    spark = _TYPES[word]
    nxt = cur.peek()
    if nxt is not None and nxt.token_type == TokenType.L_PAREN:
        inner_start, inner_end = cur.balanced()
        args = cur.source.text[inner_start:inner_end].replace(" ", "")
        if not re.fullmatch(r"\d+(,\d+)?", args):
            raise cur.error_at(nxt, f"bad type arguments {args!r} for {tok.text}")
        if spark == "decimal":
            spark = f"decimal({args})"
    elif spark == "decimal":
        spark = "decimal(10,0)"
    if cur.match("UNSIGNED"):
        if spark not in _UNSIGNED:
            raise cur.error_at(tok, f"{tok.text} cannot be UNSIGNED")
        spark = _UNSIGNED[spark]
    return spark
