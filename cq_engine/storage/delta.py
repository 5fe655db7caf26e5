"""``Storage`` over the ``deltalake`` (delta-rs) package: the Delta log through delta-rs, compute in Spark.

Reads pin a snapshot, keep only the data files whose time-column statistics overlap the range and hand
those to ``spark.read.parquet``; writes replace a time range (or any predicate) in one atomic delta-rs
commit (ARCHITECTURE.md §3). Reading the log without Spark is ``storage.log``; predicates are ``storage.predicates``.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Schema, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from cq_engine.errors import AlreadyCommitted, CQError, TableError
from cq_engine.storage import log
from cq_engine.storage.base import ArrowData, Scan, TimeRange, align_columns
from cq_engine.storage.maintain import NEW_TABLE_PROPERTIES, WRITER_HOOKS
from cq_engine.storage.predicates import _range_bounds, groups_predicate, range_predicate, ranges_predicate
from cq_engine.storage.retry import MAX_ATTEMPTS, Replayable, retry_conflicts
from cq_engine.storage.state import DeltaStateTables
from cq_engine.storage.txns import Transactions

__all__ = ["COMMIT_ID_KEY", "DeltaRsStorage", "arrow_type", "groups_predicate", "range_predicate", "ranges_predicate"]

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from cq_engine.model import TableDecl

TIMESTAMP = pa.timestamp("us", tz="UTC")
# Delta statistics store timestamps truncated to milliseconds, so a file's true maximum can lie up to
# 1 ms above its recorded one.
_STATS_SLACK = timedelta(milliseconds=1)

# A commitInfo key carrying a unique id per write, so the writer can find its own commit's version
# even when other writers commit right after it (write_deltalake returns nothing).
COMMIT_ID_KEY = "cq.commitId"

_SIMPLE_TYPES: dict[str, pa.DataType] = {
    "double": pa.float64(),
    "float": pa.float32(),
    "real": pa.float32(),
    "bigint": pa.int64(),
    "long": pa.int64(),
    "int": pa.int32(),
    "integer": pa.int32(),
    "smallint": pa.int16(),
    "short": pa.int16(),
    "tinyint": pa.int8(),
    "byte": pa.int8(),
    "boolean": pa.bool_(),
    "bool": pa.bool_(),
    "string": pa.string(),
    "binary": pa.binary(),
    "timestamp": TIMESTAMP,
    "date": pa.date32(),
}
# Delta's own type names where they differ from the Spark SQL names people write.
_DISPLAY = {"long": "bigint", "integer": "int", "short": "smallint", "byte": "tinyint"}


def arrow_type(spark_type: str) -> pa.DataType:
    """The Arrow type for a Spark SQL type name (``double``, ``varchar(64)``, ``decimal(10,2)``,
    ``array<bigint>``, ``struct<a:bigint,b:string>``...)."""
    raw = re.sub(r"\s+", "", spark_type)
    name = raw.lower()
    if name in _SIMPLE_TYPES:
        return _SIMPLE_TYPES[name]
    if name.startswith("array<") and name.endswith(">"):
        return pa.list_(arrow_type(raw[6:-1]))
    if name.startswith("struct<") and name.endswith(">"):
        fields = []
        for part in _split_fields(raw[7:-1]):
            field, _, type_ = part.partition(":")
            fields.append(pa.field(field, arrow_type(type_)))
        return pa.struct(fields)
    if re.fullmatch(r"(varchar|char)\(\d+\)", name):
        return pa.string()
    match = re.fullmatch(r"decimal(?:\((\d+)(?:,(\d+))?\))?", name)
    if match:
        precision, scale = int(match.group(1) or 10), int(match.group(2) or 0)
        if not 1 <= precision <= 38 or scale > precision:
            raise TableError(f"invalid type {spark_type!r}: decimal precision 1..38, scale <= precision")
        return pa.decimal128(precision, scale)
    raise TableError(
        f"unknown column type {spark_type!r} (known: {', '.join(sorted(_SIMPLE_TYPES))}, "
        "varchar(n), char(n), decimal(p,s))"
    )


def _split_fields(inner: str) -> list[str]:
    """``a:bigint,b:struct<c:string,d:bigint>`` → its top-level ``name:type`` parts."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    return [*parts, inner[start:]] if inner else []


def _delta_types(schema: Schema) -> list[tuple[str, str]]:
    """(name, Delta type) pairs; complex types as their JSON so they compare exactly."""
    fields = json.loads(schema.to_json())["fields"]
    return [(f["name"], f["type"] if isinstance(f["type"], str) else json.dumps(f["type"])) for f in fields]


