"""Small builder functions: one definition → its asset, jobs, and schedule or tick sensor."""


from datetime import datetime, timedelta
from typing import Optional

import dagster as dg
from dagster_pyspark import PySparkResource

from cq_engine import timing
from cq_engine.cron import CronPlan, resample_cron
from cq_engine.durations import format_duration
from cq_engine.model import ContinuousQuery
from cq_engine.run import RunResult
from cq_engine.times import UTC, iso, parse_time

from .resource import CQEngineResource
from .translator import CQTranslator

IN_FLIGHT = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
             dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
MAX_TICKS_PER_EVALUATION = 100


class FiringConfig(dg.Config):
    """Run config of a definition's jobs: a firing comes from the run's ``cq/fire_time`` tag;
    a recalculation from ``recalculate_from`` (and ``recalculate_to``)."""

    recalculate_from: Optional[str] = None
    recalculate_to: Optional[str] = None


def firing_tags(definition: ContinuousQuery, fire: datetime, translator: CQTranslator) -> dict[str, str]:
    lo, hi = timing.time_range(definition.resample, fire)
    return {**translator.get_tags(definition), "cq/fire_time": iso(fire), "cq/range_start": iso(lo),
            "cq/range_end": iso(hi)}


def firing_request(definition: ContinuousQuery, fire: datetime, translator: CQTranslator) -> dg.RunRequest:
    """The run of the firing at ``fire``; its run key makes a duplicate tick harmless."""
    return dg.RunRequest(run_key=f"{definition.name}@{iso(fire)}", tags=firing_tags(definition, fire, translator))


def in_flight(instance: dg.DagsterInstance, definition: ContinuousQuery) -> int:
    """Runs of the definition queued or in progress (DISCARD skips while there are any)."""
    records = instance.get_run_records(dg.RunsFilter(tags={"cq/name": definition.name}, statuses=IN_FLIGHT), limit=1)
    return len(records)


def materialization(definition: ContinuousQuery, result: RunResult) -> dg.MaterializeResult:
    return dg.MaterializeResult(
        metadata={
            "cq/kind": result.kind,
            "cq/range_start": iso(result.time_range[0]),
            "cq/range_end": iso(result.time_range[1]),
            "cq/rows_written": dg.MetadataValue.int(result.rows_written),
            "cq/sink_version": dg.MetadataValue.int(result.sink_version),
            "cq/source_versions": dg.MetadataValue.json(result.source_versions),
            "cq/files_read": dg.MetadataValue.int(result.files_read),
            "cq/seconds": dg.MetadataValue.float(round(result.seconds, 3)),
        },
    )


def build_asset(definition: ContinuousQuery, translator: CQTranslator) -> dg.AssetsDefinition:
    """The sink as an asset whose materialization is one firing (or one recalculation)."""
    spec = translator.get_sink_asset_spec(definition)

    @dg.multi_asset(name=translator.get_op_name(definition), specs=[spec], op_tags={"cq/name": definition.name})
    def _asset(context: dg.AssetExecutionContext, config: FiringConfig, cq_engine: CQEngineResource,
               pyspark: PySparkResource):
        engine = cq_engine.engine(pyspark.spark_session)
        tags = context.run.tags
        if config.recalculate_from:
            tz = engine.settings.tz
            end = parse_time(config.recalculate_to, tz=tz, what="recalculate_to") if config.recalculate_to else None
            result = engine.recalculate(definition.name, start=parse_time(config.recalculate_from, tz=tz, what="recalculate_from"),
                                        end=end, now=datetime.now(UTC))
        elif "cq/fire_time" in tags:
            result = engine.run_firing(definition.name, parse_time(tags["cq/fire_time"], tz=UTC))
        else:
            raise dg.Failure(f"{definition.name}: a run needs the tag cq/fire_time (a firing) or "
                             "recalculate_from in its config (a recalculation)")
        context.log.info(f"{definition.name}: {result.kind} [{iso(result.time_range[0])}, {iso(result.time_range[1])}) "
                         f"wrote {result.rows_written} rows, {definition.sink} v{result.sink_version}")
        yield materialization(definition, result)

    return _asset


