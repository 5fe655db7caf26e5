"""Small builder functions: one definition → its asset, jobs, and schedule or tick sensor."""

from datetime import datetime

import dagster as dg
from dagster_pyspark import PySparkResource

from cq_engine.engine import RunResult
from cq_engine.model import ContinuousQuery, Definition, PeriodTrigger
from cq_engine.schedule.cron import CronPlan
from cq_engine.schedule.ticks import Ticks, parse_tick_cursor, tick_cursor, ticks_of
from cq_engine.streams.timing import StreamWork
from cq_engine.times import UTC, iso, parse_time

from . import health
from .resource import CQEngineResource
from .translator import CQTranslator

IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]
MAX_TICKS_PER_EVALUATION = 100


class FiringConfig(dg.Config):
    """Run config of the firing ops: a firing at ``fire_time`` (or the run's ``cq/fire_time`` tag);
    a recalculation from ``recalculate_from`` (and ``recalculate_to``); a batch from ``firings``, a
    round of stream works from ``works``. A continuous query's or PERIOD stream's run with none of
    them runs its latest firing."""

    fire_time: str | None = None
    recalculate_from: str | None = None
    recalculate_to: str | None = None
    firings: dict[str, list[str]] | None = None  # a batch (the cq_firings job): definition -> firing times
    # A pipelined batch: definition -> [run key, range end] of the run whose commit its first firing awaits.
    after: dict[str, list[str]] | None = None
    works: dict[str, list[str]] | None = None  # a stream round (the cq_streams job): stream -> StreamWork JSON


def firing_tags(definition: Definition, fire: datetime, translator: CQTranslator, ticks: Ticks) -> dict[str, str]:
    lo, hi = ticks.range_of(fire)
    return {
        **translator.get_tags(definition),
        "cq/fire_time": iso(fire),
        "cq/range_start": iso(lo),
        "cq/range_end": iso(hi),
    }


def firing_request(definition: Definition, fire: datetime, translator: CQTranslator, ticks: Ticks) -> dg.RunRequest:
    """The run of the firing at ``fire``; its run key makes a duplicate tick harmless."""
    return dg.RunRequest(
        run_key=f"{definition.name}@{iso(fire)}", tags=firing_tags(definition, fire, translator, ticks)
    )


def in_flight(instance: dg.DagsterInstance, definition: Definition, statuses=IN_FLIGHT) -> int:
    """Runs of the definition queued or in progress (DISCARD skips while there are any); 0 or 1."""
    records = instance.get_run_records(dg.RunsFilter(tags={"cq/name": definition.name}, statuses=statuses), limit=1)
    return len(records)


def materialization(
    definition: Definition,
    result: RunResult,
    *,
    engine,
    ignored: tuple[str, ...] = (),
    asset_key: dg.AssetKey | None = None,
) -> dg.MaterializeResult:
    """The run's ``cq/*`` metadata (``cq/rows_written``: the rows it wrote) and Dagster's table
    metadata (``dagster/row_count``: the sink's rows, ``dagster/column_schema``, ...:
    ``health.sink_metadata``); ``cq/ignored``: rows the tick that requested it left out and windows
    the run dropped (``RunResult.ignored``), and why."""
    ignored = (*ignored, *result.ignored)
    extra = {"cq/ignored": dg.MetadataValue.json(list(ignored))} if ignored else {}
    table = health.sink_metadata(engine, definition)
    return dg.MaterializeResult(
        asset_key=asset_key,
        metadata={
            **table,
            **extra,
            "cq/kind": result.kind,
            "cq/range_start": iso(result.time_range[0]),
            "cq/range_end": iso(result.time_range[1]),
            "cq/rows_written": dg.MetadataValue.int(result.rows_written),
            "cq/sink_version": dg.MetadataValue.int(result.sink_version),
            "cq/source_versions": dg.MetadataValue.json(result.source_versions),
            "cq/files_read": dg.MetadataValue.int(result.files_read),
            "cq/seconds": dg.MetadataValue.float(round(result.seconds, 3)),
            # Only streams notify (NOTIFY); a continuous query's 0 would suggest it could.
            **(
                {}
                if isinstance(definition, ContinuousQuery)
                else {"cq/notified": dg.MetadataValue.int(result.notified)}
            ),
        },
    )


