"""Load every definition under the sql directory; a bad file is rejected whole, the others load."""

from __future__ import annotations

from pathlib import Path

import sqlglot
from sqlglot import exp

from .config import Settings
from .errors import CQError, ParseError
from .model import Catalog, ContinuousQuery, TableDecl
from .parse import ParseOptions, parse_file, sql_files
from .parse.fragments import TIME_REF


def require_definition(catalog: Catalog, name: str, *, sql_dir: str) -> ContinuousQuery:
    """The definition called ``name``; a ``CQError`` listing the known ones otherwise."""
    d = catalog.definition(name)
    if d is None:
        known = ", ".join(x.name for x in catalog.definitions) or "none"
        raise CQError(f"no definition named {name!r} in {sql_dir} (known: {known})")
    return d


def parse_options(settings: Settings) -> ParseOptions:
    return ParseOptions(tz=settings.tz, min_every=settings.min_every_delta)


def load_catalog(path: str | Path, *, options: ParseOptions | None = None) -> Catalog:
    """Parse all ``.sql`` files under ``path``; per-file errors land in ``Catalog.errors``."""
    opts = options or ParseOptions()
    tables: list[TableDecl] = []
    definitions: list[ContinuousQuery] = []
    errors: list[str] = []
    for file in sql_files(path):
        try:
            statements = parse_file(file, options=opts)
            file_tables = [s for s in statements if isinstance(s, TableDecl)]
            file_defs = [s for s in statements if not isinstance(s, TableDecl)]
            _check_unique(tables + file_tables, definitions + file_defs)
            all_tables = {t.name.lower(): t for t in tables + file_tables}
            for d in file_defs:
                _check_against_tables(d, all_tables)
        except ParseError as exc:
            errors.append(str(exc))
            continue
        tables += file_tables
        definitions += file_defs
    # A source declared in a later file than its query is checked once everything is in.
    by_name = {t.name.lower(): t for t in tables}
    kept = []
    for d in definitions:
        try:
            _check_against_tables(d, by_name)
            kept.append(d)
        except ParseError as exc:
            errors.append(str(exc))
    return Catalog(tables=tuple(tables), definitions=tuple(kept), errors=tuple(errors))


def _err(location, message: str) -> ParseError:
    return ParseError(message, file=location.file, line=location.line, col=location.col)


def _check_unique(tables: list[TableDecl], definitions: list[ContinuousQuery]) -> None:
    seen: dict[str, object] = {}
    for t in tables:
        if (prev := seen.get(t.name.lower())) is not None:
            raise _err(t.location, f"table {t.name!r} is declared twice (first at {prev})")
        seen[t.name.lower()] = t.location
    seen.clear()
    sinks: dict[str, ContinuousQuery] = {}
    for d in definitions:
        if (prev := seen.get(d.name.lower())) is not None:
            raise _err(d.location, f"{d.name!r} is defined twice (first at {prev})")
        seen[d.name.lower()] = d.location
        if (other := sinks.get(d.sink.lower())) is not None:
            raise _err(d.location, f"{d.name!r} writes table {d.sink!r}, which {other.name!r} already writes "
                                   f"({other.location}); give each definition its own sink")
        sinks[d.sink.lower()] = d
        if d.sink.lower() == d.source.lower():
            raise _err(d.location, f"{d.name!r} reads and writes the same table {d.sink!r}")


def _columns(sql: str) -> list[str]:
    return [c.name for c in sqlglot.parse_one(sql, read="spark").find_all(exp.Column)]


def referenced_columns(d: ContinuousQuery) -> set[str]:
    """Source columns a query reads (lower-cased), besides the time column."""
    names: list[str] = list(d.group_keys)
    for sql in [i.expression for i in d.select] + [d.where, d.having]:
        if sql:
            names += _columns(sql)
    outputs = {i.name.lower() for i in d.select}
    return {n.lower() for n in names if n != TIME_REF} - (outputs if d.having else set())


def _check_against_tables(d: ContinuousQuery, tables: dict[str, TableDecl]) -> None:
    source = tables.get(d.source.lower())
    if source is None:
        return  # may exist in the warehouse only; checked when the firing reads it
    if d.where and source.time_column.lower() in {c.lower() for c in _columns(d.where)}:
        raise _err(d.location, f"{d.name!r}: a time filter on {source.time_column!r} is not allowed in WHERE: "
                               "each firing sets the time range itself")
    known = {c.name.lower() for c in source.columns}
    missing = sorted(referenced_columns(d) - known)
    if d.align_by_device and "device" not in known:
        missing.append("device")
    if missing:
        raise _err(d.location, f"{d.name!r}: table {source.name!r} has no column {missing[0]!r} "
                               f"(columns: {', '.join(c.name for c in source.columns)})")

