"""Reading user files (CSV, JSON lines, Parquet), conforming them to a table's schema, and
:func:`ingest`: the public write path (``cq ingest``), where BEFORE INSERT triggers fire."""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
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

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
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


def ingest(
    *,
    table: str,
    data: pa.Table | str | os.PathLike,
    ctx: EngineContext | None = None,
    engine: Any = None,
    settings: Settings | None = None,
    now: datetime | None = None,
    label: str | None = None,
) -> IngestResult:
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
    if raw.num_rows == 0:  # an empty commit would only add a version that changes nothing
        where = "the data" if isinstance(data, pa.Table) else f"{data}: the file"
        raise CQError(f"{where} holds no rows (a header only?); nothing was written to '{table}'")
    try:
        rows = conform(
            raw, ctx.storage.schema(table), table=table, time_column=ctx.time_column(table), tz=ctx.settings.tz, now=now
        )
    except TableError as exc:
        if isinstance(data, pa.Table):
            raise
        raise TableError(f"{data}: {exc}") from None
    failures = fire_before(
        ctx.catalog.triggers, table=table, batch=rows, settings=ctx.settings, now=now or datetime.now(UTC)
    )
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
    raise CQError(f"{path}: unknown file type {suffix or '(none)'!r} (use .csv, .json, .jsonl, .ndjson or .parquet)")


def _read_csv(path: str) -> pa.Table:
    import pyarrow.csv as pcsv

    with open(path, newline="", encoding="utf-8-sig") as f:
        header = next(csv.reader(f), None)
    if not header:
        raise CQError(f"{path}: cannot read the file: no header row")
    return pcsv.read_csv(
        path,
        convert_options=pcsv.ConvertOptions(
            column_types={name: pa.string() for name in header}, strings_can_be_null=True, null_values=[""]
        ),
    )


def _read_json(path: str) -> pa.Table:
    import pyarrow.json as pjson

    inferred = pjson.read_json(path)
    as_text = [
        pa.field(f.name, pa.string())
        for f in inferred.schema
        if pa.types.is_timestamp(f.type) or pa.types.is_date(f.type)
    ]
    if not as_text:
        return inferred
    # Arrow's JSON inference turns '...+08:00' into a naive UTC timestamp, losing that it had an offset.
    options = pjson.ParseOptions(explicit_schema=pa.schema(as_text), unexpected_field_behavior="infer")
    return pjson.read_json(path, parse_options=options)


def conform(
    data: pa.Table, schema: pa.Schema, *, table: str, time_column: str, tz: tzinfo, now: datetime | None = None
) -> pa.Table:
    """``data`` with exactly ``schema``'s columns and types.

    Columns match case-insensitively; missing nullable columns become nulls. Timestamp columns accept
    ISO-8601 strings with an offset or without (read in ``tz``), integers as epoch milliseconds (within
    ``EPOCH_SPAN`` of ``now``, default the clock: seconds or microseconds read as milliseconds land
    decades away), and Arrow timestamps (naive ones read in ``tz``). Text read into a floating column
    may spell NaN or Infinity; a number too large for it (``1e400``) is refused. Raises ``TableError``
    naming the table, the column, the row and the first value that cannot be read."""
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
            arrays.append(
                _to_timestamp(values, table=table, column=field.name, tz=tz, now=now or datetime.now(UTC)).cast(
                    field.type
                )
            )
        else:
            cast = _cast(values, field.type, table=table, column=field.name)
            if pa.types.is_floating(field.type):
                spelled = (
                    pc.match_substring_regex(values, _NON_FINITE_TEXT, ignore_case=True)
                    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type)
                    else None
                )
                _refuse_non_finite(
                    cast, spelled, column=field.name, what=f"table '{table}', column '{field.name}'", original=values
                )
            arrays.append(cast)
    return pa.Table.from_arrays(arrays, schema=schema)


# Non-finite values a text file may ask for by name.
_NON_FINITE_TEXT = r"^[+-]?(nan|inf|infinity)$"
# Integer epochs (milliseconds) must land this close to now.
EPOCH_SPAN = timedelta(days=365 * 30)


def _refuse_non_finite(
    values: pa.ChunkedArray,
    spelled: pa.ChunkedArray | None,
    *,
    column: str,
    what: str,
    original: pa.ChunkedArray | None = None,
) -> None:
    """A non-finite float not spelled as NaN/Infinity in the input is an overflow: refuse it."""
    bad = pc.invert(pc.fill_null(pc.is_finite(values), True))
    if spelled is not None:
        bad = pc.and_(bad, pc.invert(pc.fill_null(spelled, False)))
    if not pc.any(bad).as_py():
        return
    row = pc.index(bad, True).as_py()
    shown = (original if original is not None else values)[row].as_py()
    raise TableError(
        f"{what}: row {row + 1} holds {shown!r}, which is not a finite number "
        "(too large for the column's type); write NaN or Infinity to mean them"
    )


