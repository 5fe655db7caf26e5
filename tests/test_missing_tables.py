"""A table a definition reads that neither a file declares nor the warehouse holds: `cq validate` warns,
and the `cq_streams` sensor says so in its log and on the stream's sink (an observation) while it is
missing, once a minute, besides its tick's skip reason. And what the sensor says of a table's rows at a
stream's creation (history, expected) is INFO, not a warning."""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg
import pytest
from conftest import sql_project

from cq_engine.cli.main import main
from cq_engine.config import Settings
from cq_engine.engine import Engine
from dagster_defs import build_definitions
from dagster_defs import streams as dagster_streams

SQL = """CREATE TABLE sensors (ts TIMESTAMP, device STRING, temperature DOUBLE);
CREATE CQ ok RESAMPLE EVERY 5s BEGIN SELECT count(temperature) AS n INTO ok_out FROM sensors GROUP BY (5s), device END;
CREATE STREAM s INTERVAL(5s) SLIDING(5s) FROM no_such_table INTO s_out AS SELECT _twstart, count(*) AS n FROM %%trows;
CREATE CQ b RESAMPLE EVERY 5s BEGIN SELECT count(v) AS n INTO b_out FROM nowhere GROUP BY (5s) END;
CREATE CQ w RESAMPLE EVERY 5s BEGIN SELECT count(v) AS n INTO w_out FROM loaded GROUP BY (5s) END;
"""


@pytest.fixture
def project(tmp_path, monkeypatch) -> Settings:
    return sql_project(tmp_path, monkeypatch, {"x.sql": SQL})


def test_validate_warns_about_a_table_neither_declared_nor_in_the_warehouse(project, capsys):
    import pyarrow as pa
    from deltalake import write_deltalake

    write_deltalake(project.table_uri("loaded"), pa.table({"ts": pa.array([0], pa.timestamp("us")), "v": [1.0]}))
    assert main(["validate"]) == 0  # a warning, not an error
    err = capsys.readouterr().err.splitlines()
    where = f"{project.sql_dir}/x.sql"
    assert err == [
        f"warning: {where}:3:1: 's' reads table 'no_such_table', which is neither declared (CREATE TABLE) nor in "
        f"the warehouse {project.warehouse}; its windows wait until it exists",
        f"warning: {where}:4:1: 'b' reads table 'nowhere', which is neither declared (CREATE TABLE) nor in "
        f"the warehouse {project.warehouse}; its firings fail until it exists",
    ]  # `loaded` is in the warehouse, `sensors` declared: nothing said about them


def test_the_stream_sensor_says_on_the_sink_and_in_its_log_that_the_table_is_missing(project, monkeypatch):
    Engine(settings=project).ensure_tables("sensors")
    defs = build_definitions(settings=project, now=datetime(2026, 12, 1, tzinfo=UTC))
    sensor = defs.resolve_sensor_def("cq_streams")
    monkeypatch.setattr(dagster_streams, "_said", {})
    with dg.instance_for_test() as instance:
        with dg.build_sensor_context(instance=instance) as ctx:
            first = sensor.evaluate_tick(ctx)
        (observation,) = first.asset_events
        assert "trigger table 'no_such_table' does not exist" in first.skip_message  # the tick says it too
        assert isinstance(observation, dg.AssetObservation) and observation.asset_key == dg.AssetKey("s_out")
        assert "trigger table 'no_such_table' does not exist" in observation.metadata["cq/waiting"].value
        with dg.build_sensor_context(instance=instance, cursor=first.cursor) as ctx:
            again = sensor.evaluate_tick(ctx)  # within the minute: the tick's reason only
        assert again.asset_events == [] and "trigger table 'no_such_table' does not exist" in again.skip_message


def test_a_streams_history_at_its_creation_is_said_at_info_not_as_a_warning(tmp_path, monkeypatch, capfd):
    import pyarrow as pa

    stream = "CREATE STREAM h INTERVAL(5s) SLIDING(5s) FROM sensors INTO h_out AS SELECT _twstart, count(*) AS n FROM %%trows;\n"
    settings = sql_project(tmp_path, monkeypatch, {"x.sql": SQL.splitlines()[0] + "\n" + stream})
    engine = Engine(settings=settings)
    engine.ensure_tables("sensors")
    ts = [datetime(2026, 12, 1, 0, 0, s, tzinfo=UTC) for s in range(10)]
    engine.storage.append(
        "sensors",
        pa.table({"ts": pa.array(ts, pa.timestamp("us", tz="UTC")), "device": ["a"] * 10, "temperature": [1.0] * 10}),
    )
    defs = build_definitions(settings=settings, now=datetime(2026, 12, 1, tzinfo=UTC))
    with dg.instance_for_test() as instance, dg.build_sensor_context(instance=instance) as ctx:
        defs.resolve_sensor_def("cq_streams").evaluate_tick(ctx)
    said = [line for line in capfd.readouterr().err.splitlines() if "h: history: 10 row(s) ignored" in line]
    assert said and all(" - INFO - " in line for line in said), said  # the sensor's log line
