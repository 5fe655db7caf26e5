"""The Spark-native Delta storage on real delta-spark tables: deletion vectors, column mapping, Delta's
idempotent writes, concurrent commits on disjoint ranges, and the choice of storage."""

import json
import logging
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import record_paths
from deltalake import DeltaTable
from test_runner import make_engine

from cq_engine import jars
from cq_engine.config import Settings, load_settings
from cq_engine.errors import AlreadyCommitted, CQError, TableError
from cq_engine.storage.delta import DeltaRsStorage
from cq_engine.storage.factory import make_storage
from cq_engine.storage.predicates import groups_predicate, range_predicate
from cq_engine.storage.spark_delta import SparkDeltaStorage, spark_predicate

T0 = datetime(2024, 3, 1, tzinfo=UTC)
M = timedelta(minutes=1)

SQL = """
CREATE CQ per_minute RESAMPLE EVERY 1m BEGIN
  SELECT max(temperature) AS tmax, count(temperature) AS n INTO per_minute_out FROM readings GROUP BY (1m), device
END;
"""


def sink(engine, table: str) -> list[tuple]:
    data = engine.spark.read.format("delta").load(engine.settings.table_uri(table)).collect()
    return sorted((r["ts"].replace(tzinfo=UTC), r["device"], r["tmax"], r["n"]) for r in data)


def make_source(spark, path: str, properties: str, temperature: str = "temperature") -> None:
    spark.sql(
        f"CREATE TABLE delta.`{path}` (ts TIMESTAMP, device STRING, {temperature} DOUBLE) USING delta "
        f"TBLPROPERTIES ({properties})"
    )
    epoch, us = datetime(1970, 1, 1, tzinfo=UTC), timedelta(microseconds=1)
    values = ", ".join(
        f"(timestamp_micros({(T0 + s * timedelta(seconds=10) - epoch) // us}), '{d}', {s + (100 if d == 'b' else 0)}.0)"
        for s in range(12)
        for d in ("a", "b")
    )
    spark.sql(f"INSERT INTO delta.`{path}` VALUES {values}")


def test_deletion_vectors_source(spark, tmp_path):
    engine = make_engine(tmp_path, spark, SQL, storage="spark")
    assert isinstance(engine.storage, SparkDeltaStorage)
    path = engine.settings.table_uri("readings")
    make_source(spark, path, "'delta.enableDeletionVectors' = 'true'")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE {'temperature'} IN (5.0, 11.0, 111.0)")
    assert "deletionVectors" in (DeltaTable(path).protocol().reader_features or [])
    last = sorted((tmp_path / "wh" / "readings" / "_delta_log").glob("*.json"))[-1].read_text()
    assert '"deletionVector":{' in last and '"operation":"DELETE"' in last  # rows deleted by DV, files kept
    engine.run_firing("per_minute", T0 + 2 * M)
    # minute 0: a = 0..5 without 5 -> max 4 (5 rows); b = 100..105 -> max 105 (6 rows);
    # minute 1: a = 6..11 without 11 -> max 10 (5); b = 106..111 without 111 -> max 110 (5)
    assert sink(engine, "per_minute_out") == [(T0 + M, "a", 10.0, 5), (T0 + M, "b", 110.0, 5)]
    engine.run_firing("per_minute", T0 + M)
    assert sink(engine, "per_minute_out")[:2] == [(T0, "a", 4.0, 5), (T0, "b", 105.0, 6)]
    with pytest.raises(TableError, match="deletionVectors"):  # what the delta-rs path says instead
        DeltaRsStorage(warehouse=engine.settings.warehouse).read_range(
            spark, "readings", time_column="ts", time_range=None
        )


def test_column_mapping_source_with_renamed_column(spark, tmp_path):
    engine = make_engine(tmp_path, spark, SQL, storage="spark")
    path = engine.settings.table_uri("readings")
    make_source(
        spark,
        path,
        "'delta.columnMapping.mode' = 'name', 'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5'",
        temperature="temp_raw",
    )
    spark.sql(f"ALTER TABLE delta.`{path}` RENAME COLUMN temp_raw TO temperature")
    engine.run_firing("per_minute", T0 + M)
    assert sink(engine, "per_minute_out") == [(T0, "a", 5.0, 6), (T0, "b", 105.0, 6)]
    # Stream-style incremental reads of added files work on it too.
    df, scan = engine.storage.read_added(
        spark, "readings", after=0, until=engine.storage.version("readings"), time_column="ts"
    )
    assert df.count() == 24 and "temperature" in df.columns and scan.files_read >= 1


