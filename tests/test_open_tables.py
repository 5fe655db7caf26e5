"""storage.open_tables: Delta tables kept open between writes (brought up to date with the commits
since, never shared between two writers, opened afresh when the table was replaced), against real
delta-rs tables on disk, through the storage's own writes."""

from __future__ import annotations

import shutil
import threading
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from cq_engine.storage.delta import DeltaRsStorage
from cq_engine.storage.open_tables import OpenTables

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def _rows(*ns: int) -> pa.Table:
    return pa.table(
        {"ts": pa.array([T0 + timedelta(minutes=n) for n in ns], pa.timestamp("us", tz="UTC")), "n": list(ns)}
    )


def test_a_table_written_twice_is_kept_open_and_sees_the_commits_of_other_writers(tmp_path):
    storage = DeltaRsStorage(warehouse=str(tmp_path))
    assert storage.append("t", _rows(0)) == 0
    assert storage.append("t", _rows(1)) == 1
    uri = storage.uri("t")
    # Another writer (another process, say) commits twice.
    write_deltalake(uri, _rows(2), mode="append")
    write_deltalake(uri, _rows(3), mode="append")
    kept = storage.open_tables.take(uri)
    assert kept is not None and kept.version() == 3  # brought up to date, not reopened
    storage.open_tables.give(uri, kept)
    # The next write lands on top of them, through the kept table: nothing lost, versions in order.
    assert (
        storage.replace_range(
            "t",
            _rows(1),
            time_column="ts",
            time_range=(T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)),
            app_id="a",
            app_version=1,
        )
        == 4
    )
    assert sorted(DeltaTable(uri).to_pyarrow_table()["n"].to_pylist()) == [0, 1, 2, 3]


def test_a_kept_table_is_lent_to_one_writer_at_a_time(tmp_path):
    uri = str(tmp_path / "t")
    write_deltalake(uri, _rows(0))
    tables = OpenTables()
    tables.give(uri, DeltaTable(uri))
    got: list = []
    threads = [threading.Thread(target=lambda: got.append(tables.take(uri))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(g is not None for g in got) == 1  # the others open their own


def test_a_table_dropped_and_created_again_is_opened_afresh(tmp_path):
    storage = DeltaRsStorage(warehouse=str(tmp_path))
    for n in range(3):
        storage.append("t", _rows(n))
    uri = storage.uri("t")
    shutil.rmtree(uri)  # dropped, created again with fewer versions, then grown past the kept one
    for n in (10, 11, 12):
        write_deltalake(uri, _rows(n), mode="append")
    assert storage.open_tables.take(uri) is None  # version 2's commit file is another one now
    assert storage.append("t", _rows(13)) == 3
    assert sorted(DeltaTable(uri).to_pyarrow_table()["n"].to_pylist()) == [10, 11, 12, 13]


def test_state_appends_keep_their_table_open(tmp_path):
    storage = DeltaRsStorage(warehouse=str(tmp_path))
    for n in range(3):
        storage.append_state("ledgerish", _rows(n))
    uri = storage.state_uri("ledgerish")
    kept = storage.open_tables.take(uri)
    assert kept is not None and kept.version() == 2
    assert sorted(storage.read_state("ledgerish")["n"].to_pylist()) == [0, 1, 2]


def test_a_reader_pinned_at_or_after_the_kept_version_moves_it_forward(tmp_path):
    uri = str(tmp_path / "t")
    for n in range(2):
        write_deltalake(uri, _rows(n), mode="append")
    tables = OpenTables()
    tables.give(uri, DeltaTable(uri, version=0))
    for n in range(2, 4):
        write_deltalake(uri, _rows(n), mode="append")
    kept = tables.take(uri, version=2)
    assert kept is not None and kept.version() == 2
    assert sorted(kept.file_uris()) == sorted(DeltaTable(uri, version=2).file_uris())
    tables.give(uri, kept)
    again = tables.take(uri, version=2)  # the same version: as held
    assert again is not None and again.version() == 2
    tables.give(uri, again)
    assert tables.take(uri, version=9) is None  # no such version: the caller's own open names the error


def test_a_reader_pinned_before_the_kept_version_opens_its_own_and_leaves_the_kept_one(tmp_path):
    uri = str(tmp_path / "t")
    for n in range(3):
        write_deltalake(uri, _rows(n), mode="append")
    tables = OpenTables()
    tables.give(uri, DeltaTable(uri))
    assert tables.take(uri, version=1) is None
    tables.give(uri, DeltaTable(uri, version=1))  # that reader's own table, returned: the newer one stays
    assert tables.take(uri, version=1) is None
    kept = tables.take(uri)
    assert kept is not None and kept.version() == 2


def test_reads_through_the_storage_use_the_kept_table_and_see_the_pinned_version(tmp_path, spark):
    storage = DeltaRsStorage(warehouse=str(tmp_path))
    for n in range(3):
        storage.append("t", _rows(n))
    uri = storage.uri("t")
    write_deltalake(uri, _rows(3), mode="append")  # another process's commit: version 3

    def ns(version):
        df, scan = storage.read_range(spark, "t", time_column="ts", time_range=None, version=version)
        return scan.version, sorted(r.n for r in df.collect())

    assert ns(3) == (3, [0, 1, 2, 3])
    assert ns(1) == (1, [0, 1])  # older than the kept table: read from a table of its own
    kept = storage.open_tables.take(uri)
    assert kept is not None and kept.version() == 3  # the reads returned the newest one they held
    storage.open_tables.give(uri, kept)
    df, scan = storage.read_added(spark, "t", after=1, until=3, time_column="ts")
    assert scan.version == 3 and sorted(r.n for r in df.collect()) == [2, 3]
