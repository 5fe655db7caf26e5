"""One continuous query's DAG run under Airflow (``dag.test()``: Airflow's scheduler loop in this
process, its metadata DB on SQLite) over a real Delta table, the firing computed by real Spark."""

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import sql_project
from deltalake import DeltaTable

from cq_engine.cli.feed import sensor_rows
from cq_engine.engine import Engine

pytestmark = pytest.mark.spark

T0 = datetime(2024, 3, 1, tzinfo=UTC)
SQL = """
CREATE TABLE IF NOT EXISTS sensors (ts TIMESTAMP, device STRING, temperature DOUBLE, humidity DOUBLE);
CREATE CQ per_minute RESAMPLE EVERY 1m RANGE 3m, 1m BEGIN
  SELECT max_value(temperature) AS tmax, count(temperature) AS n INTO per_minute_out FROM sensors GROUP BY (1m), device
END;
"""


def expected(source: pa.Table, lo: datetime, hi: datetime) -> list[tuple]:
    """The firing's rows by pyarrow: per minute and device in [lo, hi), max and count of temperature."""
    ts = source["ts"]
    rows = source.filter(pc.and_(pc.greater_equal(ts, pa.scalar(lo)), pc.less(ts, pa.scalar(hi))))
    rows = rows.append_column("minute", pc.floor_temporal(rows["ts"], unit="minute"))
    grouped = rows.group_by(["minute", "device"]).aggregate([("temperature", "max"), ("temperature", "count")])
    return sorted((r["minute"], r["device"], r["temperature_max"], r["temperature_count"]) for r in grouped.to_pylist())


def test_a_dag_run_computes_its_data_interval_into_the_sink(spark, airflow_db, tmp_path, monkeypatch):
    from airflow.models.asset import AssetEvent
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from airflow_dags.dags import build_dags

    settings = sql_project(tmp_path, monkeypatch, {"defs.sql": SQL})
    engine = Engine(settings=settings, spark_session=spark)
    engine.ensure_tables()
    engine.storage.append("sensors", sensor_rows(start=T0, end=T0 + timedelta(minutes=10)))

    dag = build_dags()["per_minute"]
    run = dag.test(logical_date=T0 + timedelta(minutes=6, seconds=20))
    assert str(run.state) == "success"
    lo, hi = T0 + timedelta(minutes=3), T0 + timedelta(minutes=5)  # firing at 6m: [6m - 3m, 6m - 1m)
    assert (run.data_interval_start, run.data_interval_end) == (lo, hi)

    sink = pa.table(DeltaTable(settings.table_uri("per_minute_out")).to_pyarrow_table())
    got = sorted(
        (r["ts"].replace(tzinfo=UTC), r["device"], r["tmax"], r["n"])
        for r in sink.select(["ts", "device", "tmax", "n"]).to_pylist()
    )
    source = DeltaTable(settings.table_uri("sensors")).to_pyarrow_table()
    want = [(m.replace(tzinfo=UTC) if m.tzinfo is None else m, *rest) for m, *rest in expected(source, lo, hi)]
    assert got == want and len(got) > 2

    with create_session() as session:
        query = XComModel.get_many(run_id=run.run_id, dag_ids="per_minute", task_ids="fire", key="return_value")
        (xcom,) = session.scalars(query).all()
        result = XComModel.deserialize_value(xcom)
        # The sink's asset event carries the same record (lineage: the task's inlet is the source).
        (event,) = session.scalars(select(AssetEvent).where(AssetEvent.source_run_id == run.run_id)).all()
        assert event.asset.name == "per_minute_out" and event.extra == result
    assert result["rows_written"] == len(got)
    assert result["sink_version"] == DeltaTable(settings.table_uri("per_minute_out")).version()
    assert result["source_versions"] == {"sensors": DeltaTable(settings.table_uri("sensors")).version()}
    assert (result["range_start"], result["range_end"]) == (lo.isoformat(), hi.isoformat())


def test_a_scheduled_runs_firing_is_committed_once_and_a_backfills_rewritten(spark, airflow_db, tmp_path, monkeypatch):
    """The task retried after its commit (or a second scheduled run of the interval) finds the sink
    holding the firing: nothing written or recorded again; a backfill's run rewrites it, as
    `cq recalculate` does."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.types import DagRunType

    from airflow_dags.tasks import run_firing

    settings = sql_project(tmp_path, monkeypatch, {"defs.sql": SQL})
    engine = Engine(settings=settings, spark_session=spark)
    engine.ensure_tables()
    engine.storage.append("sensors", sensor_rows(start=T0, end=T0 + timedelta(minutes=10)))
    end = T0 + timedelta(minutes=5)  # the firing at 6m: [3m, 5m)
    lag_us = 60_000_000  # RANGE 3m, 1m: the firing is a minute after its range's end

    def fire(run_type: DagRunType) -> dict:
        return run_firing(name="per_minute", lag_us=lag_us, data_interval_end=end, dag_run=DagRun(run_type=run_type))

    first = fire(DagRunType.SCHEDULED)
    assert first["already_committed"] is False and first["rows_written"] > 2
    sink = DeltaTable(settings.table_uri("per_minute_out"))
    again = fire(DagRunType.SCHEDULED)
    assert again["already_committed"] is True and again["sink_version"] == first["sink_version"] == sink.version()
    assert DeltaTable(settings.table_uri("per_minute_out")).version() == first["sink_version"]
    assert [e.status for e in engine.ledger.entries("per_minute")] == ["succeeded"]

    rewritten = fire(DagRunType.BACKFILL_JOB)
    assert rewritten["already_committed"] is False and rewritten["sink_version"] == first["sink_version"] + 1
    assert rewritten["rows_written"] == first["rows_written"]
    assert [e.status for e in engine.ledger.entries("per_minute")] == ["succeeded", "succeeded"]
