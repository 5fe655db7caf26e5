"""The one small storage interface the planner and runner depend on (DESIGN §2).

``DeltaRsStorage`` (the ``deltalake`` package) implements it here; a ``delta-spark`` implementation
can be added beside it for clusters that have the jars, without touching planner or runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Mapping, Protocol, Union

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from ..model import TableDecl

TimeRange = tuple[datetime, datetime]  # half-open [start, end), aware UTC
ArrowData = Union[pa.Table, pa.RecordBatchReader]


@dataclass(frozen=True)
class Scan:
    """What a snapshot read looked at: table version pinned and files kept by statistics."""

    table: str
    version: int
    files_total: int
    files_read: int


class Storage(Protocol):
    def exists(self, table: str) -> bool: ...

    def create_table(self, decl: "TableDecl") -> bool:
        """Create the table from its declaration; False (no change) if it exists with that schema."""

    def schema(self, table: str) -> pa.Schema: ...

    def version(self, table: str) -> int: ...

    def append(self, table: str, data: pa.Table, *, metadata: Mapping[str, str] | None = None) -> int:
        """Append in one commit, creating the table if missing; returns the new version."""

    def read_range(
        self, spark: "SparkSession", table: str, *, time_column: str, time_range: TimeRange | None,
        version: int | None = None,
    ) -> tuple["DataFrame", Scan]:
        """A Spark DataFrame of the rows with ``time_column`` in ``time_range`` at a pinned version,
        reading only files whose statistics can hold such rows."""

    def replace_range(
        self, table: str, data: ArrowData, *, time_column: str, time_range: TimeRange,
        app_id: str, app_version: int, metadata: Mapping[str, str] | None = None,
    ) -> int:
        """Atomically replace every row with ``time_column`` in ``time_range`` by ``data`` (one
        commit carrying the application transaction); creates the table if missing. Returns the
        new version."""

    def transaction_version(self, table: str, app_id: str) -> int | None: ...
