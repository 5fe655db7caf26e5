"""Compactions never run beside each other on one table (``storage.maintain.compact_files``): real
Delta tables on disk, real processes racing. delta-rs alone commits a compaction from a stale snapshot
over another one and doubles the rows (the first test shows it); the claim keeps every row once."""

from __future__ import annotations

import multiprocessing
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from cq_engine.storage import state as state_module
from cq_engine.storage.delta import DeltaRsStorage
from cq_engine.storage.maintain import (
    claim_compaction,
    compact_files,
    compaction_claimed_until,
    release_compaction,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _ids(uri: str) -> list[int]:
    return sorted(pa.RecordBatchReader.from_stream(DeltaTable(uri).scan()).read_all()["i"].to_pylist())


def _table(uri: str, files: int) -> None:
    for i in range(files):
        write_deltalake(uri, pa.table({"i": [i]}), mode="append")


def test_delta_rs_alone_commits_a_compaction_from_a_stale_snapshot_over_another(tmp_path):
    # Why compact_files claims the table. If this fails after a deltalake upgrade, delta-rs refuses
    # the second compaction itself (a delete-delete conflict) and the claim is merely redundant.
    uri = str(tmp_path / "t")
    _table(uri, 10)
    first, second = DeltaTable(uri), DeltaTable(uri)  # two writers' snapshots of version 9
    assert first.optimize.compact()["numFilesRemoved"] == 10
    assert second.optimize.compact()["numFilesRemoved"] == 10  # committed over the first
    assert _ids(uri) == sorted(list(range(10)) * 2)


def test_a_live_claim_leaves_the_table_alone_and_a_lapsed_one_does_not(tmp_path):
    uri = str(tmp_path / "t")
    _table(uri, 10)
    held = claim_compaction(DeltaTable(uri), now=T0, lease=timedelta(hours=1))  # a compactor that died
    assert held is not None and held % 2 == 1
    assert compaction_claimed_until(DeltaTable(uri), now=T0) == T0 + timedelta(hours=1)
    version = DeltaTable(uri).version()
    assert compact_files(uri, now=T0 + timedelta(minutes=59)) == 0
    assert DeltaTable(uri).version() == version  # no commit
    assert claim_compaction(DeltaTable(uri), now=T0 + timedelta(minutes=59), lease=timedelta(hours=1)) is None
    # Lapsed: compacted, and the claim released.
    assert compact_files(uri, now=T0 + timedelta(hours=1, seconds=1)) == 10
    dt = DeltaTable(uri)
    assert [h["operation"] for h in dt.history(3)] == ["WRITE", "OPTIMIZE", "WRITE"]
    assert compaction_claimed_until(dt, now=T0) is None
    assert _ids(uri) == list(range(10)) and len(dt.file_uris()) == 1
    assert compact_files(uri) == 0 and DeltaTable(uri).version() == dt.version()  # one file: nothing to do


def test_a_claim_is_released_after_a_metadata_change_and_only_by_its_holder(tmp_path):
    # A commit changing the table's metadata (cq maintain setting retention properties, or a second
    # writer creating the table) fails a concurrent commit's conflict check: the release is retried.
    uri = str(tmp_path / "t")
    _table(uri, 3)
    dt = DeltaTable(uri)
    held = claim_compaction(dt, now=datetime.now(UTC), lease=timedelta(hours=1))
    assert held is not None
    DeltaTable(uri).alter.set_table_properties({"delta.logRetentionDuration": "interval 2 days"})
    release_compaction(dt, held)  # dt still holds the snapshot before the metadata change
    assert compaction_claimed_until(DeltaTable(uri), now=datetime.now(UTC)) is None
    # A lapsed claim another compactor took since is not released by its former holder.
    later = claim_compaction(DeltaTable(uri), now=T0, lease=timedelta(hours=1))  # expired at once
    newer = claim_compaction(DeltaTable(uri), now=datetime.now(UTC), lease=timedelta(hours=1))
    assert later is not None and newer is not None
    release_compaction(DeltaTable(uri), later)
    assert DeltaTable(uri).transaction_version("cq-engine/compaction") == newer


def race(target, *args, workers: int = 3) -> None:
    """``target(*args, worker, barrier)`` in ``workers`` processes at once (the barrier lines them up);
    each must exit cleanly. Spawned: delta-rs's runtime does not survive a fork, and the children read
    the parent's environment (e.g. the AWS variables of an S3 test)."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(workers)
    procs = [ctx.Process(target=target, args=(*args, w, barrier)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
    assert [p.exitcode for p in procs] == [0] * workers


def compact_in_rounds(uri: str, rounds: int, worker: int, barrier) -> None:
    for r in range(rounds):
        write_deltalake(uri, pa.table({"i": [1000 * worker + r]}), mode="append")
        barrier.wait()  # every worker compacts at the same moment, from the same few snapshots
        compact_files(uri)


def test_compactions_racing_in_several_processes_keep_every_row_once(tmp_path):
    uri = str(tmp_path / "t")
    _table(uri, 6)
    workers, rounds = 3, 8
    race(compact_in_rounds, uri, rounds, workers=workers)
    expected = sorted([*range(6), *(1000 * w + r for w in range(workers) for r in range(rounds))])
    assert _ids(uri) == expected
    operations = [h["operation"] for h in DeltaTable(uri).history()]
    assert operations.count("OPTIMIZE") >= 2, operations  # compactions did run, between the rounds' appends


def _append_states(warehouse: str, count: int, worker: int, barrier) -> None:
    state_module.STATE_COMPACT_EVERY = 4  # compact often: most appends race a compaction
    store = DeltaRsStorage(warehouse=warehouse)
    barrier.wait()
    for k in range(count):
        store.append_state("firings", pa.table({"i": [1000 * worker + k]}))


def test_state_appends_of_several_processes_compacting_as_they_go_keep_every_row_once(tmp_path):
    warehouse = str(tmp_path / "wh")
    workers, count = 3, 30
    race(_append_states, warehouse, count, workers=workers)
    store = DeltaRsStorage(warehouse=warehouse)
    assert sorted(store.read_state("firings")["i"].to_pylist()) == sorted(
        1000 * w + k for w in range(workers) for k in range(count)
    )
    operations = [h["operation"] for h in DeltaTable(store.state_uri("firings")).history()]
    assert "OPTIMIZE" in operations, (len(operations), operations)  # compactions ran beside the appends