def _append_minutes(engine, minutes: range) -> None:
    for m in minutes:
        ts = [T0 + m * M + timedelta(seconds=s) for s in (0, 30)]
        engine.storage.append(
            "readings",
            pa.table(
                {
                    "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
                    "device": ["a", "a"],
                    "temperature": pa.array([float(m), float(m) + 0.5]),
                }
            ),
        )


def writer_of(engine, table: str, version: int) -> str:
    """Who wrote commit ``version`` of ``table``: "spark" (delta-spark's executors) or "delta-rs"."""
    log = engine.settings.table_uri(table) + f"/_delta_log/{version:020d}.json"
    lines = Path(log).read_text().splitlines()
    (info,) = [json.loads(line)["commitInfo"] for line in lines if '"commitInfo"' in line]
    return "spark" if "Apache-Spark" in info.get("engineInfo", "") else "delta-rs"


# 0: the executors write every commit; the default: a firing's small result is committed by delta-rs.
@pytest.mark.parametrize("write_bytes", [0, Settings.spark_write_bytes])
def test_retried_firing_adds_no_commit_but_new_source_data_is_written(spark, tmp_path, write_bytes):
    engine = make_engine(tmp_path, spark, SQL, storage="spark", spark_write_bytes=write_bytes)
    _append_minutes(engine, range(3))
    first = engine.run_firing("per_minute", T0 + 2 * M)
    assert writer_of(engine, "per_minute_out", first.sink_version) == ("spark" if write_bytes == 0 else "delta-rs")
    retry = engine.run_firing("per_minute", T0 + 2 * M)
    assert retry.sink_version == first.sink_version == engine.storage.version("per_minute_out")
    assert retry.rows_written == first.rows_written == 1
    late = pa.table(
        {
            "ts": pa.array([T0 + M + timedelta(seconds=45)], pa.timestamp("us", tz="UTC")),
            "device": ["a"],
            "temperature": [99.0],
        }
    )
    engine.storage.append("readings", late)  # a late row: the source version moves on
    again = engine.run_firing("per_minute", T0 + 2 * M)
    assert again.sink_version == first.sink_version + 1
    assert sink(engine, "per_minute_out") == [(T0 + M, "a", 99.0, 3)]
    # A changed definition is a new write identity: same range, same source version, new rows.
    redefined_sql = SQL.replace("max(temperature)", "min(temperature)")
    engine = make_engine(tmp_path, spark, redefined_sql, storage="spark", spark_write_bytes=write_bytes)
    redefined = engine.run_firing("per_minute", T0 + 2 * M)
    assert redefined.sink_version == again.sink_version + 1
    assert sink(engine, "per_minute_out") == [(T0 + M, "a", 1.0, 3)]


