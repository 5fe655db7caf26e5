"""Housekeeping (``storage.maintain``, ``housekeeping``, ``cq maintain``) on real Delta tables on disk:
compaction keeps the rows, a checkpoint is written, log files past retention (and before the checkpoint)
are deleted and newer ones kept, VACUUM deletes only files out of the table for longer than the file
retention, the ledger's retention drops old entries only, and a second run commits nothing. The last
test runs the Spark storage's path (OPTIMIZE / VACUUM in Spark SQL) on the shared session."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, PostCommitHookProperties, write_deltalake

from cq_engine.cli.main import main
from cq_engine.storage import state as state_module
from cq_engine.storage.delta import DeltaRsStorage
from cq_engine.storage.ledger import Ledger, LedgerEntry
from cq_engine.storage.maintain import NEW_TABLE_PROPERTIES, Retention, interval, parse_interval, properties_to_set

T0 = datetime(2024, 3, 1, tzinfo=UTC)
TS = pa.timestamp("us", tz="UTC")


def _rows(i: int) -> pa.Table:
    return pa.table({"ts": pa.array([T0 + timedelta(minutes=i)], TS), "device": ["d1"], "v": [float(i)]})


def _sorted(uri: str, version: int | None = None) -> list[tuple]:
    data = pa.RecordBatchReader.from_stream(DeltaTable(uri, version=version).scan()).read_all()
    return sorted(zip(data["ts"].to_pylist(), data["device"].to_pylist(), data["v"].to_pylist()))


def _sink(tmp_path: Path, commits: int = 30, checkpoint: int | None = None) -> tuple[DeltaRsStorage, str]:
    """A table of ``commits`` one-row appends (a checkpoint after version ``checkpoint``, as its
    writer makes them), then a replace of minute 3 (its file removed). Created with the engine's table
    properties, so maintenance sets only what a test's retention changes."""
    store = DeltaRsStorage(warehouse=str(tmp_path / "wh"))
    uri = store.uri("out")
    none = PostCommitHookProperties(create_checkpoint=False)
    for i in range(commits):
        write_deltalake(
            uri, _rows(i), mode="append", configuration=NEW_TABLE_PROPERTIES, post_commithook_properties=none
        )
        if i == checkpoint:
            DeltaTable(uri).create_checkpoint()
    write_deltalake(uri, _rows(3), mode="overwrite", predicate=f"ts = '{(T0 + timedelta(minutes=3)).isoformat()}'")
    return store, uri


def _age(log_dir: Path, below: int, days: int) -> None:
    old = time.time() - days * 86400
    for p in log_dir.glob("0*"):
        if int(p.name.split(".")[0]) < below:
            os.utime(p, (old, old))


def test_interval_properties_round_trip_and_only_differences_are_set():
    assert interval(timedelta(days=30)) == "interval 30 days"
    assert interval(timedelta(hours=36)) == "interval 36 hours"
    assert interval(timedelta(seconds=90)) == "interval 90 seconds"
    assert parse_interval("interval 1 week") == timedelta(days=7)
    assert parse_interval("nonsense") is None
    every10 = {"delta.checkpointInterval": "10"}  # a table setting no interval gets the engine's
    assert properties_to_set({}, Retention()) == every10  # Delta's retention defaults: nothing more
    assert properties_to_set({"delta.checkpointInterval": "50"}, Retention()) == {}  # the table's own stays
    assert properties_to_set({"delta.logRetentionDuration": "interval 720 hours", **every10}, Retention()) == {}
    assert properties_to_set(every10, Retention(log=timedelta(days=2))) == {
        "delta.logRetentionDuration": "interval 2 days"
    }


