"""Housekeeping of a Delta table with delta-rs: retention properties, compaction, a checkpoint, log
cleanup and VACUUM, each only when it has something to do, so running it again changes nothing
(docs/operations/housekeeping.md, ARCHITECTURE.md §3).

Why: every firing, stream run and ledger append is a commit adding a small file. Writers checkpoint on
their own (delta-rs every 100 commits, delta-spark every 10), so opening a table reads a checkpoint
plus a bounded tail of JSON; what still grows with the history is the number of live small files
(a read opens each) and of dead files and log files on disk (listing them). Compaction rewrites live
files with ``dataChange=false``: the engine's log readers (``storage.log``, sensors, known groups)
skip such commits, and Delta's conflict rules make a compaction that raced a writer fail (it is then
retried on the new snapshot) rather than bring back rows that writer removed.

Compactions never run beside each other on one table: delta-rs 1.6.6 commits a compaction whose input
files another compaction already replaced since its snapshot, so both stand and every row of those
files is in the table twice (``tests/test_compaction.py`` shows it; Delta's rules make the second fail
as a delete-delete conflict). They do race here: every writer of a state table compacts it when its
append lands on a multiple of ``STATE_COMPACT_EVERY``, several processes append to the ledger, and
``cq maintain`` runs beside them. So a compaction first claims the table (``claim_compaction``): an
empty commit carrying the application transaction ``cq-engine/compaction``, whose version says until
when the claim holds. Two claims from one snapshot conflict under Delta's own rules (the second commit
carrying an app id a concurrent commit carried fails), a claimer that sees a live claim leaves the
table alone, and the compaction reads a snapshot taken after its claim, so it sees every compaction
claimed before. Releasing is a second empty commit; the claim of a process that died lapses.

Safety of the deletes: a data file is deleted only once it has been out of the table for
``Retention.files`` (VACUUM; the engine reads pinned versions of planned work, so that must exceed the
longest a planned work waits), a log file only once older than ``Retention.log`` and before the newest
checkpoint (a sensor cursor older than that falls back to comparing snapshots, ``storage.log``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, Transaction
from deltalake.exceptions import CommitFailedError, DeltaError

from cq_engine.storage import log
from cq_engine.storage.retry import retry_conflicts

LOG_RETENTION_KEY = "delta.logRetentionDuration"
FILE_RETENTION_KEY = "delta.deletedFileRetentionDuration"
CHECKPOINT_INTERVAL_KEY = "delta.checkpointInterval"
# Every table the engine creates checkpoints every 10 commits (delta-spark's default; delta-rs's is
# 100). Whoever opens a table replays each commit since its newest checkpoint, one GET apiece on an
# object store: each batch run's process opening its sinks, a reader pinned to a version older than
# the one its process holds, delta-spark's snapshot of every new version of a fed source. At 100 an
# open read up to 99 commit files, at 10 a checkpoint and at most 9. `cq maintain` sets it on a table
# that sets no interval of its own.
NEW_TABLE_PROPERTIES = {CHECKPOINT_INTERVAL_KEY: "10"}
# Delta's defaults when a table does not set the property.
DEFAULTS = {LOG_RETENTION_KEY: timedelta(days=30), FILE_RETENTION_KEY: timedelta(days=7)}
# Appends to an engine state table compact it when they land on a multiple of this version.
STATE_COMPACT_EVERY = 100
# The engine's own commits: a checkpoint at the table's interval, but no expired-log cleanup. delta-rs
# would otherwise list the whole log directory, stat'ing every file, after *each* commit (350 ms per
# sink commit at 50,000 log files against 70 ms without); `maintain_table` cleans the log instead.
WRITER_HOOKS = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)
COMPACTION_APP_ID = "cq-engine/compaction"
# Longer than any compaction the engine runs (a state table's takes seconds, a large sink's minutes): a
# compaction still running after its lease could race the next one.
COMPACTION_LEASE = timedelta(hours=1)
TARGET_FILE_BYTES = 104_857_600  # delta-rs's default target size: smaller files are merged


@dataclass(frozen=True)
class Retention:
    """How long Delta log files (``log``) and data files no longer in the table (``files``) are kept."""

    log: timedelta = DEFAULTS[LOG_RETENTION_KEY]
    files: timedelta = DEFAULTS[FILE_RETENTION_KEY]

    def properties(self) -> dict[str, str]:
        return {LOG_RETENTION_KEY: interval(self.log), FILE_RETENTION_KEY: interval(self.files)}


@dataclass
class TableReport:
    """What maintenance did to one table (``name``: a table, or ``_cq/<state>``)."""

    name: str
    version: int = -1  # the table's version afterwards
    files_before: int = 0  # live data files
    files_after: int = 0
    compacted: int = 0  # files compaction replaced
    checkpoint: int | None = None  # the version a checkpoint was written for
    logs_removed: int = 0
    vacuumed: int = -1  # data files deleted (-1: not counted)
    properties_set: bool = False
    dropped_entries: int = 0  # ledger rows past retention
    notes: list[str] = field(default_factory=list)
    error: str | None = None  # the table could not be maintained

    def line(self) -> str:
        if self.error is not None:
            return f"{self.name}: FAILED: {self.error}"
        parts = [f"v{self.version}", f"files {self.files_before} -> {self.files_after}"]
        if self.properties_set:
            parts.append("table properties set")
        if self.dropped_entries:
            parts.append(f"{self.dropped_entries} ledger entries dropped")
        if self.checkpoint is not None:
            parts.append(f"checkpoint v{self.checkpoint}")
        parts.append(f"{self.logs_removed} log files removed")
        parts.append(f"{'?' if self.vacuumed < 0 else self.vacuumed} data files vacuumed")
        return f"{self.name}: " + ", ".join(parts) + "".join(f"; {n}" for n in self.notes)


def interval(value: timedelta) -> str:
    """A Delta interval property value (``interval 30 days``) in the largest exact unit."""
    seconds = int(value.total_seconds())
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds % size == 0 and seconds:
            return f"interval {seconds // size} {unit}"
    return f"interval {seconds} seconds"


_UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800}


def parse_interval(text: str | None) -> timedelta | None:
    """``interval 30 days`` (Delta's form of these properties) → its duration; None if not of that form."""
    match = re.fullmatch(r"\s*(?:interval\s+)?(\d+)\s+(second|minute|hour|day|week)s?\s*", (text or "").lower())
    return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)]) if match else None


