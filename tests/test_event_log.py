"""The run's SQLite event log kept open while a run writes (dagster_defs.event_log), on a real
Dagster instance: no event's connection is the last, so SQLite no longer checkpoints and deletes the
write-ahead log after every event; the events are stored all the same. And `cq dev`'s event log
storage (`PooledSqliteEventLogStorage`): Dagster's SQLite files, each shard's connection kept for
reuse, what one instance writes read by another at once."""

import os
import time

import dagster as dg
from dagster._core.events import DagsterEvent, DagsterEventType, StepMaterializationData
from dagster._core.events.log import EventLogEntry
from dagster._core.test_utils import create_run_for_test

from cq_engine.cli.dev import write_dagster_home
from dagster_defs.event_log import MAX_OPEN_SHARDS, PooledSqliteEventLogStorage, event_log_kept_open


def _store(instance, run_id: str, key: str) -> None:
    event = DagsterEvent(
        DagsterEventType.ASSET_MATERIALIZATION.value,
        "j",
        event_specific_data=StepMaterializationData(dg.AssetMaterialization(asset_key=key)),
    )
    instance.store_event(
        EventLogEntry(
            error_info=None,
            level=20,
            user_message="",
            run_id=run_id,
            timestamp=time.time(),
            dagster_event=event,
            job_name="j",
        )
    )


def test_the_event_log_stays_open_while_a_run_writes(tmp_path):
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        storage = instance.event_log_storage
        assert type(storage).__name__ == "SqliteEventLogStorage"
        run = create_run_for_test(instance, job_name="j")
        _store(instance, run.run_id, "a")
        wal = storage.path_for_shard(run.run_id) + "-wal"
        assert not os.path.exists(wal)  # the event's connection was the last: checkpointed, deleted
        with event_log_kept_open(instance, run.run_id):
            for k in range(3):
                _store(instance, run.run_id, f"k{k}")
                assert os.path.exists(wal)  # kept: not checkpointed after each event
        assert not os.path.exists(wal)
        _store(instance, run.run_id, "z")
        keys = [
            r.event_log_entry.dagster_event.asset_key.to_user_string()
            for r in instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey("k1")), limit=10
            ).records
        ]
        assert keys == ["k1"]
        assert len(instance.all_logs(run.run_id)) == 5


def test_other_storages_are_left_alone():
    with event_log_kept_open(object(), "run"):
        pass


def _materialized(instance, key: str) -> list[str]:
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey(key)), limit=100).records
    return [r.run_id for r in records]


def test_cq_devs_event_log_keeps_its_connections_and_stores_every_event(tmp_path):
    home = write_dagster_home(tmp_path / "home")
    writer = dg.DagsterInstance.from_config(str(home))
    reader = dg.DagsterInstance.from_config(str(home))  # another process's instance, as the daemon's
    try:
        storage = writer.event_log_storage
        assert isinstance(storage, PooledSqliteEventLogStorage)
        assert storage.path_for_shard("r") == str(home / "history" / "runs" / "r.db")  # Dagster's own files
        run = create_run_for_test(writer, job_name="j")
        for k in range(3):
            _store(writer, run.run_id, f"k{k}")
            # Written by one instance's kept connection, read at once by the other's.
            assert _materialized(reader, f"k{k}") == [run.run_id]
            assert len(reader.all_logs(run.run_id)) == k + 1
        wal = storage.path_for_shard(run.run_id) + "-wal"
        assert os.path.exists(wal)  # its connection kept: no checkpoint and deletion after each event
        # More runs than it keeps engines for: the least recent are dropped, nothing is lost.
        runs = [create_run_for_test(writer, job_name="j").run_id for _ in range(MAX_OPEN_SHARDS + 4)]
        for run_id in runs:
            _store(writer, run_id, "many")
        assert sorted(_materialized(reader, "many")) == sorted(runs)
        assert all(len(writer.all_logs(r)) == 1 for r in runs)
        assert len(writer.all_logs(run.run_id)) == 3
        # A wipe drops the kept connections before it deletes the files; the storage goes on.
        writer.wipe()
        assert not os.path.exists(storage.path_for_shard(run.run_id))
        assert _materialized(writer, "k0") == []
        again = create_run_for_test(writer, job_name="j")
        _store(writer, again.run_id, "after")
        assert _materialized(reader, "after") == [again.run_id]
        # The other instance's connection to the run's old file is not reused: it reads the new one.
        assert len(reader.all_logs(run.run_id)) == 0
        _store(writer, run.run_id, "reused")
        assert [e.dagster_event.asset_key.to_user_string() for e in reader.all_logs(run.run_id)] == ["reused"]
    finally:
        writer.dispose()
        reader.dispose()