def test_sink_with_deletion_vectors_is_written_by_the_executors(spark, tmp_path):
    engine = make_engine(tmp_path, spark, SQL, storage="spark")
    path = engine.settings.table_uri("per_minute_out")
    spark.sql(
        f"CREATE TABLE delta.`{path}` (ts TIMESTAMP, device STRING, tmax DOUBLE, n BIGINT) USING delta "
        "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    )
    assert engine.storage.writes_frame("per_minute_out", input_bytes=1)  # delta-rs cannot write it
    _append_minutes(engine, range(3))
    r = engine.run_firing("per_minute", T0 + 2 * M)
    assert writer_of(engine, "per_minute_out", r.sink_version) == "spark"
    assert sink(engine, "per_minute_out") == [(T0 + M, "a", 1.5, 2)]


def test_who_writes_a_sink_is_asked_of_the_log_once_and_checked_at_each_commit(spark, tmp_path, monkeypatch):
    # Plan time asks from memory (on an object store every look at the log is a request); each commit
    # checks the snapshot it writes on, so a protocol changed under a running process sends that
    # commit to Spark's connector.
    from cq_engine.storage import log

    engine = make_engine(tmp_path, spark, SQL, storage="spark")
    _append_minutes(engine, range(4))
    first = engine.run_firing("per_minute", T0 + M)
    assert writer_of(engine, "per_minute_out", first.sink_version) == "delta-rs"
    probes = record_paths(monkeypatch, log, "_exists")
    assert not engine.storage.writes_frame("per_minute_out", input_bytes=1) and probes == []
    second = engine.run_firing("per_minute", T0 + 2 * M)
    assert writer_of(engine, "per_minute_out", second.sink_version) == "delta-rs"
    path = engine.settings.table_uri("per_minute_out")
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    third = engine.run_firing("per_minute", T0 + 3 * M)  # delta-rs cannot write it now
    assert writer_of(engine, "per_minute_out", third.sink_version) == "spark"
    assert engine.storage.writes_frame("per_minute_out", input_bytes=1)
    assert sink(engine, "per_minute_out") == [(T0 + M * k, "a", k + 0.5, 2) for k in (0, 1, 2)]


def test_disjoint_ranges_committing_at_once_both_land(spark, tmp_path):
    engine = make_engine(tmp_path, spark, SQL, storage="spark")
    _append_minutes(engine, range(2))
    engine.run_firing("per_minute", T0 + M)  # creates the sink
    storage, start = engine.storage, engine.storage.version("per_minute_out")
    barrier, errors, versions = threading.Barrier(4), [], []

    def write(minute: int) -> None:
        lo = T0 + timedelta(hours=1 + minute)
        frame = spark.createDataFrame(
            pa.table(
                {
                    "ts": pa.array([lo + timedelta(seconds=s) for s in range(0, 60, 20)], pa.timestamp("us", tz="UTC")),
                    "device": ["x"] * 3,
                    "tmax": [1.0, 2.0, 3.0],
                    "n": pa.array([1, 2, 3], pa.int64()),
                }
            )
        )
        barrier.wait()
        try:
            versions.append(
                storage.replace_range(
                    "per_minute_out",
                    frame,
                    time_column="ts",
                    time_range=(lo, lo + M),
                    app_id=f"t/{minute}",
                    app_version=1,
                    source_versions={"readings": 1},
                )
            )
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(m,)) for m in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    assert sorted(versions) == list(range(start + 1, start + 5))
    got = sink(engine, "per_minute_out")
    assert len([r for r in got if r[1] == "x"]) == 12 and len(got) == 13


def test_rows_outside_the_range_and_predicates(spark, tmp_path):
    engine = make_engine(tmp_path, spark, SQL, storage="spark")
    _append_minutes(engine, range(2))
    engine.run_firing("per_minute", T0 + M)
    frame = spark.createDataFrame(
        pa.table(
            {
                "ts": pa.array([T0 + 5 * M], pa.timestamp("us", tz="UTC")),
                "device": ["a"],
                "tmax": [1.0],
                "n": pa.array([1], pa.int64()),
            }
        )
    )
    before = engine.storage.version("per_minute_out")
    with pytest.raises(CQError, match=r"per_minute_out.*outside the replaced range"):
        engine.storage.replace_range(
            "per_minute_out", frame, time_column="ts", time_range=(T0, T0 + M), app_id="t", app_version=1
        )
    assert engine.storage.version("per_minute_out") == before  # nothing half-written
    assert (
        spark_predicate(range_predicate("ts", (T0, T0 + M)))
        == "`ts` >= '2024-03-01T00:00:00.000000Z' AND `ts` < '2024-03-01T00:01:00.000000Z'"
    )
    pred = spark_predicate(groups_predicate("ts", ['de"v'], [(("it's",), T0)]))
    assert pred.count("`") == 4 and '`de"v`' in pred and "'it''s'" in pred, pred
    # Timestamp columns get typed literals (delta-spark checks each written row without folding a cast);
    # a string column compared with the same text keeps its string literal.
    stamps = frozenset({"ts"})
    assert (
        spark_predicate(range_predicate("TS", (T0, T0 + M)), timestamp_columns=stamps)
        == "`TS` >= TIMESTAMP '2024-03-01T00:00:00.000000Z' AND `TS` < TIMESTAMP '2024-03-01T00:01:00.000000Z'"
    )
    pred = spark_predicate(
        groups_predicate("ts", ["dev"], [(("2024-03-01T00:00:00.000000Z",), T0)]), timestamp_columns=stamps
    )
    assert pred == "(`dev` = '2024-03-01T00:00:00.000000Z') AND `ts` >= TIMESTAMP '2024-03-01T00:00:00.000000Z'", pred


