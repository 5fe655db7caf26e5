"""Window-triggered streams' DAGs under Airflow (``dag.test()``: Airflow's scheduler loop in this
process, its metadata DB on SQLite) run on the events of their trigger table's watcher (one asset for
the INTERVAL and the SESSION stream of ``meters``), over a real Delta table, the windows computed by
real Spark: the sinks against a pure-Python reference, and each window's run in the ledger once
however often a run is repeated or resumed. And the watcher in ``airflow triggerer`` itself (no
Spark, but minutes of the quick loop's budget: the module is marked ``spark`` with the slow tests)."""

import asyncio
import importlib
from pathlib import Path

import pytest
import window_reference as ref
from conftest import sql_project
from streams_util import METERS, T0, Bench, reference, sink_summary, us

pytestmark = pytest.mark.spark

SQL = """
CREATE STREAM s_int INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname OPTIONS(WATERMARK(10s))
  INTO s_int_out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;
CREATE STREAM s_sess SESSION(ts, 9s) FROM meters PARTITION BY tbname OPTIONS(WATERMARK(10s))
  INTO s_sess_out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;
"""
MINUTE = 60_000_000


def expected(bench: Bench, until_seconds: int) -> list[tuple]:
    """The closed INTERVAL windows at watermark ``until_seconds`` after T0, per meter, by the reference."""
    until = us(T0) + until_seconds * 1_000_000
    return reference(bench.rows(), ref.interval_windows, interval=MINUTE, sliding=MINUTE, offset=0, until=until)


def sessions(bench: Bench, until_seconds: int) -> list[tuple]:
    """The closed sessions (gap 9 s) at watermark ``until_seconds`` after T0, per meter."""
    until = us(T0) + until_seconds * 1_000_000
    return reference(bench.rows(), ref.session_windows, gap=9_000_000, until=until)


def watched(dag):
    """The watcher of the asset the DAG is scheduled on (as the DAG file built it)."""
    (asset,) = dag.timetable.asset_condition.objects
    (watcher,) = asset.watchers
    return watcher.trigger


def fire(table: str, uri: str, *, after: int | None) -> tuple[dict, list[str]]:
    """What Airflow's triggerer does with the table asset's watcher, once: the trigger rebuilt from
    the classpath and keyword arguments Airflow registered for the asset (started after version
    ``after``, as restarted from its stored state), run until its first event, and the event submitted
    (``Trigger.submit_event``: the asset event and the DAG runs it queues). The event's payload and the
    DAGs it queued (taken off the queue: ``dag.test`` runs them)."""
    from airflow.models.asset import AssetDagRunQueue, AssetModel
    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session
    from sqlalchemy import delete, select

    with create_session() as session:
        asset = session.scalars(select(AssetModel).where(AssetModel.name == table, AssetModel.uri == uri)).one()
        (watcher,) = asset.watchers
        assert watcher.name == f"{table}_commits"
        trigger_id, classpath, kwargs = watcher.trigger.id, watcher.trigger.classpath, watcher.trigger.kwargs
    module, _, name = classpath.rpartition(".")  # what the triggerer imports
    trigger = getattr(importlib.import_module(module), name)(**{**kwargs, "after_version": after, "poll_seconds": 0.05})

    async def first():
        events = trigger.run()
        try:
            return await asyncio.wait_for(events.__anext__(), timeout=30)
        finally:
            await events.aclose()

    event = asyncio.run(first())
    Trigger.submit_event(trigger_id, event)
    with create_session() as session:
        queued = sorted(q.target_dag_id for q in session.scalars(select(AssetDagRunQueue)))
        session.execute(delete(AssetDagRunQueue))
    return event.payload, queued


def run_dag(dag, sink: str = "s_int_out") -> dict:
    """One DAG run (as an asset event starts it); its task's XCom, checked against the sink's asset event."""
    from airflow.models.asset import AssetEvent
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    run = dag.test(logical_date=None)
    assert str(run.state) == "success"
    with create_session() as session:
        query = XComModel.get_many(run_id=run.run_id, dag_ids=dag.dag_id, task_ids="tick", key="return_value")
        (xcom,) = session.scalars(query).all()
        result = XComModel.deserialize_value(xcom)
        (event,) = session.scalars(select(AssetEvent).where(AssetEvent.source_run_id == run.run_id)).all()
        assert event.asset.name == sink and event.extra == result
    return result


def unpause(*dag_ids: str) -> None:
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import update

    with create_session() as session:
        session.execute(update(DagModel).where(DagModel.dag_id.in_(dag_ids)).values(is_paused=False))


