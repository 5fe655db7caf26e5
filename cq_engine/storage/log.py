"""Reading the Delta log without Spark, touching only its new part (ARCHITECTURE.md §3, §7).

Sensors and schedules call ``latest_version`` each tick with the version they saw last, then
``read_commits`` for the commits after it: both cost grows with the number of new commits, not with the
table's history. Log files are read with ``pyarrow.fs`` (local paths, ``s3://``, ...), never with Spark.

Statistics: Delta stores timestamp statistics truncated to milliseconds, so a file's ``max_time`` may be
up to 1 ms below its true maximum (``min_time`` is exact or below, so still a lower bound).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.fs as pafs

_LOG = "_delta_log"
# Commit files read at once: on an object store each read is a round trip or two (pyarrow's S3
# reader asks for the size first), and a sensor evaluation waited for them one after another.
READ_THREADS = 8


def arrow_table(stream) -> pa.Table:
    """An Arrow C stream (delta-rs's scans and add actions) as a pyarrow Table. Not ``pa.table(stream)``:
    that first asks pandas whether it was handed a DataFrame, importing pandas (a few tenths of a second)
    into commands and sensors that never use it."""
    return pa.RecordBatchReader.from_stream(stream).read_all()


@dataclass(frozen=True)
class FileChange:
    """One data file a commit added or removed: its location and its time-column statistics.

    ``path`` is the file's full location: the table URI joined with the action's URL-decoded relative
    path (an absolute URI in the log is kept as it is). ``min_time``/``max_time`` (aware UTC) come from
    the file's ``stats``; None when the file has no statistics for the time column, which means the
    file may hold any time. ``max_time`` may be up to 1 ms below the true maximum (Delta truncates
    timestamp statistics to milliseconds). ``rows`` is the statistics' ``numRecords`` (None: unknown).
    """

    path: str
    min_time: datetime | None
    max_time: datetime | None
    rows: int | None


# Stands for "files removed that cannot be known" (the log before them was cleaned up): no bounds, so a
# reader that treats missing statistics as "any time" treats it as "everything may have changed".
UNKNOWN_REMOVED = FileChange(path="", min_time=None, max_time=None, rows=None)


@dataclass(frozen=True)
class Commit:
    """One table version: when, what operation, and the files it added/removed with ``dataChange``
    true (compaction, OPTIMIZE and other rewrites that change no data are left out)."""

    version: int
    timestamp: datetime
    operation: str | None
    added: tuple[FileChange, ...]
    removed: tuple[FileChange, ...]


# -- file system ---------------------------------------------------------------------------------


def _normalize(uri: str) -> str:
    uri = uri.rstrip("/") or "/"
    if "://" not in uri and not uri.startswith("file:"):
        uri = os.path.abspath(uri)
    return uri


# Delta/object_store storage option names -> pyarrow S3FileSystem arguments.
_S3_OPTIONS = {
    "aws_access_key_id": "access_key",
    "access_key_id": "access_key",
    "aws_secret_access_key": "secret_key",
    "secret_access_key": "secret_key",
    "aws_session_token": "session_token",
    "session_token": "session_token",
    "aws_token": "session_token",
    "aws_region": "region",
    "region": "region",
    "aws_default_region": "region",
    "aws_endpoint_url": "endpoint_override",
    "aws_endpoint": "endpoint_override",
    "endpoint_url": "endpoint_override",
    "endpoint": "endpoint_override",
}


@functools.lru_cache(maxsize=16)
def _s3_filesystem(options: tuple[tuple[str, str], ...]) -> pafs.FileSystem:
    # One per set of options, not per table: an S3FileSystem costs ~0.1 s of AWS SDK set-up, and a
    # batch run reads the logs of hundreds of sinks every round.
    kwargs: dict[str, object] = {}
    for key, value in options:
        arg = _S3_OPTIONS.get(key.lower())
        if arg == "endpoint_override" and "://" in value:
            kwargs["scheme"], value = value.split("://", 1)
        if arg:
            kwargs[arg] = value
    return pafs.S3FileSystem(**kwargs)


@functools.lru_cache(maxsize=16)
def _bucket_filesystem(bucket: str) -> pafs.FileSystem:
    return pafs.FileSystem.from_uri(f"s3://{bucket}")[0]  # configured from the environment


@functools.lru_cache(maxsize=256)
def _cached_filesystem(uri: str, options: tuple[tuple[str, str], ...]) -> tuple[pafs.FileSystem, str]:
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme in ("s3", "s3a"):
        key = (parsed.netloc + parsed.path).rstrip("/")
        return (_s3_filesystem(options) if options else _bucket_filesystem(parsed.netloc)), key
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path.rstrip("/") or "/"


def _filesystem(uri: str, storage_options: Mapping[str, str] | None) -> tuple[pafs.FileSystem, str]:
    """The file system holding ``uri`` and the table root's path in it. Storage options are mapped for
    ``s3://`` (keys, region, endpoint); elsewhere pyarrow's own configuration (environment) applies."""
    return _cached_filesystem(uri, tuple(sorted((storage_options or {}).items())))


def _json_name(version: int) -> str:
    return f"{version:020d}.json"


def _exists(fs: pafs.FileSystem, path: str) -> bool:
    if isinstance(fs, pafs.S3FileSystem):
        # One HEAD: get_file_info follows a missing key's HEAD with a LIST (is it a "directory"?),
        # and most probes here are for the next version, which is missing.
        try:
            fs.open_input_file(path).close()
        except FileNotFoundError:
            return False
        return True
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def _read(fs: pafs.FileSystem, path: str) -> bytes | None:
    """The file's bytes, or None if it does not exist."""
    try:
        with fs.open_input_stream(path) as stream:
            return stream.read()
    except FileNotFoundError:
        return None
    except OSError as exc:  # some file systems report a missing key as a plain OSError
        if "not exist" in str(exc).lower() or "not found" in str(exc).lower():
            return None
        raise


def _read_all(fs: pafs.FileSystem, paths: list[str]) -> list[bytes | None]:
    """``_read`` of each of ``paths``, up to ``READ_THREADS`` at once (pyarrow releases the GIL while
    it waits on the store); one after another in a process that has begun to exit, where a thread
    pool takes no new work."""
    if len(paths) < 2:
        return [_read(fs, p) for p in paths]
    try:
        with ThreadPoolExecutor(max_workers=min(READ_THREADS, len(paths)), thread_name_prefix="cq-log") as pool:
            return list(pool.map(lambda p: _read(fs, p), paths))
    except RuntimeError:  # "cannot schedule new futures after interpreter shutdown"
        return [_read(fs, p) for p in paths]


# -- latest version ------------------------------------------------------------------------------


def latest_version(
    uri: str, *, known: int | None = None, storage_options: Mapping[str, str] | None = None
) -> int | None:
    """The table's latest version, or None if ``uri`` is not a Delta table.

    Probes ``_delta_log/<version>.json`` forward from ``known`` (a version seen before), else from
    ``_delta_log/_last_checkpoint``'s version, else from 0, galloping (+1, +2, +4, ...) then bisecting,
    so it costs a few existence checks however long the table's history: with ``known`` and no new
    commit, two. A ``_last_checkpoint`` that is stale (older than the newest checkpoint) only makes the
    probe start earlier; one that names a version with no log file, or a ``known`` version whose log
    file is gone with nothing after it (table re-created), falls back to starting again from scratch."""
    fs, root = _filesystem(_normalize(uri), storage_options)
    log = f"{root}/{_LOG}"
    if known is not None and known >= 0:
        if _exists(fs, f"{log}/{_json_name(known + 1)}"):
            return _forward(fs, log, known + 1)
        if _exists(fs, f"{log}/{_json_name(known)}"):
            return known
    start = _last_checkpoint(fs, log)
    if start is not None and (
        _exists(fs, f"{log}/{_json_name(start)}") or _exists(fs, f"{log}/{start:020d}.checkpoint.parquet")
    ):
        return _forward(fs, log, start)
    if _exists(fs, f"{log}/{_json_name(0)}"):
        return _forward(fs, log, 0)
    return _listed_version(fs, log)


def _forward(fs: pafs.FileSystem, log: str, start: int) -> int:
    """The last version from ``start`` (which exists) on: commit files exist for every version from
    ``start`` to the latest and for none after it, so gallop to a missing one, then bisect."""
    present, step = start, 1
    while _exists(fs, f"{log}/{_json_name(present + step)}"):
        present += step
        step *= 2
    missing = present + step
    while missing - present > 1:
        middle = (present + missing) // 2
        if _exists(fs, f"{log}/{_json_name(middle)}"):
            present = middle
        else:
            missing = middle
    return present


def _last_checkpoint(fs: pafs.FileSystem, log: str) -> int | None:
    raw = _read(fs, f"{log}/_last_checkpoint")
    if raw is None:
        return None
    try:
        version = json.loads(raw)["version"]
    except (ValueError, KeyError, TypeError):  # torn or foreign content: ignore it
        return None
    return version if isinstance(version, int) and version >= 0 else None


def _listed_version(fs: pafs.FileSystem, log: str) -> int | None:
    """Last resort (no checkpoint pointer, no version 0): list the log directory once."""
    try:
        infos = fs.get_file_info(pafs.FileSelector(log, allow_not_found=True))
    except (FileNotFoundError, NotADirectoryError):
        return None
    versions = []
    for info in infos:
        name = info.base_name
        head = name.split(".", 1)[0]
        if len(head) == 20 and head.isdigit() and (name.endswith(".json") or ".checkpoint" in name):
            versions.append(int(head))
    return max(versions) if versions else None


def commit_info(uri: str, version: int, *, storage_options: Mapping[str, str] | None = None) -> dict | None:
    """The ``commitInfo`` action of commit ``version`` (its custom metadata included), read from its
    JSON log file without listing the log; None if the file is gone or holds none."""
    fs, root = _filesystem(_normalize(uri), storage_options)
    raw = _read(fs, f"{root}/{_LOG}/{_json_name(version)}")
    for line in (raw or b"").splitlines():
        if line.startswith(b'{"commitInfo":'):
            info = json.loads(line)["commitInfo"]
            return info if isinstance(info, dict) else None
    return None


_TXN = b'{"txn":'


def transactions(
    uri: str, *, after: int, until: int, storage_options: Mapping[str, str] | None = None
) -> dict[str, int] | None:
    """The ``txn`` (app transaction) version per app id that commits ``after + 1 .. until`` leave (a
    later commit's wins, as in Delta's log replay), read from their JSON files by name; None when one
    of them is gone (a log cleaned up past it)."""
    fs, root = _filesystem(_normalize(uri), storage_options)
    found: dict[str, int] = {}
    raws = _read_all(fs, [f"{root}/{_LOG}/{_json_name(v)}" for v in range(after + 1, until + 1)])
    if any(raw is None for raw in raws):
        return None
    for raw in raws:
        for line in (raw or b"").splitlines():
            if line.startswith(_TXN):
                txn = json.loads(line)["txn"]
                app, v = txn.get("appId"), txn.get("version")
                if isinstance(app, str) and isinstance(v, int):
                    found[app] = v
    return found


# -- commits -------------------------------------------------------------------------------------


# An add or remove line whose own `dataChange` is false: its map fields hold only JSON strings, so the
# unquoted form appears nowhere else on such a line (Delta writes its log as compact JSON).
_FILE_ACTIONS = (b'{"add":', b'{"remove":')
_NO_DATA_CHANGE = b'"dataChange":false'


def read_commits(
    uri: str, *, after: int, until: int, time_column: str, storage_options: Mapping[str, str] | None = None
) -> list[Commit]:
    """The commits ``after + 1 .. until`` (``after`` may be -1: from the first version), read from their
    JSON log files, with the time-column statistics of the files each added or removed.

    A removed file carries no statistics in the log: they come from the add action of an earlier commit
    in the batch, else from the snapshot at ``after`` (loaded only then); a file found in neither gets no
    bounds. If a commit file has been cleaned up (log retention), the answer is one synthetic Commit
    (``version=until``, ``operation=None``) holding the difference between the snapshots at ``after``
    and ``until``; if the snapshot at ``after`` cannot be loaded either, its ``removed`` is
    ``(UNKNOWN_REMOVED,)`` and its ``added`` every file of ``until``."""
    if until <= after:
        return []
    table = _normalize(uri)
    fs, root = _filesystem(table, storage_options)
    log = f"{root}/{_LOG}"
    versions = range(max(after, -1) + 1, until + 1)
    raws = _read_all(fs, [f"{log}/{_json_name(v)}" for v in versions])
    if any(raw is None for raw in raws):
        return [_snapshot_diff(table, fs, log, after, until, time_column, storage_options)]
    raw_commits = [(v, raw) for v, raw in zip(versions, raws) if raw is not None]

    column = time_column.lower()
    parsed = []
    added_in_batch: dict[str, FileChange] = {}
    needs_snapshot = False
    for version, raw in raw_commits:
        info: dict = {}
        adds, removes = [], []
        for line in raw.splitlines():
            if not line.strip() or (line.startswith(_FILE_ACTIONS) and _NO_DATA_CHANGE in line):
                continue  # compaction's thousands of adds and removes change no data: not parsed
            action = json.loads(line)
            if "commitInfo" in action:
                info = action["commitInfo"] or {}
            elif "add" in action and action["add"].get("dataChange", True):
                change = _change(table, action["add"], column)
                adds.append(change)
                added_in_batch[change.path] = change
            elif "remove" in action and action["remove"].get("dataChange", True):
                remove = action["remove"]
                change = _change(table, remove, column)
                if change.min_time is None:  # the usual case: removes carry no statistics
                    known = added_in_batch.get(change.path)
                    if known is not None:
                        change = known
                    else:
                        change = None  # resolved from the snapshot at `after` below
                        needs_snapshot = True
                removes.append((_full_path(table, remove["path"]), change))
        timestamp = _commit_time(info) or _file_time(fs, f"{log}/{_json_name(version)}")
        parsed.append((version, timestamp, info.get("operation"), adds, removes))

    before: dict[str, FileChange] = {}
    if needs_snapshot and after >= 0:
        before = _snapshot_files(table, after, time_column, storage_options) or {}
    return [
        Commit(
            version=version,
            timestamp=timestamp,
            operation=operation,
            added=tuple(adds),
            removed=tuple(change or before.get(path) or FileChange(path, None, None, None) for path, change in removes),
        )
        for version, timestamp, operation, adds, removes in parsed
    ]


def _full_path(table: str, path: str) -> str:
    scheme = urlparse(path).scheme
    if len(scheme) > 1:  # an absolute URI (a one-letter "scheme" would be a Windows drive)
        return path
    return f"{table}/{unquote(path)}"


def _change(table: str, action: Mapping, column: str) -> FileChange:
    """A FileChange from an add/remove action and its ``stats`` JSON (or a partition value)."""
    path = _full_path(table, action["path"])
    stats = action.get("stats")
    lo = hi = None
    rows = None
    if stats:
        try:
            stats = json.loads(stats) if isinstance(stats, str) else stats
        except ValueError:
            stats = {}
        rows = stats.get("numRecords")
        lo = _parse_time(_get(stats.get("minValues"), column))
        hi = _parse_time(_get(stats.get("maxValues"), column))
    if lo is None or hi is None:
        value = _get(action.get("partitionValues"), column)
        if value is not None:
            lo = hi = _parse_time(value)
    if lo is None or hi is None:
        lo = hi = None
    return FileChange(path=path, min_time=lo, max_time=hi, rows=rows if isinstance(rows, int) else None)


def _get(values: Mapping | None, column: str):
    """``values[column]`` with the column name matched case-insensitively."""
    if not isinstance(values, Mapping):
        return None
    for key, value in values.items():
        if key.lower() == column:
            return value
    return None


def _parse_time(value) -> datetime | None:
    """An aware UTC datetime from a statistics/partition value (ISO text, naive meaning UTC)."""
    if isinstance(value, datetime):
        t = value
    elif isinstance(value, str):
        try:
            t = datetime.fromisoformat(value.strip())
        except ValueError:
            return None
    else:
        return None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _commit_time(info: Mapping) -> datetime | None:
    millis = info.get("inCommitTimestamp", info.get("timestamp"))
    if isinstance(millis, (int, float)):
        return datetime.fromtimestamp(millis / 1000, tz=UTC)
    return None


def _file_time(fs: pafs.FileSystem, path: str) -> datetime:
    """A commit's time from its log file's modification time (the Delta default without commitInfo)."""
    mtime = fs.get_file_info(path).mtime
    if mtime is None:
        return datetime.now(UTC)
    return mtime.replace(tzinfo=UTC) if mtime.tzinfo is None else mtime.astimezone(UTC)


def _snapshot_files(
    table: str, version: int, time_column: str, storage_options: Mapping[str, str] | None
) -> dict[str, FileChange] | None:
    """The files of the snapshot at ``version`` by full path, or None if it cannot be loaded."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    try:
        dt = DeltaTable(table, version=version, storage_options=dict(storage_options or {}) or None)
        actions = arrow_table(dt.get_add_actions(flatten=True))
    except (DeltaError, OSError, ValueError):
        return None
    names = {n.lower(): n for n in actions.column_names}
    column = time_column.lower()

    def values(prefix: str) -> list:
        name = names.get(f"{prefix}.{column}")
        return actions.column(name).to_pylist() if name else [None] * actions.num_rows

    mins, maxs, parts = values("min"), values("max"), values("partition")
    rows = actions.column("num_records").to_pylist() if "num_records" in names else [None] * actions.num_rows
    files = {}
    for path, lo, hi, part, n in zip(actions.column("path").to_pylist(), mins, maxs, parts, rows):
        lo, hi = _parse_time(lo), _parse_time(hi)
        if (lo is None or hi is None) and part is not None:
            lo = hi = _parse_time(part)
        if lo is None or hi is None:
            lo = hi = None
        full = _full_path(table, path)
        files[full] = FileChange(full, lo, hi, n)
    return files


def _snapshot_diff(
    table: str,
    fs: pafs.FileSystem,
    log: str,
    after: int,
    until: int,
    time_column: str,
    storage_options: Mapping[str, str] | None,
) -> Commit:
    """One synthetic commit: the files of ``until`` not in ``after`` (added) and the reverse (removed).
    Rewrites without data change in between show up too (an over-report, never an under-report)."""
    from deltalake.exceptions import DeltaError

    now = _snapshot_files(table, until, time_column, storage_options)
    if now is None:
        raise DeltaError(f"cannot load version {until} of the Delta table at {table}")
    if after < 0:
        before: dict[str, FileChange] | None = {}
    else:
        before = _snapshot_files(table, after, time_column, storage_options)
    if before is None:
        added: Iterable[FileChange] = now.values()
        removed: tuple[FileChange, ...] = (UNKNOWN_REMOVED,)
    else:
        added = (f for p, f in now.items() if p not in before)
        removed = tuple(f for p, f in before.items() if p not in now)
    raw = _read(fs, f"{log}/{_json_name(until)}")
    info: dict = {}
    if raw is not None:
        for line in raw.splitlines():
            if line.strip() and "commitInfo" in (action := json.loads(line)):
                info = action["commitInfo"] or {}
    timestamp = _commit_time(info) or (
        _file_time(fs, f"{log}/{_json_name(until)}") if raw is not None else datetime.now(UTC)
    )
    return Commit(version=until, timestamp=timestamp, operation=None, added=tuple(added), removed=removed)