def build_jobs(definition: ContinuousQuery, asset: dg.AssetsDefinition, translator: CQTranslator):
    tags = translator.get_tags(definition)
    # One step per run: the in-process executor spares each firing a second Python process.
    firing_job = dg.define_asset_job(translator.get_job_name(definition), selection=[asset], tags=tags,
                                     executor_def=dg.in_process_executor,
                                     description=f"One firing of {definition.name} per run (tag cq/fire_time).")
    recalc_job = dg.define_asset_job(
        translator.get_recalculate_job_name(definition), selection=[asset], tags={**tags, "cq/recalculate": "true"},
        executor_def=dg.in_process_executor,
        description=f"Recalculate {definition.name}: set recalculate_from (and recalculate_to) in the run config.",
    )
    return firing_job, recalc_job


def build_schedule(definition: ContinuousQuery, job, translator: CQTranslator, plan: CronPlan,
                   *, default_status: dg.DefaultScheduleStatus) -> dg.ScheduleDefinition:
    """A cron schedule whose ticks are exactly the definition's firing times."""

    def evaluate(context: dg.ScheduleEvaluationContext):
        fire = context.scheduled_execution_time.astimezone(UTC)
        if not timing.is_firing_time(definition.resample, fire):
            return dg.SkipReason(f"{iso(fire)} is not a firing time of {definition.name}")
        if definition.timeout_policy == "DISCARD" and in_flight(context.instance, definition):
            return dg.SkipReason(f"DISCARD: a run of {definition.name} is still queued or running; "
                                 f"the firing at {iso(fire)} is skipped")
        return firing_request(definition, fire, translator)

    return dg.ScheduleDefinition(
        name=translator.get_schedule_name(definition), job=job, cron_schedule=plan.cron_strings[0] if len(plan.cron_strings) == 1 else list(plan.cron_strings),
        execution_timezone=plan.timezone, execution_fn=evaluate, default_status=default_status,
        description=f"Firings of {definition.name}: every {format_duration(definition.resample.every)} from {iso(definition.resample.boundary)}",
    )


def due_firings(definition: ContinuousQuery, *, cursor: Optional[str], now: datetime) -> list[datetime]:
    """Firing times after the cursor up to ``now``; on a first evaluation only the latest one."""
    r = definition.resample
    latest = timing.latest_firing(r, now=now)
    if latest is None:
        return []
    if cursor is None:
        return [latest]
    after = parse_time(cursor, tz=UTC) + timedelta(microseconds=1)
    return timing.firing_times_between(r, start=after, end=latest + timedelta(microseconds=1))


def build_tick_sensor(definition: ContinuousQuery, job, translator: CQTranslator,
                      *, default_status: dg.DefaultSensorStatus) -> dg.SensorDefinition:
    """Where cron cannot express the firing times (sub-minute EVERY, non-dividing intervals)."""
    interval = max(1, min(30, int(definition.resample.every.total_seconds() // 2) or 1))

    def evaluate(context: dg.SensorEvaluationContext):
        due = due_firings(definition, cursor=context.cursor, now=datetime.now(UTC))
        if not due:
            return dg.SkipReason(f"no firing of {definition.name} is due")
        if definition.timeout_policy == "DISCARD":
            context.update_cursor(iso(due[-1]))
            if in_flight(context.instance, definition):
                return dg.SkipReason(f"DISCARD: a run of {definition.name} is still queued or running; "
                                     f"skipped {len(due)} firing(s) up to {iso(due[-1])}")
            return [firing_request(definition, due[-1], translator)]
        due = due[:MAX_TICKS_PER_EVALUATION]
        context.update_cursor(iso(due[-1]))
        return [firing_request(definition, fire, translator) for fire in due]

    return dg.SensorDefinition(
        name=translator.get_sensor_name(definition), job=job, evaluation_fn=evaluate,
        minimum_interval_seconds=interval, default_status=default_status,
        description=f"Firings of {definition.name} every {format_duration(definition.resample.every)} (not expressible as cron)",
    )


def cron_plan(definition: ContinuousQuery, *, timezone: str, now: datetime) -> Optional[CronPlan]:
    r = definition.resample
    return resample_cron(every=r.every, boundary=r.boundary, timezone=timezone, verify_from=now)
