"""Delta tables kept open between writes and reads in one process (ARCHITECTURE.md §3).

Why: a delta-rs open lists the table's ``_delta_log`` and loads its newest checkpoint, tombstones
included; a sink written once per firing for months keeps a week of log files and, after each
compaction, a checkpoint holding every compacted file's tombstone for the file retention. A writer
that opened its table again for every commit paid that on every firing (at 100,000 commits: 80 ms
per open against a few at 100). A table kept open is brought up to date with
``update_incremental`` (the commits since, nothing else) before its next write; a reader pinned to a
version at or after the one held moves it forward the same way (a firing reads its source at the
version it pinned, a commit or a few past the last firing's).

A table is lent to one writer or reader at a time (``take`` removes it, ``give`` returns it after a write
that succeeded), so threads never share one. Before lending, the commit file of the version it
holds must still be the one seen when it was returned (same size and modification time): a table
dropped and created again under the same name, or a log cleaned up past it, is opened afresh.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping

import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from cq_engine.storage import log

# Tables kept open per process (least recently returned first out). Above the number of sinks a
# batch run writes each round: at 256, a thousand sinks written in turn missed on every write.
LIMIT = 4096


class OpenTables:
    """Delta tables lent to writers and taken back, per table URI."""

    def __init__(self, *, limit: int = LIMIT) -> None:
        self._free: OrderedDict[str, tuple[DeltaTable, tuple[int, int]]] = OrderedDict()
        self._lock = threading.Lock()
        self._limit = limit

    def take(
        self, uri: str, *, version: int | None = None, storage_options: Mapping[str, str] | None = None
    ) -> DeltaTable | None:
        """The table at ``uri`` brought up to ``version`` (None: its latest), if one was returned, is
        still the same table and holds no later version; None otherwise (the caller opens it)."""
        with self._lock:
            entry = self._free.pop(uri, None)
        if entry is None:
            return None
        dt, stamp = entry
        if version is not None and dt.version() > version:
            # A reader pinned to an older version: going back would load the checkpoint again, so it
            # opens its own; the newer one stays for the next reader or writer.
            with self._lock:
                self._free.setdefault(uri, entry)
            return None
        if _stamp(uri, dt.version(), storage_options) != stamp:
            return None
        try:
            if version is None:
                # Only when there is a newer commit: update_incremental lists the log and reads
                # _last_checkpoint even when there is none, and on an object store a probe for the
                # next version is one HEAD (a commit landing after it is the commit's conflict).
                if _exists(uri, dt.version() + 1, storage_options):
                    dt.update_incremental()
            elif dt.version() < version:
                dt.load_as_version(version)  # forward: the commits since, as update_incremental
        except DeltaError:
            return None
        return dt

    def give(self, uri: str, dt: DeltaTable, *, storage_options: Mapping[str, str] | None = None) -> None:
        """Return ``dt`` (at ``uri``) after a read or a write that succeeded, for the next one; a
        table kept meanwhile at a later version (a reader of an older version opened its own, or
        two opened at once) stays instead: moving forward is cheap, going back is not."""
        stamp = _stamp(uri, dt.version(), storage_options)
        if stamp is None:
            return
        with self._lock:
            kept = self._free.get(uri)
            if kept is None or kept[0].version() <= dt.version():
                self._free[uri] = (dt, stamp)
            self._free.move_to_end(uri)
            while len(self._free) > self._limit:
                self._free.popitem(last=False)


def _exists(uri: str, version: int, storage_options: Mapping[str, str] | None) -> bool:
    fs, root = log._filesystem(log._normalize(uri), storage_options)
    return log._exists(fs, f"{root}/_delta_log/{log._json_name(version)}")


def _stamp(uri: str, version: int, storage_options: Mapping[str, str] | None) -> tuple[int, int] | None:
    """Size and modification time (ns) of the commit file of ``version``; None if it is gone."""
    fs, root = log._filesystem(log._normalize(uri), storage_options)
    info = fs.get_file_info(f"{root}/_delta_log/{log._json_name(version)}")
    if info.type == pafs.FileType.NotFound:
        return None
    return int(info.size or 0), int(info.mtime_ns or 0)
