"""The one storage interface every layer above ``storage/`` depends on (see ARCHITECTURE.md).

It names what callers need: the data path (snapshot reads into Spark, atomic range/predicate
replaces), Spark-free log reads (latest version, commits, a snapshot's event-time span, one commit's
rows) and small engine state tables under ``_cq/`` (read / append / overwrite an Arrow table).
``DeltaRsStorage`` (``storage.delta``, the ``deltalake`` package) implements it all;
``SparkDeltaStorage`` (``storage.spark_delta``, Spark's own connector) replaces the data path and keeps
the rest; ``storage.factory`` picks one. Nothing outside ``storage/`` imports ``deltalake`` or builds a
table URI.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol, TypeAlias, runtime_checkable

import pyarrow as pa

from cq_engine.errors import TableError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from cq_engine.model import TableDecl
    from cq_engine.storage.log import Commit
    from cq_engine.storage.maintain import Retention, TableReport

TimeRange = tuple[datetime, datetime]  # half-open [start, end), aware UTC
ArrowData: TypeAlias = pa.Table | pa.RecordBatchReader


def align_columns(names: list[str], schema: pa.Schema, *, table: str) -> list[tuple[pa.Field, int | None]]:
    """Pair each field of ``schema`` with the index of the same-named column in ``names``
    (case-insensitive), or None for a missing nullable one. Unknown, doubled or missing
    non-nullable columns are a ``TableError`` naming the table and column."""
    by_name: dict[str, int] = {}
    for i, name in enumerate(names):
        if name.lower() in by_name:
            raise TableError(f"table '{table}': the data has column '{name}' twice (names ignore case)")
        by_name[name.lower()] = i
    known = {f.name.lower() for f in schema}
    unknown = [n for n in names if n.lower() not in known]
    if unknown:
        raise TableError(f"table '{table}' has no column '{unknown[0]}' (columns: {', '.join(schema.names)})")
    pairs: list[tuple[pa.Field, int | None]] = []
    for field in schema:
        index = by_name.get(field.name.lower())
        if index is None and not field.nullable:
            raise TableError(f"table '{table}': the data has no column '{field.name}', which cannot be null")
        pairs.append((field, index))
    return pairs


@dataclass(frozen=True)
class Scan:
    """What a snapshot read looked at: table version pinned and files kept by statistics."""

    table: str
    version: int
    files_total: int
    files_read: int
    columns: tuple[str, ...] = ()  # the snapshot's columns (known from the Delta log, no Spark call)
    bytes_read: int = -1  # size of the files read (-1: unknown)


@runtime_checkable
class DataFrameWriter(Protocol):
    """A storage whose executors write a Spark DataFrame themselves (``replace_range`` takes the frame):
    no result row passes through the process running the firing."""

    def writes_frame(self, table: str, *, input_bytes: int) -> bool:
        """Hand ``table`` a Spark result computed from ``input_bytes`` of input (-1: unknown) as a
        DataFrame? False: collect it to Arrow first."""
        ...

    def rows_written(self, table: str, version: int) -> int:
        """The rows the commit ``version`` of ``table`` wrote (its operation metrics)."""
        ...


class Storage(Protocol):
    def exists(self, table: str) -> bool: ...

    def create_table(self, decl: TableDecl) -> bool:
        """Create the table from its declaration; False (no change) if it exists with that schema."""

    def schema(self, table: str) -> pa.Schema: ...

    def row_count(self, table: str) -> int | None:
        """The table's rows from its Delta log's statistics (None: a file without them)."""
        ...

    def version(self, table: str) -> int: ...

    def append(self, table: str, data: pa.Table, *, metadata: Mapping[str, str] | None = None) -> int:
        """Append in one commit, creating the table if missing; returns the new version."""

    def read_range(
        self,
        spark: SparkSession,
        table: str,
        *,
        time_column: str,
        time_range: TimeRange | None,
        version: int | None = None,
    ) -> tuple[DataFrame, Scan]:
        """A Spark DataFrame of the rows with ``time_column`` in ``time_range`` at a pinned version,
        reading only files whose statistics can hold such rows."""

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
        """Atomically replace every row with ``time_column`` in ``time_range`` by ``data`` (one
        commit carrying the application transaction); creates the table if missing. Returns the
        new version. With the run's ``source_versions``, a storage may skip a write it already made
        from the same inputs (Delta's idempotent writes)."""

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
        """IoTDB's write of a continuous query's firing (``storage.upsert``): each row of ``data``
        (all inside ``time_range``) overwrites, where its cells are not NULL, the row with the same
        ``time_column`` and ``keys``, or is added; no row is deleted. One atomic commit carrying the
        application transaction (and, as ``replace_range``, Delta's idempotent-write identity where
        the storage skips); creates the table if missing. Returns the new version. ``once``: the
        application transaction is Delta's idempotent-write identity (``txnAppId``/``txnVersion``): a
        table that holds ``app_id`` at ``app_version`` or later is left alone and ``AlreadyCommitted``
        raised, also when a concurrent writer commits it first (a conflict, checked again)."""

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
        """Atomically replace every row matching ``predicate`` (delta-rs SQL) by ``data`` (one commit
        carrying the application transaction); creates the table if missing; ``check`` sees the data
        (cast to the table's schema) before it is written. Returns the new version. ``once``: as
        ``upsert_cells``'s, the application transaction is the idempotent-write identity and a table
        holding it (at ``app_version`` or later) raises ``AlreadyCommitted``."""

    def read_added(
        self,
        spark: SparkSession,
        table: str,
        *,
        after: int,
        until: int,
        time_column: str,
    ) -> tuple[DataFrame, Scan]:
        """A Spark DataFrame of the rows in the files added (data change) by versions
        ``after + 1 .. until``."""

    def latest_version(self, table: str, *, known: int | None = None) -> int | None:
        """The table's latest version from the Delta log alone (None: no table), probing forward from
        ``known``: no Spark, cost independent of the table's history."""

    def read_commits(self, table: str, *, after: int, until: int, time_column: str) -> list[Commit]:
        """The commits ``after + 1 .. until`` with the files each added/removed (``storage.log``)."""

    def transaction_version(self, table: str, app_id: str) -> int | None: ...

    def warm(self, table: str, *, app_id: str | None = None) -> None:
        """Open ``table`` for the commits to come (nothing if it does not exist): what the first
        commit would read of its log is read now (its snapshot, who writes it, ``app_id``'s
        idempotent-write map), so a run waiting for its first firing pays it before the firing is due."""

    def table_span(
        self, table: str, *, version: int | None, time_column: str
    ) -> tuple[datetime | None, datetime | None, int]:
        """Event-time extent ``(min, max)`` and row count of a snapshot, from file statistics alone."""

    def commit_rows(self, table: str, commit: Commit, *, schemas: dict[str, pa.Schema] | None = None) -> pa.Table:
        """The rows of the files ``commit`` added, as Arrow in the table's current schema (no Spark)."""

    def read_file(self, table: str, path: str, *, columns: tuple[str, ...] | None = None) -> pa.Table:
        """One data file of ``table`` by its full path, optionally only some of its columns (no Spark)."""

    def known_groups(self, table: str, keys: tuple[str, ...], *, version: int, time_column: str) -> pa.Table | None:
        """Every distinct ``keys`` tuple ``table`` holds at ``version``, maintained incrementally from the
        Delta log (``storage.groups``); None when the table's files cannot be read one by one."""

    # -- engine state: small tables at ``_cq/<name>`` (the ledger, frontiers, outboxes, ticks) --------

    def read_state(self, name: str) -> pa.Table | None:
        """The state table ``name``, or None if it was never written."""

    def append_state(self, name: str, data: pa.Table, *, once: tuple[str, int] | None = None) -> bool:
        """Append to the state table ``name`` in one commit, creating it if missing; whether it appended
        (``once``: an application transaction ``(app_id, version)``; a table that holds ``app_id`` at
        ``version`` or later, even from a concurrent writer, is left alone)."""

    def overwrite_state(
        self, name: str, data: pa.Table, *, app_id: str | None = None, app_version: int | None = None
    ) -> None:
        """Replace the state table ``name`` in one commit (with an application transaction if given)."""

    def drop_state(self, prefix: str) -> str | None:
        """Delete every state table under ``prefix``; where they were, or None if there was nothing."""

    def replace_state_where(self, name: str, rows: Callable[[pa.Table], pa.Table], *, predicate: str) -> None:
        """Replace the rows of state table ``name`` matching ``predicate`` by ``rows(current)``, one commit."""

    def state_names(self) -> list[str]:
        """Every state table under ``_cq/``."""

    # -- housekeeping (``storage.maintain``) ---------------------------------------------------------

    def maintain(self, table: str, *, retention: Retention) -> TableReport:
        """Retention properties, compaction, checkpoint, log cleanup and VACUUM of ``table``."""

    def maintain_state(self, name: str, *, retention: Retention) -> TableReport:
        """The same for the state table ``name``."""