def _micros(t: datetime) -> int:
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


class DeltaRsStorage(DeltaStateTables):
    """Delta tables under ``warehouse`` (``<warehouse>/<table>``) read and written with delta-rs."""

    def __init__(self, *, warehouse: str, storage_options: dict[str, str] | None = None):
        self.warehouse = warehouse if "://" in warehouse else os.path.abspath(warehouse)
        self.storage_options = storage_options

    # -- metadata ---------------------------------------------------------------------------------

    def exists(self, table: str) -> bool:
        return DeltaTable.is_deltatable(self.uri(table), storage_options=self.storage_options)

    def _open(self, table: str, version: int | None = None) -> DeltaTable:
        try:
            return DeltaTable(self.uri(table), version=version, storage_options=self.storage_options)
        except TableNotFoundError:
            raise TableError(
                f"table '{table}' does not exist (create it with CREATE TABLE in sql/ or `cq ingest`)"
            ) from None
        except DeltaError as exc:
            if version is not None and self.exists(table):
                raise TableError(f"table '{table}' has no version {version}: {exc}") from None
            # A damaged log: name the table, not delta-rs's backtrace.
            raise TableError(f"table '{table}' cannot be read: {str(exc).splitlines()[0]}") from None

    @contextmanager
    def _snapshot(self, table: str, version: int | None = None) -> Iterator[DeltaTable]:
        """The table at ``version`` (None: latest) for a read: kept open since an earlier read or
        write of this process and moved forward (``storage.open_tables``), or opened; returned for
        the next one once the read has planned its files."""
        uri = self.uri(table)
        dt = self.open_tables.take(uri, version=version, storage_options=self.storage_options)
        if dt is None:
            dt = self._open(table, version)
        yield dt
        self.open_tables.give(uri, dt, storage_options=self.storage_options)

    def schema(self, table: str) -> pa.Schema:
        # A table this process holds open is moved forward, not opened again (its whole log read).
        with self._snapshot(table) as dt:
            return pa.schema(dt.schema().to_arrow())

    def row_count(self, table: str) -> int | None:
        """The table's rows from its log's per-file statistics (``numRecords``), no data read; None
        when a file has none (written without statistics)."""
        with self._snapshot(table) as dt:
            actions = log.arrow_table(dt.get_add_actions(flatten=True))
        if "num_records" not in actions.column_names:
            return 0 if actions.num_rows == 0 else None
        counts = actions.column("num_records").to_pylist()
        return None if any(n is None for n in counts) else sum(counts)

    def version(self, table: str) -> int:
        # Probed by commit file names from the last checkpoint: opening the table would list its log.
        found = self.latest_version(table)
        return self._open(table).version() if found is None else found  # missing: the error naming it

    def transaction_version(self, table: str, app_id: str) -> int | None:
        return self._open(table).transaction_version(app_id)

    def warm(self, table: str, *, app_id: str | None = None) -> None:
        """``Storage.warm``: the snapshot kept in ``open_tables`` for the next write, the table's
        ``txn`` map read (``storage.txns``) when ``app_id`` is given."""
        try:
            dt = self._writable(self.uri(table))
        except DeltaError:  # a damaged log: the write says so, naming the table
            return
        if dt is None:
            return
        self._warmed(table, dt)
        if app_id is not None:
            self.txns.held(self.uri(table), dt, app_id, storage_options=self.storage_options)
        self.open_tables.give(self.uri(table), dt, storage_options=self.storage_options)

    def _warmed(self, table: str, dt: DeltaTable) -> None:
        """What a storage learns of a table it warms, beyond its snapshot (``SparkDeltaStorage``: who writes it)."""

    def create_table(self, decl: TableDecl) -> bool:
        """Create ``decl``'s empty table; False if it exists with the same columns and types."""
        wanted = pa.schema([pa.field(c.name, arrow_type(c.type)) for c in decl.columns])
        if self.exists(decl.name):
            self._check_same(decl.name, Schema.from_arrow(wanted), self._open(decl.name).schema())
            return False
        # mode="ignore": a concurrent creator of the same table is not an error.
        DeltaTable.create(
            self.uri(decl.name),
            wanted,
            mode="ignore",
            configuration=NEW_TABLE_PROPERTIES,
            storage_options=self.storage_options,
        )
        self._check_same(decl.name, Schema.from_arrow(wanted), self._open(decl.name).schema())
        return True

    @staticmethod
    def _check_same(table: str, wanted: Schema, actual: Schema) -> None:
        want = {n.lower(): (n, t) for n, t in _delta_types(wanted)}
        have = {n.lower(): (n, t) for n, t in _delta_types(actual)}
        show = lambda t: _DISPLAY.get(t, t)
        problems = [f"column '{want[k][0]}' is missing" for k in want if k not in have]
        problems += [f"column '{have[k][0]}' is not declared" for k in have if k not in want]
        problems += [
            f"column '{want[k][0]}' is {show(have[k][1])}, declared {show(want[k][1])}"
            for k in want
            if k in have and want[k][1] != have[k][1]
        ]
        if problems:
            raise TableError(f"table '{table}' exists with a different schema: {'; '.join(problems)}")

    def _time_field(self, table: str, dt: DeltaTable, time_column: str) -> str:
        """The stored name of ``time_column`` (matched case-insensitively); it must be a timestamp."""
        types = _delta_types(dt.schema())
        match = next(((n, t) for n, t in types if n.lower() == time_column.lower()), None)
        if match is None:
            raise TableError(
                f"table '{table}' has no time column '{time_column}' (columns: {', '.join(n for n, _ in types)})"
            )
        if match[1] != "timestamp":
            raise TableError(
                f"table '{table}', column '{match[0]}' is {_DISPLAY.get(match[1], match[1])}, "
                "not a timestamp, so it cannot be the time column"
            )
        return match[0]

    # -- reads ------------------------------------------------------------------------------------

    def read_range(
        self,
        spark: SparkSession,
        table: str,
        *,
        time_column: str,
        time_range: TimeRange | None,
        version: int | None = None,
    ) -> tuple[DataFrame, Scan]:
        """Rows with ``time_column`` in ``time_range`` (None: all rows) at a pinned version, reading
        only the files whose statistics can hold such rows."""
        with self._snapshot(table, version) as dt:
            return self._read_snapshot(spark, table, dt, time_column, time_range)

    def _read_snapshot(
        self, spark: SparkSession, table: str, dt: DeltaTable, time_column: str, time_range: TimeRange | None
    ) -> tuple[DataFrame, Scan]:
        """``read_range`` of the open snapshot ``dt``: its parquet files whose statistics can hold the range."""
        column = self._time_field(table, dt, time_column)
        _check_readable(table, dt)
        uris = dt.file_uris()
        actions = log.arrow_table(dt.get_add_actions(flatten=True))
        mask = range_mask(actions, column, time_range)
        kept = [u for u, keep in zip(uris, mask) if keep]
        df = where_in_range(_read_files(spark, _spark_schema(dt), kept), column, time_range)
        return df, Scan(
            table=table,
            version=dt.version(),
            files_total=len(uris),
            files_read=len(kept),
            columns=snapshot_columns(dt),
            bytes_read=kept_bytes(actions, mask),
        )

    def read_added(
        self,
        spark: SparkSession,
        table: str,
        *,
        after: int,
        until: int,
        time_column: str,
    ) -> tuple[DataFrame, Scan]:
        """The rows of the data files added (``dataChange``) by the commits ``after + 1 .. until``, read
        with the schema of version ``until``: what each new version committed.

        The Delta log records files, not rows: a commit that rewrites a file (DELETE, UPDATE, an
        overwrite with a predicate that keeps some of a file's rows) adds a file holding the surviving
        rows too, so those count as added; appends are exact. Files compacted without data change are
        left out. ``Scan.files_total`` counts the added files, ``files_read`` those read (the same).
        If a commit file has been cleaned up, the files of ``until`` not in ``after`` are read instead."""
        with self._snapshot(table, until) as dt:
            self._time_field(table, dt, time_column)
            _check_readable(table, dt)
            spark_schema = _spark_schema(dt)
        commits = log.read_commits(
            self.uri(table), after=after, until=until, time_column=time_column, storage_options=self.storage_options
        )
        paths = list(dict.fromkeys(f.path for c in commits for f in c.added))
        return _read_files(spark, spark_schema, paths), Scan(
            table=table, version=until, files_total=len(paths), files_read=len(paths)
        )

    # -- writes -----------------------------------------------------------------------------------

    def append(self, table: str, data: pa.Table, *, metadata: Mapping[str, str] | None = None) -> int:
        """Append ``data`` in one commit, creating the table if missing; returns the new version."""
        dt = self._open_existing(table)
        if dt is not None:
            data = _cast_to(table, data, pa.schema(dt.schema().to_arrow()))
        else:
            data = data.cast(storable_schema(data.schema))
        commit_id = uuid.uuid4().hex
        props = CommitProperties(custom_metadata={**(metadata or {}), COMMIT_ID_KEY: commit_id})

        if dt is None:

            def create(attempt: int) -> None:
                write_deltalake(
                    self.uri(table),
                    data,
                    mode="append",
                    configuration=NEW_TABLE_PROPERTIES,
                    commit_properties=props,
                    post_commithook_properties=WRITER_HOOKS,
                    storage_options=self.storage_options,
                )

            retry_conflicts(create)
            return self._version_written(table, None, commit_id)
        written = dt
        return self._commit(
            table,
            written,
            lambda: write_deltalake(
                written, data, mode="append", commit_properties=props, post_commithook_properties=WRITER_HOOKS
            ),
            commit_id=commit_id,
            txns={},
        )

    def _open_existing(self, table: str) -> DeltaTable | None:
        """The table's latest snapshot for a write (``_writable``: kept open since an earlier write, or
        opened), or None if there is no table (one log load, not two)."""
        try:
            return self._writable(self.uri(table))
        except DeltaError:
            return self._open(table)  # the damaged log's error, naming the table

    def _open_or_create(self, table: str, schema_of: Callable[[], pa.Schema], *, time_column: str) -> DeltaTable:
        """The table's latest snapshot; a missing table is created first from the data's schema
        (``schema_of()``, asked only then), which must have a timestamp ``time_column``."""
        dt = self._open_existing(table)
        if dt is not None:
            return dt
        schema = schema_of()
        incoming = {f.name.lower(): f.type for f in schema}
        if not pa.types.is_timestamp(incoming.get(time_column.lower(), pa.null())):
            raise TableError(
                f"table '{table}' does not exist and the data to write has no "
                f"timestamp column '{time_column}' to create it from"
            )
        DeltaTable.create(
            self.uri(table),
            storable_schema(schema),
            mode="ignore",
            configuration=NEW_TABLE_PROPERTIES,
            storage_options=self.storage_options,
        )
        return self._open(table)

    def _version_written(self, table: str, dt: DeltaTable | None, commit_id: str) -> int:
        """The version of the commit ``commit_id`` just made through ``dt`` (which delta-rs moves to
        the snapshot its commit made): that snapshot's last commit, checked by its id; else looked up."""
        if dt is not None:  # its commit file, read by name: history() would list the whole log
            newest = log.commit_info(self.uri(table), dt.version(), storage_options=self.storage_options)
            if newest and self._commit_matches(newest, commit_id):
                return dt.version()
        return self._committed_version(table, commit_id)

    def _commit(
        self,
        table: str,
        dt: DeltaTable,
        write: Callable[[], None],
        *,
        commit_id: str,
        txns: Mapping[str, int],
        txn: tuple[str, int] | None = None,
        once: bool = False,
    ) -> int:
        """Run ``write`` (one commit through ``dt``; retried on top of the table as it is now after a
        conflict) and return the version it committed; ``dt`` goes back to ``open_tables``. After a
        conflict, a table that now holds ``txn`` is not written again (``_skipped``): delta-rs refuses
        a commit whose application transaction a concurrent commit carried (``ConcurrentTransaction``),
        and writing it on top would commit the same firing twice."""
        base = [dt.version()]

        def attempt(n: int) -> None:
            if n:
                dt.update_incremental()
                if self._already_written(table, dt, txn):
                    raise _Held
            base[0] = dt.version()
            write()

        try:
            retry_conflicts(attempt)
        except _Held:
            return self._skipped(table, dt, txn, once=once)
        # The next version was claimed by an atomic create (a conditional PUT on S3, a rename that
        # refuses to overwrite elsewhere): one past the snapshot written on is this commit. After
        # delta-rs' own retries it is later, and looked up by the commit's id.
        version = dt.version() if dt.version() == base[0] + 1 else self._version_written(table, dt, commit_id)
        self.txns.wrote(self.uri(table), base=base[0], version=version, txns=txns)
        self.open_tables.give(self.uri(table), dt, storage_options=self.storage_options)  # after its last use
        return version

    def _committed_version(self, table: str, commit_id: str) -> int:
        # deltalake 1.6.6's history() lists the newest commits present when it is called but numbers
        # them down from the version the DeltaTable object loaded, so its numbers are only right if
        # no commit landed in between: check that the version did not move across the call.
        for _ in range(MAX_ATTEMPTS):
            dt = self._open(table)
            history = dt.history(limit=100)
            if self._open(table).version() == dt.version():
                break
        for commit in history:
            if self._commit_matches(commit, commit_id):
                return int(commit["version"])
        return dt.version()  # buried under 100 newer commits: the latest is the best answer left

    def _commit_matches(self, commit: dict, commit_id: str) -> bool:
        return commit.get(COMMIT_ID_KEY) == commit_id

    def replace_range(
        self,
        table: str,
        data: ArrowData,
        *,
        time_column: str,
        time_range: TimeRange,
        app_id: str,
        app_version: int,
        metadata: Mapping[str, str] | None = None,
        source_versions: Mapping[str, int] | None = None,
    ) -> int:
        """Replace every row with ``time_column`` in ``time_range`` by ``data`` in one commit carrying
        the application transaction ``(app_id, app_version)`` (recorded only: delta-rs never skips a
        write, so ``source_versions`` is unused); creates the table if missing. Rows of
        ``data`` outside the range are a ``CQError`` (``replace_where`` with a range predicate)."""
        lo, hi = _range_bounds(time_range)

        def check_for(column: str) -> Callable[[pa.RecordBatch | pa.Table], None]:
            return lambda part: _check_in_range(table, column, part.column(column), lo, hi)

        return self._replace(
            table,
            data,
            predicate_for=lambda column: range_predicate(column, (lo, hi)),
            check_for=check_for,
            time_column=time_column,
            app_id=app_id,
            app_version=app_version,
            metadata=metadata,
        )

    def replace_where(
        self,
        table: str,
        data: ArrowData,
        *,
        predicate: str,
        time_column: str,
        app_id: str,
        app_version: int,
        metadata: Mapping[str, str] | None = None,
        check: Callable[[pa.RecordBatch | pa.Table], None] | None = None,
        source_versions: Mapping[str, int] | None = None,
        once: bool = False,
    ) -> int:
        """Replace every row matching ``predicate`` (delta-rs SQL, e.g. from ``ranges_predicate`` or
        ``groups_predicate``) by ``data`` in one commit carrying the application transaction
        ``(app_id, app_version)``; returns the new version. ``data`` may be empty (a pure delete).

        The table is created from ``data``'s schema if missing (it must then have a timestamp
        ``time_column``); ``data`` is cast to the table's schema (column names matched ignoring case)
        and ``check``, if given, is called on it (the whole table, or each streamed batch) before it is
        written: raise to refuse it. delta-rs itself refuses rows that do not match ``predicate``.

        A commit that conflicts with a concurrent writer is written again, up to ``MAX_ATTEMPTS``
        times with a jittered backoff (``storage.retry``); a ``RecordBatchReader`` is streamed once
        and replayed from a local spill file. ``once``: skipped with ``AlreadyCommitted`` where the
        table holds ``(app_id, app_version)`` already (``Storage.replace_where``)."""
        return self._replace(
            table,
            data,
            predicate_for=lambda _column: predicate,
            check_for=lambda _column: check,
            time_column=time_column,
            app_id=app_id,
            app_version=app_version,
            metadata=metadata,
            txn=(app_id, app_version) if once else None,
            once=once,
        )

    def upsert_cells(
        self,
        table: str,
        data: ArrowData,
        *,
        time_column: str,
        keys: tuple[str, ...],
        time_range: TimeRange,
        app_id: str,
        app_version: int,
        metadata: Mapping[str, str] | None = None,
        source_versions: Mapping[str, int] | None = None,
        once: bool = False,
    ) -> int:
        """IoTDB's write of a firing (``storage.upsert``): each row of ``data`` (all inside
        ``time_range``) overwrites the non-NULL cells of the sink row with its ``time_column`` and
        ``keys``, or is inserted; nothing is deleted. One delta-rs MERGE commit carrying the
        application transaction (recorded only, as ``replace_range`` does here: ``source_versions``
        is unused); ``once``: skipped with ``AlreadyCommitted`` where the sink holds it (``Storage``)."""
        from cq_engine.storage.upsert import merge_deltars

        return self._upsert(
            table,
            data,
            time_column=time_column,
            keys=keys,
            time_range=time_range,
            app_id=app_id,
            app_version=app_version,
            metadata=metadata,
            txn=(app_id, app_version) if once else None,
            once=once,
            merge=merge_deltars,
        )

    def _upsert(
        self, table, data, *, time_column, keys, time_range, app_id, app_version, metadata, txn, merge, once=False
    ) -> int:
        """``upsert_cells`` through delta-rs; ``txn``: Delta's idempotent-write identity, as ``_replace``'s
        (``once``: a write it skips raises ``AlreadyCommitted``)."""
        lo, hi = _range_bounds(time_range)
        dt = self._open_or_create(table, lambda: data.schema, time_column=time_column)
        self._check_delta_rs_writes(table, dt)
        if isinstance(data, pa.RecordBatchReader):
            data = data.read_all()  # replayed on a conflict: a firing's few rows
        if self._already_written(table, dt, txn):
            # This identity committed these cells already (delta-spark skips them too).
            return self._skipped(table, dt, txn, once=once)
        column = self._time_field(table, dt, time_column)
        data = _cast_to(table, data, pa.schema(dt.schema().to_arrow()))
        _check_in_range(table, column, data.column(column), lo, hi)
        commit_id, props = _commit_properties(app_id, app_version, txn, metadata)
        names = {f.name.lower(): f.name for f in data.schema}
        stored_keys = [names.get(k.lower(), k) for k in keys]

        def write() -> None:
            if not data.num_rows:  # nothing to upsert: the commit still records the run's identity, as a replace's does
                write_deltalake(
                    dt, data, mode="append", commit_properties=props, post_commithook_properties=WRITER_HOOKS
                )
                return
            if not any(range_mask(log.arrow_table(dt.get_add_actions(flatten=True)), column, (lo, hi))):
                # No file of the sink can hold a row of the range (its statistics): every row is an
                # insert, so the upsert is the range's replace, which deletes nothing there and costs
                # about half a MERGE (a firing whose RANGE does not overlap the previous one's). A
                # concurrent writer adding rows there meanwhile conflicts (the replace reads the range).
                write_deltalake(
                    dt,
                    data,
                    mode="overwrite",
                    predicate=range_predicate(column, (lo, hi)),
                    commit_properties=props,
                    post_commithook_properties=WRITER_HOOKS,
                )
                return
            merge(
                dt,
                data,
                time_column=column,
                keys=stored_keys,
                time_range=(lo, hi),
                commit_properties=props,
                post_commithook_properties=WRITER_HOOKS,
            )

        return self._commit(
            table, dt, write, commit_id=commit_id, txns=_txns(app_id, app_version, txn), txn=txn, once=once
        )

    def _replace(
        self,
        table: str,
        data: ArrowData,
        *,
        predicate_for: Callable[[str], str],
        check_for: Callable[[str], Callable[[pa.RecordBatch | pa.Table], None] | None],
        time_column: str,
        app_id: str,
        app_version: int,
        metadata: Mapping[str, str] | None,
        txn: tuple[str, int] | None = None,
        once: bool = False,
    ) -> int:
        """``replace_where`` with the predicate and check made from the stored time column's name.
        ``txn``: Delta's idempotent-write identity ``(txnAppId, txnVersion)`` as delta-spark records it:
        a write whose identity the table already holds at that version or later is skipped (the
        table's version is returned; ``once``: ``AlreadyCommitted``), else the commit records it."""
        dt = self._open_or_create(table, lambda: data.schema, time_column=time_column)
        self._check_delta_rs_writes(table, dt)
        if self._already_written(table, dt, txn):
            if isinstance(data, pa.RecordBatchReader):
                for _ in data:  # drained, so the caller counts the rows that identity wrote
                    pass
            # This identity already committed these rows (delta-spark skips it too).
            return self._skipped(table, dt, txn, once=once)
        column = self._time_field(table, dt, time_column)
        target = pa.schema(dt.schema().to_arrow())
        commit_id, props = _commit_properties(app_id, app_version, txn, metadata)
        predicate = predicate_for(column)
        check = check_for(column)
        failure: list[BaseException] = []
        if isinstance(data, pa.Table):
            data = _cast_to(table, data, target)
            if check is not None:
                check(data)
            stream = None
        else:
            stream = Replayable(target, _checked_batches(table, data, target, check, failure))

        def write() -> None:
            try:
                # Through the snapshot already loaded: a URI would load the log once more.
                write_deltalake(
                    dt,
                    data if stream is None else stream.reader(),
                    mode="overwrite",
                    predicate=predicate,
                    commit_properties=props,
                    post_commithook_properties=WRITER_HOOKS,
                )
            except CommitFailedError:
                raise
            except DeltaError:
                # delta-rs flattens an exception raised while it pulls batches into a DeltaError
                # message; re-raise the original (e.g. the out-of-range CQError) instead.
                if failure:
                    raise failure[0] from None
                raise

        txns = _txns(app_id, app_version, txn)
        if stream is None:
            return self._commit(table, dt, write, commit_id=commit_id, txns=txns, txn=txn, once=once)
        with stream:
            return self._commit(table, dt, write, commit_id=commit_id, txns=txns, txn=txn, once=once)

    def _check_delta_rs_writes(self, table: str, dt: DeltaTable) -> None:
        """A storage that also writes with Spark's connector refuses here a table delta-rs cannot write."""

    def _skipped(self, table: str, dt: DeltaTable, txn: tuple[str, int] | None, *, once: bool) -> int:
        """A write of ``txn`` that ``dt`` (given back) already holds: its version, or ``AlreadyCommitted``."""
        self.open_tables.give(self.uri(table), dt, storage_options=self.storage_options)
        if once and txn is not None:
            raise AlreadyCommitted(table, txn[0], txn[1], version=dt.version())
        return dt.version()

    def _already_written(self, table: str, dt: DeltaTable, txn: tuple[str, int] | None) -> bool:
        """Does the table hold Delta's idempotent-write identity ``txn`` at ``dt``'s version or later?"""
        if txn is None:
            return False
        held = self.txns.held(self.uri(table), dt, txn[0], storage_options=self.storage_options)
        return held is not None and held >= txn[1]

    @property
    def txns(self) -> Transactions:
        """The idempotent-write identities this object's tables hold (``storage.txns``)."""
        return self.__dict__.setdefault("_txns", Transactions())


