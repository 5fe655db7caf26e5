"""A run's SQLite event log kept open while the run writes to it (``cq dev``'s Dagster instance).

Dagster's SQLite event log storage opens a connection for each event and closes it after. In WAL
mode the last connection to close a database checkpoints it and deletes its write-ahead log, so
each event paid a checkpoint (two syncs and a file deletion): 26 ms an event on this machine, and
a batch run writing a thousand materializations a round fell 30-40 s behind its own commits (the
next run, which waits for those events, started its first firing that late). One more connection
held open for the run's duration means no event's connection is the last: 10 ms an event,
nothing else changed (the same rows, the same durability). Other storages (PostgreSQL) need
nothing."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator

INDEX_SHARD = "index"  # the shard holding the asset index (SqliteEventLogStorage's INDEX_SHARD_NAME)


@contextlib.contextmanager
def event_log_kept_open(instance, run_id: str) -> Iterator[None]:
    """Hold run ``run_id``'s event log database and the asset index open (if the instance's event
    log is Dagster's sharded SQLite storage) until the block ends."""
    storage = getattr(instance, "event_log_storage", None)
    path_for_shard = getattr(storage, "path_for_shard", None)
    with contextlib.ExitStack() as stack:
        if type(storage).__name__ == "SqliteEventLogStorage" and callable(path_for_shard):
            for shard in (run_id, INDEX_SHARD):
                path = path_for_shard(shard)
                if not os.path.exists(path):
                    continue
                try:
                    conn = sqlite3.connect(path, timeout=30)
                    conn.execute("SELECT count(*) FROM sqlite_master").fetchall()  # opens the WAL index
                except sqlite3.Error:  # an optimization only
                    continue
                stack.callback(conn.close)
        yield
