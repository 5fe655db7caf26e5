"""Runner end to end on real Spark and Delta: idempotence, crash recovery, file skipping, recalculation."""

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import STORAGES
from deltalake import DeltaTable

from cq_engine.cli.feed import sensor_rows
from cq_engine.config import Settings
from cq_engine.engine import Engine
from cq_engine.errors import CQError, TableError, TimeError
from cq_engine.resample.run import write_identity

T0 = datetime(2024, 3, 1, tzinfo=UTC)
REPO = Path(__file__).resolve().parents[1]

SQL = """
CREATE TABLE IF NOT EXISTS sensors (ts TIMESTAMP, device STRING, temperature DOUBLE, humidity DOUBLE);
CREATE CQ per_minute RESAMPLE EVERY 1m BEGIN
  SELECT max_value(temperature) AS tmax, count(temperature) AS n INTO per_minute_out FROM sensors GROUP BY (1m), device
END;
CREATE CQ sliding RESAMPLE EVERY 1m RANGE 3m BEGIN
  SELECT avg(humidity) AS h INTO sliding_out FROM sensors GROUP BY (30s), device FILL(PREVIOUS)
END;
CREATE CQ odd_grid RESAMPLE EVERY 50s RANGE 100s BEGIN
  SELECT count(humidity) AS n INTO odd_out FROM sensors GROUP BY (20s)
END;
"""


def rows(engine: Engine, table: str) -> list[dict]:
    data = pa.table(DeltaTable(engine.settings.table_uri(table)).scan())
    return sorted(data.to_pylist(), key=lambda r: tuple(str(v) for v in r.values()))


def make_engine(tmp_path, spark, sql=SQL, **settings) -> Engine:
    (tmp_path / "sql").mkdir(exist_ok=True)
    (tmp_path / "sql" / "defs.sql").write_text(sql)
    s = Settings(sql_dir=str(tmp_path / "sql"), warehouse=str(tmp_path / "wh"), home=str(tmp_path / ".cq"), **settings)
    engine = Engine(settings=s, spark_session=spark)
    assert not engine.catalog.errors, engine.catalog.errors
    return engine


@pytest.fixture(scope="module", params=list(STORAGES))
def engine(spark, tmp_path_factory, request):
    tmp = tmp_path_factory.mktemp("runner")
    eng = make_engine(tmp, spark, **STORAGES[request.param])
    eng.ensure_tables()
    # 30 commits of one minute each: file skipping has something to skip.
    for m in range(30):
        eng.storage.append("sensors", sensor_rows(start=T0 + timedelta(minutes=m), end=T0 + timedelta(minutes=m + 1)))
    return eng


def test_firing_reads_only_overlapping_files(engine):
    r = engine.run_firing("per_minute", T0 + timedelta(minutes=11))
    assert r.files_total == 30 and r.files_read <= 2
    assert r.source_versions == {"sensors": engine.storage.version("sensors")}
    got = rows(engine, "per_minute_out")
    assert {x["ts"] for x in got} == {T0 + timedelta(minutes=10)}
    expected = sensor_rows(start=T0 + timedelta(minutes=10), end=T0 + timedelta(minutes=11)).to_pylist()
    for device in ("dev-a", "dev-b", "dev-c"):
        temps = [x["temperature"] for x in expected if x["device"] == device and x["temperature"] is not None]
        (row,) = [x for x in got if x["device"] == device]
        assert (row["tmax"], row["n"]) == (max(temps), len(temps))