class _Held(Exception):
    """A write's identity was committed by a concurrent writer meanwhile (``_commit``)."""


def _txns(app_id: str, app_version: int, txn: tuple[str, int] | None) -> dict[str, int]:
    return {app_id: app_version, **({txn[0]: txn[1]} if txn is not None else {})}


def _commit_properties(
    app_id: str, app_version: int, txn: tuple[str, int] | None, metadata: Mapping[str, str] | None
) -> tuple[str, CommitProperties]:
    """A write's commit id and properties: its metadata, the application transaction and ``txn``."""
    commit_id = uuid.uuid4().hex
    transactions = [Transaction(app_id=app_id, version=app_version)]
    if txn is not None and txn[0] != app_id:  # one txn action per application id and commit
        transactions.append(Transaction(app_id=txn[0], version=txn[1]))
    props = CommitProperties(
        custom_metadata={**(metadata or {}), COMMIT_ID_KEY: commit_id},
        max_commit_retries=MAX_ATTEMPTS,
        app_transactions=transactions,
    )
    return commit_id, props


def _check_readable(table: str, dt: DeltaTable) -> None:
    # Plain parquet reads would ignore deleted-row bitmaps and physical column names.
    unsupported = {"deletionVectors", "columnMapping"} & set(dt.protocol().reader_features or ())
    if unsupported:
        raise TableError(
            f"table '{table}' uses Delta features {sorted(unsupported)} that the deltalake read path does not support"
        )


