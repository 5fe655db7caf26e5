"""The live files of an engine state table, read by file name: the checkpoint ``_last_checkpoint``
names and the commits after it, never a listing of the log (ARCHITECTURE.md §3).

Why: a delta-rs open lists the whole ``_delta_log`` and loads every action of the newest checkpoint,
tombstones included. A state table appended once per firing keeps thousands of log files and, after
compaction, a checkpoint holding every compacted file's tombstone for the file retention; opening the
ledger cost 50-90 ms at 100,000 commits against a few at 100, on every read. Here the cost is the
checkpoint's ``add`` column and the commits since it (at most a checkpoint interval).

Only the plain tables the engine writes with delta-rs qualify: reader version 1 (no deletion vectors, no
column mapping), unpartitioned, a single-file checkpoint, relative paths. Anything else, or a log that
changed under the read, answers None, and the caller opens the table with delta-rs as before.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import Schema

from cq_engine.storage import log


def live_files(uri: str, *, storage_options: Mapping[str, str] | None = None) -> list[str] | None:
    """The file-system paths (for ``log._filesystem(uri)``) of the table's live data files at its
    latest version, or None if the table is not one this reader takes (see the module docstring)."""
    found = _live(uri, storage_options)
    return sorted(found[0]) if found is not None else None


def _live(uri: str, storage_options: Mapping[str, str] | None) -> tuple[dict[str, int], str | None] | None:
    """The live files (path -> size in bytes) and the table's newest schema (Delta's ``schemaString``)."""
    fs, root = log._filesystem(log._normalize(uri), storage_options)
    logdir = f"{root}/_delta_log"
    checkpoint = _checkpoint_version(fs, logdir)
    files: dict[str, int] = {}
    schema: str | None = None
    start = 0
    if checkpoint is not None:
        base = _checkpoint_files(fs, f"{logdir}/{checkpoint:020d}.checkpoint.parquet")
        if base is None:
            return None
        (files, schema), start = base, checkpoint + 1
    latest = log.latest_version(uri, known=checkpoint, storage_options=storage_options)
    if latest is None:
        return None
    for version in range(start, latest + 1):
        raw = log._read(fs, f"{logdir}/{log._json_name(version)}")
        if raw is None:  # cleaned up under a stale `_last_checkpoint`: leave it to delta-rs
            return None
        for line in raw.splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "add" in action:
                if action["add"].get("deletionVector") or action["add"].get("partitionValues"):
                    return None
                files[action["add"]["path"]] = int(action["add"].get("size") or 0)
            elif "remove" in action:
                files.pop(action["remove"]["path"], None)
            elif "protocol" in action and not _plain_protocol(action["protocol"]):
                return None
            elif "metaData" in action:
                if not _plain_metadata(action["metaData"]):
                    return None
                schema = action["metaData"].get("schemaString")
    if any(len(urlparse(p).scheme) > 1 for p in files):  # absolute URIs: not this table's own files
        return None
    return {f"{root}/{unquote(p)}": n for p, n in files.items()}, schema


def read_live(uri: str, *, storage_options: Mapping[str, str] | None = None) -> pa.Table | None:
    """The rows of the table's live files (``live_files``), or None if it has none or this reader
    does not take it. Columns a file lacks (added later) are null in its rows. A file of at least
    ``BIG_FILE`` bytes (a compaction's) is read once per process: Delta never rewrites a file, and a
    sensor reading a ledger that holds a month every few seconds read its compacted rows each time."""
    found = _live(uri, storage_options)
    if not found or not found[0]:
        return None
    files, schema_string = found
    fs, _ = log._filesystem(log._normalize(uri), storage_options)
    try:
        if len(files) == 1 and max(files.values()) < BIG_FILE:
            return pq.read_table(next(iter(files)), filesystem=fs)
        schema = pa.schema(Schema.from_json(schema_string).to_arrow()) if schema_string else None
        parts = [_big_file(fs, p, n) for p, n in sorted(files.items()) if n >= BIG_FILE]
        small = sorted(p for p, n in files.items() if n < BIG_FILE)
        if small:
            # One dataset over the files (read in parallel; 99 small files: 12 ms against 36 one by one)
            # with the table's own schema, so columns added later are null in the older files' rows.
            parts.append(ds.dataset(small, schema=schema, filesystem=fs, format="parquet").to_table())
    except (FileNotFoundError, pa.ArrowInvalid):  # vacuumed between the log read and the file read
        return None
    if len(parts) == 1 and schema is None:
        return parts[0]
    if schema is None:
        return pa.concat_tables(parts, promote_options="default")
    return pa.concat_tables([_conform(t, schema) for t in parts])


BIG_FILE = 512 * 1024  # bytes: a file this large is read once per process (``read_live``)
FILES_KEPT_BYTES = 256 * 1024 * 1024  # Arrow bytes of such files kept per process
_FILES: OrderedDict[tuple[str, int], pa.Table] = OrderedDict()
_FILES_LOCK = threading.Lock()


def _big_file(fs, path: str, size: int) -> pa.Table:
    key = (path, size)
    with _FILES_LOCK:
        table = _FILES.get(key)
        if table is not None:
            _FILES.move_to_end(key)
            return table
    table = pq.read_table(path, filesystem=fs)
    with _FILES_LOCK:
        _FILES[key] = table
        while sum(t.nbytes for t in _FILES.values()) > FILES_KEPT_BYTES and len(_FILES) > 1:
            _FILES.popitem(last=False)
    return table


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s columns in its order (a column it lacks: nulls) and types."""
    columns = [
        table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def _checkpoint_version(fs, logdir: str) -> int | None:
    raw = log._read(fs, f"{logdir}/_last_checkpoint")
    if raw is None:
        return None
    try:
        info = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(info, dict) or info.get("parts") or info.get("v2Checkpoint"):
        return None
    version = info.get("version")
    return version if isinstance(version, int) and version >= 0 else None


_CHECKPOINTS: OrderedDict[tuple[str, int, int], tuple[dict[str, int], str | None] | None] = OrderedDict()
_CHECKPOINTS_LOCK = threading.Lock()
CHECKPOINTS_KEPT = 256  # checkpoints' file sets remembered per process


def _checkpoint_files(fs, path: str) -> tuple[dict[str, int], str | None] | None:
    """``_read_checkpoint`` remembered per checkpoint file (its path, size and modification time: a
    checkpoint is written once): a checkpoint after a compaction holds every removed file's tombstone
    for the file retention (100,000 rows at 100,000 commits), and a sensor reads the same one at
    every tick until the next checkpoint."""
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return None
    key = (path, int(info.size or 0), int(info.mtime_ns or 0))
    with _CHECKPOINTS_LOCK:
        known = key in _CHECKPOINTS
        found = _CHECKPOINTS.get(key)
        if known:
            _CHECKPOINTS.move_to_end(key)
    if not known:
        found = _read_checkpoint(fs, path)
        with _CHECKPOINTS_LOCK:
            _CHECKPOINTS[key] = found
            while len(_CHECKPOINTS) > CHECKPOINTS_KEPT:
                _CHECKPOINTS.popitem(last=False)
    return None if found is None else (dict(found[0]), found[1])


def _read_checkpoint(fs, path: str) -> tuple[dict[str, int], str | None] | None:
    """The ``add`` paths (with their sizes) and the schema of a single-file checkpoint, or None if it is
    not a plain table's."""
    try:
        names = set(pq.read_schema(path, filesystem=fs).names)
        columns = [c for c in ("add", "protocol", "metaData") if c in names]
        data = pq.read_table(path, columns=columns, filesystem=fs)
    except (FileNotFoundError, OSError, pa.ArrowInvalid):
        return None
    for row in data.column("protocol").drop_null().to_pylist() if "protocol" in names else []:
        if not _plain_protocol(row):
            return None
    schema = None
    for row in data.column("metaData").drop_null().to_pylist() if "metaData" in names else []:
        if not _plain_metadata(row):
            return None
        schema = row.get("schemaString")
    if "add" not in names:
        return {}, schema
    adds = data.column("add").drop_null().combine_chunks()
    fields = {f.name for f in adds.type}
    if "deletionVector" in fields and adds.field("deletionVector").null_count < len(adds):
        return None
    if "partitionValues" in fields and any(adds.field("partitionValues").to_pylist()):
        return None
    sizes = adds.field("size").to_pylist() if "size" in fields else [0] * len(adds)
    return {p: int(n or 0) for p, n in zip(adds.field("path").to_pylist(), sizes)}, schema


def _plain_protocol(protocol: Mapping) -> bool:
    return int(protocol.get("minReaderVersion") or 1) <= 1


def _plain_metadata(metadata: Mapping) -> bool:
    configuration = metadata.get("configuration") or {}
    if isinstance(configuration, list):  # a map column read from parquet: (key, value) pairs
        configuration = dict(configuration)
    mode = configuration.get("delta.columnMapping.mode")
    return not metadata.get("partitionColumns") and mode in (None, "none")
