"""The batched Airflow form's DAG ``cq_firings`` run with ``dag.test()`` (Airflow's scheduler loop in
this process, its metadata DB on SQLite) over a real Delta table, the firings computed by real Spark:
each window's run executes the firings due of every definition whose own DAG is not paused, from the
engine's ledger (BLOCKED every one in order, DISCARD the latest), each firing in the ledger and the
sink once however often a window is run again."""

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
M = timedelta(minutes=1)
SQL = """
CREATE TABLE IF NOT EXISTS plant (ts TIMESTAMP, device STRING, temperature DOUBLE, humidity DOUBLE);
CREATE CQ blocked_cq RESAMPLE EVERY 1m BEGIN
  SELECT max_value(temperature) AS tmax, count(temperature) AS n INTO blocked_out FROM plant GROUP BY (1m), device
END;
CREATE CQ discard_cq RESAMPLE EVERY 1m TIMEOUT POLICY DISCARD BEGIN
  SELECT max_value(temperature) AS tmax, count(temperature) AS n INTO discard_out FROM plant GROUP BY (1m), device
END;
CREATE STREAM n_period PERIOD(1m) FROM plant INTO n_period_out AS SELECT _tlocaltime, count(*) AS n FROM %%trows;
"""
NAMES = ("blocked_cq", "discard_cq", "n_period")
SINKS = {"blocked_cq": "blocked_out", "discard_cq": "discard_out", "n_period": "n_period_out"}
# Its own table name: the session's Airflow DB keeps one asset per name, and `sensors` is another
# test's asset at another location (a task whose inlet clashes with it fails as inactive).


def per_minute(source: pa.Table, lo: datetime, hi: datetime) -> list[tuple]:
    """The continuous queries' rows by pyarrow: per minute and device in [lo, hi), max and count."""
    ts = source["ts"]
    rows = source.filter(pc.and_(pc.greater_equal(ts, pa.scalar(lo)), pc.less(ts, pa.scalar(hi))))
    rows = rows.append_column("minute", pc.floor_temporal(rows["ts"], unit="minute"))
    grouped = rows.group_by(["minute", "device"]).aggregate([("temperature", "max"), ("temperature", "count")])
    return sorted(
        (r["minute"].replace(tzinfo=UTC), r["device"], r["temperature_max"], r["temperature_count"])
        for r in grouped.to_pylist()
    )


