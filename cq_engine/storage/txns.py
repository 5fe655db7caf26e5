"""Delta's idempotent-write identities (``txn`` actions) of tables, kept per process (ARCHITECTURE.md §3).

A write carrying ``(txnAppId, txnVersion)`` is skipped when the table already holds that app id at
that version or later. delta-rs answers ``DeltaTable.transaction_version`` by replaying every commit
since the last checkpoint, on each call: on an object store a GET per commit, so a sink written twice
a minute paid up to a hundred requests per firing between checkpoints (the app id is new every firing,
so no answer can be reused). Here a table's whole ``txn`` map is read once per process (its last
checkpoint's ``txn`` column and the commits after it), then moved forward by the commits since: none to
read for the ones this process made (``wrote``), one GET for another writer's.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow.parquet as pq
from deltalake import DeltaTable

from cq_engine.storage import log

GAP = 64  # commits read by name to move a map forward; past that it is read again from the checkpoint


@dataclass(frozen=True)
class _Map:
    version: int
    txns: dict[str, int]  # app id -> txn version, as the log's replay leaves it (the newest wins)


class Transactions:
    """The ``txn`` maps of tables, per table URI, each as of a table version."""

    def __init__(self) -> None:
        self._maps: dict[str, _Map] = {}
        self._lock = threading.Lock()

    def held(self, uri: str, dt: DeltaTable, app_id: str, *, storage_options: Mapping[str, str] | None) -> int | None:
        """The txn version ``app_id`` holds in ``dt`` (the table at ``uri``, at its version), or None."""
        version = dt.version()
        with self._lock:
            known = self._maps.get(uri)
        if known is not None and known.version <= version and version - known.version <= GAP:
            newer = log.transactions(uri, after=known.version, until=version, storage_options=storage_options)
            if newer is not None:
                return self._keep(uri, _Map(version, {**known.txns, **newer})).txns.get(app_id)
        whole = _read_map(uri, version, storage_options)
        if whole is None:  # a log this reader does not follow (multi-part or V2 checkpoint): ask delta-rs
            return dt.transaction_version(app_id)
        return self._keep(uri, whole).txns.get(app_id)

    def wrote(self, uri: str, *, base: int, version: int, txns: Mapping[str, int]) -> None:
        """This process committed ``version`` on top of ``base`` with ``txns``: a map known at
        ``base`` holds at ``version`` with them (after a gap it is moved forward on the next ask)."""
        with self._lock:
            known = self._maps.get(uri)
            if known is not None and known.version == base and version == base + 1:
                self._maps[uri] = _Map(version, {**known.txns, **txns})

    def _keep(self, uri: str, m: _Map) -> _Map:
        with self._lock:
            kept = self._maps.get(uri)
            if kept is None or kept.version <= m.version:
                self._maps[uri] = m
        return m


def _read_map(uri: str, version: int, storage_options: Mapping[str, str] | None) -> _Map | None:
    """The table's ``txn`` map at ``version``: its last checkpoint at or before it, then the commits
    after; None for a checkpoint this does not read (multi-part, V2, or newer than ``version``)."""
    fs, root = log._filesystem(log._normalize(uri), storage_options)
    start = log._last_checkpoint(fs, f"{root}/{log._LOG}")
    txns: dict[str, int] = {}
    if start is not None:
        if start > version:
            return None
        path = f"{root}/{log._LOG}/{start:020d}.checkpoint.parquet"
        try:
            column = pq.read_table(path, filesystem=fs, columns=["txn"]).column("txn")
        except (FileNotFoundError, KeyError, OSError):
            return None
        for row in column.to_pylist():
            if row and isinstance(row.get("appId"), str) and isinstance(row.get("version"), int):
                txns[row["appId"]] = row["version"]
    newer = log.transactions(uri, after=-1 if start is None else start, until=version, storage_options=storage_options)
    if newer is None:
        return None
    return _Map(version, {**txns, **newer})
