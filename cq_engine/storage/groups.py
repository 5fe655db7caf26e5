"""Known group values: every distinct tuple of some columns (a continuous query's ``device`` and GROUP BY
columns) that a source table holds at a version, kept incrementally from the Delta log.

IoTDB takes a query's devices from its schema, so a device that sent nothing in a firing's range still
gets its rows (a count of 0). The table model has no schema of devices: the group values a table holds
are its devices. Finding them by a scan of the whole table at every firing would make a firing's cost
grow with the table, so they are counted instead: the state table ``_cq/groups/<table>/<keys>`` holds
each group with its number of rows at one version; moving it to a later version reads only the
commits in between (the key columns of the files they added, plus one, and of the files they removed,
minus one; commits that change no data are skipped). A group whose count reaches 0 is gone. A process
keeps the state in memory, so a batch run's firings on one source version cost a lookup; the state
table is rewritten (one small delta-rs commit) only when the set of groups changed or
``PERSIST_EVERY`` versions went by, so another process starts close to the latest version.

Tables whose files cannot be read one by one (deletion vectors, column mapping, a group column that is
a partition column) have no state here: ``None`` tells the caller to ask Spark.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

import pyarrow as pa
from deltalake import DeltaTable

from cq_engine.storage import log

PERSIST_EVERY = 16  # versions: how far a persisted state may lag the one in memory
_ROWS, _VERSION = "__cq_rows", "__cq_version"


class Unavailable(Exception):
    """The groups cannot be counted from the table's files (the caller asks Spark instead)."""


@dataclass(frozen=True)
class _State:
    version: int
    schema: pa.Schema  # the key columns
    counts: dict[tuple, int]
    persisted: int  # the version the state table holds