def _spark_schema(dt: DeltaTable) -> StructType:
    """The snapshot's schema as Spark's."""
    from pyspark.sql.types import StructType

    return StructType.fromJson(json.loads(dt.schema().to_json()))


def _read_files(spark: SparkSession, spark_schema: StructType, uris: list[str]) -> DataFrame:
    """``spark.read.parquet`` of ``uris`` with ``spark_schema`` (an empty frame for no file)."""
    if not uris:
        return spark.createDataFrame([], schema=spark_schema)
    # Hadoop's S3 connector (what Spark reads with) answers to s3a://, delta-rs writes s3://.
    uris = [("s3a://" + u[5:]) if u.startswith("s3://") else u for u in uris]
    return spark.read.schema(spark_schema).parquet(*uris)


def range_mask(actions: pa.Table, column: str, time_range: TimeRange | None) -> list[bool]:
    """Per add action: can the file hold a row with ``column`` in ``time_range`` (None: every file)?"""
    if time_range is None:
        return [True] * actions.num_rows
    lo, hi = _range_bounds(time_range)
    return _overlaps(actions, column, lo, hi)


def where_in_range(df: DataFrame, column: str, time_range: TimeRange | None) -> DataFrame:
    """``df`` filtered to ``column`` in the half-open ``time_range`` (None: unfiltered)."""
    if time_range is None:
        return df
    from pyspark.sql import functions as F

    lo, hi = _range_bounds(time_range)
    # Microsecond literals avoid any session-time-zone interpretation.
    ts = F.col(f"`{column}`")
    return df.where((ts >= F.timestamp_micros(F.lit(_micros(lo)))) & (ts < F.timestamp_micros(F.lit(_micros(hi)))))


