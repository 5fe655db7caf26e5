"""The run's SQLite event log kept open while a run writes (dagster_defs.event_log), on a real
Dagster instance: no event's connection is the last, so SQLite no longer checkpoints and deletes the
write-ahead log after every event; the events are stored all the same."""

import os
import time

import dagster as dg
from dagster._core.events import DagsterEvent, DagsterEventType, StepMaterializationData
from dagster._core.events.log import EventLogEntry
from dagster._core.test_utils import create_run_for_test

from dagster_defs.event_log import event_log_kept_open


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