def ledger_runs(bench: Bench, name: str = "s_int") -> list[tuple]:
    entries = [e for e in bench.engine.ledger.entries(name) if e.status == "succeeded" and e.kind != "ignored"]
    return sorted((e.kind, e.range_start, e.range_end, e.source_versions.get("meters")) for e in entries)


def test_stream_dag_runs_on_watcher_events_and_computes_each_window_once(spark, airflow_db, tmp_path, monkeypatch):
    from deltalake import DeltaTable

    # Airflow is imported once its configuration (airflow_db) is in place.
    from airflow_dags import stream_tasks
    from airflow_dags.dags import build_dags

    b = Bench(tmp_path, spark, SQL)
    for var, value in {
        "CQ_SQL_DIR": b.settings.sql_dir,
        "CQ_WAREHOUSE": b.settings.warehouse,
        "CQ_HOME": b.settings.home,
        "CQ_CONFIG": tmp_path / "none.toml",
    }.items():
        monkeypatch.setenv(var, str(value))
    assert (tmp_path / "sql" / "s.sql").read_text().startswith(METERS)
    dags = build_dags()
    dag, sess = dags["s_int"], dags["s_sess"]
    assert watched(sess).serialize() == watched(dag).serialize()  # one watcher for the table's streams

    # Deployed: the DAG file synced to the metadata DB (by a first run, which creates the cursor), the
    # DAGs unpaused, and with the next sync the asset's watcher registered (Airflow registers the
    # watchers of assets that unpaused DAGs are scheduled on). Its first start reports the table as it
    # is: both streams' DAGs are queued.
    assert run_dag(dag)["works"] == []
    unpause("s_int", "s_sess")
    assert run_dag(sess, "s_sess_out")["works"] == []
    asset_uri = Path(b.settings.table_uri("meters")).resolve().as_uri()
    payload, queued = fire("meters", asset_uri, after=None)
    assert (payload["version"], queued) == (0, ["s_int", "s_sess"])
    first = run_dag(dag)
    assert (first["works"], first["trigger_version"], first["sink_version"]) == ([], 0, None)
    assert run_dag(sess, "s_sess_out")["works"] == []

    b.append([(s, d, float(s % 7)) for s in range(0, 55, 5) for d in ("d1", "d2")])
    b.append([(s, d, float(s % 5)) for s in range(60, 155, 5) for d in ("d1", "d2")])
    payload, queued = fire("meters", asset_uri, after=0)
    uri = str((tmp_path / "wh" / "meters").resolve())
    assert (payload, queued) == ({"table": "meters", "uri": uri, "version": 2, "previous": 0}, ["s_int", "s_sess"])
    second = run_dag(dag)
    assert sink_summary(b.sink("s_int_out")) == expected(b, 140) and len(expected(b, 140)) == 4
    assert second["trigger_version"] == 2 and second["rows_written"] == 4
    assert second["sink_version"] == DeltaTable(b.settings.table_uri("s_int_out")).version()
    run_dag(sess, "s_sess_out")
    assert sink_summary(b.sink("s_sess_out")) == sessions(b, 140) and len(sessions(b, 140)) == 2

    # A late row into the closed window [0, 1m) of d1, and rows that close [2m, 3m).
    b.append([(32, "d1", 100.0)])
    b.append([(s, d, 1.5) for s in range(160, 220, 5) for d in ("d1", "d2")])
    assert fire("meters", asset_uri, after=2)[0]["version"] == 4
    third = run_dag(dag)
    assert sink_summary(b.sink("s_int_out")) == expected(b, 205) and len(expected(b, 205)) == 6
    assert next(r for r in b.sink("s_int_out") if r["tbname"] == "d1" and r["_twstart"] == T0)["n"] == 12
    assert third["trigger_version"] == 4 and third["works"]
    run_dag(sess, "s_sess_out")  # the late row into the closed session [0s, 50s] of d1 recomputes it
    assert sink_summary(b.sink("s_sess_out")) == sessions(b, 205) and len(sessions(b, 205)) == 4
    assert next(r for r in b.sink("s_sess_out") if r["tbname"] == "d1" and r["_twstart"] == T0)["n"] == 12

    # The same event again (a repeated run): nothing is planned, nothing recorded.
    runs, session_runs = ledger_runs(b), ledger_runs(b, "s_sess")
    assert len(runs) == len(set(runs)) >= 2 and len(session_runs) == len(set(session_runs)) >= 2
    again = run_dag(dag)
    assert (again["works"], again["skipped"], again["trigger_version"]) == ([], 0, 4)
    assert run_dag(sess, "s_sess_out")["works"] == []
    assert ledger_runs(b) == runs and ledger_runs(b, "s_sess") == session_runs

    # A run that dies after its works committed, before it saved the cursor: the next run resumes
    # the plan it recorded, finds its works in the ledger and computes nothing again.
    b.append([(s, d, 2.5) for s in range(220, 280, 5) for d in ("d1", "d2")])
    real_write = stream_tasks.write_atomic

    def dying(path, text, **kw):
        if path.name == "s_int.json":
            raise KeyboardInterrupt("worker killed")
        return real_write(path, text, **kw)

    monkeypatch.setattr(stream_tasks, "write_atomic", dying)
    with pytest.raises(KeyboardInterrupt):
        stream_tasks.tick_stream(b.engine, b.engine.stream("s_int"), now=T0)
    monkeypatch.setattr(stream_tasks, "write_atomic", real_write)
    committed = ledger_runs(b)
    assert len(committed) == len(runs) + 1
    resumed = run_dag(dag)
    assert resumed["resumed"] and resumed["skipped"] == 1 and resumed["works"] == []
    assert resumed["trigger_version"] == 5
    assert ledger_runs(b) == committed and len(committed) == len(set(committed))
    assert sink_summary(b.sink("s_int_out")) == expected(b, 265)
    assert not (tmp_path / ".cq" / "ticks" / "s_int.plan.json").exists()
    assert run_dag(dag)["works"] == []  # and the cursor it saved plans nothing again


