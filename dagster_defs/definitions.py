"""``build_definitions``: every definition in CQ_SQL_DIR → Dagster objects, through a translator."""

from __future__ import annotations

import hashlib
from datetime import datetime

import dagster as dg

from cq_engine.catalog import load_catalog, parse_options
from cq_engine.config import Settings, load_settings
from cq_engine.errors import CQError, ParseError
from cq_engine.model import ContinuousQuery, PeriodTrigger
from cq_engine.engine import Engine
from cq_engine.times import UTC

from .builders import build_asset, build_jobs, build_schedule, build_tick_sensor
from .streams import build_stream_sensor
from .triggers import build_trigger_sensor
from .resource import CQEngineResource, pyspark_resource
from .translator import CQTranslator


def build_definitions(*, settings: Settings | None = None, translator: CQTranslator | None = None,
                      now: datetime | None = None, running: bool = True) -> dg.Definitions:
    """Jobs, assets and schedules/sensors for every definition; bad files become placeholder assets
    whose description is the ``file:line:col`` error, so one bad file never takes the location down."""
    settings = settings or load_settings()
    translator = translator or CQTranslator()
    now = now or datetime.now(UTC)
    try:
        catalog = load_catalog(settings.sql_dir, options=parse_options(settings))
        errors = list(catalog.errors)
    except CQError as exc:  # the sql directory itself is unusable
        catalog, errors = None, [exc if isinstance(exc, ParseError) else ParseError(str(exc), file=settings.sql_dir)]
    schedule_status = dg.DefaultScheduleStatus.RUNNING if running else dg.DefaultScheduleStatus.STOPPED
    sensor_status = dg.DefaultSensorStatus.RUNNING if running else dg.DefaultSensorStatus.STOPPED
    assets: list = []
    jobs, schedules, sensors = [], [], []
    sources: set[str] = set()
    engine = Engine(settings=settings, catalog=catalog) if catalog else None
    for definition in catalog.definitions if catalog else ():
        asset = build_asset(definition, translator)
        firing_job, recalc_job = build_jobs(definition, asset, translator)
        assets.append(asset)
        jobs += [firing_job, recalc_job]
        sources.update(t for t in (definition.source, getattr(definition, "trigger_table", None)) if t)
        if not isinstance(definition, ContinuousQuery) and not isinstance(definition.trigger, PeriodTrigger):
            sensors.append(build_stream_sensor(definition, firing_job, translator, engine, default_status=sensor_status))
            continue
        ticks = engine.ticks(definition.name, now=now)
        plan = ticks.cron(now)
        if plan is not None:
            schedules.append(build_schedule(definition, firing_job, translator, ticks, plan,
                                            default_status=schedule_status))
        else:
            sensors.append(build_tick_sensor(definition, firing_job, translator, ticks, default_status=sensor_status))
    # BEFORE INSERT triggers run in the ingest path; AFTER INSERT ones get a sensor each.
    sensors += [build_trigger_sensor(t, engine, default_status=sensor_status)
                for t in (catalog.triggers if catalog else ()) if t.event == "after"]
    sinks = {d.sink.lower() for d in catalog.definitions if d.sink} if catalog else set()
    assets += [translator.get_source_asset_spec(s) for s in sorted(sources) if s.lower() not in sinks]
    assets += [error_placeholder(e) for e in errors]
    return dg.Definitions(
        assets=assets, jobs=jobs, schedules=schedules, sensors=sensors,
        resources={"cq_engine": CQEngineResource.from_settings(settings), "pyspark": pyspark_resource(settings)},
    )


def error_placeholder(error: ParseError) -> dg.AssetSpec:
    """A visible stand-in for a file (or definition) that failed to load: its description is the error."""
    where = f"{error.file}:{','.join(error.names)}" if error.names else error.file
    key = "invalid_" + hashlib.sha1(where.encode()).hexdigest()[:8]
    return dg.AssetSpec(key=dg.AssetKey(["cq_errors", key]), group_name="cq_errors",
                        description=f"**This definition file failed to load**\n\n```\n{error}\n```",
                        metadata={"cq/error": str(error), "cq/file": error.file, "cq/line": error.line,
                                  "cq/col": error.col, "cq/message": error.detail}, kinds={"sql"})
