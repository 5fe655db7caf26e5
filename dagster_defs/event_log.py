"""Dagster's SQLite event log made cheap to write (``cq dev``'s Dagster instance).

Dagster's SQLite event log storage opens an engine and a connection for each statement group of an
event and closes them after; in WAL mode the last connection to close a database also checkpoints
it and deletes its write-ahead log. ``PooledSqliteEventLogStorage`` (named in the ``dagster.yaml``
``cq dev`` writes, so the daemon, the webserver and every run use it) keeps each shard's engine and
connection: 2.3 ms an event against 7.7 on an idle machine, the same files and rows. For another
SQLite instance, ``event_log_kept_open`` holds one more connection open for a run's duration, so
no event's connection is the last (no checkpoint per event; 10 ms an event against 26 then).
Other storages (PostgreSQL) need neither."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections import OrderedDict
from collections.abc import Iterator

from sqlalchemy import create_engine
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import QueuePool

from .internals import SQLITE_BUSY_TIMEOUT_SECONDS, ConfigurableClassData, SqliteEventLogStorage

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


MAX_OPEN_SHARDS = 16  # run event logs (and the index) whose engine a process keeps, least recent dropped


class PooledSqliteEventLogStorage(SqliteEventLogStorage):
    """Dagster's sharded SQLite event log (``cq dev``'s instance: same files, same rows), with each
    shard's engine and one connection kept for reuse. Dagster's own opens an engine and a connection
    for each of the four statement groups of an asset event and closes them after: half of what an
    event costs (2.3 ms an event against 7.7 on this machine, idle). At a thousand materializations a round, the daemon's
    thousand planned events at a run's creation and the run's own trail its commits by tens of
    seconds on a loaded machine, and a pipelined successor waits for them."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        self._engines: OrderedDict[str, tuple[Engine, int | None]] = OrderedDict()  # shard -> (engine, inode)
        super().__init__(base_dir, inst_data)

    @classmethod
    def from_config_value(cls, inst_data, config_value):
        return cls(inst_data=inst_data, **config_value)

    @contextlib.contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        with self._db_lock:  # Dagster's own serialises a storage's connections too
            engine = self._engine(shard)
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with engine.connect() as conn, conn.begin():
                yield conn

    def _engine(self, shard: str) -> Engine:
        path = self.path_for_shard(shard)
        inode = os.stat(path).st_ino if os.path.exists(path) else None
        engine, known = self._engines.pop(shard, (None, None))
        if engine is not None and known is not None and known != inode:
            # Deleted or replaced since (another process's wipe): not a connection to the old file.
            engine.dispose()
            engine = None
            self._initialized_dbs.discard(shard)
        if engine is None:
            engine = create_engine(
                self.conn_string_for_shard(shard),
                poolclass=QueuePool,
                pool_size=1,
                max_overflow=4,  # Dagster opens a second one while it creates a shard
                connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS, "check_same_thread": False},
            )
        self._engines[shard] = (engine, inode)
        while len(self._engines) > MAX_OPEN_SHARDS:
            self._engines.popitem(last=False)[1][0].dispose()
        return engine

    def _dispose_engines(self) -> None:
        with self._db_lock:
            while self._engines:
                self._engines.popitem()[1][0].dispose()

    def wipe(self) -> None:
        self._dispose_engines()  # before the files go: no connection left on an unlinked file
        super().wipe()

    def dispose(self) -> None:
        self._dispose_engines()
        super().dispose()