def type_name(t: pa.DataType) -> str:
    """A Spark SQL name for an Arrow type, as users write it in CREATE TABLE."""
    names = {
        pa.float64(): "double",
        pa.float32(): "float",
        pa.int64(): "bigint",
        pa.int32(): "int",
        pa.int16(): "smallint",
        pa.int8(): "tinyint",
        pa.bool_(): "boolean",
        pa.string(): "string",
        pa.large_string(): "string",
        pa.binary(): "binary",
        pa.date32(): "date",
    }
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


def _to_timestamp(values: pa.ChunkedArray, *, table: str, column: str, tz: tzinfo, now: datetime) -> pa.ChunkedArray:
    """UTC microsecond timestamps from strings, epoch milliseconds or Arrow timestamps."""
    t = values.type
    if pa.types.is_timestamp(t) and t.tz is not None:
        return _cast(values, TIMESTAMP, table=table, column=column)
    if pa.types.is_integer(t):
        return _from_epoch_ms(values.cast(pa.int64()), table=table, column=column, now=now)
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        # Naive: wall-clock time in tz, resolved per distinct value exactly as parse_time does.
        naive = _cast(values, pa.timestamp("us"), table=table, column=column)
        return _map_distinct(naive, lambda v: v.replace(tzinfo=tz).astimezone(UTC))
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        digits = pc.match_substring_regex(values, r"^[+-]?\d{1,18}$")
        if pc.any(digits).as_py():  # epoch milliseconds as text (CSV): the same range check
            _from_epoch_ms(pc.if_else(digits, values, None).cast(pa.int64()), table=table, column=column, now=now)

        def parse(text: str) -> datetime:
            try:
                return parse_time(text, tz=tz, bounded=False)  # data: ingest checks its own ranges
            except (TimeError, ValueError, OverflowError):
                raise _cannot(
                    table,
                    column,
                    text,
                    "timestamp (use ISO-8601 such as 2021-05-11T22:18:40+08:00, or epoch milliseconds)",
                ) from None

        return _map_distinct(values, parse)
    first = next((v for v in values.to_pylist() if v is not None), None)
    raise _cannot(table, column, first, "timestamp")


def _from_epoch_ms(values: pa.ChunkedArray, *, table: str, column: str, now: datetime) -> pa.ChunkedArray:
    """Epoch milliseconds within ``EPOCH_SPAN`` of ``now``; anything else is almost surely another
    unit (seconds land in 1970, microseconds millennia ahead), so it is refused with a hint."""
    lo, hi = (int((now + d - EPOCH) / timedelta(milliseconds=1)) for d in (-EPOCH_SPAN, EPOCH_SPAN))
    bad = pc.invert(pc.fill_null(pc.and_(pc.greater_equal(values, lo), pc.less_equal(values, hi)), True))
    if pc.any(bad).as_py():
        row = pc.index(bad, True).as_py()
        value = values[row].as_py()
        hint = ""
        for unit, scale in (("seconds", 1000), ("microseconds", 1 / 1000), ("nanoseconds", 1 / 1_000_000)):
            if lo <= value * scale <= hi:
                hint = f" (as epoch {unit} it would be {(EPOCH + timedelta(milliseconds=value * scale)).isoformat()})"
                break
        when = (EPOCH + timedelta(milliseconds=value)).isoformat() if abs(value) < 2.5e14 else "out of range"
        raise TableError(
            f"table '{table}', column '{column}': row {row + 1} holds {value}, which as epoch "
            f"milliseconds is {when}, more than {EPOCH_SPAN.days // 365} years from now{hint}; "
            "write epoch milliseconds or an ISO-8601 time"
        )
    return pc.multiply(values, 1000).cast(TIMESTAMP)


def _map_distinct(values: pa.ChunkedArray, convert) -> pa.ChunkedArray:
    """Apply a Python ``convert`` once per distinct non-null value (time series repeat values often)."""
    distinct = pc.unique(values)
    converted = pa.array([None if v is None else convert(v) for v in distinct.to_pylist()], TIMESTAMP)
    return pc.take(converted, pc.index_in(values, value_set=distinct))