def test_the_engines_tables_checkpoint_every_10_commits_and_maintenance_gives_others_that_interval(tmp_path):
    # An open replays every commit since the newest checkpoint (one GET apiece on an object store).
    store = DeltaRsStorage(warehouse=str(tmp_path / "wh"))
    for i in range(12):
        store.append("out", _rows(i))  # created by the first
        store.append_state("firings", _rows(i))
    for uri in (store.uri("out"), store.state_uri("firings")):
        names = {p.name for p in (Path(uri) / "_delta_log").iterdir()}
        assert {n for n in names if "checkpoint." in n} == {f"{9:020d}.checkpoint.parquet"}, (uri, sorted(names))
        assert DeltaTable(uri).metadata().configuration["delta.checkpointInterval"] == "10"
    # A table written by someone else gets the interval from `cq maintain`; one with its own keeps it.
    for name, own in (("theirs", None), ("tuned", "50")):
        uri = store.uri(name)
        write_deltalake(uri, _rows(0), mode="append", configuration={"delta.checkpointInterval": own} if own else None)
        write_deltalake(uri, _rows(1), mode="append")
        assert store.maintain(name, retention=Retention()).error is None
        assert DeltaTable(uri).metadata().configuration.get("delta.checkpointInterval") == (own or "10")


def test_maintain_compacts_checkpoints_and_cleans_old_log_files_only(tmp_path):
    store, uri = _sink(tmp_path, checkpoint=19)
    before = _sorted(uri)
    assert len(DeltaTable(uri).file_uris()) == 30
    log_dir = Path(uri) / "_delta_log"
    _age(log_dir, below=20, days=40)  # versions 0-19 (and 19's checkpoint) 40 days ago, 20-30 just now
    removed_file = {Path(u).name for u in DeltaTable(uri, version=29).file_uris()} - {
        Path(u).name for u in DeltaTable(uri).file_uris()
    }

    report = store.maintain("out", retention=Retention())
    assert report.error is None and report.files_before == 30 and report.files_after == 1 and report.compacted == 30
    dt = DeltaTable(uri)
    assert _sorted(uri) == before  # the same rows
    # 31 the compaction's claim, 32 the compaction, 33 the claim's release (storage.maintain)
    assert [h["operation"] for h in dt.history(3)] == ["WRITE", "OPTIMIZE", "WRITE"]
    assert dt.version() == 33 and report.checkpoint == 33 and (log_dir / f"{33:020d}.checkpoint.parquet").exists()
    names = {p.name for p in log_dir.iterdir()}
    # Versions older than the retention go, up to the newest checkpoint before the cut-off (19), so
    # every version within the retention can still be rebuilt; newer ones stay.
    assert not any(f"{v:020d}.json" in names for v in range(19)), sorted(names)
    assert all(f"{v:020d}.json" in names for v in range(19, 34)) and f"{19:020d}.checkpoint.parquet" in names
    assert report.logs_removed == 19 and report.vacuumed == 0
    assert len(_sorted(uri, version=19)) == 20
    # Files out of the table for less than the file retention stay: a reader pinned at version 29 (a
    # planned work, a ledger entry's source version) still reads its rows.
    assert all((Path(uri) / name).exists() for name in removed_file)
    assert len(_sorted(uri, version=29)) == 30
    assert len(_sorted(uri, version=30)) == 30

    again = store.maintain("out", retention=Retention())  # idempotent: nothing left to do, no commit
    assert DeltaTable(uri).version() == 33 and again.checkpoint is None and again.logs_removed == 0
    assert again.compacted == 0 and again.vacuumed == 0 and not again.properties_set


def test_engine_commits_leave_expired_log_cleanup_to_maintenance(tmp_path):
    # delta-rs would otherwise list (and stat) the whole log after every commit to clean it.
    store, uri = _sink(tmp_path, checkpoint=19)
    log_dir = Path(uri) / "_delta_log"
    _age(log_dir, below=20, days=40)
    store.append("out", _rows(40))
    store.append_state("firings", _rows(40))
    store.replace_range(
        "out",
        _rows(41),
        time_column="ts",
        time_range=(T0 + timedelta(minutes=41), T0 + timedelta(minutes=42)),
        app_id="cq:out",
        app_version=1,
    )
    names = {p.name for p in log_dir.iterdir()}
    assert all(f"{v:020d}.json" in names for v in range(33)), sorted(names)
    state_log = Path(store.state_uri("firings")) / "_delta_log"
    assert (state_log / f"{0:020d}.json").exists()
    report = store.maintain("out", retention=Retention())
    assert report.error is None and report.logs_removed == 19