def properties_to_set(configuration: Mapping[str, str | None], retention: Retention) -> dict[str, str]:
    """The retention properties whose effective value (Delta's default if unset) differs from
    ``retention``, and the engine's checkpoint interval if the table sets none."""
    wanted = {LOG_RETENTION_KEY: retention.log, FILE_RETENTION_KEY: retention.files}
    out = {k: v for k, v in NEW_TABLE_PROPERTIES.items() if configuration.get(k) is None}
    for key, value in wanted.items():
        current = configuration.get(key)
        effective = DEFAULTS[key] if current is None else parse_interval(current)
        if effective != value:
            out[key] = interval(value)
    return out


def log_files(uri: str, storage_options: dict[str, str] | None) -> set[str]:
    """The names of the files in the table's ``_delta_log``."""
    fs, root = log._filesystem(log._normalize(uri), storage_options)
    infos = fs.get_file_info(pafs.FileSelector(f"{root}/_delta_log", allow_not_found=True))
    return {i.base_name for i in infos if i.type == pafs.FileType.File}


def maintain_table(
    uri: str,
    *,
    name: str,
    retention: Retention,
    storage_options: dict[str, str] | None = None,
    compact: Callable[[DeltaTable], int] | None = None,
    vacuum: Callable[[DeltaTable], int] | None = None,
    set_properties: Callable[[dict[str, str]], None] | None = None,
) -> TableReport:
    """Retention properties, compaction, checkpoint, log cleanup and VACUUM of the table at ``uri``
    with delta-rs. ``compact``, ``vacuum`` and ``set_properties`` replace delta-rs's for the data path
    of a storage whose writer is Spark (``SparkDeltaStorage``); each returns the files it replaced or
    deleted (-1: not counted)."""
    report = TableReport(name)
    open_ = lambda: DeltaTable(uri, storage_options=storage_options)
    dt = open_()
    report.files_before = len(dt.file_uris())
    # Writers' commits (the compaction's too) also clean the log when they checkpoint: count it all.
    logs_before = log_files(uri, storage_options)
    wanted = properties_to_set(dt.metadata().configuration or {}, retention)
    if wanted:
        if set_properties is not None:
            set_properties(wanted)
        else:
            retry_conflicts(lambda _a: open_().alter.set_table_properties(wanted))
        report.properties_set = True
    if report.files_before > 1:
        if compact is not None:
            report.compacted = compact(open_())
        else:  # a writer that removed a file this compaction read makes it fail: redone on the new snapshot
            report.compacted = retry_conflicts(lambda _a: compact_files(uri, storage_options=storage_options))
    # VACUUM before the checkpoint: delta-rs's checkpoint drops the tombstones older than the file
    # retention, and the checkpoint then covers VACUUM's own commits.
    report.vacuumed = (vacuum or _vacuum(retention))(open_())
    dt = open_()
    report.version, report.files_after = dt.version(), len(dt.file_uris())
    try:
        if not _has_checkpoint(uri, dt.version(), storage_options):
            dt.create_checkpoint()  # delta-rs also cleans the log here when the table allows it
            report.checkpoint = dt.version()
        dt.cleanup_metadata()  # log files older than delta.logRetentionDuration, before the newest checkpoint
        report.logs_removed = len(logs_before - log_files(uri, storage_options))
    except (DeltaError, OSError) as exc:  # e.g. reader features delta-rs cannot checkpoint: the writer's own
        report.notes.append(f"checkpoint/log cleanup left to the table's writer: {str(exc).splitlines()[0]}")
    return report


