"""Reading user files (CSV, JSON lines, Parquet), conforming them to a table's schema, and
:func:`ingest`: the public write path (``cq ingest``), where BEFORE INSERT triggers fire."""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from datetime import datetime, timezone, tzinfo
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cq_engine.config import Settings, load_settings
from cq_engine.context import EngineContext
from cq_engine.errors import CQError, TableError, TimeError
from cq_engine.storage.base import align_columns
from cq_engine.times import parse_time
from cq_engine.triggers.runtime import fire_before

UTC = timezone.utc
TIMESTAMP = pa.timestamp("us", tz="UTC")
_JSON_EXTENSIONS = (".json", ".jsonl", ".ndjson")


@dataclass(frozen=True)
class IngestResult:
    """One ingest: the table's new version, the rows written, and the OPTIMISTIC BEFORE INSERT
    triggers that failed (logged; the rows were written anyway)."""

    table: str
    version: int
    rows: int
    trigger_failures: tuple[str, ...] = ()


def ingest(*, table: str, data: pa.Table | str | os.PathLike, ctx: EngineContext | None = None,
           engine: Any = None, settings: Settings | None = None, now: datetime | None = None,
           label: str | None = None) -> IngestResult:
    """Append ``data`` (an Arrow table, or a CSV / JSON-lines / Parquet file) to ``table`` in one Delta
    commit, creating a declared table if missing. Columns match by name and are cast as in ``conform``.

    The BEFORE INSERT triggers whose pattern matches ``table`` fire first, in name order, on the
    conformed rows; a PESSIMISTIC one failing raises ``TriggerError`` and nothing is written.
    ``ctx`` (or an ``Engine``'s, else one opened from ``settings``, else from the environment)
    supplies the definitions and the warehouse; ``now`` (default: the clock) is only recorded when a
    trigger is first created; ``label`` goes into the commit's ``cq.ingest`` metadata (default: the file, or "python")."""
    if ctx is None:
        ctx = engine.ctx if engine is not None else EngineContext.open(settings=settings or load_settings())
    ctx.ensure_tables(table)
    if not ctx.storage.exists(table):
        raise TableError(f"table {table!r} does not exist: declare it with CREATE TABLE in {ctx.settings.sql_dir}")
    label = label or ("python" if isinstance(data, pa.Table) else str(data))
    raw = data if isinstance(data, pa.Table) else read_input(str(data))
    rows = conform(raw, ctx.storage.schema(table), table=table, time_column=ctx.time_column(table),
                   tz=ctx.settings.tz)
    failures = fire_before(ctx.catalog.triggers, table=table, batch=rows, settings=ctx.settings,
                           now=now or datetime.now(UTC))
    version = ctx.storage.append(table, rows, metadata={"cq.ingest": label})
    return IngestResult(table=table, version=version, rows=rows.num_rows, trigger_failures=failures)


def read_input(path: str) -> pa.Table:
    """Read a ``.csv``, ``.json``/``.jsonl``/``.ndjson`` (JSON lines) or ``.parquet`` file.

    CSV columns come back as strings and JSON time-like strings stay strings, so that
    :func:`conform` alone decides how each value is read (Arrow's inference would drop leading zeros
    and, for JSON, a timestamp's offset)."""
    suffix = Path(path).suffix.lower()
    try:
        if suffix == ".csv":
            return _read_csv(path)
        if suffix in _JSON_EXTENSIONS:
            return _read_json(path)
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path)
    except (OSError, pa.ArrowException, UnicodeDecodeError, csv.Error) as exc:
        raise CQError(f"{path}: cannot read the file: {exc}") from None
    raise CQError(f"{path}: unknown file type {suffix or '(none)'!r} "
                  "(use .csv, .json, .jsonl, .ndjson or .parquet)")


def _read_csv(path: str) -> pa.Table:
    import pyarrow.csv as pcsv

    with open(path, newline="", encoding="utf-8-sig") as f:
        header = next(csv.reader(f), None)
    if not header:
        raise CQError(f"{path}: cannot read the file: no header row")
    return pcsv.read_csv(
        path,
        convert_options=pcsv.ConvertOptions(
            column_types={name: pa.string() for name in header},
            strings_can_be_null=True, null_values=[""]),
    )


def _read_json(path: str) -> pa.Table:
    import pyarrow.json as pjson

    inferred = pjson.read_json(path)
    as_text = [pa.field(f.name, pa.string()) for f in inferred.schema
               if pa.types.is_timestamp(f.type) or pa.types.is_date(f.type)]
    if not as_text:
        return inferred
    # Arrow's JSON inference turns '...+08:00' into a naive UTC timestamp, losing that it had an offset.
    options = pjson.ParseOptions(explicit_schema=pa.schema(as_text), unexpected_field_behavior="infer")
    return pjson.read_json(path, parse_options=options)