FIRING_RETRY = dg.RetryPolicy(max_retries=3, delay=2, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS)


def execute_one(
    context: dg.AssetExecutionContext,
    config: FiringConfig,
    engine,
    definition: Definition,
    *,
    asset_key: dg.AssetKey | None = None,
) -> dg.MaterializeResult:
    """One run of one definition: a recalculation (config or ``cq/recalculate_from`` tag), a stream
    run (``cq/work`` tag) or a firing (``fire_time`` config or ``cq/fire_time`` tag; by default the
    latest one of a definition with ticks, so a plain "Materialize" in the UI fires it now)."""
    tags = context.run.tags
    ignored: tuple[str, ...] = ()
    start = config.recalculate_from or tags.get("cq/recalculate_from")
    fire_time = config.fire_time or tags.get("cq/fire_time")
    ticked = isinstance(definition, ContinuousQuery) or isinstance(definition.trigger, PeriodTrigger)
    if start:
        tz = engine.settings.tz
        stop = config.recalculate_to or tags.get("cq/recalculate_to")
        end = parse_time(stop, tz=tz, what="recalculate_to") if stop else None
        result = engine.recalculate(
            definition.name, start=parse_time(start, tz=tz, what="recalculate_from"), end=end, now=datetime.now(UTC)
        )
    elif "cq/work" in tags:
        work = StreamWork.from_json(tags["cq/work"])
        result = engine.run_stream(definition.name, work)
        ignored = work.ignored
    elif fire_time or ticked:
        now = datetime.now(UTC)
        fire = (
            parse_time(fire_time, tz=engine.settings.tz, what="fire_time")
            if fire_time
            else engine.ticks(definition.name, now=now).latest(now)
        )
        if fire is None:
            raise dg.Failure(f"{definition.name}: no firing is due yet", allow_retries=False)
        run = engine.run_firing if isinstance(definition, ContinuousQuery) else engine.run_period
        result = run(definition.name, fire)
    else:
        raise dg.Failure(
            f"{definition.name}: a stream run needs the tag cq/work (its sensor sets it), or "
            "recalculate_from in its config (a recalculation)",
            allow_retries=False,
        )
    context.log.info(
        f"{definition.name}: {result.kind} [{iso(result.time_range[0])}, {iso(result.time_range[1])}) "
        f"wrote {result.rows_written} rows, {definition.sink} v{result.sink_version}"
        + (f"; {result.notified} notification(s)" if result.notified else "")
    )
    for line in (*ignored, *result.ignored):
        context.log.warning(f"{definition.name}: {line}")
    return materialization(definition, result, ignored=ignored, asset_key=asset_key, engine=engine)


def build_asset(definition: Definition, translator: CQTranslator) -> dg.AssetsDefinition:
    """The sink as an asset whose materialization is one firing, stream run or recalculation."""
    spec = translator.get_sink_asset_spec(definition)

    # A firing that still fails after the storage's own conflict retries (e.g. a lost Spark
    # connection) runs again: every firing is an idempotent range replace.
    @dg.multi_asset(
        name=translator.get_op_name(definition),
        specs=[spec],
        check_specs=[health.completeness_check_spec(definition, spec.key)],
        op_tags={"cq/name": definition.name},
        retry_policy=FIRING_RETRY,
    )
    def _asset(
        context: dg.AssetExecutionContext, config: FiringConfig, cq_engine: CQEngineResource, pyspark: PySparkResource
    ):
        engine = cq_engine.engine(pyspark.spark_session)
        run = lambda: [execute_one(context, config, engine, definition)]
        yield from health.CheckReporter(context, engine, {spec.key: definition}).around(run)

    return _asset


