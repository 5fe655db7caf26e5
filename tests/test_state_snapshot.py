"""storage.snapshot: a state table's live files read by file name (checkpoint + commits since, no
log listing), against real Delta tables written by delta-rs on disk; and read_state through it."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

import pyarrow as pa
from conftest import record_paths
from deltalake import DeltaTable, write_deltalake

from cq_engine.storage import log, snapshot
from cq_engine.storage.delta import DeltaRsStorage
from cq_engine.storage.maintain import WRITER_HOOKS

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def _row(i: int) -> pa.Table:
    return pa.table({"n": [i], "s": [f"x{i}"], "at": pa.array([T0], pa.timestamp("us", tz="UTC"))})


def _live(uri: str) -> set[str]:
    """The live files as delta-rs sees them (its own open), as file-system paths."""
    return {u.removeprefix("file://") for u in DeltaTable(uri).file_uris()}


def test_live_files_match_delta_rs_through_appends_compactions_and_checkpoints(tmp_path, monkeypatch):
    uri = str(tmp_path / "state")
    for i in range(5):  # no checkpoint yet: every commit from version 0
        write_deltalake(uri, _row(i), mode="append", post_commithook_properties=WRITER_HOOKS)
    assert set(snapshot.live_files(uri) or []) == _live(uri) and len(_live(uri)) == 5
    DeltaTable(uri).optimize.compact()  # removes 5, adds 1
    for i in range(5, 230):  # delta-rs checkpoints every 100 commits
        write_deltalake(uri, _row(i), mode="append", post_commithook_properties=WRITER_HOOKS)
    assert json.loads((tmp_path / "state" / "_delta_log" / "_last_checkpoint").read_text())["version"] > 100
    assert set(snapshot.live_files(uri) or []) == _live(uri) and len(_live(uri)) == 226
    DeltaTable(uri).optimize.compact()  # 226 tombstones, in the next checkpoint
    DeltaTable(uri).create_checkpoint()
    assert set(snapshot.live_files(uri) or []) == _live(uri) and len(_live(uri)) == 1

    # No listing of the log: only files named by version (and the checkpoint pointer) are opened.
    opened = record_paths(monkeypatch, log, "_read")
    monkeypatch.setattr(log, "_listed_version", _no_listing)  # the one place storage.log lists the log
    table = snapshot.read_live(uri)
    assert table is not None and sorted(table.column("n").to_pylist()) == list(range(230))
    assert opened[0] == "_last_checkpoint" and all(n.endswith(".json") for n in opened[1:]), opened


def _no_listing(fs, logdir):
    raise AssertionError(f"listed {logdir}")


def test_tables_this_reader_does_not_take_answer_none(tmp_path):
    partitioned = str(tmp_path / "p")
    write_deltalake(partitioned, _row(1), mode="append", partition_by=["s"])
    assert snapshot.live_files(partitioned) is None
    assert snapshot.live_files(str(tmp_path / "missing")) is None
    # A stale pointer whose commits after it were cleaned up: left to delta-rs.
    uri = str(tmp_path / "t")
    for i in range(3):
        write_deltalake(uri, _row(i), mode="append")
    DeltaTable(uri).create_checkpoint()
    (tmp_path / "t" / "_delta_log" / "_last_checkpoint").write_text(json.dumps({"version": 0, "size": 1}))
    os.remove(tmp_path / "t" / "_delta_log" / f"{1:020d}.json")
    assert snapshot.live_files(uri) is None


def test_read_state_reads_by_file_name_and_equals_a_delta_rs_scan(tmp_path):
    storage = DeltaRsStorage(warehouse=str(tmp_path / "wh"))
    for i in range(150):  # a compaction at version 100 (STATE_COMPACT_EVERY) and a checkpoint
        storage.append_state("ledger_like", _row(i))
    fast = storage.read_state("ledger_like")
    scan = log.arrow_table(DeltaTable(storage.state_uri("ledger_like")).scan())
    assert fast is not None and sorted(fast.column("n").to_pylist()) == sorted(scan.column("n").to_pylist())
    assert fast.column_names == scan.column_names
    assert storage.read_state("never_written") is None


def test_a_column_added_later_is_null_in_the_older_files_rows(tmp_path):
    uri = str(tmp_path / "evolving")
    for i in range(3):
        write_deltalake(uri, _row(i), mode="append")
    newer = _row(3).append_column("extra", pa.array(["e"]))
    write_deltalake(uri, newer, mode="append", schema_mode="merge")
    table = snapshot.read_live(uri)
    assert table is not None and table.num_rows == 4
    by_n = dict(zip(table.column("n").to_pylist(), table.column("extra").to_pylist(), strict=True))
    assert by_n == {0: None, 1: None, 2: None, 3: "e"}


def test_a_checkpoint_is_read_once_per_process_until_the_next_one(tmp_path, monkeypatch):
    uri = str(tmp_path / "state")
    for i in range(101):  # delta-rs checkpoints at version 99 (its 100th commit)
        write_deltalake(uri, _row(i), mode="append", post_commithook_properties=WRITER_HOOKS)
    reads = record_paths(monkeypatch, snapshot, "_read_checkpoint")
    first = snapshot.live_files(uri)
    write_deltalake(uri, _row(101), mode="append", post_commithook_properties=WRITER_HOOKS)
    second = snapshot.live_files(uri)  # the same checkpoint: remembered, only the commits since read
    assert reads == ["00000000000000000099.checkpoint.parquet"]
    assert set(second or []) == _live(uri) and len(second or []) == len(first or []) + 1
    DeltaTable(uri).optimize.compact()
    DeltaTable(uri).create_checkpoint()  # a new checkpoint: read
    assert set(snapshot.live_files(uri) or []) == _live(uri) and len(reads) == 2


def test_a_large_file_is_read_once_per_process_and_later_columns_are_null_in_its_rows(tmp_path, monkeypatch):
    uri = str(tmp_path / "state")
    big = pa.table({"n": list(range(40_000)), "s": [os.urandom(12).hex() for _ in range(40_000)]})
    write_deltalake(uri, big, post_commithook_properties=WRITER_HOOKS)
    write_deltalake(uri, pa.table({"n": [-1], "s": ["small"]}), mode="append", post_commithook_properties=WRITER_HOOKS)
    sizes = sorted(f.stat().st_size for f in (tmp_path / "state").glob("*.parquet"))
    assert sizes[0] < snapshot.BIG_FILE <= sizes[-1]
    reads: list[str] = []
    real = snapshot.pq.read_table
    monkeypatch.setattr(snapshot.pq, "read_table", lambda path, **kw: reads.append(path) or real(path, **kw))
    first = snapshot.read_live(uri)
    second = snapshot.read_live(uri)
    assert first is not None and second is not None and first.num_rows == second.num_rows == 40_001
    assert len(reads) == 1  # the large file, once; the small one through a dataset each time
    # A column added later: null in the remembered file's rows too.
    write_deltalake(
        uri,
        pa.table({"n": [-2], "s": ["new"], "extra": ["x"]}),
        mode="append",
        schema_mode="merge",
        post_commithook_properties=WRITER_HOOKS,
    )
    third = snapshot.read_live(uri)
    assert third is not None and third.num_rows == 40_002 and len(reads) == 1
    assert third.column_names == ["n", "s", "extra"] and third["extra"].null_count == 40_001
    assert sorted(third["n"].to_pylist()) == sorted(DeltaTable(uri).to_pyarrow_table()["n"].to_pylist())