def snapshot_columns(dt: DeltaTable) -> tuple[str, ...]:
    """The snapshot's column names, from its log."""
    return tuple(f.name for f in dt.schema().fields)


def kept_bytes(actions: pa.Table, mask: list[bool]) -> int:
    """Total size of the add actions kept by ``mask`` (-1 when the log has no sizes)."""
    if "size_bytes" not in actions.column_names:
        return -1
    return sum(size or 0 for size, keep in zip(actions.column("size_bytes").to_pylist(), mask) if keep)


def _overlaps(actions: pa.Table, column: str, lo: datetime, hi: datetime) -> list[bool]:
    """Per add action: can the file hold a row with ``column`` in [lo, hi)? Files without stats can."""
    names = actions.column_names
    if f"min.{column}" not in names or f"max.{column}" not in names:
        return [True] * actions.num_rows
    mins = actions.column(f"min.{column}").to_pylist()
    maxs = actions.column(f"max.{column}").to_pylist()
    return [mn is None or mx is None or (mn < hi and mx + _STATS_SLACK > lo) for mn, mx in zip(mins, maxs)]


def storable_schema(schema: pa.Schema) -> pa.Schema:
    """The schema a new table gets from its first data: nullable columns, timestamps as UTC micros
    (naive timestamps are UTC inside the engine), large/view strings as plain strings."""

    def fix(t: pa.DataType) -> pa.DataType:
        if pa.types.is_timestamp(t):
            return TIMESTAMP
        if pa.types.is_large_string(t) or pa.types.is_string_view(t):
            return pa.string()
        if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
            return pa.binary()
        return t

    return pa.schema([pa.field(f.name, fix(f.type)) for f in schema])