def test_vacuum_deletes_only_files_out_of_the_table_past_the_retention(tmp_path):
    store, uri = _sink(tmp_path, commits=5)
    rows = _sorted(uri)
    time.sleep(0.01)  # file times strictly before the (zero) retention's cut-off
    report = store.maintain("out", retention=Retention(files=timedelta(0)))
    assert report.properties_set and report.vacuumed == 6  # 5 compacted + the replaced minute-3 file
    dt = DeltaTable(uri)
    assert dt.metadata().configuration["delta.deletedFileRetentionDuration"] == "interval 0 seconds"
    assert _sorted(uri) == rows
    assert sorted(p.name for p in Path(uri).glob("*.parquet")) == sorted(Path(u).name for u in dt.file_uris())


def _entry(definition: str, finished: datetime, status: str = "succeeded") -> LedgerEntry:
    return LedgerEntry(
        definition=definition,
        kind="ignored" if status == "ignored" else "firing",
        fire_time=finished,
        range_start=finished - timedelta(minutes=1),
        range_end=finished,
        source_versions={"src": 1},
        rows_written=1,
        sink_version=1,
        status=status,
        started_at=finished - timedelta(seconds=1),
        finished_at=finished,
    )


def test_ledger_retention_drops_old_entries_only_and_keeps_each_newest_run(tmp_path):
    store = DeltaRsStorage(warehouse=str(tmp_path / "wh"))
    ledger = Ledger(store=store)
    now = datetime(2024, 6, 1, tzinfo=UTC)
    old, new = now - timedelta(days=40), now - timedelta(days=1)
    entries = [
        _entry("a", old),
        _entry("a", old + timedelta(minutes=1), "failed"),
        _entry("a", old + timedelta(minutes=2), "ignored"),
        _entry("a", new),
        _entry("b", old),  # b's newest run, though old: kept (`cq show`)
        _entry("b", old - timedelta(minutes=5)),
        _entry("c", new),
    ]
    ledger.record_many(entries)
    assert ledger.drop_before(now - timedelta(days=30)) == 4
    kept = [(e.definition, e.finished_at, e.status) for e in ledger.entries()]
    assert sorted(kept) == sorted([("a", new, "succeeded"), ("b", old, "succeeded"), ("c", new, "succeeded")])
    version = DeltaTable(store.state_uri("firings")).version()
    assert ledger.drop_before(now - timedelta(days=30)) == 0
    assert DeltaTable(store.state_uri("firings")).version() == version  # nothing to drop: no commit


def test_state_appends_compact_the_table_every_n_versions(tmp_path, monkeypatch):
    monkeypatch.setattr(state_module, "STATE_COMPACT_EVERY", 5)
    store = DeltaRsStorage(warehouse=str(tmp_path / "wh"))
    for i in range(7):
        store.append_state("streams/s1/outbox", pa.table({"i": [i]}))
    dt = DeltaTable(store.state_uri("streams/s1/outbox"))
    # versions 0-5 appends; the 6th (version 5 % 5 == 0) compacts: 6 its claim, 7 the compaction, 8 the
    # claim's release; 9 the 7th append
    assert [h["operation"] for h in dt.history()][:4] == ["WRITE", "WRITE", "OPTIMIZE", "WRITE"]
    assert dt.version() == 9 and len(dt.file_uris()) == 2
    assert sorted(store.read_state("streams/s1/outbox")["i"].to_pylist()) == list(range(7))
    assert store.state_names() == ["streams/s1/outbox"]


