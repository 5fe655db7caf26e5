"""``build_definitions``: every definition in CQ_SQL_DIR → Dagster objects, through a translator."""

from __future__ import annotations

import hashlib
import os
import re
from datetime import datetime
from pathlib import Path

import dagster as dg

from cq_engine.config import Settings, load_settings
from cq_engine.engine import Engine
from cq_engine.errors import CQError, ParseError
from cq_engine.model import ContinuousQuery, PeriodTrigger, Stream
from cq_engine.scheduling.batch import batch_interval
from cq_engine.times import UTC

from .batch import build_batch_asset, build_batch_sensor, build_switch, build_switch_sensor
from .builders import build_asset, build_jobs, build_schedule, build_tick_sensor
from .internals import InstigatorType
from .maintenance import build_maintenance
from .resource import CQEngineResource, cached_catalog, pyspark_resource
from .sink_health import build_health_sensor
from .streams import build_streams_asset, build_streams_sensor
from .translator import CQTranslator, configured_translator
from .triggers import build_trigger_sensor

RUN_MODELS = ("batch", "per_firing")


def build_definitions(
    *,
    settings: Settings | None = None,
    translator: CQTranslator | None = None,
    now: datetime | None = None,
    running: bool = True,
    run_model: str | None = None,
) -> dg.Definitions:
    """Jobs, assets and schedules/sensors for every definition; bad files become placeholder assets
    whose description is the ``file:line:col`` error, so one bad file never takes the location down.
    ``run_model`` (default ``$CQ_RUN_MODEL``, else ``batch``): ``batch`` runs the due firings of every
    continuous query and PERIOD stream together (``dagster_defs.batch``); ``per_firing`` gives each
    firing its own run from the definition's schedule or tick sensor. Building writes nothing."""
    settings = settings or load_settings()
    translator = (translator or configured_translator()).bound(settings)
    now = now or datetime.now(UTC)
    run_model = run_model or os.environ.get("CQ_RUN_MODEL") or "batch"
    if run_model not in RUN_MODELS:
        raise CQError(f"CQ_RUN_MODEL={run_model!r}: expected one of {', '.join(RUN_MODELS)}")
    try:
        catalog = cached_catalog(settings)
        errors = list(catalog.errors)
    except CQError as exc:  # the sql directory itself is unusable
        catalog, errors = None, [exc if isinstance(exc, ParseError) else ParseError(str(exc), file=settings.sql_dir)]
    resources = {"cq_engine": CQEngineResource.from_settings(settings), "pyspark": pyspark_resource(settings)}
    if catalog is None:
        return dg.Definitions(assets=error_placeholders(errors), resources=resources)
    schedule_status = dg.DefaultScheduleStatus.RUNNING if running else dg.DefaultScheduleStatus.STOPPED
    sensor_status = dg.DefaultSensorStatus.RUNNING if running else dg.DefaultSensorStatus.STOPPED
    assets: list = []
    jobs: list = []
    schedules: list = []
    sensors: list = []
    sources: set[str] = set()
    engine = Engine(settings=settings, catalog=catalog)
    definitions = list(catalog.definitions)
    ticked = [d for d in definitions if isinstance(d, ContinuousQuery) or isinstance(d.trigger, PeriodTrigger)]
    batched = ticked if run_model == "batch" else []
    in_batch = {d.name for d in batched}
    for definition in definitions:
        sources.update(t for t in (definition.source, getattr(definition, "trigger_table", None)) if t)
    if batched:
        batch_asset, sink_keys = build_batch_asset(batched, translator)
        assets.append(batch_asset)
        # The batches' runs carry cq/batch (the sensor's tag): a definition's own run of this job does not.
        jobs.append(
            dg.define_asset_job(
                translator.get_batch_job_name(),
                selection=list(sink_keys.values()),
                executor_def=dg.in_process_executor,
                description="The firings due across definitions, one run per batch (run config `firings`, "
                "tag cq/batch); or one definition's firing or recalculation: select its sink alone.",
            )
        )
        ticks = {d.name: build_ticks(engine, d, now=now) for d in batched if isinstance(d, ContinuousQuery)}

        def ticks_for(d):
            if d.name not in ticks:  # a PERIOD stream: its creation is recorded at its first tick
                ticks[d.name] = engine.ticks(d.name, now=datetime.now(UTC))
            return ticks[d.name]

        sensors.append(
            build_batch_sensor(
                batched,
                jobs[0],
                translator,
                ticks_for,
                sink_keys,
                default_status=sensor_status,
                interval=batch_interval(batched, ticks),
                check_every=settings.completeness_every_delta,
                settings=settings,
            )
        )
        # No jobs of their own (a run of cq_firings_job with one sink selected is one definition's):
        # each would cost a pass over every sink when the location loads (ARCHITECTURE.md §6.4).
        schedules += [build_switch(d, jobs[0], translator, default_status=schedule_status) for d in batched]
    windowed = [d for d in definitions if isinstance(d, Stream) and not isinstance(d.trigger, PeriodTrigger)]
    if windowed:
        # One asset, job and sensor for every window-triggered stream (dagster_defs.streams): a single
        # stream's run or recalculation is that job with its sink selected.
        streams_asset, stream_keys = build_streams_asset(windowed, translator)
        streams_job = dg.define_asset_job(
            translator.get_streams_job_name(),
            selection=list(stream_keys.values()),
            executor_def=dg.in_process_executor,
            description="The window-triggered streams' works their sensor hands to a run, or one stream's "
            "run or recalculation (select its sink; run config `recalculate_from` / `recalculate_to`).",
        )
        assets.append(streams_asset)
        jobs.append(streams_job)
        sensors.append(
            build_streams_sensor(
                windowed,
                streams_job,
                translator,
                engine,
                stream_keys,
                default_status=sensor_status,
                keep={n for e in errors for n in e.names},
            )
        )
        for definition in windowed:
            sensors.append(
                build_switch_sensor(
                    definition, translator, default_status=sensor_status, via=translator.get_streams_sensor_name()
                )
            )
    in_batch |= {d.name for d in windowed}
    if batched or windowed:
        # Stopped and stale sinks marked in the catalog's list (their check fails saying why).
        switch_kinds = {d.name: InstigatorType.SCHEDULE for d in batched} | {
            d.name: InstigatorType.SENSOR for d in windowed
        }
        keys = {**(sink_keys if batched else {}), **(stream_keys if windowed else {})}
        sensors.append(
            build_health_sensor(
                [*batched, *windowed], keys, switch_kinds, translator, engine, default_status=sensor_status
            )
        )
    for definition in definitions:
        if definition.name in in_batch:
            continue
        asset = build_asset(definition, translator)
        firing_job, recalc_job = build_jobs(definition, [asset], translator)
        assets.append(asset)
        jobs += [firing_job, recalc_job]
        ticks_ = build_ticks(engine, definition, now=now)
        plan = ticks_.cron(now)
        if plan is not None:
            schedules.append(
                build_schedule(definition, firing_job, translator, ticks_, plan, default_status=schedule_status)
            )
        else:
            sensors.append(build_tick_sensor(definition, firing_job, translator, ticks_, default_status=sensor_status))
    # BEFORE INSERT triggers run in the ingest path; AFTER INSERT ones get a sensor each.
    sensors += [
        build_trigger_sensor(t, engine, default_status=sensor_status) for t in catalog.triggers if t.event == "after"
    ]
    # Housekeeping of the tables the definitions write: one job and its (daily) schedule.
    maintenance_job, maintenance_schedule = build_maintenance(settings, default_status=schedule_status)
    jobs.append(maintenance_job)
    schedules.append(maintenance_schedule)
    sinks = {d.sink.lower() for d in definitions if d.sink}
    decls = {t.name.lower(): t for t in catalog.tables}
    assets += [
        translator.get_source_asset_spec(s, decls.get(s.lower())) for s in sorted(sources) if s.lower() not in sinks
    ]
    assets += error_placeholders(errors)
    # In-process for every job, Dagster's implicit asset job (the UI's "Materialize") included: one
    # step per run, and no second Python process for it.
    return dg.Definitions(
        assets=assets,
        jobs=jobs,
        schedules=schedules,
        sensors=sensors,
        resources=resources,
        executor=dg.in_process_executor,
    )


