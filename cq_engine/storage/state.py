"""Delta access that is not the data path: the engine's small state tables under ``_cq/`` (ledger,
stream frontiers, notify outbox, PERIOD ticks) and Arrow-only reads of a table's log and files (a
snapshot's event-time span, the rows one commit added). A mixin over ``uri``/``storage_options`` so a
second ``Storage`` (e.g. one writing the data path through Spark) can keep this half on delta-rs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import datetime

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import DeltaError, TableNotFoundError

from cq_engine.errors import TableError
from cq_engine.names import check_name
from cq_engine.storage import log, snapshot
from cq_engine.storage.groups import KnownGroups
from cq_engine.storage.maintain import (
    NEW_TABLE_PROPERTIES,
    STATE_COMPACT_EVERY,
    WRITER_HOOKS,
    Retention,
    TableReport,
    compact_files,
    maintain_table,
)
from cq_engine.storage.open_tables import OpenTables
from cq_engine.storage.retry import retry_conflicts


class DeltaStateTables:
    """State tables at ``<warehouse>/_cq/<name>`` and log reads of ``<warehouse>/<table>`` with delta-rs."""

    warehouse: str
    storage_options: dict[str, str] | None

    def uri(self, table: str) -> str:
        # The last defence of the name rule: no table name reaches outside the warehouse.
        return f"{self.warehouse.rstrip('/')}/{check_name(table, what='table')}"

    def state_uri(self, name: str) -> str:
        """``<warehouse>/_cq/<name>``; each segment of ``name`` (``streams/<stream>/frontier``) follows the
        name rule, so engine state (and what ``drop_state`` deletes) never leaves ``_cq``."""
        for part in name.split("/"):
            check_name(part, what="engine state path segment")
        return f"{self.warehouse.rstrip('/')}/_cq/{name}"

    # -- state tables -----------------------------------------------------------------------------

    def read_state(self, name: str) -> pa.Table | None:
        """The state table ``name`` (e.g. ``streams/s1/outbox``), or None if never written."""
        uri = self.state_uri(name)
        # By file name (the checkpoint and the commits since), not a delta-rs open, which lists the
        # log and loads every tombstone: the ledger read stays as fast at 100,000 commits as at 100.
        fast = snapshot.read_live(uri, storage_options=self.storage_options)
        if fast is not None:
            return fast
        if not DeltaTable.is_deltatable(uri, storage_options=self.storage_options):
            return None
        # DeltaTable.scan (delta-rs' own engine), not to_pyarrow_table: the latter's pyarrow dataset
        # intermittently aborts the interpreter at exit in deltalake 1.6.6.
        return log.arrow_table(DeltaTable(uri, storage_options=self.storage_options).scan())

    @property
    def open_tables(self) -> OpenTables:
        """Tables kept open between this object's writes (``storage.open_tables``)."""
        return self.__dict__.setdefault("_open_tables", OpenTables())

    def _writable(self, uri: str) -> DeltaTable | None:
        """The table at ``uri`` for a write (kept open since the last one, or opened), None if missing."""
        kept = self.open_tables.take(uri, storage_options=self.storage_options)
        if kept is not None:
            return kept
        try:
            return DeltaTable(uri, storage_options=self.storage_options)
        except TableNotFoundError:
            return None

    def append_state(self, name: str, data: pa.Table, *, once: tuple[str, int] | None = None) -> bool:
        """Append ``data`` to the state table ``name`` in one commit, creating it if missing; whether it
        appended. ``once``: an application transaction ``(app_id, version)`` the commit carries; a
        table holding ``app_id`` at ``version`` or later already is left alone (another writer
        appended these rows, also at the same moment: delta-rs refuses the second of two concurrent
        commits carrying one app id, and the table is checked again after the conflict)."""
        uri = self.state_uri(name)
        dt = self._writable(uri)
        props = (
            None if once is None else CommitProperties(app_transactions=[Transaction(app_id=once[0], version=once[1])])
        )
        held = [False]

        def write(attempt: int) -> None:
            nonlocal dt
            # Retried: e.g. two first writers racing to create the table; the loser appends on its next try.
            if dt is None and attempt:
                dt = self._writable(uri)
            if dt is None:
                write_deltalake(
                    uri,
                    data,
                    mode="append",
                    configuration=NEW_TABLE_PROPERTIES,
                    commit_properties=props,
                    post_commithook_properties=WRITER_HOOKS,
                    storage_options=self.storage_options,
                )
                return
            if attempt:
                dt.update_incremental()
            if once is not None:
                version = dt.transaction_version(once[0])
                if version is not None and version >= once[1]:
                    held[0] = True
                    return
            write_deltalake(dt, data, mode="append", commit_properties=props, post_commithook_properties=WRITER_HOOKS)

        retry_conflicts(write)
        if dt is not None:
            self.open_tables.give(uri, dt, storage_options=self.storage_options)
        if held[0]:
            return False
        # Each append adds a small file and a read opens every live one: the append landing on a
        # multiple of STATE_COMPACT_EVERY compacts them (the ledger read by each run stays a few files).
        seen = self.__dict__.setdefault("_state_versions", {})
        version = log.latest_version(uri, known=seen.get(name), storage_options=self.storage_options)
        seen[name] = version
        if version and version % STATE_COMPACT_EVERY == 0:
            # Lost a race with a writer: the next multiple (or `cq maintain`) does it.
            with contextlib.suppress(DeltaError):
                compact_files(uri, storage_options=self.storage_options)
        return True

    def replace_state_where(self, name: str, rows: Callable[[pa.Table], pa.Table], *, predicate: str) -> None:
        """Replace the rows of the state table ``name`` matching ``predicate`` (delta-rs SQL) by
        ``rows(current table)`` in one commit; after a conflict, computed again from the new snapshot."""
        uri = self.state_uri(name)

        kept: list[DeltaTable] = []

        def write(_attempt: int) -> None:
            dt = (None if kept else self.open_tables.take(uri, storage_options=self.storage_options)) or DeltaTable(
                uri, storage_options=self.storage_options
            )
            kept[:] = [dt]
            data = rows(log.arrow_table(dt.scan()))
            write_deltalake(
                dt,
                data,
                mode="overwrite",
                predicate=predicate,
                post_commithook_properties=WRITER_HOOKS,
                storage_options=self.storage_options,
            )

        retry_conflicts(write)
        self.open_tables.give(uri, kept[0], storage_options=self.storage_options)

    def state_names(self) -> list[str]:
        """Every state table under ``_cq/`` (``firings``, ``streams/s1/frontier``, ...)."""
        root = log._normalize(f"{self.warehouse.rstrip('/')}/_cq")
        fs, path = log._filesystem(root, self.storage_options)
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
        found = [i.path[len(path) + 1 : -len("/_delta_log")] for i in infos if i.base_name == "_delta_log"]
        return sorted(n for n in found if "/_delta_log/" not in f"/{n}/")

    def maintain_state(self, name: str, *, retention: Retention) -> TableReport:
        """``storage.maintain.maintain_table`` of the state table ``name`` (delta-rs: its only writer)."""
        return maintain_table(
            self.state_uri(name), name=f"_cq/{name}", retention=retention, storage_options=self.storage_options
        )

    def maintain(self, table: str, *, retention: Retention) -> TableReport:
        """``storage.maintain.maintain_table`` of ``table`` with delta-rs."""
        return maintain_table(self.uri(table), name=table, retention=retention, storage_options=self.storage_options)

    def overwrite_state(
        self, name: str, data: pa.Table, *, app_id: str | None = None, app_version: int | None = None
    ) -> None:
        """Replace the state table ``name`` (schema included) by ``data`` in one commit, carrying the
        application transaction ``(app_id, app_version)`` if given."""
        props = None
        if app_id is not None:
            props = CommitProperties(app_transactions=[Transaction(app_id=app_id, version=app_version or 0)])
        write_deltalake(
            self.state_uri(name),
            data,
            mode="overwrite",
            schema_mode="overwrite",
            configuration=NEW_TABLE_PROPERTIES,  # merged into an existing table's (tried: delta-rs 1.6)
            commit_properties=props,
            post_commithook_properties=WRITER_HOOKS,
            storage_options=self.storage_options,
        )

    def drop_state(self, prefix: str) -> str | None:
        """Delete every state table under ``prefix`` (e.g. ``streams/s1``); where they were, or None if
        there was nothing."""
        fs, root = log._filesystem(log._normalize(self.state_uri(prefix)), self.storage_options)
        if fs.get_file_info(root).type == pafs.FileType.NotFound:
            return None
        fs.delete_dir(root)
        return self.state_uri(prefix)

    # -- log and file reads without Spark ---------------------------------------------------------

    def latest_version(self, table: str, *, known: int | None = None) -> int | None:
        """``log.latest_version`` of the table: no snapshot load, a few file probes."""
        return log.latest_version(self.uri(table), known=known, storage_options=self.storage_options)

    def read_commits(self, table: str, *, after: int, until: int, time_column: str) -> list[log.Commit]:
        """``log.read_commits`` of the table: the JSON commit files ``after + 1 .. until``."""
        return log.read_commits(
            self.uri(table), after=after, until=until, time_column=time_column, storage_options=self.storage_options
        )

    def table_span(
        self, table: str, *, version: int | None, time_column: str
    ) -> tuple[datetime | None, datetime | None, int]:
        """Event-time extent and row count of a snapshot, from its files' statistics."""
        dt = DeltaTable(self.uri(table), version=version, storage_options=self.storage_options)
        actions = log.arrow_table(dt.get_add_actions(flatten=True))
        names = actions.column_names
        lo_col, hi_col = f"min.{time_column}", f"max.{time_column}"
        if actions.num_rows == 0 or lo_col not in names:
            return None, None, 0
        mins = [v for v in actions.column(lo_col).to_pylist() if v is not None]
        maxs = [v for v in actions.column(hi_col).to_pylist() if v is not None]
        rows = sum(v or 0 for v in actions.column("num_records").to_pylist()) if "num_records" in names else 0
        return (min(mins) if mins else None), (max(maxs) if maxs else None), rows

    def commit_rows(self, table: str, commit: log.Commit, *, schemas: dict[str, pa.Schema] | None = None) -> pa.Table:
        """The rows of the files ``commit`` added, in the table's current schema (columns a file lacks
        are null; ``schemas`` caches that schema per table). Plain Parquet reads would ignore deletion
        vectors, so such tables are a ``TableError``."""
        schemas = {} if schemas is None else schemas
        if table not in schemas:
            dt = DeltaTable(self.uri(table), storage_options=self.storage_options)
            if {"deletionVectors", "columnMapping"} & set(dt.protocol().reader_features or ()):
                raise TableError(
                    f"table {table!r} uses deletion vectors or column mapping: its versions cannot be read file by file"
                )
            schemas[table] = pa.schema(dt.schema().to_arrow())
        schema = schemas[table]
        parts = [self.read_file(table, change.path) for change in commit.added]
        return pa.concat_tables([_to_schema(p, schema) for p in parts]) if parts else schema.empty_table()

    def read_file(self, table: str, path: str, *, columns: tuple[str, ...] | None = None) -> pa.Table:
        """One data file of ``table`` by its full path (``log.FileChange.path``); with ``columns``, only
        those of them the file has (names matched ignoring case)."""
        uri = log._normalize(self.uri(table))
        if path.startswith(uri + "/"):
            fs, root = log._filesystem(uri, self.storage_options)
            with fs.open_input_file(f"{root}/{path[len(uri) + 1 :]}") as source:
                return _read_parquet(source, columns)
        return _read_parquet(path, columns)  # an absolute URI elsewhere (a shallow clone's files)

    def known_groups(self, table: str, keys: tuple[str, ...], *, version: int, time_column: str) -> pa.Table | None:
        """Every distinct ``keys`` tuple ``table`` holds at ``version``, kept incrementally from its log
        (``storage.groups``); None when its files cannot be read one by one (ask Spark)."""
        known = self.__dict__.get("_known_groups")
        if known is None:
            known = self.__dict__.setdefault("_known_groups", KnownGroups(self))
        return known.groups(table, keys, version=version, time_column=time_column)


def _read_parquet(source, columns: tuple[str, ...] | None) -> pa.Table:
    if columns is None:
        return pq.read_table(source)
    wanted = {c.lower() for c in columns}
    names = [n for n in pq.read_schema(source).names if n.lower() in wanted]
    return pq.read_table(source, columns=names)


def _to_schema(data: pa.Table, schema: pa.Schema) -> pa.Table:
    names = {n.lower(): n for n in data.column_names}
    arrays = [
        data.column(names[f.name.lower()]).cast(f.type) if f.name.lower() in names else pa.nulls(data.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)