def test_an_empty_arrow_result_written_by_the_executors_empties_its_range(spark, tmp_path):
    """A firing or tick without rows (a PERIOD stream's first tick) still commits its replace when the
    executors write every commit (CQ_SPARK_WRITE_BYTES=0): zero Arrow rows carry their schema to Spark."""
    engine = make_engine(tmp_path, spark, SQL, storage="spark", spark_write_bytes=0)
    _append_minutes(engine, range(2))
    engine.run_firing("per_minute", T0 + M)
    assert sink(engine, "per_minute_out")
    schema = pa.schema(DeltaTable(engine.settings.table_uri("per_minute_out")).schema().to_arrow())
    before = engine.storage.version("per_minute_out")
    engine.storage.replace_range(
        "per_minute_out", schema.empty_table(), time_column="ts", time_range=(T0, T0 + M), app_id="t", app_version=2
    )
    assert engine.storage.version("per_minute_out") == before + 1
    assert sink(engine, "per_minute_out") == []


def test_storage_choice(tmp_path, monkeypatch, caplog):
    session = lambda: None
    chosen = make_storage(Settings(warehouse=str(tmp_path), storage="spark"), session=session)
    assert isinstance(chosen, SparkDeltaStorage)
    assert type(make_storage(Settings(warehouse=str(tmp_path)), session=session)) is SparkDeltaStorage  # the default
    assert type(make_storage(Settings(warehouse=str(tmp_path), storage="deltars"), session=session)) is DeltaRsStorage
    assert load_settings(environ={"CQ_SPARK_WRITE_BYTES": "0"}, config_file="/nonexistent").spark_write_bytes == 0
    with pytest.raises(CQError, match="CQ_SPARK_WRITE_BYTES: expected a byte count >= 0, got -1"):
        load_settings(environ={"CQ_SPARK_WRITE_BYTES": "-1"}, config_file="/nonexistent")
    assert load_settings(environ={"CQ_STORAGE": "spark"}, config_file="/nonexistent").storage == "spark"
    with pytest.raises(CQError, match="CQ_STORAGE: unknown storage 'parquet'"):
        load_settings(environ={"CQ_STORAGE": "parquet"})
    monkeypatch.setenv("CQ_MAVEN_REPO", str(tmp_path / "empty-m2"))
    with caplog.at_level(logging.WARNING, logger="cq_engine.storage"):
        chosen = make_storage(Settings(warehouse=str(tmp_path), storage="spark"), session=session)
    assert type(chosen) is DeltaRsStorage
    assert [r.message for r in caplog.records if "delta-spark jars not found" in r.message] and len(caplog.records) == 1
    assert jars.missing(jars.delta_artifacts()) == list(jars.delta_artifacts())


def _cells(rows: list[tuple]) -> pa.Table:
    return pa.table(
        {
            "ts": pa.array([T0 + r[0] * M for r in rows], pa.timestamp("us", tz="UTC")),
            "device": [r[1] for r in rows],
            "tmax": pa.array([r[2] for r in rows], pa.float64()),
            "n": pa.array([r[3] for r in rows], pa.int64()),
        }
    )


UPSERT_PATHS = ["deltars", "spark-driver", "spark-executors", "spark-frame"]


def _upsert_engine(spark, tmp_path, storage: str):
    """An engine whose upserts take the path ``storage`` names (one of ``UPSERT_PATHS``)."""
    return make_engine(
        tmp_path,
        spark,
        SQL,
        storage="deltars" if storage == "deltars" else "spark",
        spark_write_bytes=0 if storage in ("spark-executors", "spark-frame") else Settings.spark_write_bytes,
    )


@pytest.mark.parametrize("storage", UPSERT_PATHS)
def test_a_firing_upserted_once_is_not_written_again_by_a_second_run(spark, tmp_path, storage):
    # A batch run's firing (once): a sink that holds the firing's identity at its version or later
    # is left alone, whichever path writes it (delta-rs, or Spark's MERGE with txnAppId/txnVersion).
    engine = _upsert_engine(spark, tmp_path, storage)
    s = engine.storage
    kwargs = dict(time_column="ts", keys=("device",), time_range=(T0, T0 + 10 * M), app_id="test/once", once=True)
    rows = _cells([(0, "a", 1.0, 1)])
    v = s.upsert_cells("per_minute_out", rows, app_version=5, source_versions={"readings": 1}, **kwargs)
    again = _cells([(0, "a", 9.0, 9), (1, "b", 9.0, 9)])
    for version, source in ((5, 2), (4, 2)):  # the same firing on newer data, an earlier firing
        data = spark.createDataFrame(again) if storage == "spark-frame" else again
        with pytest.raises(AlreadyCommitted):
            s.upsert_cells("per_minute_out", data, app_version=version, source_versions={"readings": source}, **kwargs)
    assert s.version("per_minute_out") == v and sink(engine, "per_minute_out") == [(T0, "a", 1.0, 1)]
    later = s.upsert_cells("per_minute_out", again, app_version=6, source_versions={"readings": 2}, **kwargs)
    assert later > v and sorted(sink(engine, "per_minute_out"), key=str) == [(T0, "a", 9.0, 9), (T0 + M, "b", 9.0, 9)]