def set_paused(paused: bool, *dag_ids: str) -> None:
    """``cq stop/start NAME --via-airflow``'s effect: the definition's own DAG paused or not."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import update

    with create_session() as session:
        session.execute(update(DagModel).where(DagModel.dag_id.in_(dag_ids)).values(is_paused=paused))


def run_window(dag, minute: int, second: int = 20) -> tuple[dict, list[tuple[str, dict]]]:
    """One run of the window of fire times ``[T0 + minute, T0 + minute + 1m)`` (a manual run at its
    ``second``); its XCom and its asset events (sink, extra)."""
    from airflow.models.asset import AssetEvent
    from airflow.models.xcom import XComModel
    from airflow.timetables.base import DataInterval
    from airflow.utils.session import create_session
    from sqlalchemy import select

    run = dag.test(logical_date=T0 + minute * M + timedelta(seconds=second))
    assert str(run.state) == "success"
    interval = DataInterval(run.data_interval_start, run.data_interval_end)
    assert dag.timetable.window(interval) == (T0 + minute * M, T0 + (minute + 1) * M)
    with create_session() as session:
        query = XComModel.get_many(run_id=run.run_id, dag_ids=dag.dag_id, task_ids="fire", key="return_value")
        (xcom,) = session.scalars(query).all()
        events = session.scalars(select(AssetEvent).where(AssetEvent.source_run_id == run.run_id)).all()
        return XComModel.deserialize_value(xcom), sorted(((e.asset.name, e.extra) for e in events), key=str)


def fired(engine: Engine, name: str) -> list[datetime]:
    entries = engine.ledger.entries(name)
    assert all(e.status == "succeeded" and e.kind in ("firing", "period") for e in entries), entries
    return [e.fire_time for e in entries]


def test_each_windows_due_firings_fused_once_blocked_discard_and_stopped(spark, airflow_db, tmp_path, monkeypatch):
    from airflow_dags.batch import BATCH_DAG_ID
    from airflow_dags.dags import build_dags

    settings = sql_project(tmp_path, monkeypatch, {"defs.sql": SQL})
    monkeypatch.setenv("CQ_AIRFLOW_FORM", "batched")
    monkeypatch.setenv("AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION", "True")  # Airflow's default
    engine = Engine(settings=settings, spark_session=spark)
    engine.ensure_tables()
    engine.storage.append("plant", sensor_rows(start=T0, end=T0 + 12 * M))
    source = DeltaTable(settings.table_uri("plant")).to_pyarrow_table()  # the continuous queries' rows

    dags = build_dags()
    dag = dags[BATCH_DAG_ID]
    assert dag.timetable.cadence == M and dag.timetable.lead == timedelta(seconds=25)
    assert all(not dags[n].timetable.scheduled for n in NAMES)

    # Deployed with Airflow's default, the definitions' DAGs paused at creation (the first run syncs
    # the DAG file): every definition is stopped, nothing fires.
    result, events = run_window(dag, 5)
    assert (result["planned"], result["stopped"], events) == (0, sorted(NAMES), [])
    assert all(fired(engine, n) == [] for n in NAMES)

    # Started (`cq start --via-airflow`: their DAGs unpaused): each fires from its first firing in
    # the window, all three in one run.
    set_paused(False, *NAMES)
    result, events = run_window(dag, 6)
    assert (result["planned"], result["committed"], result["failed"], result["stopped"]) == (3, 3, 0, [])
    assert {f["name"]: f["fire_time"] for f in result["firings"]} == {n: (T0 + 6 * M).isoformat() for n in NAMES}
    # Each committed firing is an asset event of its sink whose extra is the firing's record.
    assert events == sorted(((SINKS[f["name"]], f) for f in result["firings"]), key=str)
    # Rows committed since: the PERIOD stream's next tick reads them (their times are past every
    # continuous query's ranges here).
    engine.storage.append("plant", sensor_rows(start=T0 + 12 * M, end=T0 + 13 * M))

    # Three windows later: BLOCKED runs the three it missed in order, DISCARD only the latest.
    result, events = run_window(dag, 9)
    got = sorted((f["name"], f["fire_time"], f["outcome"]) for f in result["firings"])
    assert got == sorted(
        [(n, (T0 + k * M).isoformat(), "ok") for n in ("blocked_cq", "n_period") for k in (7, 8, 9)]
        + [("discard_cq", (T0 + 9 * M).isoformat(), "ok")]
    )
    assert any("discard_cq: DISCARD skipped 2 firing(s)" in note for note in result["notes"])
    assert len(events) == 7

    # The same window again (a rerun, or a second run of it): every firing is in the ledger already.
    again, events = run_window(dag, 9, second=40)
    assert (again["planned"], events) == (0, [])

    # discard_cq stopped (`cq stop --via-airflow`): left out, the others go on.
    set_paused(True, "discard_cq")
    result, _ = run_window(dag, 10)
    assert result["stopped"] == ["discard_cq"] and {f["name"] for f in result["firings"]} == {"blocked_cq", "n_period"}

    # The ledger: every due firing once; the sinks: each firing's range once, as pyarrow computes it.
    assert fired(engine, "blocked_cq") == [T0 + k * M for k in range(6, 11)]
    assert fired(engine, "n_period") == [T0 + k * M for k in range(6, 11)]
    assert fired(engine, "discard_cq") == [T0 + 6 * M, T0 + 9 * M]

    def sink(name: str) -> list[tuple]:
        table = DeltaTable(settings.table_uri(name)).to_pyarrow_table().to_pylist()
        return sorted((r["ts"].replace(tzinfo=UTC), r["device"], r["tmax"], r["n"]) for r in table)

    assert sink("blocked_out") == per_minute(source, T0 + 5 * M, T0 + 10 * M)
    assert sink("discard_out") == per_minute(source, T0 + 5 * M, T0 + 6 * M) + per_minute(
        source, T0 + 8 * M, T0 + 9 * M
    )
    ticks = DeltaTable(settings.table_uri("n_period_out")).to_pyarrow_table().to_pylist()
    at = [r["_tlocaltime"].replace(tzinfo=UTC) for r in ticks]
    assert len(at) == len(set(at)) and set(at) <= {T0 + k * M for k in range(7, 11)}, at
    # The first tick (6m) set the baseline; the next read the rows appended after it, the others none.
    assert {t: r["n"] for t, r in zip(at, ticks, strict=True) if r["n"]} == {T0 + 7 * M: 3 * 12}
