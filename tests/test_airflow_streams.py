"""Window-triggered streams and eKuiper rules under Airflow, without Spark: their DAGs as Airflow's
DagBag parses them (scheduled on their trigger table's asset and its watcher), and the watcher
(``DeltaCommitTrigger``) run with asyncio over a real Delta table written by deltalake."""

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import record_paths, sql_project

REPO = Path(__file__).resolve().parents[1]
TDENGINE = """
CREATE TABLE meters (ts TIMESTAMP, current DOUBLE, voltage INT, status INT) TAGS (location STRING);
CREATE STREAM s_int INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname
  INTO s_int_out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;
CREATE STREAM s_sess SESSION(ts, 30s) FROM meters PARTITION BY tbname
  INTO s_sess_out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;
CREATE STREAM s_tick PERIOD(1m) FROM meters INTO s_tick_out AS SELECT _tlocaltime, count(*) AS n FROM %%trows;
"""
EKUIPER = """
CREATE STREAM demo (ID STRING, temperature FLOAT, ts BIGINT)
  WITH (DATASOURCE="demo", FORMAT="json", KEY="ts", TIMESTAMP="ts");
CREATE RULE demo_counts INTO demo_counts AS
  SELECT ID, count(*) AS readings FROM demo GROUP BY ID, TUMBLINGWINDOW(ss, 10);
"""
TRIGGER = "airflow_dags.watch.DeltaCommitTrigger"


def scheduled_on(dag) -> list:
    """The assets a DAG is scheduled on, as the scheduler stores them (the serialized DAG)."""
    from airflow.serialization.serialized_objects import DagSerialization

    stored = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    return [asset for _, asset in stored.timetable.asset_condition.iter_assets()]


