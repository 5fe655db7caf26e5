"""The firing ledger: one row per firing or recalculation run, in a Delta table under ``_cq/``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from cq_engine.errors import AlreadyCommitted, CQError
from cq_engine.storage.predicates import _literal

if TYPE_CHECKING:
    from cq_engine.storage.base import Storage

TIMESTAMP = pa.timestamp("us", tz="UTC")
KINDS = ("firing", "recalculate", "realtime", "history", "period", "ignored")  # the last four: streams
# "ignored": no run; rows a stream's tick left out (late, expired, history) or windows its run dropped
# (TRUE_FOR), ``error`` says why
STATUSES = ("succeeded", "failed", "ignored")
STATE_NAME = "firings"  # the ledger's state table: ``_cq/firings``

SCHEMA = pa.schema(
    [
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
    ]
)


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


@dataclass
class Recording:
    """What a run fills in while :meth:`Ledger.recording` watches it."""

    started_at: datetime
    source_versions: dict[str, int] = field(default_factory=dict)
    rows_written: int = 0
    sink_version: int | None = None


class Ledger:
    """Append-only state table (``_cq/firings``) of :class:`LedgerEntry` rows, through the storage seam."""

    def __init__(self, *, store: Storage):
        self.store = store

    @contextmanager
    def recording(
        self,
        *,
        definition: str,
        kind: str,
        fire_time: datetime | None,
        time_range: tuple[datetime, datetime],
        into: list[LedgerEntry] | None = None,
    ) -> Iterator[Recording]:
        """Record the run in the ``with`` body: a failed entry (and the exception re-raised) if it
        raises, else a succeeded one with what the body put in the :class:`Recording`. The one ledger
        wrapper of continuous-query firings and stream runs. With ``into`` the entry is appended
        there instead, for one :meth:`record_many` commit of many runs. A body raising
        ``AlreadyCommitted`` (another run committed this firing) records nothing."""
        rec = Recording(started_at=datetime.now(UTC))

        def entry(status: str, error: str | None = None) -> LedgerEntry:
            ok = status == "succeeded"
            return LedgerEntry(
                definition=definition,
                kind=kind,
                fire_time=fire_time,
                range_start=time_range[0],
                range_end=time_range[1],
                source_versions=dict(rec.source_versions),
                rows_written=rec.rows_written if ok else 0,
                sink_version=rec.sink_version if ok else None,
                status=status,
                started_at=rec.started_at,
                finished_at=datetime.now(UTC),
                error=error,
            )

        write = into.append if into is not None else self.record
        try:
            yield rec
        except AlreadyCommitted:  # another run committed it and recorded it: nothing to record here
            raise
        except Exception as exc:
            write(entry("failed", str(exc)[:2000]))
            raise
        write(entry("succeeded"))

    def note_ignored(
        self,
        *,
        definition: str,
        fire_time: datetime | None,
        span: tuple[datetime, datetime],
        source_versions: dict[str, int],
        text: str,
    ) -> None:
        """An ``ignored`` entry (not a run): what a stream left out over the event times ``span``
        (both ends included), and why (``text``, in ``error``)."""
        now = datetime.now(UTC)
        self.record(
            LedgerEntry(
                definition=definition,
                kind="ignored",
                fire_time=fire_time,
                range_start=span[0],
                range_end=span[1] + timedelta(microseconds=1),  # the ledger's ranges are half-open
                source_versions=source_versions,
                rows_written=0,
                sink_version=None,
                status="ignored",
                started_at=now,
                finished_at=now,
                error=text,
            )
        )

    def record(self, entry: LedgerEntry) -> None:
        """Append one entry (one commit)."""
        self.record_many([entry])

    def record_many(self, entries: list[LedgerEntry]) -> None:
        """Append ``entries`` in one commit (none: no commit)."""
        rows = []
        for entry in entries:
            row = asdict(entry)
            row["source_versions"] = json.dumps(entry.source_versions, sort_keys=True)
            rows.append(row)
        if rows:
            self.store.append_state(STATE_NAME, pa.Table.from_pylist(rows, schema=SCHEMA))

    def drop_before(self, cutoff: datetime) -> int:
        """Delete the entries finished before ``cutoff`` (the ledger's retention), except each
        definition's newest run, which ``cq show`` and the completeness check start from; one commit,
        none when there is nothing to drop. Returns how many were dropped."""
        dropped = 0

        def kept(current: pa.Table) -> pa.Table:
            nonlocal dropped
            data = current.select(SCHEMA.names).cast(SCHEMA)
            old = data.filter(pc.less(data["finished_at"], pa.scalar(cutoff, TIMESTAMP)))
            runs = data.filter(pc.not_equal(data["status"], "ignored"))
            newest = runs.group_by("definition").aggregate([("started_at", "max")])
            keys = {(d, t) for d, t in zip(newest["definition"].to_pylist(), newest["started_at_max"].to_pylist())}
            mask = [
                (d, t) in keys and s != "ignored"
                for d, t, s in zip(
                    old["definition"].to_pylist(), old["started_at"].to_pylist(), old["status"].to_pylist()
                )
            ]
            dropped = old.num_rows - sum(mask)
            return old.filter(pa.array(mask, pa.bool_()))

        data = self.to_arrow()
        kept(data)
        if dropped:
            self.store.replace_state_where(STATE_NAME, kept, predicate=f'"finished_at" < {_literal(cutoff)}')
        return dropped

    def to_arrow(self) -> pa.Table:
        """The whole ledger as an Arrow table with :data:`SCHEMA` (empty if nothing was recorded)."""
        data = self.store.read_state(STATE_NAME)
        if data is None:
            return SCHEMA.empty_table()
        return data.select(SCHEMA.names).cast(SCHEMA)

    def entries(self, definition: str | None = None) -> list[LedgerEntry]:
        """All entries (of ``definition`` if given), oldest ``started_at`` first; empty if no ledger."""
        data = self.to_arrow()
        if definition is not None:
            data = data.filter(pc.equal(data["definition"], definition))
        return self._rows(data)

    @staticmethod
    def _rows(data: pa.Table) -> list[LedgerEntry]:
        names = [f.name for f in fields(LedgerEntry)]
        result = []
        for row in data.to_pylist():
            row["source_versions"] = json.loads(row["source_versions"] or "{}")
            result.append(LedgerEntry(**{n: row[n] for n in names}))
        result.sort(key=lambda e: (e.started_at, e.finished_at))
        return result

    def entries_since(self, since: datetime, definitions: Iterable[str] | None = None) -> list[LedgerEntry]:
        """The entries started at or after ``since`` (of ``definitions`` if given), oldest first; the
        filter runs in Arrow before any row becomes a Python object (the completeness check reads
        the recent hour of a ledger holding months)."""
        data = self.to_arrow()
        mask = pc.greater_equal(data["started_at"], pa.scalar(since, TIMESTAMP))
        if definitions is not None:
            mask = pc.and_(mask, pc.is_in(data["definition"], pa.array(sorted(set(definitions)), pa.string())))
        return self._rows(data.filter(mask))

    def last(self, definition: str) -> LedgerEntry | None:
        """The most recently started run of ``definition`` (``ignored`` notes are not runs)."""
        found = [e for e in self.entries(definition) if e.status != "ignored"]
        return found[-1] if found else None

    def last_fired(self) -> dict[str, datetime]:
        """Per definition, the fire time of its latest succeeded firing or PERIOD tick (what a window
        run plans from, ``scheduling.windows``): grouped in Arrow, no row a Python object."""
        data = self.to_arrow()
        mask = pc.and_(
            pc.equal(data["status"], "succeeded"),
            pc.and_(pc.is_in(data["kind"], pa.array(["firing", "period"])), pc.is_valid(data["fire_time"])),
        )
        latest = data.filter(mask).group_by("definition").aggregate([("fire_time", "max")])
        return dict(zip(latest["definition"].to_pylist(), latest["fire_time_max"].to_pylist(), strict=True))

    def last_by_definition(self) -> dict[str, LedgerEntry]:
        """The most recently started run of every definition in the ledger."""
        return {e.definition: e for e in self.entries() if e.status != "ignored"}
