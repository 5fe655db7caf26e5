"""The firing ledger: one row per firing or recalculation run, in a Delta table under ``_cq/``."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from cq_engine.errors import CQError

UTC = timezone.utc
TIMESTAMP = pa.timestamp("us", tz="UTC")
KINDS = ("firing", "recalculate", "realtime", "history", "period")  # the last three: streams
STATUSES = ("succeeded", "failed")
MAX_ATTEMPTS = 5

SCHEMA = pa.schema([
    pa.field("definition", pa.string()),
    pa.field("kind", pa.string()),
    pa.field("fire_time", TIMESTAMP),
    pa.field("range_start", TIMESTAMP),
    pa.field("range_end", TIMESTAMP),
    pa.field("source_versions", pa.string()),  # JSON object: table -> Delta version read
    pa.field("rows_written", pa.int64()),
    pa.field("sink_version", pa.int64()),
    pa.field("status", pa.string()),
    pa.field("started_at", TIMESTAMP),
    pa.field("finished_at", TIMESTAMP),
    pa.field("error", pa.string()),
])


@dataclass(frozen=True)
class LedgerEntry:
    """What one run of a definition did; times are timezone-aware UTC."""

    definition: str
    kind: str
    fire_time: datetime | None
    range_start: datetime
    range_end: datetime
    source_versions: dict[str, int]
    rows_written: int
    sink_version: int | None
    status: str
    started_at: datetime
    finished_at: datetime
    error: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise CQError(f"ledger entry: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.status not in STATUSES:
            raise CQError(f"ledger entry: status {self.status!r} is not one of {', '.join(STATUSES)}")
        for name in ("fire_time", "range_start", "range_end", "started_at", "finished_at"):
            value = getattr(self, name)
            if value is None and name == "fire_time":
                continue
            if value is None or value.tzinfo is None:
                raise CQError(f"ledger entry: {name} must be a timezone-aware time, got {value!r}")
            object.__setattr__(self, name, value.astimezone(UTC))


class Ledger:
    """Append-only Delta table of :class:`LedgerEntry` rows at ``uri``."""

    def __init__(self, *, uri: str, storage_options: dict[str, str] | None = None):
        self.uri = uri if "://" in uri else os.path.abspath(uri)
        self.storage_options = storage_options

    def record(self, entry: LedgerEntry) -> None:
        """Append one entry (one commit)."""
        row = asdict(entry)
        row["source_versions"] = json.dumps(entry.source_versions, sort_keys=True)
        data = pa.Table.from_pylist([row], schema=SCHEMA)
        for attempt in range(MAX_ATTEMPTS):
            try:
                write_deltalake(self.uri, data, mode="append", storage_options=self.storage_options)
                return
            except CommitFailedError:
                # Two first writers racing to create the table; the loser appends on its next try.
                if attempt == MAX_ATTEMPTS - 1:
                    raise

    def to_arrow(self) -> pa.Table:
        """The whole ledger as an Arrow table with :data:`SCHEMA` (empty if nothing was recorded)."""
        if not DeltaTable.is_deltatable(self.uri, storage_options=self.storage_options):
            return SCHEMA.empty_table()
        # DeltaTable.scan (delta-rs' own engine), not to_pyarrow_table: the latter's pyarrow dataset
        # intermittently aborts the interpreter at exit in deltalake 1.6.6.
        data = pa.table(DeltaTable(self.uri, storage_options=self.storage_options).scan())
        return data.select(SCHEMA.names).cast(SCHEMA)

    def entries(self, definition: str | None = None) -> list[LedgerEntry]:
        """All entries (of ``definition`` if given), oldest ``started_at`` first; empty if no ledger."""
        data = self.to_arrow()
        names = [f.name for f in fields(LedgerEntry)]
        result = []
        for row in data.to_pylist():
            if definition is not None and row["definition"] != definition:
                continue
            row["source_versions"] = json.loads(row["source_versions"] or "{}")
            result.append(LedgerEntry(**{n: row[n] for n in names}))
        result.sort(key=lambda e: (e.started_at, e.finished_at))
        return result

    def last(self, definition: str) -> LedgerEntry | None:
        """The most recently started entry of ``definition``."""
        found = self.entries(definition)
        return found[-1] if found else None

    def last_by_definition(self) -> dict[str, LedgerEntry]:
        """The most recently started entry of every definition in the ledger."""
        return {e.definition: e for e in self.entries()}
