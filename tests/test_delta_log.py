"""storage.log (the Delta log without Spark), the predicate builders, replace_where and read_added,
against real Delta tables written by delta-rs on disk."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import record_paths
from deltalake import DeltaTable, write_deltalake

from cq_engine.errors import CQError
from cq_engine.storage import log
from cq_engine.storage.delta import DeltaRsStorage, groups_predicate, range_predicate, ranges_predicate
from cq_engine.storage.log import UNKNOWN_REMOVED, Commit, FileChange, latest_version, read_commits
from cq_engine.storage.predicates import FALSE, merge_ranges, sql_literal

T0 = datetime(2024, 1, 1, tzinfo=UTC)
TS = pa.timestamp("us", tz="UTC")
MS = timedelta(milliseconds=1)
S = timedelta(seconds=1)
M = timedelta(minutes=1)


def rows(times: list[datetime], values: list[float] | None = None, device: str | None = "d1") -> pa.Table:
    values = values if values is not None else [float(i) for i in range(len(times))]
    return pa.table(
        {
            "ts": pa.array(times, TS),
            "device": pa.array([device] * len(times), pa.string()),
            "v": pa.array(values, pa.float64()),
        }
    )


def append(uri: str, times: list[datetime], **kw) -> None:
    write_deltalake(uri, rows(times, **kw), mode="append")


def all_rows(uri: str) -> list[tuple]:
    data = pa.table(DeltaTable(uri).scan())
    return sorted(
        zip(*(data.column(n).to_pylist() for n in data.column_names)), key=lambda r: tuple((x is None, x) for x in r)
    )


def delete_log_file(uri: str, version: int) -> None:
    os.remove(os.path.join(uri, "_delta_log", f"{version:020d}.json"))


def set_last_checkpoint(uri: str, version: int) -> None:
    with open(os.path.join(uri, "_delta_log", "_last_checkpoint"), "w") as f:
        json.dump({"version": version, "size": 1}, f)


@pytest.fixture
def uri(tmp_path) -> str:
    return str(tmp_path / "t")


@pytest.fixture
def probes(monkeypatch) -> list[str]:
    """Every existence probe latest_version makes."""
    return record_paths(monkeypatch, log, "_exists")


# -- latest_version ------------------------------------------------------------------------------


def test_latest_version_not_a_table(tmp_path):
    assert latest_version(str(tmp_path / "missing")) is None
    (tmp_path / "empty" / "_delta_log").mkdir(parents=True)
    assert latest_version(str(tmp_path / "empty")) is None
    assert latest_version(str(tmp_path / "empty"), known=3) is None


def test_latest_version_after_0_1_and_many_commits(uri, probes):
    DeltaTable.create(uri, rows([]).schema)
    assert latest_version(uri) == 0
    assert latest_version(uri, known=0) == 0
    append(uri, [T0])
    assert latest_version(uri) == 1
    assert latest_version(uri, known=0) == latest_version(uri, known=1) == 1
    for i in range(2, 121):
        append(uri, [T0 + i * M])
    # delta-rs writes a checkpoint every 100 commits (delta.checkpointInterval) by itself.
    assert os.path.exists(os.path.join(uri, "_delta_log", f"{99:020d}.checkpoint.parquet"))
    assert json.loads(Path(uri, "_delta_log", "_last_checkpoint").read_text())["version"] == 99
    assert latest_version(uri) == 120
    for known in (0, 1, 50, 118, 119, 120):
        assert latest_version(uri, known=known) == 120
    # The cost of a tick does not grow with the history: no new commit or one is two probes.
    probes.clear()
    assert latest_version(uri, known=120) == 120 and len(probes) == 2
    probes.clear()
    assert latest_version(uri, known=119) == 120 and len(probes) == 2
    # From scratch: _last_checkpoint (99), then a gallop and bisection over the 21 versions after it.
    probes.clear()
    assert latest_version(uri) == 120 and len(probes) <= 12
    # Gallop over many new commits: logarithmic, not one probe per commit.
    probes.clear()
    assert latest_version(uri, known=0) == 120 and len(probes) <= 16


def test_latest_version_stale_missing_or_torn_last_checkpoint(uri):
    for i in range(10):
        append(uri, [T0 + i * M])
        if i in (3, 7):
            DeltaTable(uri).create_checkpoint()
    assert json.loads(Path(uri, "_delta_log", "_last_checkpoint").read_text())["version"] == 7
    set_last_checkpoint(uri, 3)  # stale: an older checkpoint than the newest
    assert latest_version(uri) == 9
    set_last_checkpoint(uri, 500)  # names a version that does not exist
    assert latest_version(uri) == 9
    with open(os.path.join(uri, "_delta_log", "_last_checkpoint"), "w") as f:
        f.write('{"vers')  # torn write
    assert latest_version(uri) == 9
    os.remove(os.path.join(uri, "_delta_log", "_last_checkpoint"))
    assert latest_version(uri) == 9  # no checkpoint pointer: from version 0
    for v in range(0, 7):  # log retention removed the commits before the checkpoint at 7
        delete_log_file(uri, v)
    assert latest_version(uri) == 9  # no pointer and no version 0: one listing of the log
    assert latest_version(uri, known=8) == 9


def test_latest_version_table_recreated_with_fewer_versions(uri):
    for i in range(3):
        append(uri, [T0 + i * M])
    assert latest_version(uri, known=50) == 2


def test_latest_version_relative_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    append("rel", [T0])
    assert latest_version("rel") == 0 and latest_version("rel/") == 0


# -- read_commits --------------------------------------------------------------------------------


def test_read_commits_appends_stats_and_paths(uri):
    DeltaTable.create(uri, rows([]).schema)
    append(uri, [T0 + S + timedelta(microseconds=234567), T0 + 5 * S])  # v1
    append(uri, [T0 + M, T0 + 2 * M, T0 + 90 * S])  # v2
    commits = read_commits(uri, after=0, until=2, time_column="TS")  # the column matched ignoring case
    assert [c.version for c in commits] == [1, 2]
    assert all(c.operation == "WRITE" and c.removed == () and len(c.added) == 1 for c in commits)
    first, second = commits[0].added[0], commits[1].added[0]
    # Statistics are truncated to milliseconds: the maximum may lie up to 1 ms below the truth.
    assert first.min_time == T0 + S + timedelta(milliseconds=234) and first.max_time == T0 + 5 * S
    assert first.rows == 2 and second.rows == 3
    assert (second.min_time, second.max_time) == (T0 + M, T0 + 2 * M)
    assert all(f.min_time.tzinfo is not None for f in (first, second))
    assert first.path.startswith(uri + "/") and os.path.exists(first.path)
    # The commit timestamps are the commits' own (aware, in order, close to now).
    assert commits[0].timestamp <= commits[1].timestamp
    assert abs(commits[1].timestamp - datetime.now(UTC)) < timedelta(minutes=5)
    assert read_commits(uri, after=2, until=2, time_column="ts") == []
    # after = -1: from the table's creation (version 0 adds no file).
    assert [c.version for c in read_commits(uri, after=-1, until=2, time_column="ts")] == [0, 1, 2]
    # A time column the statistics do not have: no bounds (any time), row counts still known.
    unknown = read_commits(uri, after=0, until=1, time_column="nope")[0].added[0]
    assert (unknown.min_time, unknown.max_time, unknown.rows) == (None, None, 2)


def test_read_commits_reads_one_after_another_once_no_thread_pool_takes_work(uri, monkeypatch):
    """A process that has begun to exit refuses new thread-pool work: the commits are still read."""
    DeltaTable.create(uri, rows([]).schema)
    for k in range(3):
        append(uri, [T0 + k * M])
    pooled = read_commits(uri, after=0, until=3, time_column="ts")

    class Refusing:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    monkeypatch.setattr(log, "ThreadPoolExecutor", Refusing)
    alone = read_commits(uri, after=0, until=3, time_column="ts")
    assert [c.version for c in alone] == [1, 2, 3] and alone == pooled
    assert log.transactions(uri, after=0, until=3) == {}


def test_read_commits_delete_update_compact_checkpoint(uri, monkeypatch):
    for i in range(4):  # v0..v3: one file per minute, 6 rows each
        append(uri, [T0 + i * M + k * 10 * S for k in range(6)], values=[float(10 * i + k) for k in range(6)])
    files = {c.version: c.added[0] for c in read_commits(uri, after=-1, until=3, time_column="ts")}
    DeltaTable(uri).delete("v >= 20 AND v < 30")  # v4: removes minute 2's file wholly
    # v5: an update, replacing minute 1's rows (the file is removed, a new one added).
    write_deltalake(
        uri, rows([T0 + M + 5 * S], [-1.0]), mode="overwrite", predicate=range_predicate("ts", (T0 + M, T0 + 2 * M))
    )
    DeltaTable(uri).optimize.compact()  # v6: a rewrite without data change
    DeltaTable(uri).create_checkpoint()  # not a commit
    assert latest_version(uri) == 6

    loaded = []
    real = log._snapshot_files
    monkeypatch.setattr(log, "_snapshot_files", lambda *a, **k: loaded.append(a[1]) or real(*a, **k))
    commits = read_commits(uri, after=3, until=6, time_column="ts")
    assert loaded == [3]  # removes need the snapshot at `after`, loaded once
    delete, update, compact = commits
    assert (delete.version, delete.operation, delete.added) == (4, "DELETE", ())
    assert delete.removed == (files[2],)  # the removed file's statistics, from the snapshot at 3
    assert files[2].min_time == T0 + 2 * M and files[2].max_time == T0 + 2 * M + 50 * S and files[2].rows == 6
    assert update.version == 5 and update.operation == "WRITE"
    assert update.removed == (files[1],)
    assert [(f.min_time, f.max_time, f.rows) for f in update.added] == [(T0 + M + 5 * S, T0 + M + 5 * S, 1)]
    assert (compact.version, compact.operation) == (6, "OPTIMIZE")
    assert compact.added == () and compact.removed == ()  # dataChange false: left out
    assert len(DeltaTable(uri).file_uris()) == 1  # (the compaction did rewrite files)

    # Appends only: no snapshot load.
    loaded.clear()
    append(uri, [T0 + 9 * M])
    assert [c.version for c in read_commits(uri, after=6, until=7, time_column="ts")] == [7]
    assert loaded == []


def test_read_commits_file_added_and_removed_in_the_batch(uri, monkeypatch):
    append(uri, [T0])  # v0
    append(uri, [T0 + M, T0 + M + S], values=[5.0, 6.0])  # v1
    DeltaTable(uri).delete("v >= 5")  # v2 removes v1's file
    monkeypatch.setattr(log, "_snapshot_files", lambda *a, **k: pytest.fail("snapshot loaded"))
    added, deleted = read_commits(uri, after=0, until=2, time_column="ts")
    assert deleted.removed == added.added  # statistics from the batch's own add action
    assert deleted.removed[0].min_time == T0 + M


def test_read_commits_partitioned_paths_are_decoded(tmp_path):
    uri = str(tmp_path / "p")
    data = pa.table({"ts": pa.array([T0], TS), "dev": ["a b/c%d=é"], "v": [1.0]})
    write_deltalake(uri, data, mode="append", partition_by=["dev"])
    (commit,) = read_commits(uri, after=-1, until=0, time_column="ts")
    (change,) = commit.added
    assert os.path.exists(change.path) and change.path in DeltaTable(uri).file_uris()
    assert change.min_time == T0


def test_read_commits_time_partition_column(tmp_path):
    uri = str(tmp_path / "tp")
    write_deltalake(uri, pa.table({"ts": pa.array([T0 + S], TS), "v": [1.0]}), mode="append", partition_by=["ts"])
    (change,) = read_commits(uri, after=-1, until=0, time_column="ts")[0].added
    assert change.min_time == change.max_time == T0 + S


def test_read_commits_cleaned_up_json_falls_back_to_snapshot_diff(uri):
    for i in range(6):  # v0..v5
        append(uri, [T0 + i * M], values=[float(i)])
    DeltaTable(uri).delete("v = 1 OR v = 2")  # v6: removes the files of v1 and v2
    DeltaTable(uri).create_checkpoint()  # checkpoint at 6
    append(uri, [T0 + 7 * M], values=[7.0])  # v7
    before = {c.version: c for c in read_commits(uri, after=-1, until=7, time_column="ts")}
    delete_log_file(uri, 3)  # log retention removed a commit file before the checkpoint

    (synthetic,) = read_commits(uri, after=1, until=7, time_column="ts")
    assert isinstance(synthetic, Commit)
    assert (synthetic.version, synthetic.operation) == (7, None)
    assert synthetic.timestamp == before[7].timestamp
    # Files of 7 not in 1 (v2's file came and went in between: in neither), files of 1 not in 7.
    assert set(synthetic.added) == {before[v].added[0] for v in (3, 4, 5, 7)}
    assert synthetic.removed == (before[1].added[0],)
    assert set(before[6].removed) == {before[1].added[0], before[2].added[0]}
    # Commits wholly after the gap are still read from their files; the snapshot at 5 that would give
    # the removed files' statistics cannot be loaded without commit 3, so they get no bounds (any time).
    six, seven = read_commits(uri, after=5, until=7, time_column="ts")
    assert seven == before[7] and (six.version, six.operation, six.added) == (6, "DELETE", ())
    assert six.removed == tuple(FileChange(f.path, None, None, None) for f in before[6].removed)

    # The snapshot at `after` is gone too: everything of `until` added, an unknown set removed.
    for v in range(0, 3):
        delete_log_file(uri, v)
    (unknown,) = read_commits(uri, after=1, until=7, time_column="ts")
    assert unknown.removed == (UNKNOWN_REMOVED,)
    assert set(unknown.added) == {before[v].added[0] for v in (0, 3, 4, 5, 7)}


def test_file_change_is_hashable_and_frozen():
    change = FileChange("p", None, None, None)
    with pytest.raises(AttributeError):
        change.path = "q"  # type: ignore[misc]
    assert {change, FileChange("p", None, None, None)} == {change}


# -- predicate builders --------------------------------------------------------------------------


def test_ranges_predicate_merges():
    r = lambda a, b: (T0 + a * M, T0 + b * M)
    assert merge_ranges([r(5, 6), r(0, 1), r(1, 2), r(3, 5), r(4, 4.5)]) == [r(0, 2), r(3, 6)]
    assert ranges_predicate("ts", [r(1, 2), r(0, 1)]) == range_predicate("ts", r(0, 2))
    assert ranges_predicate("ts", [r(0, 1), r(3, 4)]) == (
        f"({range_predicate('ts', r(0, 1))}) OR ({range_predicate('ts', r(3, 4))})"
    )
    assert ranges_predicate("ts", []) == FALSE == "false"
    with pytest.raises(CQError, match="empty time range"):
        ranges_predicate("ts", [r(2, 1)])
    with pytest.raises(CQError, match="timezone-aware"):
        ranges_predicate("ts", [(datetime(2024, 1, 1), datetime(2024, 1, 2))])


def test_groups_predicate_text():
    b1, b2 = T0 + M, T0 + 2 * M
    lit = lambda t: sql_literal(t)
    assert groups_predicate("ts", ["device"], []) == "false"
    assert groups_predicate("ts", ["device"], [(("a",), b1)]) == f'("device" = \'a\') AND "ts" >= {lit(b1)}'
    # Groups sharing a bound go into one IN; a NULL key is IS NULL; quotes are doubled; a repeated
    # group keeps its earliest bound.
    text = groups_predicate(
        "ts", ["device"], [(("a",), b1), (("o'b",), b1), ((None,), b1), (("c",), b2), (("c",), b1 + 3 * M)]
    )
    assert text == (
        f"((\"device\" IN ('a', 'o''b') OR \"device\" IS NULL) AND \"ts\" >= {lit(b1)}) OR "
        f'(("device" = \'c\') AND "ts" >= {lit(b2)})'
    )
    text = groups_predicate("Time", ["k", "s"], [((1, "x"), b2), ((None, "y"), b1), ((2, None), b2)])
    assert text == (
        f'(("k" IS NULL AND "s" = \'y\') AND "Time" >= {lit(b1)}) OR '
        f'((("k" = 1 AND "s" = \'x\') OR ("k" = 2 AND "s" IS NULL)) AND "Time" >= {lit(b2)})'
    )
    assert groups_predicate("ts", [], [((), b2), ((), b1)]) == f'"ts" >= {lit(b1)}'
    assert sql_literal(True) == "true" and sql_literal(-3) == "-3" and sql_literal(0.5) == "0.5"
    with pytest.raises(CQError, match="2 key column"):
        groups_predicate("ts", ["a", "b"], [((1,), b1)])
    with pytest.raises(CQError, match="cannot match"):
        groups_predicate("ts", ["v"], [((float("nan"),), b1)])


KEYED = pa.schema([("ts", TS), ("device", pa.string()), ("k", pa.int64()), ("v", pa.float64())])


def keyed_rows() -> pa.Table:
    devices = ["a", "o'b", None, "c"]
    data = [(T0 + m * M, d, k, float(m)) for m in range(4) for d in devices for k in (1, 2, None)]
    return pa.Table.from_pylist([dict(zip(KEYED.names, r)) for r in data], schema=KEYED)


def row_set(uri: str) -> set[tuple]:
    data = pa.table(DeltaTable(uri).scan())
    return set(zip(*(data.column(n).to_pylist() for n in KEYED.names)))


@pytest.mark.parametrize("keys", [["device"], ["k"], ["device", "k"]])
def test_groups_predicate_deletes_exactly_the_groups(tmp_path, keys):
    storage = DeltaRsStorage(warehouse=str(tmp_path))
    storage.append("g", keyed_rows())
    uri = storage.uri("g")
    before = row_set(uri)
    index = {"device": 1, "k": 2}
    values = sorted({tuple(r[index[c]] for c in keys) for r in before}, key=repr)
    # Most groups (not all), bounds cycling through before, inside and after the data.
    skipped = [v for v in values if None not in v][::4]
    groups = [(v, T0 + [0, 1, 2, 5][i % 4] * M) for i, v in enumerate(values) if v not in skipped]
    groups.append((groups[0][0], T0 + 2 * M))  # repeated: the earliest bound wins
    assert any(None in g[0] for g in groups) and len({g for g, _ in groups}) < len(values)
    bound: dict[tuple, datetime] = {}
    for g, lower in groups:
        bound[g] = min(lower, bound.get(g, lower))
    version = storage.replace_where(
        "g",
        KEYED.empty_table(),
        predicate=groups_predicate("ts", keys, groups),
        time_column="ts",
        app_id="grp",
        app_version=1,
    )
    expected = {
        r
        for r in before
        if not (tuple(r[index[c]] for c in keys) in bound and r[0] >= bound[tuple(r[index[c]] for c in keys)])
    }
    assert row_set(uri) == expected and len(expected) < len(before)
    assert version == storage.version("g") and storage.transaction_version("g", "grp") == 1


def test_replace_where_false_and_ranges(tmp_path):
    storage = DeltaRsStorage(warehouse=str(tmp_path))
    storage.append("g", keyed_rows())
    before = row_set(storage.uri("g"))
    # "false" matches nothing: a commit that only records the transaction.
    version = storage.replace_where(
        "g", KEYED.empty_table(), predicate=ranges_predicate("ts", []), time_column="ts", app_id="none", app_version=3
    )
    assert version == 1 and row_set(storage.uri("g")) == before
    assert storage.transaction_version("g", "none") == 3
    ranges = [(T0, T0 + M), (T0 + 3 * M, T0 + 4 * M)]
    storage.replace_where(
        "g", KEYED.empty_table(), predicate=ranges_predicate("ts", ranges), time_column="ts", app_id="r", app_version=1
    )
    assert row_set(storage.uri("g")) == {r for r in before if T0 + M <= r[0] < T0 + 3 * M}


def test_replace_where_with_data_check_and_reader(tmp_path):
    storage = DeltaRsStorage(warehouse=str(tmp_path))
    storage.append("g", keyed_rows())
    uri = storage.uri("g")
    before = row_set(uri)
    groups = [(("a",), T0 + 2 * M), ((None,), T0 + 3 * M)]
    predicate = groups_predicate("ts", ["device"], groups)
    seen: list[int] = []
    new = pa.table(
        {
            "v": [100.0, 101.0],
            "ts": pa.array([T0 + 2 * M, T0 + 9 * M], TS),
            "device": pa.array(["a", None], pa.large_string()),
        }
    )  # other order, other types
    storage.replace_where(
        "g",
        new,
        predicate=predicate,
        time_column="ts",
        app_id="w",
        app_version=1,
        check=lambda part: seen.append(part.num_rows),
    )
    assert seen == [2]
    kept = {r for r in before if not ((r[1] == "a" and r[0] >= T0 + 2 * M) or (r[1] is None and r[0] >= T0 + 3 * M))}
    assert row_set(uri) == kept | {(T0 + 2 * M, "a", None, 100.0), (T0 + 9 * M, None, None, 101.0)}

    # A check that refuses the data leaves the table as it was, for a table and for a stream.
    after_first = row_set(uri)
    version = storage.version("g")

    def refuse(part):
        if any(d == "zz" for d in part.column("device").to_pylist()):
            raise CQError("row outside its group")

    bad = pa.table({"ts": pa.array([T0 + 5 * M], TS), "device": ["zz"], "k": [1], "v": [0.0]})
    with pytest.raises(CQError, match="outside its group"):
        storage.replace_where("g", bad, predicate=predicate, time_column="ts", app_id="w", app_version=2, check=refuse)
    good = pa.table({"ts": pa.array([T0 + 5 * M], TS), "device": ["a"], "k": [7], "v": [1.0]})
    reader = pa.RecordBatchReader.from_batches(good.schema, iter(good.to_batches() + bad.to_batches()))
    with pytest.raises(CQError, match="outside its group"):
        storage.replace_where(
            "g", reader, predicate=predicate, time_column="ts", app_id="w", app_version=2, check=refuse
        )
    assert storage.version("g") == version and row_set(uri) == after_first
    assert storage.transaction_version("g", "w") == 1
    # A streamed write that passes.
    reader = pa.RecordBatchReader.from_batches(good.schema, iter(good.to_batches()))
    storage.replace_where("g", reader, predicate=predicate, time_column="ts", app_id="w", app_version=2, check=refuse)
    assert (T0 + 5 * M, "a", 7, 1.0) in row_set(uri) and storage.transaction_version("g", "w") == 2


def test_replace_where_creates_missing_table(tmp_path):
    storage = DeltaRsStorage(warehouse=str(tmp_path))
    version = storage.replace_where(
        "new",
        rows([T0]),
        predicate=groups_predicate("ts", ["device"], [(("d1",), T0)]),
        time_column="ts",
        app_id="c",
        app_version=1,
    )
    assert version == storage.version("new") and all_rows(storage.uri("new")) == [(T0, "d1", 0.0)]
    assert storage.latest_version("new") == version
    assert storage.latest_version("absent") is None


# -- read_added (Spark) --------------------------------------------------------------------------


def spark_rows(df) -> list[tuple]:
    data = df.toArrow()
    return sorted(zip(*(data.column(n).to_pylist() for n in ("ts", "device", "v"))))


def test_read_added_reads_the_new_versions_files(spark, tmp_path):
    storage = DeltaRsStorage(warehouse=str(tmp_path / "wh"))
    for i in range(3):  # v0..v2
        storage.append("s", rows([T0 + i * M, T0 + i * M + S], [float(i), float(i) + 0.5]))
    df, scan = storage.read_added(spark, "s", after=0, until=2, time_column="ts")
    assert spark_rows(df) == [
        (T0 + M, "d1", 1.0),
        (T0 + M + S, "d1", 1.5),
        (T0 + 2 * M, "d1", 2.0),
        (T0 + 2 * M + S, "d1", 2.5),
    ]
    assert (scan.table, scan.version, scan.files_read, scan.files_total) == ("s", 2, 2, 2)

    DeltaTable(storage.uri("s")).optimize.compact()  # v3: no data change
    storage.replace_range(
        "s",
        rows([T0 + 5 * M], [9.0], device="r"),
        time_column="ts",
        time_range=(T0 + 5 * M, T0 + 6 * M),
        app_id="x",
        app_version=1,
    )  # v4
    DeltaTable(storage.uri("s")).delete("v = 0.5")  # v5: rewrites the compacted file, survivors "added"
    assert storage.read_commits("s", after=2, until=3, time_column="ts")[0].operation == "OPTIMIZE"
    df, scan = storage.read_added(spark, "s", after=2, until=4, time_column="ts")
    assert spark_rows(df) == [(T0 + 5 * M, "r", 9.0)] and scan.files_read == 1
    df, scan = storage.read_added(spark, "s", after=4, until=5, time_column="ts")
    assert (T0, "d1", 0.5) not in spark_rows(df) and len(spark_rows(df)) == 5
    # Nothing new: an empty frame with the table's columns.
    df, scan = storage.read_added(spark, "s", after=5, until=5, time_column="ts")
    assert df.count() == 0 and df.columns == ["ts", "device", "v"] and scan.files_read == 0
