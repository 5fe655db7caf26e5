"""Delta's txn actions as ``storage.txns`` keeps them: the answers delta-rs' log replay gives, read once
per table (checkpoint, then commits by name) and moved forward without re-reading the log."""

import pyarrow as pa
from conftest import record_paths
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from cq_engine.storage import log
from cq_engine.storage.txns import Transactions

ROWS = pa.table({"x": pa.array([1], pa.int64())})


def commit(where, **txns: int) -> None:
    props = CommitProperties(app_transactions=[Transaction(app_id=a, version=v) for a, v in txns.items()])
    write_deltalake(where, ROWS, mode="append", commit_properties=props)


def test_the_map_answers_as_delta_rs_does_across_a_checkpoint_and_other_writers(tmp_path, monkeypatch):
    uri = str(tmp_path / "t")
    commit(uri, a=1)
    commit(uri, a=2, b=5)
    DeltaTable(uri).create_checkpoint()  # version 1: a=2, b=5 in the checkpoint's txn column
    commit(uri, a=7)  # a later commit wins, lower or higher
    dt = DeltaTable(uri)
    txns = Transactions()
    for app in ("a", "b", "nobody"):
        assert txns.held(uri, dt, app, storage_options=None) == dt.transaction_version(app)
    assert txns.held(uri, dt, "a", storage_options=None) == 7
    reads = record_paths(monkeypatch, log, "_read")
    commit(uri, a=3, c=1)  # another writer
    dt.update_incremental()
    assert [txns.held(uri, dt, app, storage_options=None) for app in ("a", "b", "c")] == [3, 5, 1]
    assert reads == ["00000000000000000003.json"]  # only the new commit, once


def test_a_commit_this_process_made_is_known_without_a_read(tmp_path, monkeypatch):
    uri = str(tmp_path / "t")
    commit(uri, a=1)
    dt = DeltaTable(uri)
    txns = Transactions()
    assert txns.held(uri, dt, "a", storage_options=None) == 1
    commit(dt, a=2, d=4)
    txns.wrote(uri, base=0, version=dt.version(), txns={"a": 2, "d": 4})
    reads = record_paths(monkeypatch, log, "_read")
    assert txns.held(uri, dt, "d", storage_options=None) == 4 and reads == []
    # Committed after a gap (another writer first): nothing is carried, the commits are read.
    commit(uri, e=1)
    dt.update_incremental()
    txns.wrote(uri, base=1, version=3, txns={"f": 9})
    assert txns.held(uri, dt, "f", storage_options=None) is None  # no such commit in the log
    assert txns.held(uri, dt, "e", storage_options=None) == 1