def build_ticks(engine: Engine, definition, *, now: datetime):
    """The definition's ticks without writing: a PERIOD stream not yet created is anchored at ``now``
    here and records its creation at its first tick (``Engine.ticks``), so building is side-effect free."""
    if isinstance(definition, ContinuousQuery):
        return engine.ticks(definition.name, now=now)
    from cq_engine.schedule.ticks import ticks_of
    from cq_engine.streams.run import recorded_created

    created = recorded_created(engine.ctx, definition) or now
    return ticks_of(definition, timezone=engine.settings.timezone, created=created)


def error_placeholders(errors: list[ParseError]) -> list[dg.AssetSpec]:
    """One visible stand-in per load error, in group ``cq_errors``, keyed by its file's name
    (``newcomer_sql_load_error``; a second error of the same file name gets a hash suffix)."""
    specs, taken = [], set()
    for error in errors:
        key = error_key(error)
        if key in taken:
            where = f"{error.file}:{','.join(error.names)}" if error.names else error.file
            key += "_" + hashlib.sha1(where.encode()).hexdigest()[:6]
        taken.add(key)
        specs.append(error_placeholder(error, key))
    return specs


def error_key(error: ParseError) -> str:
    """The error asset's name (under ``cq_errors``): its file's name, ``newcomer_sql_load_error``."""
    return re.sub(r"\W+", "_", Path(error.file).name).strip("_") + "_load_error"


def error_placeholder(error: ParseError, key: str | None = None) -> dg.AssetSpec:
    """A file (or definition) that failed to load: the description says the error and what it does to
    the file's definitions in plain sentences (shown as text in lists, as markdown on the asset's page);
    ``cq/error`` repeats it as markdown."""
    what = "This definition file" if not error.names or error.kept else "A definition of this file"
    fix = "Fix it and reload the code location (Deployment, Reload; cq validate checks it first)."
    # The error as an indented code block: no markdown in it (a name's `_` or `*`) is interpreted.
    description = f"{what} failed to load:\n\n    {error}\n\nMeanwhile {error.consequence()}. {fix}"
    return dg.AssetSpec(
        key=dg.AssetKey(["cq_errors", key or error_key(error)]),
        group_name="cq_errors",
        description=description,
        metadata={
            "cq/error": dg.MetadataValue.md(
                f"**{error.file}** failed to load\n\n    {error}\n\n{error.consequence()}."
            ),
            "cq/file": error.file,
            "cq/line": error.line,
            "cq/col": error.col,
            "cq/message": error.detail,
            "cq/kept": ", ".join(error.kept),
        },
        kinds={"sql"},
    )