@pytest.mark.parametrize("storage", UPSERT_PATHS)
def test_a_range_replaced_once_is_not_written_again_by_a_second_run(spark, tmp_path, storage):
    # A batch run's PERIOD tick (replace_where once): the same, for a replace, on every write path.
    from cq_engine.storage.predicates import range_predicate

    engine = _upsert_engine(spark, tmp_path, storage)
    s = engine.storage
    kwargs = dict(predicate=range_predicate("ts", (T0, T0 + 10 * M)), time_column="ts", app_id="test/period", once=True)
    v = s.replace_where("per_minute_out", _cells([(0, "a", 1.0, 1)]), app_version=5, **kwargs)
    again = _cells([(0, "a", 9.0, 9), (1, "b", 9.0, 9)])
    for version in (5, 4):  # the same tick again, an earlier tick
        data = spark.createDataFrame(again) if storage == "spark-frame" else again
        with pytest.raises(AlreadyCommitted):
            s.replace_where("per_minute_out", data, app_version=version, **kwargs)
    assert s.version("per_minute_out") == v and sink(engine, "per_minute_out") == [(T0, "a", 1.0, 1)]
    data = spark.createDataFrame(again) if storage == "spark-frame" else again
    assert s.replace_where("per_minute_out", data, app_version=6, **kwargs) > v
    assert sorted(sink(engine, "per_minute_out"), key=str) == [(T0, "a", 9.0, 9), (T0 + M, "b", 9.0, 9)]


@pytest.mark.parametrize("storage", UPSERT_PATHS)
def test_upsert_cells_overwrites_non_null_cells_adds_rows_and_deletes_nothing(spark, tmp_path, storage):
    # IoTDB's SELECT ... INTO: a non-NULL cell overwrites the point at its time and device, a NULL one
    # writes nothing, a new key is added, every other row stays (inside the range too).
    engine = _upsert_engine(spark, tmp_path, storage)
    s = engine.storage
    whole = (T0, T0 + 10 * M)
    kwargs = dict(time_column="ts", keys=("device",), time_range=whole, app_id="test/upsert")
    first = _cells([(0, "a", 1.0, 1), (1, "a", 2.0, 2), (1, "b", 3.0, 3), (2, None, 4.0, 4)])
    s.upsert_cells("per_minute_out", first, app_version=1, source_versions={"readings": 1}, **kwargs)
    second = _cells([(1, "a", None, 20), (1, "b", 30.0, None), (2, None, 40.0, None), (3, "a", 5.0, 5)])
    data = spark.createDataFrame(second) if storage == "spark-frame" else second
    v = s.upsert_cells("per_minute_out", data, app_version=2, source_versions={"readings": 2}, **kwargs)
    assert v == s.version("per_minute_out")
    expected = [
        (T0, "a", 1.0, 1),
        (T0 + M, "a", 2.0, 20),
        (T0 + M, "b", 30.0, 3),
        (T0 + 2 * M, None, 40.0, 4),
        (T0 + 3 * M, "a", 5.0, 5),
    ]
    assert sorted(sink(engine, "per_minute_out"), key=str) == sorted(expected, key=str)
    # The same identity on the same source version again: Delta skips it (the spark storage), or the
    # same cells are upserted again (deltars, which never skips): the table is the same either way.
    again = s.upsert_cells("per_minute_out", data, app_version=2, source_versions={"readings": 2}, **kwargs)
    assert (again == v) == (storage != "deltars")
    assert sorted(sink(engine, "per_minute_out"), key=str) == sorted(expected, key=str)
    # No cells: one commit recording the identity, nothing changed.
    empty = s.upsert_cells("per_minute_out", _cells([]), app_version=3, source_versions={"readings": 3}, **kwargs)
    assert empty > again and sorted(sink(engine, "per_minute_out"), key=str) == sorted(expected, key=str)