def test_cq_maintain_reports_every_state_table_and_sink(tmp_path, monkeypatch, capsys):
    sql = tmp_path / "sql"
    sql.mkdir()
    (sql / "defs.sql").write_text(
        "CREATE TABLE src (ts TIMESTAMP, device STRING, v DOUBLE);\n"
        "CREATE CQ q RESAMPLE EVERY 1m BEGIN SELECT max_value(v) AS m INTO out FROM src GROUP BY (1m), device END;\n"
    )
    _, uri = _sink(tmp_path, commits=4)
    Ledger(store=DeltaRsStorage(warehouse=str(tmp_path / "wh"))).record(_entry("q", datetime.now(UTC)))
    for key, value in {
        "CQ_SQL_DIR": str(sql),
        "CQ_WAREHOUSE": str(tmp_path / "wh"),
        "CQ_HOME": str(tmp_path / ".cq"),
        "CQ_STORAGE": "deltars",
        "CQ_CONFIG": str(tmp_path / "none.toml"),
    }.items():
        monkeypatch.setenv(key, value)
    assert main(["maintain"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["_cq/firings", "out"], out
    # The sink's retention properties (CQ_LOG_RETENTION's 7 days differ from Delta's 30) are one commit,
    # the compaction three (its claim, itself, the claim's release).
    assert "files 4 -> 1" in out[1] and "table properties set" in out[1] and "checkpoint v8" in out[1], out
    assert len(DeltaTable(uri).file_uris()) == 1
    # The engine's state tables keep a day of log (read at their latest version only); sinks, CQ_LOG_RETENTION.
    ledger = DeltaTable(str(tmp_path / "wh" / "_cq" / "firings")).metadata().configuration
    assert ledger["delta.logRetentionDuration"] == "interval 1 days", ledger
    # A sink keeps the log as long as its data files (CQ_LOG_RETENTION's default, 7 days, not Delta's 30).
    assert DeltaTable(uri).metadata().configuration["delta.logRetentionDuration"] == "interval 7 days"

    monkeypatch.setenv("CQ_LEDGER_RETENTION", "30m")
    assert main(["maintain"]) == 1
    err = capsys.readouterr().err
    assert "CQ_LEDGER_RETENTION: '30m' is below the minimum of 1h" in err and "Traceback" not in err, err


@pytest.mark.spark
def test_spark_storage_optimizes_and_vacuums_through_spark_sql(tmp_path, spark):
    from cq_engine.storage.spark_delta import SparkDeltaStorage

    # Every commit by Spark (CQ_SPARK_WRITE_BYTES=0): Spark stays the only committer.
    store = SparkDeltaStorage(warehouse=str(tmp_path / "wh"), session=lambda: spark, executor_write_bytes=0)
    uri = store.uri("out")
    for i in range(4):
        spark.createDataFrame(_rows(i).to_pandas()).write.format("delta").mode("append").save(uri)
    rows = _sorted(uri)
    report = store.maintain("out", retention=Retention(log=timedelta(days=2), files=timedelta(hours=1)))
    assert report.error is None and report.properties_set and report.compacted == 4 and report.files_after == 1
    dt = DeltaTable(uri)
    ops = [(h["operation"], h.get("engineInfo", "")) for h in dt.history()]
    assert ops[0][0] == "OPTIMIZE" and "Apache-Spark" in ops[0][1], ops
    assert ops[1][0] == "SET TBLPROPERTIES", ops
    assert dt.metadata().configuration["delta.logRetentionDuration"] == "interval 2 days"
    assert _sorted(uri) == rows
    assert report.vacuumed == 0  # the compacted files left the table just now: within the hour kept


@pytest.mark.spark
def test_the_dagster_maintenance_job_and_its_daily_schedule(tmp_path, spark, monkeypatch):
    import dagster as dg

    from cq_engine.config import Settings
    from dagster_defs.definitions import build_definitions

    sql = tmp_path / "sql"
    sql.mkdir()
    (sql / "defs.sql").write_text(
        "CREATE CQ q RESAMPLE EVERY 1m BEGIN SELECT max_value(v) AS m INTO out FROM src GROUP BY (1m), device END;\n"
    )
    _, uri = _sink(tmp_path, commits=3)
    for key, value in {"CQ_STORAGE": "deltars", "CQ_CONFIG": str(tmp_path / "none.toml")}.items():
        monkeypatch.setenv(key, value)
    settings = Settings(
        sql_dir=str(sql),
        warehouse=str(tmp_path / "wh"),
        home=str(tmp_path / ".cq"),
        timezone="Asia/Shanghai",
        spark_master="local[*]",
    )
    defs = build_definitions(settings=settings, running=True)
    schedule = defs.resolve_schedule_def("cq_maintenance")
    assert (schedule.cron_schedule, schedule.execution_timezone) == ("0 3 * * *", "Asia/Shanghai")
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("cq_maintenance_job").execute_in_process(instance=instance)
    assert result.success
    [materialized] = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
    assert materialized.step_output_data.metadata["cq/files_compacted"].value == 4
    assert len(DeltaTable(uri).file_uris()) == 1