def test_each_stream_and_rule_is_a_dag_on_its_trigger_tables_watched_asset(airflow_home, tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    settings = sql_project(tmp_path, monkeypatch, {"td.sql": TDENGINE, "ek.sql": EKUIPER})
    bag = DagBag(dag_folder=str(REPO / "airflow_dags" / "dags"))
    assert bag.import_errors == {}
    assert set(bag.dags) == {"s_int", "s_sess", "s_tick", "demo_counts"}
    assets = {}
    for name, table, sink in (
        ("s_int", "meters", "s_int_out"),
        ("s_sess", "meters", "s_sess_out"),
        ("demo_counts", "demo", "demo_counts"),
    ):
        dag = bag.dags[name]
        (asset,) = scheduled_on(dag)
        location = str((tmp_path / "wh" / table).resolve())
        assert (asset.name, asset.uri) == (table, Path(location).as_uri())
        (watcher,) = asset.watchers
        assert watcher.name == f"{table}_commits"
        assert watcher.trigger["classpath"] == TRIGGER
        assert watcher.trigger["kwargs"] == {
            "table": table,
            "uri": location,
            "poll_seconds": 1.0,
            "after_version": None,
        }
        assert dag.max_active_runs == 1 and not dag.catchup
        (task,) = dag.tasks
        assert [a.name for a in task.outlets] == [sink]
        assets[name] = asset
    # One asset (and one watcher: the same trigger) for the two streams of `meters`.
    assert assets["s_int"] == assets["s_sess"]
    assert settings.table_uri("meters").endswith("/meters")
    # The PERIOD stream keeps its timetable.
    assert type(bag.dags["s_tick"].timetable).__name__ == "CQTimetable"


def test_a_broken_file_stays_one_import_error_beside_the_stream_dags(airflow_home, tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    broken = "CREATE STREAM bad SESSION(ts, 30q) FROM meters INTO bad_out AS SELECT _twstart, count(*) FROM %%trows;\n"
    sql_project(tmp_path, monkeypatch, {"td.sql": TDENGINE, "zz.sql": broken})
    bag = DagBag(dag_folder=str(REPO / "airflow_dags" / "dags"))
    assert set(bag.dags) == {"s_int", "s_sess", "s_tick"}
    (error,) = bag.import_errors.values()
    assert error.startswith(f"SqlLoadError: {tmp_path / 'sql' / 'zz.sql'}:1:")


# -- the watcher -------------------------------------------------------------------------------------
def commit(uri: str, n: int) -> None:
    from deltalake import write_deltalake

    rows = pa.table(
        {"ts": pa.array([datetime(2026, 1, 1, tzinfo=UTC)] * n, pa.timestamp("us", tz="UTC")), "v": list(range(n))}
    )
    write_deltalake(uri, rows, mode="append")


class Events:
    """A trigger's events, each awaited for a while: an event not yielded in time stays awaited (a
    cancelled ``__anext__`` would end the generator)."""

    def __init__(self, trigger):
        self.events = trigger.run()
        self.pending = None

    async def next(self, *, within: float):
        """The next event's payload, or None if none came within ``within`` seconds."""
        if self.pending is None:
            self.pending = asyncio.ensure_future(self.events.__anext__())
        done, _ = await asyncio.wait({self.pending}, timeout=within)
        if not done:
            return None
        event, self.pending = self.pending.result(), None
        return event.payload

    async def close(self):
        if self.pending is not None:
            self.pending.cancel()
        await self.events.aclose()


def probed_versions(names: list[str]) -> set[int]:
    return {int(n.split(".")[0]) for n in names if n.split(".")[0].isdigit()}


def test_watcher_reports_each_new_version_reading_only_the_log_after_it(airflow_home, tmp_path, monkeypatch):
    from airflow_dags.watch import DeltaCommitTrigger
    from cq_engine.storage import log

    uri = str(tmp_path / "meters")
    for _ in range(6):
        commit(uri, 2)  # versions 0..5
    probes = record_paths(monkeypatch, log, "_exists")
    reads = record_paths(monkeypatch, log, "_read")
    trigger = DeltaCommitTrigger(table="meters", uri=uri, poll_seconds=0.05, after_version=5)
    classpath, kwargs = trigger.serialize()
    assert (classpath, kwargs["after_version"]) == (TRIGGER, 5)
    assert DeltaCommitTrigger(**kwargs).serialize() == (classpath, kwargs)  # what the triggerer rebuilds

    async def scenario() -> list:
        events = Events(trigger)
        seen = [await events.next(within=0.4)]  # nothing committed since version 5
        commit(uri, 3)
        seen.append(await events.next(within=5))
        commit(uri, 1)
        seen.append(await events.next(within=5))
        await events.close()
        return seen

    assert asyncio.run(scenario()) == [
        None,
        {"table": "meters", "uri": uri, "version": 6, "previous": 5},
        {"table": "meters", "uri": uri, "version": 7, "previous": 6},
    ]
    # Only the log from the last reported version on: no older commit file, no checkpoint pointer
    # and no listing (probing from scratch would check version 0 or read _last_checkpoint).
    assert probes and min(probed_versions(probes)) == 5
    assert reads == []


def test_watcher_without_a_reported_version_reports_the_current_one_then_new_ones(airflow_home, tmp_path):
    from airflow_dags.watch import DeltaCommitTrigger

    uri = str(tmp_path / "later")
    trigger = DeltaCommitTrigger(table="later", uri=uri, poll_seconds=0.05)

    async def scenario() -> list:
        events = Events(trigger)
        seen = [await events.next(within=0.3)]  # no table yet: nothing, and no error
        commit(uri, 1)
        commit(uri, 1)
        seen.append(await events.next(within=5))
        seen.append(await events.next(within=0.3))
        commit(uri, 1)
        seen.append(await events.next(within=5))
        await events.close()
        return seen

    first, *rest = asyncio.run(scenario())
    assert first is None
    # Two commits before it looked: one event, for the latest (or one per commit if it looked between).
    versions = [e["version"] for e in rest if e is not None]
    assert versions[-1] == 2 and versions == sorted(set(versions)) and 1 in versions


@pytest.mark.parametrize("module", ["airflow_dags.watch", "airflow_dags.stream_dags", "airflow_dags.stream_tasks"])
def test_stream_modules_import_nothing_heavy(module):
    import subprocess
    import sys

    code = (
        f"import sys, {module}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'pyspark', 'dagster', 'deltalake', 'py4j', 'pyarrow'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
