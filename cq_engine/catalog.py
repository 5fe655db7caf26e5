"""Load every definition under the sql directory; a bad file is rejected whole, the others load."""

from __future__ import annotations

import functools
import re
from dataclasses import replace
from pathlib import Path

import sqlglot
from sqlglot import exp

from cq_engine.config import Settings
from cq_engine.errors import CQError, ParseError
from cq_engine.lastgood import LastGood
from cq_engine.model import (
    DATA_SHAPED,
    Catalog,
    ContinuousQuery,
    Definition,
    SelectItem,
    SessionTrigger,
    SourceLocation,
    Stream,
    TableDecl,
    TriggerDef,
    joined_column,
)
from cq_engine.parse import ParseOptions, parse_file, parse_text, sql_files
from cq_engine.parse.ekuiper import first_row_values, integer_averages
from cq_engine.parse.fragments import TIME_REF
from cq_engine.parse.iotdb import COUNT_STAR, expand_count_star
from cq_engine.streams.output import data_columns, sink_mismatch


def require_definition(catalog: Catalog, name: str, *, sql_dir: str) -> Definition:
    """The definition called ``name``; a ``CQError`` showing the load error that removed it, or
    listing the known ones."""
    d = catalog.definition(name)
    if d is not None:
        return d
    lowered = name.lower()
    removed = next((e for e in catalog.errors if lowered in (n.lower() for n in e.names)), None)
    if removed is not None:
        raise CQError(f"{name!r} did not load: {removed}")
    known = ", ".join(x.name for x in catalog.definitions) or "none"
    failed = f"; {len(catalog.errors)} load error(s), first: {catalog.errors[0]}" if catalog.errors else ""
    raise CQError(f"no definition named {name!r} in {sql_dir} (known: {known}){failed}")


def parse_options(settings: Settings) -> ParseOptions:
    return ParseOptions(tz=settings.tz, min_every=settings.min_every_delta)


# Statement names in a file that does not parse: what ``cq run NAME`` needs to show the file's error.
_DECLARED = re.compile(
    r"\bCREATE\s+(?:CONTINUOUS\s+QUERY|CQ|STREAM|RULE|(?:STATELESS\s+|STATEFUL\s+)?TRIGGER)"
    r"\s+(?:IF\s+NOT\s+EXISTS\s+)?[`\"]?(\w+)",
    re.IGNORECASE,
)


def _declared_names(file: Path) -> tuple[str, ...]:
    try:
        return tuple(_DECLARED.findall(file.read_text(encoding="utf-8", errors="replace")))
    except OSError:
        return ()


def load_catalog(
    path: str | Path,
    *,
    options: ParseOptions | None = None,
    context: str | Path | None = None,
    last_good: LastGood | None = None,
) -> Catalog:
    """Parse all ``.sql`` files under ``path``; per-file errors land in ``Catalog.errors``.

    ``context`` (the sql directory when ``path`` is one file of it): the tables its other files declare
    are known when checking ``path``'s definitions (they are not part of the catalog). ``last_good``:
    a file that fails is loaded from its last good text there instead (its error says which
    definitions that keeps), and a file that loads is recorded as its last good version."""
    opts = options or ParseOptions()
    files = sql_files(path)
    tables: list[TableDecl] = []
    definitions: list[Definition] = []
    triggers: list[TriggerDef] = []
    errors: list[ParseError] = []
    for file in files:
        try:
            text = _read(file)
            file_tables, file_triggers, file_defs = _take_file(text, file, opts, tables, definitions, triggers)
        except CQError as exc:
            error = exc if isinstance(exc, ParseError) else ParseError(str(exc), file=str(file))
            last = last_good.get(file) if last_good is not None else None
            try:  # the last good version, checked against what loaded before it as the file would be
                if last is None:
                    raise error
                file_tables, file_triggers, file_defs = _take_file(last.text, file, opts, tables, definitions, triggers)
            except CQError:
                errors.append(error.removing(_declared_names(file)))
                continue
            names = tuple(x.name for x in [*file_defs, *file_triggers])
            errors.append(error.keeping(names, since=last.at))
        else:
            if last_good is not None:
                last_good.put(file, text)
        tables += file_tables
        definitions += file_defs
        triggers += file_triggers
    # A source declared in a later file than its query is checked once everything is in.
    by_name = _context_tables(context, exclude=files, options=opts)
    by_name.update({t.name.lower(): t for t in tables})
    by_name.update({t.alias.lower(): t for t in tables if t.alias})
    kept = []
    for d in definitions:
        try:
            d = _resolve_rule(d, by_name)
            d = _resolve_count_star(d, by_name)
            _check_against_tables(d, by_name)
            kept.append(d)
        except CQError as exc:
            error = exc if isinstance(exc, ParseError) else _err(d.location, str(exc))
            errors.append(error.removing((d.name,)))
    return Catalog(tables=tuple(tables), definitions=tuple(kept), errors=tuple(errors), triggers=tuple(triggers))