class KnownGroups:
    """The group-value state of one warehouse (``DeltaStateTables.known_groups``)."""

    def __init__(self, tables):
        self._tables = tables  # a DeltaStateTables
        self._memory: dict[str, _State] = {}
        self._lock = threading.Lock()

    def groups(self, table: str, keys: tuple[str, ...], *, version: int, time_column: str) -> pa.Table | None:
        """Every distinct ``keys`` tuple of ``table`` at ``version`` (columns named as ``keys``), or None
        when the table's files cannot be read one by one."""
        name = f"groups/{table}/k{hashlib.sha256(','.join(k.lower() for k in keys).encode()).hexdigest()[:16]}"
        with self._lock:
            try:
                state = self._advance(name, table, keys, version=version, time_column=time_column)
            except Unavailable:
                return None
        rows = [g for g, n in state.counts.items() if n > 0]
        rows.sort(key=lambda g: tuple((v is not None, str(v)) for v in g))
        arrays = [pa.array([g[i] for g in rows], state.schema.field(i).type) for i in range(len(keys))]
        return pa.Table.from_arrays(arrays, names=list(keys))

    def _advance(self, name: str, table: str, keys: tuple[str, ...], *, version: int, time_column: str) -> _State:
        state = self._memory.get(name) or self._load(name, keys)
        if state is None or state.version > version:
            state = self._snapshot(table, keys, version)
        elif state.version < version:
            commits = self._tables.read_commits(table, after=state.version, until=version, time_column=time_column)
            if any(f is log.UNKNOWN_REMOVED for c in commits for f in c.removed):
                state = self._snapshot(table, keys, version)
            else:
                counts = dict(state.counts)
                try:
                    for commit in commits:
                        for change in commit.added:
                            _add(counts, self._file_counts(table, change.path, keys, state.schema), 1)
                        for change in commit.removed:
                            _add(counts, self._file_counts(table, change.path, keys, state.schema), -1)
                except (OSError, pa.ArrowException):  # a removed file vacuumed, a changed type: count again
                    state = self._snapshot(table, keys, version)
                else:
                    counts = {g: n for g, n in counts.items() if n > 0}
                    state = _State(version, state.schema, counts, state.persisted)
        if state.persisted != state.version:
            before = self._memory.get(name)
            changed = before is None or set(before.counts) != set(state.counts)
            if changed or state.version - state.persisted >= PERSIST_EVERY:
                state = self._persist(name, state)
        self._memory[name] = state
        return state

    def _load(self, name: str, keys: tuple[str, ...]) -> _State | None:
        data = self._tables.read_state(name)
        if data is None or data.num_rows == 0 or data.column_names[: len(keys)] != list(keys):
            return None
        version = data.column(_VERSION)[0].as_py()
        groups = zip(*[data.column(i).to_pylist() for i in range(len(keys))])
        # The marker row (count -1) only keeps the version of a table without groups.
        counts = {g: n for g, n in zip(groups, data.column(_ROWS).to_pylist()) if n >= 0}
        schema = pa.schema([data.schema.field(i) for i in range(len(keys))])
        return _State(version, schema, counts, version)

    def _persist(self, name: str, state: _State) -> _State:
        groups = list(state.counts.items())
        # One marker row keeps the version of a table without groups.
        columns = [
            pa.array([g[i] for g, _ in groups] + [None], state.schema.field(i).type) for i in range(len(state.schema))
        ]
        rows = pa.array([n for _, n in groups] + [-1], pa.int64())
        versions = pa.array([state.version] * (len(groups) + 1), pa.int64())
        data = pa.Table.from_arrays([*columns, rows, versions], names=[*state.schema.names, _ROWS, _VERSION])
        try:
            self._tables.overwrite_state(name, data)
        except Exception:  # another process wrote it first: any persisted state is right for its version
            return state
        return _State(state.version, state.schema, state.counts, state.version)

    def _snapshot(self, table: str, keys: tuple[str, ...], version: int) -> _State:
        """Count the groups of every file of the snapshot (the first time, or when the log cannot say)."""
        uri = self._tables.uri(table)
        dt = DeltaTable(uri, version=version, storage_options=self._tables.storage_options)
        # Column mapping also comes without table features (reader version 2 and the table property).
        mapped = (dt.metadata().configuration or {}).get("delta.columnMapping.mode", "none").lower() != "none"
        if mapped or {"deletionVectors", "columnMapping"} & set(dt.protocol().reader_features or ()):
            raise Unavailable(table)
        lowered = {c.lower() for c in dt.metadata().partition_columns}
        if any(k.lower() in lowered for k in keys):
            raise Unavailable(table)
        full = pa.schema(dt.schema().to_arrow())
        by_name = {f.name.lower(): f for f in full}
        if any(k.lower() not in by_name for k in keys):
            raise Unavailable(table)  # the query's column check names the missing column
        schema = pa.schema([pa.field(k, by_name[k.lower()].type) for k in keys])
        counts: dict[tuple, int] = {}
        paths = log.arrow_table(dt.get_add_actions(flatten=True)).column("path").to_pylist()
        for path in paths:
            _add(counts, self._file_counts(table, log._full_path(log._normalize(uri), path), keys, schema), 1)
        return _State(version, schema, counts, -1)

    def _file_counts(self, table: str, path: str, keys: tuple[str, ...], schema: pa.Schema) -> dict[tuple, int]:
        """Rows per group of one data file (its key columns only)."""
        data = self._tables.read_file(table, path, columns=keys)
        names = {n.lower(): n for n in data.schema.names}
        columns = [
            data.column(names[k.lower()]).cast(schema.field(i).type)
            if k.lower() in names
            else pa.nulls(data.num_rows, schema.field(i).type)
            for i, k in enumerate(keys)
        ]
        if data.num_rows == 0:
            return {}
        grouped = (
            pa.table(columns, names=[f"k{i}" for i in range(len(keys))])
            .group_by([f"k{i}" for i in range(len(keys))])
            .aggregate([([], "count_all")])
        )
        groups = zip(*[grouped.column(f"k{i}").to_pylist() for i in range(len(keys))])
        return dict(zip(groups, grouped.column("count_all").to_pylist()))


def _add(counts: dict[tuple, int], delta: dict[tuple, int], sign: int) -> None:
    for group, n in delta.items():
        counts[group] = counts.get(group, 0) + sign * n
