"""The cq_health sensor on a real Dagster instance: a stale sink's check fails (what turns the
catalog's row red in Dagster OSS), once, and its real completeness comes back when it is fresh again."""

from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
from test_scheduling import make_project

from cq_engine.engine import Engine
from dagster_defs.internals import InstigatorType
from dagster_defs.sink_health import build_health_sensor, sink_state
from dagster_defs.translator import CQTranslator


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


def test_a_sink_is_stopped_stale_or_ok():
    assert sink_state(True, 1.0, 60) == "stopped"
    assert sink_state(False, 61.0, 60) == "stale"
    assert sink_state(False, 59.0, 60) == "ok"
    assert sink_state(False, None, 60) == "ok"  # never materialized: Dagster shows that itself


def test_the_health_sensor_fails_a_stale_sinks_check_once_and_restores_it(tmp_path, instance):
    settings, catalog = make_project(tmp_path)
    engine = Engine(settings=settings, catalog=catalog)
    definitions = list(catalog.definitions)
    keys = {d.name: dg.AssetKey(d.sink) for d in definitions}
    later = datetime.now(UTC) + timedelta(hours=2)
    clock = {"now": datetime.now(UTC)}

    sensor = build_health_sensor(
        definitions,
        keys,
        {d.name: InstigatorType.SCHEDULE for d in definitions},
        CQTranslator().bound(settings),
        engine,
        default_status=dg.DefaultSensorStatus.RUNNING,
        clock=lambda: clock["now"],
    )

    def evaluate(cursor):
        with dg.build_sensor_context(instance=instance, cursor=cursor) as ctx:
            return sensor.evaluate_tick(ctx)

    for key in ("b_out", "d_out"):
        instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=key))
    fresh = evaluate(None)
    assert not fresh.asset_events and "3 sink(s) running and fresh" in fresh.skip_message

    clock["now"] = later  # two hours without a materialization: stale (x_out was never materialized)
    stale = evaluate(fresh.cursor)
    failed = {e.asset_key.to_user_string(): e for e in stale.asset_events}
    assert set(failed) == {"b_out", "d_out"}
    b = failed["b_out"]
    assert (b.check_name, b.passed, b.severity) == ("cq_completeness", False, dg.AssetCheckSeverity.ERROR)
    assert b.description.startswith("Stale: newest materialization ") and "stale after 1m5s (EVERY 20s" in b.description
    assert b.metadata["cq/state"].value == "stale"
    assert not evaluate(stale.cursor).asset_events  # said once, not every evaluation

    instance.report_runless_asset_event(dg.AssetMaterialization(asset_key="b_out"))
    clock["now"] = datetime.now(UTC)
    back = evaluate(stale.cursor)
    (restored,) = [e for e in back.asset_events if e.asset_key == dg.AssetKey("b_out")]
    assert restored.passed and "owed" in restored.metadata  # the ledger's verdict again