def settings_catalog(settings: Settings, *, record: bool = True) -> Catalog:
    """The catalog of ``settings.sql_dir`` as a running stack sees it: a file that fails to load keeps
    its last good version (``cq_engine.lastgood``, under CQ_HOME); ``record=False`` only reads it."""
    return load_catalog(
        settings.sql_dir, options=parse_options(settings), last_good=LastGood(settings.home, record=record)
    )


def _read(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ParseError(f"cannot read file: {exc}", file=str(file)) from None


def _take_file(
    text: str,
    file: Path,
    opts: ParseOptions,
    tables: list[TableDecl],
    definitions: list[Definition],
    triggers: list[TriggerDef],
) -> tuple[list[TableDecl], list[TriggerDef], list[Definition]]:
    """One file's statements, checked against those loaded before it: (tables, triggers, definitions)."""
    statements = parse_text(text, file=str(file), options=opts)
    file_tables = [s for s in statements if isinstance(s, TableDecl)]
    file_triggers = [s for s in statements if isinstance(s, TriggerDef)]
    file_defs = [s for s in statements if not isinstance(s, (TableDecl, TriggerDef))]
    _check_unique(tables + file_tables, definitions + file_defs)
    _check_trigger_names(triggers + file_triggers, definitions + file_defs, new=file_triggers + file_defs)
    all_tables = {t.name.lower(): t for t in tables + file_tables}
    for d in file_defs:
        _check_against_tables(d, all_tables)
    return file_tables, file_triggers, file_defs


def _context_tables(context: str | Path | None, *, exclude: list[Path], options: ParseOptions) -> dict:
    """Tables declared in ``context``'s files other than ``exclude`` (files that fail are skipped: their
    errors are reported when the directory is validated)."""
    if context is None or not Path(context).is_dir():
        return {}
    skip = {f.resolve() for f in exclude}
    out: dict[str, TableDecl] = {}
    for file in sql_files(context):
        if file.resolve() in skip:
            continue
        try:
            statements = parse_file(file, options=options)
        except CQError:
            continue
        for t in statements:
            if isinstance(t, TableDecl):
                out.setdefault(t.name.lower(), t)
                if t.alias:
                    out.setdefault(t.alias.lower(), t)
    return out


def _resolve_rule(d: Definition, tables: dict[str, TableDecl]) -> Definition:
    """An eKuiper rule reads the table its stream name declares, and ``SELECT *`` is its fields."""
    if not isinstance(d, Stream) or d.form != "ekuiper":
        return d
    table = tables.get(d.read_table.lower())
    star = any(i.expression == "*" for i in d.select)
    if table is None:
        if star:
            raise _err(
                d.location,
                f"{d.name!r}: SELECT * needs {d.source!r} declared (CREATE STREAM {d.source} "
                "(...) WITH (...) or CREATE TABLE) to know its fields",
            )
        return d
    items = []
    for item in d.select:
        if item.expression != "*":
            items.append(item)
            continue
        taken = {i.name.lower() for i in d.select}
        items += [
            SelectItem(expression=f"`{c.name}`", name=c.name, is_aggregate=False)
            for c in table.columns
            if c.name.lower() not in taken
        ]
    resolved = replace(d, trigger_table=table.name, source=table.name, select=tuple(items))
    return first_row_values(integer_averages(resolved, table))


def _resolve_count_star(d: Definition, tables: dict[str, TableDecl]) -> Definition:
    """A continuous query's ``count(*)``: one count per series of its declared source (IoTDB)."""
    if not isinstance(d, ContinuousQuery) or not any(i.expression == COUNT_STAR for i in d.select):
        return d
    table = tables.get(d.source.lower())
    if table is None:
        raise _err(
            _word_location(d.location, "count"),
            f"{d.name!r}: count(*) needs {d.source!r} declared (CREATE TABLE) to know its series",
        )
    return expand_count_star(d, table)


def _err(location, message: str) -> ParseError:
    return ParseError(message, file=location.file, line=location.line, col=location.col)


def _reads(d: Definition) -> list[str]:
    """The tables a definition reads."""
    if isinstance(d, Stream):
        joined = [j.table for q in d.leaves for j in q.joins]
        return [t for t in dict.fromkeys((d.trigger_table, *[q.source for q in d.leaves], *joined)) if t]
    return [d.source]


def undeclared_reads(catalog: Catalog) -> list[tuple[Definition, str]]:
    """(definition, table) for every table a definition reads (source, trigger table) that no file
    declares (CREATE TABLE, or an eKuiper stream's name): it must exist in the warehouse."""
    declared = {t.name.lower() for t in catalog.tables} | {t.alias.lower() for t in catalog.tables if t.alias}
    return [(d, t) for d in catalog.definitions for t in _reads(d) if t.lower() not in declared]


def _check_trigger_names(triggers: list[TriggerDef], definitions: list[Definition], *, new: list) -> None:
    """Trigger names are unique, and distinct from definitions' (``cq drop NAME`` takes either); the
    error points at the statement of ``new`` (the file being added)."""
    fresh = {id(x) for x in new}
    seen = {x.name.lower(): x.location for x in [*definitions, *triggers] if id(x) not in fresh}
    for x in sorted(new, key=lambda x: (x.location.line, x.location.col)):
        if (prev := seen.get(x.name.lower())) is not None and (
            isinstance(x, TriggerDef) or x.name.lower() in {t.name.lower() for t in triggers}
        ):
            raise _err(
                x.location,
                f"{x.name!r} is defined twice (first at {prev}): trigger names are unique "
                "among triggers and definitions",
            )
        seen[x.name.lower()] = x.location


def _check_unique(tables: list[TableDecl], definitions: list[Definition]) -> None:
    seen: dict[str, object] = {}
    for t in tables:
        if (prev := seen.get(t.name.lower())) is not None:
            raise _err(t.location, f"table {t.name!r} is declared twice (first at {prev})")
        seen[t.name.lower()] = t.location
    seen.clear()
    sinks: dict[str, Definition] = {}
    for d in definitions:
        if (prev := seen.get(d.name.lower())) is not None:
            raise _err(d.location, f"{d.name!r} is defined twice (first at {prev})")
        seen[d.name.lower()] = d.location
        if d.sink is None:
            continue
        if (other := sinks.get(d.sink.lower())) is not None:
            raise _err(
                d.location,
                f"{d.name!r} writes table {d.sink!r}, which {other.name!r} already writes "
                f"({other.location}); give each definition its own sink",
            )
        sinks[d.sink.lower()] = d
        if d.sink.lower() in (t.lower() for t in _reads(d)):
            raise _err(d.location, f"{d.name!r} reads and writes the same table {d.sink!r}")


@functools.lru_cache(maxsize=8192)
def _columns(sql: str) -> tuple[str, ...]:
    # Cached: every firing's plan asks for its definition's columns, and a parse costs a millisecond.
    return tuple(c.name for c in sqlglot.parse_one(sql, read="spark").find_all(exp.Column))


def _names(sqls) -> set[str]:
    """Columns named by Spark SQL fragments (lower-cased), without the engine's own columns."""
    names = [n for sql in sqls if sql for n in _columns(sql)]
    return {n.lower() for n in names if n != TIME_REF and not n.lower().startswith("__cq")}


def _aliases(d: Stream) -> set[str]:
    """The old form's PARTITION BY aliases: columns the engine computes, not the table's."""
    return {alias.lower() for alias, _ in d.partition_exprs}


def _query_columns(d: Stream) -> set[str]:
    """Columns a stream's query reads from its source (a join's: ``_join_columns``)."""
    outputs = {i.name.lower() for i in d.select}  # HAVING may name the result's columns
    calls = [*d.series, *(d.interp.calls if d.interp is not None else ())]
    read = _names([i.expression for i in d.select] + [c.argument for c in calls] + [d.where])
    read |= _names([d.having]) - outputs
    grouped = {k.lower() for k in d.group_by if not k.lower().startswith("__cq")}
    return (read | grouped) - _aliases(d)


def _join_columns(q: Stream) -> dict[str, set[str]]:
    """A join query's columns by table (``model.join_column``: side 0 is the trigger rows' table)."""
    sqls = [i.expression for i in q.select] + [q.where, q.having, *[k.expression for k in q.order_by]]
    sqls += [c.argument for c in [*q.series, *(q.interp.calls if q.interp is not None else ())]]
    sqls += [j.on for j in q.joins] + [f"`{k}`" for k in q.group_by]
    sqls += [f"`{c}`" for j in q.joins for c in (j.asof or ())[:2]]  # an ASOF join's time comparison
    tables = [q.source, *[j.table for j in q.joins]]
    out: dict[str, set[str]] = {}
    for name in [n for sql in sqls if sql for n in _columns(sql)]:
        if (side := joined_column(name)) is not None and side[0] < len(tables) and tables[side[0]]:
            out.setdefault(str(tables[side[0]]), set()).add(side[1].lower())
    return out


def _trigger_columns(d: Stream) -> set[str]:
    """Columns a stream's trigger reads from its trigger table (a PARTITION BY alias: its expression's)."""
    t = d.trigger
    sqls = [
        d.options.pre_filter,
        getattr(t, "column", None),
        getattr(t, "start", None),
        getattr(t, "end", None),
        getattr(t, "over", None),
    ]
    sqls += [sql for _, sql in d.partition_exprs]
    plain = {c.lower() for c in d.partition_by + getattr(t, "columns", ())} - _aliases(d)
    return _names(sqls) | plain


def referenced_columns(d: Definition) -> set[str]:
    """Source columns a definition reads (lower-cased), besides the time column."""
    if isinstance(d, Stream):
        return set().union(*[_query_columns(q) for q in d.leaves]) | _trigger_columns(d)
    names = _names([i.expression for i in d.select] + [d.where, d.having]) | {k.lower() for k in d.group_keys}
    outputs = {i.name.lower() for i in d.select}
    return names - (outputs if d.having else set())


def _missing(d: Definition, table: TableDecl, need: set[str]) -> None:
    known = {c.name.lower() for c in table.columns}
    missing = sorted(need - known)
    if missing:
        raise _err(
            _word_location(d.location, missing[0]),
            f"{d.name!r}: table {table.name!r} has no column {missing[0]!r} "
            f"(columns: {', '.join(c.name for c in table.columns)})",
        )


def _word_location(at: SourceLocation, word: str) -> SourceLocation:
    """Where ``word`` is first written after ``at`` in its file (the statement's start if not found)."""
    try:
        text = Path(at.file).read_text(encoding="utf-8")
    except OSError:
        return at
    lines = text.split("\n")
    start = sum(len(x) + 1 for x in lines[: at.line - 1]) + at.col - 1
    found = re.compile(rf"(?<![\w`]){re.escape(word)}(?![\w`])", re.IGNORECASE).search(text, start)
    if found is None:
        return at
    line = text.count("\n", 0, found.start()) + 1
    return SourceLocation(at.file, line, found.start() - (text.rfind("\n", 0, found.start()) + 1) + 1)


def _check_against_tables(d: Definition, tables: dict[str, TableDecl]) -> None:
    if isinstance(d, Stream):
        _check_stream(d, tables)
        return
    source = tables.get(d.source.lower())
    if source is None:
        return  # may exist in the warehouse only; checked when the firing reads it
    if d.where and source.time_column.lower() in {c.lower() for c in _columns(d.where)}:
        raise _err(
            d.location,
            f"{d.name!r}: a time filter on {source.time_column!r} is not allowed in WHERE: "
            "each firing sets the time range itself",
        )
    _missing(d, source, referenced_columns(d) | ({"device"} if d.align_by_device else set()))


_TRIGGER_NAMES = {"session": "SESSION", "state": "STATE_WINDOW", "event": "EVENT_WINDOW", "count": "COUNT_WINDOW"}


def check_sink_columns(stream: Stream, table: TableDecl) -> None:
    """A stream writing a declared table must fit its columns (``stream_output.sink_mismatch``, the
    rule runs apply to any existing sink); error at the stream."""
    tags = tuple(c.name for c in table.columns if c.is_tag)
    message = sink_mismatch(stream, table.name, data_columns(stream, [c.name for c in table.columns], tags))
    if message is not None:
        raise _err(stream.location, message)


def _check_stream(d: Stream, tables: dict[str, TableDecl]) -> None:
    trigger = tables.get(d.trigger_table.lower()) if d.trigger_table else None
    if d.sink is not None and (sink := tables.get(d.sink.lower())) is not None:
        check_sink_columns(d, sink)
    for q in d.leaves:
        if d.trigger.kind == "period" and d.partition_by and q.reads == "table":
            # A tick's groups are those of its %%trows; a table read whole has no such groups.
            raise _err(
                d.location,
                f"{d.name!r}: a PERIOD stream with PARTITION BY reads FROM %%trows or %%tbname, "
                f"not another table ({q.source!r})",
            )
    # An old-form alias of tbname itself (PARTITION BY tbname tname) still groups by subtable.
    partition = {p.lower() for p in d.partition_by} | {sql.lower() for _, sql in d.partition_exprs}
    if trigger is not None:
        tags = [c.name for c in trigger.columns if c.is_tag]
        if (
            isinstance(d.trigger, SessionTrigger)
            and d.trigger.ts_column
            and d.trigger.ts_column.lower() != trigger.time_column.lower()
        ):
            raise _err(
                d.location,
                f"{d.name!r}: SESSION({d.trigger.ts_column}, ...) must name the time column "
                f"{trigger.time_column!r} of table {trigger.name!r}",
            )
        if tags and d.form != "ekuiper" and d.trigger.kind in DATA_SHAPED and "tbname" not in partition:
            raise _err(
                d.location,
                f"{d.name!r}: {_TRIGGER_NAMES[d.trigger.kind]} on super table {trigger.name!r} "
                "needs PARTITION BY tbname (each subtable has its own windows)",
            )
        if d.form == "new":
            for p in d.partition_by:
                col = trigger.column(p)
                if col is None or not col.is_tag:
                    raise _err(
                        d.location,
                        f"{d.name!r}: PARTITION BY may only name tbname and tag columns of "
                        f"{trigger.name!r} (tags: {', '.join(tags) or 'none'}), not {p!r}",
                    )
        _missing(d, trigger, _trigger_columns(d))
    for q in d.leaves:  # each query reading a table names its columns
        if (source := tables.get(q.source.lower()) if q.source else None) is not None:
            _missing(d, source, _query_columns(q))
        for name, need in _join_columns(q).items():
            if (table := tables.get(name.lower())) is not None:
                _missing(d, table, need)
    for q in d.leaves:
        if q.series and (source := tables.get(q.source.lower()) if q.source else None) is not None:
            _check_series(d, q, source)
    if d.key_bound == "row":
        for q in (d, *d.union):
            for sql, leaf in _row_times(q, q.select[0].expression):
                if (source := tables.get(leaf.source.lower()) if leaf.source else None) is not None:
                    _check_row_time(d, sql, source)


def _row_times(q: Stream, sql: str) -> list[tuple[str, Stream]]:
    """Where the sink's time column ``sql`` of ``q`` comes from: (Spark SQL, the query reading a table),
    through the subquery's result columns it names."""
    if q.subquery is None:
        return [(sql, q)]
    names = [i.name.lower() for i in q.subquery.select]
    out = []
    for name in _names([sql]) & set(names):
        for branch in (q.subquery, *q.subquery.union):
            out += _row_times(branch, branch.select[names.index(name)].expression)
    return out


def _check_row_time(d: Stream, sql: str, source: TableDecl) -> None:
    """A row's own time as the sink's time column is a TIMESTAMP column of the rows read (a join's:
    of the trigger rows)."""
    names = _names([sql]) | {side[1] for n in _columns(sql) if (side := joined_column(n)) and side[0] == 0}
    for name in names:
        col = source.column(name)
        if col is not None and col.type.lower() != "timestamp":
            raise _err(
                _word_location(d.location, name),
                f"{d.name!r}: the first column is the sink's time column, but {name!r} of table "
                f"{source.name!r} is {col.type.upper()}, not TIMESTAMP",
            )


_NUMBERS = ("tinyint", "smallint", "int", "bigint", "float", "double", "decimal")
# What a multi-row function's argument may be (TDengine's function reference); the others take any type.
_SERIES_TYPES = {"diff": (*_NUMBERS, "boolean", "timestamp")} | {
    f: _NUMBERS for f in ("csum", "mavg", "derivative", "statecount", "stateduration", "top", "bottom", "histogram")
}


def _check_series(d: Stream, q: Stream, source: TableDecl) -> None:
    """A multi-row function over a column (DIFF(current)...) takes a column of the type it computes with."""
    for call in q.series:
        allowed = _SERIES_TYPES.get(call.function)
        col = source.column(call.argument.strip("`")) if allowed else None
        if col is not None and allowed and not col.type.lower().startswith(allowed):
            raise _err(
                _word_location(d.location, call.function),
                f"{d.name!r}: {call.function.upper()}({col.name}) needs a number"
                f"{', BOOL or TIMESTAMP' if call.function == 'diff' else ''}, but {col.name!r} of table "
                f"{source.name!r} is {col.type.upper()}",
            )