def _cast_to(table: str, data: pa.Table | pa.RecordBatch, schema: pa.Schema) -> pa.Table | pa.RecordBatch:
    """``data`` with exactly ``schema``'s columns (matched case-insensitively) and types."""
    arrays = []
    for field, i in align_columns(data.schema.names, schema, table=table):
        if i is None:
            arrays.append(pa.nulls(data.num_rows, field.type))
            continue
        try:
            arrays.append(pc.cast(data.column(i), field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise TableError(
                f"table '{table}', column '{field.name}': cannot store "
                f"{data.schema.field(i).type} as {field.type}: {exc}"
            ) from None
    if isinstance(data, pa.RecordBatch):
        return pa.RecordBatch.from_arrays(arrays, schema=schema)
    return pa.Table.from_arrays(arrays, schema=schema)


def _check_in_range(table: str, column: str, values: pa.Array | pa.ChunkedArray, lo: datetime, hi: datetime) -> None:
    """Rows outside [lo, hi) would survive next to the replaced range, so they are an error."""
    if values.null_count:
        raise CQError(f"table '{table}': {values.null_count} row(s) to write have no '{column}'")
    if len(values) == 0:
        return
    bounds = pc.min_max(values).as_py()
    if bounds["min"] < lo or bounds["max"] >= hi:
        raise CQError(
            f"table '{table}': rows to write span [{bounds['min'].isoformat()}, {bounds['max'].isoformat()}] "
            f"on '{column}', outside the replaced range [{lo.isoformat()}, {hi.isoformat()})"
        )


def _checked_batches(
    table: str,
    reader: pa.RecordBatchReader,
    schema: pa.Schema,
    check: Callable[[pa.RecordBatch | pa.Table], None] | None,
    failure: list[BaseException],
) -> Iterator[pa.RecordBatch]:
    """Stream ``reader`` cast to ``schema`` and checked; a failure is kept in ``failure`` so the
    caller can re-raise it (delta-rs only reports its text)."""
    try:
        for batch in reader:
            batch = _cast_to(table, batch, schema)
            if check is not None:
                check(batch)
            yield batch
    except BaseException as exc:
        failure.append(exc)
        raise