def build_jobs(definition: Definition, selection: list, translator: CQTranslator):
    """The definition's firing job and recalculate job over ``selection`` (its asset or sink key)."""
    tags = translator.get_tags(definition)
    # One step per run: the in-process executor spares each firing a second Python process.
    firing_job = dg.define_asset_job(
        translator.get_job_name(definition),
        selection=selection,
        tags=tags,
        executor_def=dg.in_process_executor,
        description=f"One firing of {definition.name} per run (tag cq/fire_time).",
    )
    recalc_job = dg.define_asset_job(
        translator.get_recalculate_job_name(definition),
        selection=selection,
        tags={**tags, "cq/recalculate": "true"},
        executor_def=dg.in_process_executor,
        description=f"Recalculate {definition.name}: set recalculate_from (and recalculate_to) in the run config "
        "or the tags cq/recalculate_from (and cq/recalculate_to).",
    )
    return firing_job, recalc_job


def build_schedule(
    definition: Definition,
    job,
    translator: CQTranslator,
    ticks: Ticks,
    plan: CronPlan,
    *,
    default_status: dg.DefaultScheduleStatus,
) -> dg.ScheduleDefinition:
    """A cron schedule whose ticks are exactly the definition's firing times."""

    def evaluate(context: dg.ScheduleEvaluationContext):
        fire = context.scheduled_execution_time.astimezone(UTC)
        if not ticks.is_tick(fire):
            return dg.SkipReason(f"{iso(fire)} is not a firing time of {definition.name}")
        if definition.timeout_policy == "DISCARD" and in_flight(context.instance, definition):
            return dg.SkipReason(
                f"DISCARD: a run of {definition.name} is still queued or running; the firing at {iso(fire)} is skipped"
            )
        return firing_request(definition, fire, translator, ticks)

    return dg.ScheduleDefinition(
        name=translator.get_schedule_name(definition),
        job=job,
        cron_schedule=plan.cron_strings[0] if len(plan.cron_strings) == 1 else list(plan.cron_strings),
        execution_timezone=plan.timezone,
        execution_fn=evaluate,
        default_status=default_status,
        description=f"Firings of {definition.name}: {ticks.description}",
    )


def due_firings(
    definition: Definition, *, cursor: str | None, now: datetime, ticks: Ticks | None = None
) -> list[datetime]:
    """Firing times after the cursor up to ``now``; on a first evaluation only the latest one."""
    ticks = ticks or ticks_of(definition, timezone="UTC")
    return ticks.due(cursor=parse_tick_cursor(cursor), now=now)


def build_tick_sensor(
    definition: Definition, job, translator: CQTranslator, ticks: Ticks, *, default_status: dg.DefaultSensorStatus
) -> dg.SensorDefinition:
    """Where cron cannot express the firing times (sub-minute EVERY, non-dividing intervals)."""
    interval = max(1, min(30, int(ticks.every.total_seconds() // 2) or 1))

    def evaluate(context: dg.SensorEvaluationContext):
        due = due_firings(definition, cursor=context.cursor, now=datetime.now(UTC), ticks=ticks)
        if not due:
            return dg.SkipReason(f"no firing of {definition.name} is due")
        if definition.timeout_policy == "DISCARD":
            context.update_cursor(tick_cursor(due[-1]))
            if in_flight(context.instance, definition):
                return dg.SkipReason(
                    f"DISCARD: a run of {definition.name} is still queued or running; "
                    f"skipped {len(due)} firing(s) up to {iso(due[-1])}"
                )
            return [firing_request(definition, due[-1], translator, ticks)]
        due = due[:MAX_TICKS_PER_EVALUATION]
        context.update_cursor(tick_cursor(due[-1]))
        return [firing_request(definition, fire, translator, ticks) for fire in due]

    return dg.SensorDefinition(
        name=translator.get_sensor_name(definition),
        job=job,
        evaluation_fn=evaluate,
        minimum_interval_seconds=interval,
        default_status=default_status,
        description=f"Firings of {definition.name} {ticks.description} (not expressible as cron)",
    )