# -- the watcher in Airflow's own triggerer ---------------------------------------------------------
READINGS = """
CREATE TABLE readings (ts TIMESTAMP, current DOUBLE) TAGS (device STRING);
CREATE STREAM r_int INTERVAL(1m) SLIDING(1m) FROM readings PARTITION BY device
  INTO r_int_out AS SELECT _twstart, count(*) AS n FROM %%trows;
"""


def append_reading(uri: str) -> None:
    from datetime import UTC, datetime

    import pyarrow as pa
    from deltalake import write_deltalake

    ts = pa.array([datetime(2026, 1, 1, tzinfo=UTC)], pa.timestamp("us", tz="UTC"))
    write_deltalake(uri, pa.table({"ts": ts, "current": [1.0], "device": ["d1"]}), mode="append")


def watcher_events(name: str, count: int, *, within: float = 90) -> list[dict]:
    """The payloads of the asset's first ``count`` watcher events, waiting for them up to ``within`` s."""
    import time

    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    deadline = time.monotonic() + within
    while True:
        with create_session() as session:
            query = select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            events = session.scalars(query.where(AssetModel.name == name).order_by(AssetEvent.id)).all()
            payloads = [e.extra["payload"] for e in events if e.extra.get("from_trigger")]
        if len(payloads) >= count or time.monotonic() > deadline:
            return payloads
        time.sleep(0.5)


def test_watcher_runs_in_airflows_triggerer_and_resumes_after_a_restart(airflow_db, tmp_path, monkeypatch):
    """No Spark: the DAG file synced by Airflow's CLI, the watcher run by ``airflow triggerer``."""
    import os
    import signal
    import subprocess
    import sys

    from airflow.models.asset import AssetDagRunQueue
    from airflow.utils.session import create_session
    from sqlalchemy import select

    settings = sql_project(tmp_path, monkeypatch, {"r.sql": READINGS})
    uri = settings.table_uri("readings")
    append_reading(uri)  # version 0
    airflow = os.path.join(os.path.dirname(sys.executable), "airflow")
    env = {**os.environ, "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False"}
    subprocess.run([airflow, "dags", "reserialize"], check=True, capture_output=True, env=env)

    def triggerer() -> subprocess.Popen:
        log = open(tmp_path / "triggerer.log", "a")  # noqa: SIM115 (closed with the process)
        return subprocess.Popen(
            [airflow, "triggerer", "--skip-serve-logs"], env=env, stdout=log, stderr=log, start_new_session=True
        )

    def stop(process: subprocess.Popen) -> None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    process = triggerer()
    try:
        # Its first start reports the table as it is, then each new version.
        assert watcher_events("readings", 1) == [{"table": "readings", "uri": uri, "version": 0, "previous": -1}]
        append_reading(uri)
        assert watcher_events("readings", 2)[1] == {"table": "readings", "uri": uri, "version": 1, "previous": 0}
    finally:
        stop(process)
    append_reading(uri)
    append_reading(uri)  # versions 2 and 3, while no triggerer runs
    process = triggerer()
    try:
        # Restarted, it resumes from the version it stored: what was committed meanwhile is one event.
        events = watcher_events("readings", 3)
        assert events[2:] == [{"table": "readings", "uri": uri, "version": 3, "previous": 1}]
    finally:
        stop(process)
    with create_session() as session:
        assert "r_int" in {q.target_dag_id for q in session.scalars(select(AssetDagRunQueue))}