def compact_files(
    uri: str,
    *,
    storage_options: dict[str, str] | None = None,
    lease: timedelta = COMPACTION_LEASE,
    now: datetime | None = None,
) -> int:
    """delta-rs's compaction of the table at ``uri``, claimed (module docstring); the files it
    replaced. 0 and no commit when fewer than two files are small enough to merge or another
    compaction holds the table. Raises ``CommitFailedError`` if a writer removed a file it read."""
    dt = DeltaTable(uri, storage_options=storage_options)
    sizes = dt.get_add_actions(flatten=True).column("size_bytes").to_pylist()
    if sum(1 for size in sizes if size < TARGET_FILE_BYTES) < 2:
        return 0
    held = claim_compaction(dt, now=now or datetime.now(UTC), lease=lease)
    if held is None:
        return 0
    try:
        dt.update_incremental()  # after the claim: every compaction claimed before it has committed
        return int(dt.optimize.compact().get("numFilesRemoved", 0))
    finally:
        release_compaction(dt, held)


def claim_compaction(dt: DeltaTable, *, now: datetime, lease: timedelta) -> int | None:
    """Claim the table of ``dt`` for a compaction until ``now + lease``: the claim (an odd
    ``cq-engine/compaction`` version), or None if a live claim holds it or a concurrent claim won."""
    if compaction_claimed_until(dt, now=now) is not None:
        return None
    held = int((now + lease).timestamp() * 1000) * 2 + 1
    try:
        _commit_claim(dt, held)
    except CommitFailedError:
        return None
    return held


def release_compaction(dt: DeltaTable, held: int) -> None:
    """Release the claim ``held`` unless it is no longer the table's, from the table's latest snapshot
    and again after a conflict (a commit changing its metadata meanwhile fails the release), since a
    claim left behind keeps every compaction away until it lapses."""

    def release(_attempt: int) -> None:
        dt.update_incremental()  # the claim in it, and any metadata change since
        if dt.transaction_version(COMPACTION_APP_ID) == held:
            _commit_claim(dt, held - 1)

    retry_conflicts(release)


def compaction_claimed_until(dt: DeltaTable, *, now: datetime) -> datetime | None:
    """Until when a compaction's claim in ``dt``'s snapshot holds the table; None if none holds it at ``now``."""
    version = dt.transaction_version(COMPACTION_APP_ID)
    if version is None or version % 2 == 0:  # never claimed, or released
        return None
    until = datetime.fromtimestamp(version // 2 / 1000, UTC)
    return until if until > now else None


def _commit_claim(dt: DeltaTable, version: int) -> None:
    """An empty commit carrying ``cq-engine/compaction`` at ``version``."""
    dt.create_write_transaction(
        [],
        mode="append",
        schema=dt.schema(),
        commit_properties=CommitProperties(app_transactions=[Transaction(app_id=COMPACTION_APP_ID, version=version)]),
        post_commithook_properties=WRITER_HOOKS,
    )


def _vacuum(retention: Retention) -> Callable[[DeltaTable], int]:
    def run(dt: DeltaTable) -> int:
        # full: also files whose tombstones have left the checkpoints, and leftovers of failed writes
        # (by modification time), as delta-spark's VACUUM; tombstones within the retention are kept.
        # A dry run first: VACUUM commits (START/END) even when it deletes nothing.
        if not vacuum_due(dt, retention):
            return 0
        return len(
            dt.vacuum(retention_hours=_hours(retention), dry_run=False, enforce_retention_duration=True, full=True)
        )

    return run


def _hours(retention: Retention) -> int:
    return math.ceil(retention.files.total_seconds() / 3600)


def vacuum_due(dt: DeltaTable, retention: Retention) -> list[str]:
    """The files VACUUM (full) would delete: out of the table for longer than the file retention, or
    never committed and older than it (relative paths)."""
    return dt.vacuum(retention_hours=_hours(retention), dry_run=True, enforce_retention_duration=True, full=True)


def delete_files(uri: str, paths: list[str], storage_options: dict[str, str] | None) -> int:
    """Delete ``paths`` (relative to the table at ``uri``) without a commit: VACUUM's START/END commits
    are an audit record, and a second committer of a table is what a storage with one writer avoids."""
    fs, root = log._filesystem(log._normalize(uri), storage_options)
    for path in paths:
        fs.delete_file(f"{root}/{path}")
    return len(paths)


def _has_checkpoint(uri: str, version: int, storage_options: dict[str, str] | None) -> bool:
    fs, root = log._filesystem(log._normalize(uri), storage_options)
    return log._exists(fs, f"{root}/_delta_log/{version:020d}.checkpoint.parquet")
