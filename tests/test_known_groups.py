"""storage.groups: the group values a table holds at a version, kept from its Delta log (no Spark):
appends add groups, a range replace that deletes a device's last rows removes it, compaction changes
nothing, another process resumes from the persisted state, an older version is counted again."""

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from cq_engine.storage import groups as groups_module
from cq_engine.storage.delta import DeltaRsStorage

T0 = datetime(2024, 1, 1, tzinfo=UTC)
KEYS = ("device",)


def rows(*pairs: tuple[int, str | None]) -> pa.Table:
    return pa.table(
        {
            "ts": pa.array([T0 + timedelta(seconds=s) for s, _ in pairs], pa.timestamp("us", tz="UTC")),
            "device": pa.array([d for _, d in pairs], pa.string()),
            "v": pa.array([1.0] * len(pairs)),
        }
    )


def known(storage: DeltaRsStorage, version: int | None = None, keys=KEYS) -> list:
    v = storage.version("t") if version is None else version
    table = storage.known_groups("t", keys, version=v, time_column="ts")
    assert table is not None
    return sorted(zip(*[table.column(k).to_pylist() for k in keys]), key=str)


def test_groups_follow_appends_replaces_and_versions(tmp_path, monkeypatch):
    storage = DeltaRsStorage(warehouse=str(tmp_path))
    storage.append("t", rows((0, "d1"), (1, "d2")))
    assert known(storage) == [("d1",), ("d2",)]
    v1 = storage.version("t")
    storage.append("t", rows((100, "d3"), (101, None)))  # a NULL device is a group too
    assert known(storage) == [("d1",), ("d2",), ("d3",), (None,)]

    # The newer version was reached from the log: only the commit's files were read.
    read: list[str] = []
    original = storage.read_file

    def counting(table, path, **kw):
        read.append(path)
        return original(table, path, **kw)

    monkeypatch.setattr(storage, "read_file", counting)
    storage.append("t", rows((200, "d4")))
    assert known(storage) == [("d1",), ("d2",), ("d3",), ("d4",), (None,)]
    assert len(read) == 1

    # A range replace deleting d2's only row (as a CQ's sink write does): d2 is gone, d1 stays.
    storage.replace_range(
        "t",
        rows((0, "d1")),
        time_column="ts",
        time_range=(T0, T0 + timedelta(seconds=50)),
        app_id="test",
        app_version=1,
    )
    assert known(storage) == [("d1",), ("d3",), ("d4",), (None,)]
    # Compaction changes no data: nothing to read, nothing changes.
    read.clear()
    DeltaTable(storage.uri("t")).optimize.compact()
    assert known(storage) == [("d1",), ("d3",), ("d4",), (None,)]
    assert read == []

    # An older version than the state's is counted from its snapshot.
    assert known(storage, v1) == [("d1",), ("d2",)]


def test_another_process_resumes_from_the_persisted_state(tmp_path, monkeypatch):
    first = DeltaRsStorage(warehouse=str(tmp_path))
    first.append("t", rows((0, "d1")))
    first.append("t", rows((1, "d2")))
    assert known(first) == [("d1",), ("d2",)]
    first.append("t", rows((2, "d3")))

    second = DeltaRsStorage(warehouse=str(tmp_path))  # a new process: nothing in memory
    read: list[str] = []
    original = second.read_file
    monkeypatch.setattr(second, "read_file", lambda table, path, **kw: read.append(path) or original(table, path, **kw))
    assert known(second) == [("d1",), ("d2",), ("d3",)]
    assert len(read) == 1  # the persisted state at the second version, plus the third commit's file
    # Two key columns are their own state.
    assert known(second, keys=("device", "v")) == [("d1", 1.0), ("d2", 1.0), ("d3", 1.0)]


def test_state_is_persisted_only_when_groups_change_or_every_few_versions(tmp_path, monkeypatch):
    monkeypatch.setattr(groups_module, "PERSIST_EVERY", 3)
    storage = DeltaRsStorage(warehouse=str(tmp_path))
    writes: list[int] = []
    original = storage.overwrite_state
    monkeypatch.setattr(
        storage, "overwrite_state", lambda name, data, **kw: writes.append(1) or original(name, data, **kw)
    )
    storage.append("t", rows((0, "d1")))
    known(storage)
    for s in range(1, 6):
        storage.append("t", rows((s, "d1")))  # no new group
        known(storage)
    assert len(writes) == 1 + 1  # the first state, then once 3 versions went by (and not yet again)


def test_tables_whose_files_cannot_be_read_one_by_one_have_no_state(tmp_path):
    storage = DeltaRsStorage(warehouse=str(tmp_path))
    from deltalake import write_deltalake

    write_deltalake(storage.uri("t"), rows((0, "d1")), partition_by=["device"])
    assert storage.known_groups("t", KEYS, version=0, time_column="ts") is None


@pytest.mark.parametrize("keys", [("device",), ("DEVICE",)])
def test_key_names_ignore_case(tmp_path, keys):
    storage = DeltaRsStorage(warehouse=str(tmp_path))
    storage.append("t", rows((0, "d1")))
    table = storage.known_groups("t", keys, version=0, time_column="ts")
    assert table is not None and table.column_names == list(keys) and table.column(0).to_pylist() == ["d1"]