def conform(data: pa.Table, schema: pa.Schema, *, table: str, time_column: str, tz: tzinfo) -> pa.Table:
    """``data`` with exactly ``schema``'s columns and types.

    Columns match case-insensitively; missing nullable columns become nulls. Timestamp columns accept
    ISO-8601 strings with an offset or without (read in ``tz``), integers as epoch milliseconds, and
    Arrow timestamps (naive ones read in ``tz``). Raises ``TableError`` naming the table, the column
    and the first value that cannot be read."""
    if time_column.lower() not in {n.lower() for n in data.column_names}:
        raise TableError(f"table '{table}': the data has no time column '{time_column}'")
    arrays = []
    for field, i in align_columns(data.column_names, schema, table=table):
        if i is None:
            arrays.append(pa.nulls(data.num_rows, field.type))
            continue
        values = data.column(i)
        is_time = field.name.lower() == time_column.lower()
        if (is_time or not field.nullable) and values.null_count:
            row = pc.index(pc.is_null(values), True).as_py()
            raise TableError(f"table '{table}', column '{field.name}': row {row + 1} has no value")
        if pa.types.is_timestamp(field.type):
            arrays.append(_to_timestamp(values, table=table, column=field.name, tz=tz).cast(field.type))
        else:
            arrays.append(_cast(values, field.type, table=table, column=field.name))
    return pa.Table.from_arrays(arrays, schema=schema)


def type_name(t: pa.DataType) -> str:
    """A Spark SQL name for an Arrow type, as users write it in CREATE TABLE."""
    names = {pa.float64(): "double", pa.float32(): "float", pa.int64(): "bigint", pa.int32(): "int",
             pa.int16(): "smallint", pa.int8(): "tinyint", pa.bool_(): "boolean", pa.string(): "string",
             pa.large_string(): "string", pa.binary(): "binary", pa.date32(): "date"}
    if t in names:
        return names[t]
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    return str(t)


def _cannot(table: str, column: str, value: object, target: str) -> TableError:
    return TableError(f"table '{table}', column '{column}': cannot read {value!r} as {target}")


def _cast(values: pa.ChunkedArray, target: pa.DataType, *, table: str, column: str) -> pa.ChunkedArray:
    try:
        return pc.cast(values, target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    # Bisect for the first prefix that fails to cast: its last value is the first offending one.
    ok, bad = 0, len(values)
    while bad - ok > 1:
        mid = (ok + bad) // 2
        try:
            pc.cast(values.slice(0, mid), target)
            ok = mid
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            bad = mid
    raise _cannot(table, column, values[bad - 1].as_py(), type_name(target)) from None


def _to_timestamp(values: pa.ChunkedArray, *, table: str, column: str, tz: tzinfo) -> pa.ChunkedArray:
    """UTC microsecond timestamps from strings, epoch milliseconds or Arrow timestamps."""
    t = values.type
    if pa.types.is_timestamp(t) and t.tz is not None:
        return _cast(values, TIMESTAMP, table=table, column=column)
    if pa.types.is_integer(t):
        try:
            return pc.multiply_checked(values.cast(pa.int64()), 1000).cast(TIMESTAMP)
        except pa.ArrowInvalid:
            raise TableError(f"table '{table}', column '{column}': epoch milliseconds out of range") from None
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        # Naive: wall-clock time in tz, resolved per distinct value exactly as parse_time does.
        naive = _cast(values, pa.timestamp("us"), table=table, column=column)
        return _map_distinct(naive, lambda v: v.replace(tzinfo=tz).astimezone(UTC))
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        def parse(text: str) -> datetime:
            try:
                return parse_time(text, tz=tz, bounded=False)  # data: ingest checks its own ranges
            except (TimeError, ValueError, OverflowError):
                raise _cannot(table, column, text, "timestamp (use ISO-8601 such as 2021-05-11T22:18:40+08:00, "
                              "or epoch milliseconds)") from None
        return _map_distinct(values, parse)
    first = next((v for v in values.to_pylist() if v is not None), None)
    raise _cannot(table, column, first, "timestamp")


def _map_distinct(values: pa.ChunkedArray, convert) -> pa.ChunkedArray:
    """Apply a Python ``convert`` once per distinct non-null value (time series repeat values often)."""
    distinct = pc.unique(values)
    converted = pa.array([None if v is None else convert(v) for v in distinct.to_pylist()], TIMESTAMP)
    return pc.take(converted, pc.index_in(values, value_set=distinct))