def test_firing_twice_leaves_one_result(engine):
    fire = T0 + timedelta(minutes=20)
    first = engine.run_firing("sliding", fire)
    once = rows(engine, "sliding_out")
    second = engine.run_firing("sliding", fire)
    assert rows(engine, "sliding_out") == once
    assert first.rows_written == second.rows_written == len(once) == 18  # 6 windows x 3 devices
    assert DeltaTable(engine.settings.table_uri("sliding_out")).version() == second.sink_version
    if engine.settings.storage == "spark":  # Delta skips the retry's write: same firing, same source version
        assert second.sink_version == first.sink_version
        micros = (fire - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
        app_id = f"{write_identity(engine.definition('sliding'), 'firing')}@{micros}/sensors"
        assert engine.storage.transaction_version("sliding_out", app_id) == engine.storage.version("sensors")
    else:
        assert engine.storage.transaction_version("sliding_out", write_identity(engine.definition("sliding"), "firing"))
    entries = [e for e in engine.ledger.entries("sliding") if e.fire_time == fire]
    assert [e.status for e in entries] == ["succeeded", "succeeded"]


def test_crash_between_compute_and_commit_leaves_sink_unchanged(engine):
    fire = T0 + timedelta(minutes=25)
    engine.run_firing("per_minute", T0 + timedelta(minutes=24))
    before_version = DeltaTable(engine.settings.table_uri("per_minute_out")).version()
    before = rows(engine, "per_minute_out")
    env = {
        **os.environ,
        "CQ_SQL_DIR": engine.settings.sql_dir,
        "CQ_WAREHOUSE": engine.settings.warehouse,
        "CQ_HOME": engine.settings.home,
        "CQ_FAILPOINT": "before-commit",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "cq_engine.cli.main", "run", "per_minute", "--at", fire.isoformat()],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 75, proc.stderr[-2000:]  # killed just before the commit
    assert DeltaTable(engine.settings.table_uri("per_minute_out")).version() == before_version
    assert rows(engine, "per_minute_out") == before
    r = engine.run_firing("per_minute", fire)  # the retry
    again = engine.run_firing("per_minute", fire)
    assert r.rows_written == again.rows_written == 3
    assert len(rows(engine, "per_minute_out")) == len(before) + 3


def test_recalculate_in_chunks_equals_the_firings(engine, spark, tmp_path):
    fires = [T0 + timedelta(minutes=m) for m in range(3, 11)]
    for f in fires:
        engine.run_firing("sliding", f)
    by_firings = [
        r for r in rows(engine, "sliding_out") if T0 + timedelta(minutes=0) <= r["ts"] < T0 + timedelta(minutes=10)
    ]
    small = Engine(
        settings=Settings(**{**engine.settings.__dict__, "recalculate_chunk_windows": 13}),
        storage=engine.storage,
        spark_session=spark,
    )
    before = DeltaTable(engine.settings.table_uri("sliding_out")).version()
    r = small.recalculate("sliding", start=T0, end=T0 + timedelta(minutes=10))
    assert r.chunks > 1 and r.time_range == (T0, T0 + timedelta(minutes=10))
    recalculated = [x for x in rows(engine, "sliding_out") if x["ts"] < T0 + timedelta(minutes=10)]
    assert recalculated == by_firings and len(recalculated) == 20 * 3
    assert r.sink_version == before + 1  # all chunks in one atomic commit


def test_recalculate_on_different_grids_per_firing(engine):
    # EVERY 50s is no multiple of the 20s step: each firing has its own grid
    r = engine.recalculate("odd_grid", start=T0, end=T0 + timedelta(seconds=300))
    assert r.chunks == len(range(2, 7))  # firings at 100s..300s have ranges inside [0, 300s)
    got = rows(engine, "odd_out")
    assert len({x["ts"] for x in got}) == len(got)


def test_bad_times_and_names(engine):
    with pytest.raises(TimeError, match=r"not a firing time of 'per_minute'.*nearest"):
        engine.run_firing("per_minute", T0 + timedelta(seconds=30))
    with pytest.raises(CQError, match="no definition named 'nope'"):
        engine.run_firing("nope", T0)


def test_missing_source_and_missing_time_column(spark, tmp_path):
    eng = make_engine(
        tmp_path,
        spark,
        sql="CREATE CQ q RESAMPLE EVERY 1m BEGIN SELECT max(v) AS m INTO out_q FROM ghost GROUP BY (1m) END;",
    )
    with pytest.raises(TableError, match="'ghost' does not exist"):
        eng.run_firing("q", T0)
    eng.storage.append("ghost", pa.table({"v": [1.0], "label": ["x"]}))
    with pytest.raises(TableError, match=r"ghost.*no time column"):
        eng.run_firing("q", T0)
    assert not eng.storage.exists("out_q")
    assert eng.ledger.last("q").status == "failed"


SILENT = """
CREATE TABLE IF NOT EXISTS t (ts TIMESTAMP, device STRING, s1 DOUBLE);
CREATE CQ counted RESAMPLE EVERY 30s RANGE 30s BEGIN
  SELECT count(s1) AS n INTO counted_out FROM t GROUP BY (10s) ALIGN BY DEVICE
END;
CREATE CQ filled RESAMPLE EVERY 30s RANGE 30s BEGIN
  SELECT max_value(s1) AS m INTO filled_out FROM t GROUP BY (10s), device FILL(-1.0)
END;
"""


def test_devices_silent_in_the_range_report_zero_counts(spark, tmp_path):
    """IoTDB takes a query's devices from its schema: a device that sent nothing in the range gets
    a row per window (count 0, FILL's constant). Here: every device the source holds at the version
    read, kept from the Delta log as devices come and go."""
    eng = make_engine(tmp_path, spark, sql=SILENT)
    eng.ensure_tables()

    def table(*rows):
        return pa.table(
            {
                "ts": pa.array([T0 + timedelta(seconds=s) for s, _, _ in rows], pa.timestamp("us", tz="UTC")),
                "device": [d for _, d, _ in rows],
                "s1": pa.array([v for _, _, v in rows], pa.float64()),
            }
        )

    eng.storage.append("t", table((1, "d1", 1.0), (12, "d1", 2.0), (40, "d2", 5.0)))  # d2: nothing in [0s, 30s)
    fire = T0 + timedelta(seconds=30)

    def written(name):
        return sorted(
            ((r["ts"] - T0).total_seconds(), r["device"], r.get("n", r.get("m"))) for r in rows(eng, f"{name}_out")
        )

    eng.run_firing("counted", fire)
    assert written("counted") == [
        (0, "d1", 1),
        (0, "d2", 0),
        (10, "d1", 1),
        (10, "d2", 0),
        (20, "d1", 0),
        (20, "d2", 0),
    ]
    eng.run_firing("filled", fire)
    assert [r for r in written("filled") if r[1] == "d2"] == [(0, "d2", -1.0), (10, "d2", -1.0), (20, "d2", -1.0)]

    eng.storage.append("t", table((100, "d3", 1.0)))  # a new device, long after the range
    assert eng.run_firing("counted", fire).rows_written == 9
    # d3's only row is deleted (a range replace, as a CQ writing its sink does): d3 is gone again.
    eng.storage.replace_range(
        "t",
        table(),
        time_column="ts",
        time_range=(T0 + timedelta(seconds=90), T0 + timedelta(seconds=120)),
        app_id="test",
        app_version=1,
    )
    assert eng.run_firing("counted", fire).rows_written == 6
    # The firing no longer computes d3's rows, and deletes nothing: the points the earlier firing wrote
    # stay, as in IoTDB, whose SELECT ... INTO never deletes a point.
    assert {r[1] for r in written("counted")} == {"d1", "d2", "d3"}
