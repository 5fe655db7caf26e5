"""The Dagster code location on a real ephemeral instance: schedules, tick sensors, DISCARD, runs."""

import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.test_utils import create_run_for_test
from deltalake import DeltaTable

from cq_engine.config import Settings
from dagster_defs import CQTranslator, build_definitions, due_firings

UTC = timezone.utc
DATA = Path(__file__).parent / "data"
NOW = datetime(2021, 5, 11, 14, 30, tzinfo=UTC)

SQL = """
CREATE CQ every_minute RESAMPLE EVERY 1m TIMEOUT POLICY DISCARD BEGIN
  SELECT max_value(temperature) AS m INTO ln_1m FROM ln GROUP BY (1m), device END;
CREATE CQ fast RESAMPLE EVERY 20s BEGIN SELECT max_value(temperature) AS m INTO ln_fast FROM ln GROUP BY (10s), device END;
CREATE CQ fast_discard RESAMPLE EVERY 20s TIMEOUT POLICY DISCARD BEGIN
  SELECT max_value(temperature) AS m INTO ln_fast2 FROM ln GROUP BY (10s), device END;
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("dagster_defs")
    (root / "sql").mkdir()
    shutil.copy(DATA / "seed004.sql", root / "sql" / "seed004.sql")
    (root / "sql" / "more.sql").write_text(SQL)
    (root / "sql" / "broken.sql").write_text("CREATE CQ broken RESAMPLE EVERY 1s\nBEGIN SELECT x AS y INTO z FROM ln WHERE time > 1 END;")
    settings = Settings(sql_dir=str(root / "sql"), warehouse=str(root / "wh"), home=str(root / ".cq"), timezone="Asia/Shanghai")
    return settings, build_definitions(settings=settings, now=NOW)


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


def test_every_definition_gets_jobs_and_a_schedule_or_sensor(project):
    _, defs = project
    names = {j.name for j in defs.jobs}
    assert {"cq1_job", "cq1_recalculate", "every_minute_job", "fast_job"} <= names
    schedules = {s.name: s for s in defs.schedules}
    sensors = {s.name for s in defs.sensors}
    # cron can express EVERY 1m; 20s is sub-minute, so a tick sensor runs those
    assert schedules["every_minute_schedule"].cron_schedule == "* * * * *"
    assert {"fast_ticks", "cq1_ticks"} <= sensors


def test_bad_file_is_a_visible_placeholder_and_others_load(project):
    settings, defs = project
    specs = [s for a in defs.assets if isinstance(a, dg.AssetSpec) for s in [a] if s.key.path[0] == "cq_errors"]
    assert len(specs) == 1
    assert f"{settings.sql_dir}/broken.sql:2:" in specs[0].description and "time filter" in specs[0].description
    assert defs.resolve_job_def("cq5_job") is not None


def test_schedule_tick_tags_and_run_key(project, instance):
    _, defs = project
    schedule = defs.resolve_schedule_def("every_minute_schedule")
    tick = datetime(2021, 5, 11, 22, 20, tzinfo=timezone(timedelta(hours=8)))
    with dg.build_schedule_context(instance=instance, scheduled_execution_time=tick) as ctx:
        (request,) = schedule.evaluate_tick(ctx).run_requests
    assert request.run_key == "every_minute@2021-05-11T14:20:00+00:00"
    assert request.tags["cq/name"] == "every_minute"
    assert (request.tags["cq/fire_time"], request.tags["cq/range_start"], request.tags["cq/range_end"]) == (
        "2021-05-11T14:20:00+00:00", "2021-05-11T14:19:00+00:00", "2021-05-11T14:20:00+00:00")


def test_discard_schedule_skips_while_a_run_is_in_flight(project, instance):
    _, defs = project
    schedule = defs.resolve_schedule_def("every_minute_schedule")
    create_run_for_test(instance, job_name="every_minute_job", status=dg.DagsterRunStatus.STARTED,
                        tags={"cq/name": "every_minute"})
    with dg.build_schedule_context(instance=instance, scheduled_execution_time=NOW) as ctx:
        result = schedule.evaluate_tick(ctx)
    assert not result.run_requests and "DISCARD" in result.skip_message


def test_tick_sensor_blocked_requests_every_due_firing_in_order(project, instance):
    _, defs = project
    sensor = defs.resolve_sensor_def("fast_ticks")
    due = due_firings(_definition(project, "fast"), cursor=None, now=NOW + timedelta(seconds=5))
    assert due == [NOW]
    due = due_firings(_definition(project, "fast"), cursor="2021-05-11T14:29:00+00:00", now=NOW + timedelta(seconds=5))
    assert due == [NOW - timedelta(seconds=40), NOW - timedelta(seconds=20), NOW]
    cursor = (datetime.now(UTC) - timedelta(seconds=61)).isoformat()
    with dg.build_sensor_context(instance=instance, cursor=cursor) as ctx:
        result = sensor.evaluate_tick(ctx)
    fires = [r.tags["cq/fire_time"] for r in result.run_requests]
    assert len(fires) >= 3 and fires == sorted(fires)
    assert len({r.run_key for r in result.run_requests}) == len(fires)
    assert result.cursor == fires[-1]


def test_tick_sensor_discard_skips_and_catches_up_with_the_latest(project, instance):
    _, defs = project
    sensor = defs.resolve_sensor_def("fast_discard_ticks")
    cursor = (datetime.now(UTC) - timedelta(seconds=61)).isoformat()
    with dg.build_sensor_context(instance=instance, cursor=cursor) as ctx:
        (only,) = sensor.evaluate_tick(ctx).run_requests  # behind by 3 firings: runs just the latest
    create_run_for_test(instance, job_name="fast_discard_job", status=dg.DagsterRunStatus.STARTING,
                        tags={"cq/name": "fast_discard"})
    with dg.build_sensor_context(instance=instance, cursor=cursor) as ctx:
        result = sensor.evaluate_tick(ctx)
    assert not result.run_requests and "DISCARD" in result.skip_message
    assert result.cursor >= only.tags["cq/fire_time"]


def test_firing_job_runs_on_spark_and_reports_the_materialization(project, instance, spark):
    settings, defs = project
    from cq_engine.run import Engine

    Engine(settings=settings, spark_session=spark).ingest("ln", str(DATA / "ln.csv"))
    job = defs.resolve_job_def("cq1_job")
    tags = {"cq/name": "cq1", "cq/fire_time": "2021-05-11T14:18:40+00:00"}
    result = job.execute_in_process(instance=instance, tags=tags)
    assert result.success
    (mat,) = result.asset_materializations_for_node("cq_cq1")
    assert mat.metadata["cq/rows_written"].value == 8
    assert mat.metadata["cq/range_start"].value == "2021-05-11T14:18:20+00:00"
    assert mat.metadata["cq/source_versions"].value == {"ln": 1}
    assert DeltaTable(settings.table_uri("cq1_out")).version() == mat.metadata["cq/sink_version"].value
    recalc = defs.resolve_job_def("cq1_recalculate").execute_in_process(
        instance=instance, run_config={"ops": {"cq_cq1": {"config": {
            "recalculate_from": "2021-05-11T22:18:00", "recalculate_to": "2021-05-11T22:19:00"}}}})
    assert recalc.success
    (mat,) = recalc.asset_materializations_for_node("cq_cq1")
    assert mat.metadata["cq/kind"].value == "recalculate" and mat.metadata["cq/rows_written"].value == 20


def test_translator_subclass_changes_keys_and_groups(project):
    settings, _ = project

    class Prefixed(CQTranslator):
        def get_asset_key(self, table):
            return dg.AssetKey(["lake", table])

        def get_group_name(self, definition):
            return "iot"

    defs = build_definitions(settings=settings, translator=Prefixed(), now=NOW)
    keys = {k.to_user_string() for a in defs.assets if isinstance(a, dg.AssetsDefinition) for k in a.keys}
    assert "lake/cq1_out" in keys
    (a,) = [a for a in defs.assets if isinstance(a, dg.AssetsDefinition) and dg.AssetKey(["lake", "cq1_out"]) in a.keys]
    assert a.group_names_by_key[dg.AssetKey(["lake", "cq1_out"])] == "iot"


def _definition(project, name):
    settings, _ = project
    from cq_engine.catalog import load_catalog, parse_options

    return load_catalog(settings.sql_dir, options=parse_options(settings)).definition(name)
