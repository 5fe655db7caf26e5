"""The batched run model: every firing due across the location's ticked definitions (continuous
queries and PERIOD streams) in one run, on one warm Spark session.

- One subsettable multi-asset (op ``cq_firings``) holds every ticked definition's sink; the sensor
  ``cq_firings`` requests runs of its job with the due firings in the run config and the sinks that
  get them as the run's asset selection. Each firing is one materialization of its sink with its
  ``cq/*`` metadata, so the sink's asset page shows its firings as before.
- Per definition (the sensor's cursor): ``upto`` (last firing requested) and, while a run holds some
  of its firings, that run's key and its first firing. BLOCKED holds its due firings while its run
  is queued or running and requests them all, in order, next; DISCARD skips them and then requests
  only the latest. Pipelined (``cq_engine.scheduling.batch.plan_batch``): a BLOCKED definition keeping up is
  requested again while its run goes on, and the new run waits for that run's commit.
- A run key per batch makes a repeated evaluation harmless. A run that failed (or vanished) puts its
  definitions' firings back, from the first one, into a later batch with a new attempt number; the
  other definitions of that run are not redone, and in the retried run a firing the ledger already
  holds as succeeded is skipped.
- ``<name>_ticks`` stays per definition as its on/off switch (``cq stop/start``): a stopped switch
  leaves the definition out of the batches. It is a schedule that ticks once a year and requests
  nothing, not a sensor: the sensor daemon evaluates every running sensor as soon as it sees it and
  then at its interval, so a thousand switch sensors held ``cq_firings`` back for minutes at every
  start (and each day); a schedule costs nothing until its cron tick, in the scheduler daemon.
- One definition on its own is a run of the same job with its sink alone selected: a firing
  (``fire_time`` config or ``cq/fire_time`` tag; neither: its latest firing) or a recalculation
  (``recalculate_from`` config or tag). There are no per-definition jobs: each would select one sink
  out of the shared multi-asset, and Dagster resolves such a job against every sink of the asset,
  so N jobs made loading the code location cost N² (ARCHITECTURE.md §6.4).
"""

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from functools import partial

import dagster as dg
from dagster_pyspark import PySparkResource

from cq_engine.config import Settings
from cq_engine.model import Definition
from cq_engine.recovery import server_coming_back
from cq_engine.resample.rounds import Stopped
from cq_engine.scheduling import batch_horizon, batch_lead
from cq_engine.scheduling.batch import (
    RUNNING,
    RequestedRun,
    adopt_runs,
    cursor_time,
    dump_cursor,
    load_cursor,
    plan_batch,
)
from cq_engine.scheduling.runs import caught_up_in, committed_through, finished_in, keeps_pace
from cq_engine.times import UTC, iso, parse_time

from . import health
from .batch_run import keyed_runs, latest_commits, run_batch
from .builders import IN_FLIGHT, FiringConfig, execute_one
from .event_log import event_log_kept_open
from .internals import IMPLICIT_ASSET_JOB_NAME, InstigatorStatus, InstigatorType
from .resource import CQEngineResource

SKIPPED_LINES = 20  # per tick: held or skipped definitions named in its log and skip reason
MAX_RUNTIME_SECONDS = 1800  # run monitoring ends a batch run older than this (its worker died): retried
SWITCH_CRON = "0 0 1 1 *"  # a switch's running state is what counts; its yearly tick requests nothing
SWITCH_INTERVAL_SECONDS = 24 * 3600  # a stream switch sensor (it holds a cursor): evaluated daily


# -- the Dagster objects ----------------------------------------------------------------------------
def requested_runs(instance, job_name: str, op: str, *, after: float) -> list[RequestedRun]:
    """The batch runs of ``job_name`` created after ``after`` (epoch seconds)."""
    records = instance.get_run_records(
        dg.RunsFilter(job_name=job_name, tags={"cq/batch": "true"}, created_after=datetime.fromtimestamp(after, UTC))
    )
    runs = []
    for record in records:
        run = record.dagster_run
        config = (((run.run_config or {}).get("ops") or {}).get(op) or {}).get("config", {})
        firings = config.get("firings") or {}
        runs.append(
            RequestedRun(
                key=run.tags.get("dagster/run_key", ""),
                created=record.create_timestamp.timestamp(),
                attempt=int(run.tags.get("cq/attempt", "0")),
                firings={n: list(fs) for n, fs in firings.items()},
                after={n: list(a) for n, a in (config.get("after") or {}).items()},
            )
        )
    return runs  # adopt_runs takes them oldest first


def sink_specs(definitions: list, translator) -> tuple[list[dg.AssetSpec], dict, dict]:
    """The skippable sink specs of a shared multi-asset, name -> sink key and sink key -> definition."""
    specs = [translator.get_sink_asset_spec(d).replace_attributes(skippable=True) for d in definitions]
    return (
        specs,
        {d.name: sp.key for d, sp in zip(definitions, specs)},
        {sp.key: d for d, sp in zip(definitions, specs)},
    )


def build_shared_asset(
    definitions: list, translator, *, name: str, description: str, many: str, run_many: Callable[..., Iterator]
) -> tuple[dg.AssetsDefinition, dict]:
    """One subsettable multi-asset over the sinks of ``definitions`` (also name -> sink key). A run with
    the run config field ``many`` (``firings`` or ``works``: name -> items) executes them through
    ``run_many(context, engine, items, sink_keys=, retry=, checks=, config=)``; a run selecting one sink is that
    definition's own firing or recalculation."""
    specs, sink_keys, by_key = sink_specs(definitions, translator)

    @dg.multi_asset(
        name=name,
        specs=specs,
        check_specs=[health.completeness_check_spec(by_key[s.key], s.key) for s in specs],
        can_subset=True,
        description=description,
    )
    def _shared(
        context: dg.AssetExecutionContext, config: FiringConfig, cq_engine: CQEngineResource, pyspark: PySparkResource
    ):
        with event_log_kept_open(context.instance, context.run_id):
            yield from _execute(context, config, engine=cq_engine.engine(pyspark.spark_session))

    def _execute(context: dg.AssetExecutionContext, config: FiringConfig, *, engine) -> Iterator:
        checks = health.CheckReporter(context, engine, by_key)
        items = getattr(config, many)
        if items:
            unknown = sorted(set(items) - sink_keys.keys())
            if unknown:
                raise dg.Failure(f"no definition named {', '.join(unknown)} in this code location")
            retry = context.run.tags.get("cq/attempt", "0") != "0"
            # The checks first, before the run's first firing or work: Dagster shows a sink's check as
            # evaluated for every materialization of the run that evaluated it, so none of this run's
            # shows "Not evaluated" or a planned check in progress. The run is requested before its
            # firings are due: this costs no latency.
            yield from checks.report()
            yield from checks.around(
                lambda: run_many(context, engine, items, sink_keys=sink_keys, retry=retry, checks=checks, config=config)
            )
            return
        selected = [by_key[k] for k in context.selected_asset_keys]
        if len(selected) != 1:
            raise dg.Failure(
                f"select one sink (one definition's firing or recalculation) or pass `{many}` in the run "
                f"config; {len(selected)} sinks are selected",
                allow_retries=False,
            )
        key = sink_keys[selected[0].name]
        yield from checks.around(lambda: [execute_one(context, config, engine, selected[0], asset_key=key)])

    return _shared, sink_keys


def build_batch_asset(definitions: list[Definition], translator) -> tuple[dg.AssetsDefinition, dict]:
    """The multi-asset of the continuous queries and PERIOD streams: batches of firings."""
    switches = {translator.get_sensor_name(d): d.name for d in definitions}
    return build_shared_asset(
        definitions,
        translator,
        name=translator.get_batch_op_name(),
        description="The firings of the location's continuous queries and PERIOD streams: a batch "
        "(run config `firings`) or one definition's firing or recalculation.",
        many="firings",
        run_many=lambda context, engine, firings, *, sink_keys, retry, checks, config: run_batch(
            context,
            engine,
            firings,
            sink_keys=sink_keys,
            retry=retry,
            on_done=checks.report,
            after=config.after,
            stopped=stopped_switches(context, switches),
        ),
    )


def build_batch_sensor(
    definitions: list[Definition],
    job,
    translator,
    ticks_for,
    sink_keys: dict,
    *,
    default_status: dg.DefaultSensorStatus,
    interval: int,
    check_every: timedelta = timedelta(0),
    settings: Settings | None = None,
) -> dg.SensorDefinition:
    """The sensor that requests the batches (see the module docstring); ``ticks_for(d)`` the ticks;
    ``settings`` locate the Spark Connect server a failed run's retry waits for."""
    switches = {translator.get_sensor_name(d): d.name for d in definitions}
    names = [d.name for d in definitions]
    op = translator.get_batch_op_name()

    def paused(context) -> set[str]:
        return {
            name
            for name, (running, _) in switch_states(context, switches, InstigatorType.SCHEDULE).items()
            if not running
        }

    def evaluate(context: dg.SensorEvaluationContext):
        now = datetime.now(UTC)
        states = load_cursor(context.cursor)
        at = cursor_time(context.cursor)
        if at is not None:
            for note in adopt_runs(states, requested_runs(context.instance, job.name, op, after=at)):
                context.log.warning(note)
        cursor = dump_cursor(states, at=at)
        keys = {k for s in states.values() for k in (s.key, s.prev) if k}
        runs = keyed_runs(context.instance, keys)
        run_status, run_ids, failed = runs.status, runs.ids, runs.failed
        busy = own_runs(context.instance, names, sink_keys, jobs=(job.name, IMPLICIT_ASSET_JOB_NAME))
        ticks = {d.name: ticks_for(d) for d in definitions}
        # In a batch run that is still running: name -> (run id, range end of its last firing there).
        running: dict[str, tuple[str, str]] = {}
        for d in definitions:
            s = states.get(d.name)
            if s and s.key and s.upto and run_status.get(s.key) in RUNNING and s.key in run_ids:
                # Its last firing in that run: DISCARD has one (`first`; `upto` moves on with skips).
                last = s.first if d.timeout_policy == "DISCARD" and s.first else s.upto
                running[d.name] = (run_ids[s.key], iso(ticks[d.name].range_of(parse_time(last, tz=UTC))[1]))
        following = {n: s.prev_end for n, s in states.items() if s.prev and s.prev_end and n in sink_keys}
        latest = latest_commits(context.instance, {n: sink_keys[n] for n in sorted(set(running) | set(following))})
        finished = finished_in(states, running, runs, latest)
        caught_up = caught_up_in(states, ticks, running, runs)
        # Pipelined: the run a definition's run follows has committed its firing there.
        prev_done = {n for n, end in following.items() if committed_through(latest.get(n), end)}
        # The horizon only for a definition that keeps pace: one slower than its EVERY (an e2e test's
        # takes 12 s per 5 s firing) would hold a run, and one of the two slots, for windows.
        keys_of = {d.name: getattr(states.get(d.name), "key", None) or "" for d in definitions}
        horizon = {
            d.name: batch_horizon(ticks[d.name].every, d.timeout_policy)
            if keeps_pace(
                latest.get(d.name),
                ticks[d.name].every,
                round_seconds=runs.round_seconds.get(keys_of[d.name]),
                in_run=run_status.get(keys_of[d.name]) in RUNNING,
            )
            else timedelta(0)
            for d in definitions
        }
        plan = partial(
            plan_batch,
            definitions,
            ticks=ticks,
            cursor=cursor,
            now=now,
            run_status=run_status,
            busy=busy,
            paused=paused(context),
            failed=failed,
            finished=frozenset(finished),
            prev_done=frozenset(prev_done),
            check_every=check_every,
            horizon=horizon,
            caught_up=frozenset(caught_up),
            ready=not server_coming_back(settings) if settings is not None else True,
        )
        # A window's batch is asked for early (the far lead) only when every definition keeping up
        # can join it; while some are still committing the firing before their last, only what the
        # usual lead asks for: requested as they come ready, the batch split into several runs
        # (each a process start, all wanting a slot at once).
        near = {d.name: batch_lead(ticks[d.name].every, d.timeout_policy) for d in definitions}
        far = {d.name: batch_lead(ticks[d.name].every, d.timeout_policy, horizon=horizon[d.name]) for d in definitions}
        batch = plan(lead=near, horizon_lead=far)
        if batch.unready and far != near:
            batch = plan(lead=near, horizon_lead=near)
        skipped = first_lines(batch.skipped)
        for line in skipped:
            context.log.info(line)
        if not batch.firings:
            return dg.SensorResult(skip_reason="; ".join(skipped) or "no firing is due", cursor=batch.cursor)
        config: dict = {"firings": {n: [iso(f) for f in fs] for n, fs in batch.firings.items()}}
        if batch.after:
            config["after"] = batch.after
        request = dg.RunRequest(
            run_key=batch.run_key,
            run_config={"ops": {op: {"config": config}}},
            asset_selection=[sink_keys[n] for n in batch.firings],
            asset_check_keys=[dg.AssetCheckKey(sink_keys[n], health.CHECK_NAME) for n in sorted(batch.checks)],
            tags={
                "cq/batch": "true",
                **batch_summary(batch.firings),
                "cq/attempt": str(batch.attempt),
                "dagster/max_runtime": str(MAX_RUNTIME_SECONDS),
            },
        )
        return dg.SensorResult(run_requests=[request], cursor=batch.cursor)

    return dg.SensorDefinition(
        name=translator.get_batch_sensor_name(),
        job=job,
        evaluation_fn=evaluate,
        minimum_interval_seconds=interval,
        default_status=default_status,
        description="Requests one run with every firing due across the location's continuous queries and PERIOD "
        "streams (BLOCKED: all, in order, each after the one before has committed; DISCARD: the latest). "
        "A definition's on/off switch is its schedule `<name>_ticks` (`cq stop NAME` / `cq start NAME`): "
        "while it is stopped, its firings are left out.",
    )


def batch_summary(firings: dict) -> dict[str, str]:
    """A batch's run tags a reader can use: how many firings of which definitions, over which fire times."""
    count = sum(len(fs) for fs in firings.values())
    times = sorted(f for fs in firings.values() for f in fs)
    span = iso(times[0]) if times[0] == times[-1] else f"{iso(times[0])} .. {iso(times[-1])}"
    return {
        "cq/firings": f"{count} firing(s) of {len(firings)} definition(s)",
        "cq/definitions": names_summary(firings),
        "cq/fire_times": span,
    }


def names_summary(names, limit: int = 5) -> str:
    """The first ``limit`` names, then how many more."""
    names = sorted(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def first_lines(lines: list[str], limit: int = SKIPPED_LINES) -> list[str]:
    """At most ``limit`` of ``lines``, then one saying how many more: a thousand held definitions'
    lines in every tick's log and skip reason cost the sensor more than its planning."""
    if len(lines) <= limit:
        return lines
    return [*lines[:limit], f"... and {len(lines) - limit} more definition(s) held or skipped"]


def own_runs(instance, names: list[str], sink_keys: dict[str, dg.AssetKey], *, jobs: tuple[str, ...]) -> set[str]:
    """Definitions with a run of their own queued or in progress: tagged ``cq/name`` (the CLI's), or
    a run of the shared job (or Dagster's implicit asset job: the UI's "Materialize") that is no
    batch and selects their sink."""
    busy = {
        r.dagster_run.tags["cq/name"]
        for r in instance.get_run_records(dg.RunsFilter(tags={"cq/name": names}, statuses=IN_FLIGHT))
    }
    by_key = {key: name for name, key in sink_keys.items()}
    for job in jobs:
        for record in instance.get_run_records(dg.RunsFilter(job_name=job, statuses=IN_FLIGHT)):
            run = record.dagster_run
            if run.tags.get("cq/batch") != "true":
                busy |= {by_key[k] for k in run.asset_selection or () if k in by_key}
    return busy


def switch_states(
    context, switches: dict[str, str], kind: InstigatorType = InstigatorType.SENSOR
) -> dict[str, tuple[bool, str | None]]:
    """Per definition whose switch (``switches``: sensor name -> definition) has a stored state in
    this code location: whether it runs, and its cursor."""
    origin = context.code_location_origin
    return instigator_states(context.instance, switches, kind, location=origin.location_name if origin else None)


def instigator_states(
    instance, switches: dict[str, str], kind: InstigatorType, *, location: str | None
) -> dict[str, tuple[bool, str | None]]:
    """``switch_states`` from an instance and a code location's name (None: any location)."""
    return {
        switches[s.origin.instigator_name]: (
            s.status != InstigatorStatus.STOPPED,
            getattr(s.instigator_data, "cursor", None),
        )
        for s in instance.all_instigator_state(instigator_type=kind)
        if s.origin.instigator_name in switches and (location is None or s.origin.location_name == location)
    }


def stopped_switches(context, switches: dict[str, str]) -> Stopped:
    """For a batch run: which of the given definitions have their switch (a schedule) stopped now."""
    origin = context.run.remote_job_origin
    location = origin.location_name if origin else None

    def stopped(names: set[str]) -> set[str]:
        states = instigator_states(context.instance, switches, InstigatorType.SCHEDULE, location=location)
        return {n for n in names if n in states and not states[n][0]}

    return stopped


def build_switch_sensor(
    definition: Definition, translator, *, default_status: dg.DefaultSensorStatus, via: str
) -> dg.SensorDefinition:
    """``<name>_ticks`` of a window-triggered stream: its running state is the stream's on/off switch
    (its cursor is used by ``cq start --ignore-untreated``), read by the sensor ``via``; its own
    evaluations (daily) request nothing."""

    def evaluate(context: dg.SensorEvaluationContext):
        return dg.SkipReason(f"{definition.name} runs through the {via} sensor")

    return dg.SensorDefinition(
        name=translator.get_sensor_name(definition),
        evaluation_fn=evaluate,
        minimum_interval_seconds=SWITCH_INTERVAL_SECONDS,
        default_status=default_status,
        description=f"ON/OFF SWITCH of {definition.name}: Running means the {via} sensor computes it, Stopped "
        "leaves it out (`cq stop` / `cq start`); its own daily evaluation requests nothing.",
    )


def build_switch(
    definition: Definition, job, translator, *, default_status: dg.DefaultScheduleStatus
) -> dg.ScheduleDefinition:
    """``<name>_ticks`` under the batched model: a schedule whose running state is the definition's
    on/off switch, read by the batch sensor (see the module docstring); its yearly tick requests nothing."""

    def evaluate(context: dg.ScheduleEvaluationContext):
        return dg.SkipReason(f"{definition.name} fires through the {translator.get_batch_sensor_name()} sensor")

    return dg.ScheduleDefinition(
        name=translator.get_sensor_name(definition),
        job=job,
        cron_schedule=SWITCH_CRON,
        execution_timezone="UTC",
        execution_fn=evaluate,
        default_status=default_status,
        description=f"ON/OFF SWITCH of {definition.name}, not a schedule: Running means it fires (through "
        f"the {translator.get_batch_sensor_name()} sensor), Stopped leaves its firings out (`cq stop` / `cq start`). "
        "Dagster needs a cron for it; its once-a-year tick requests nothing.",
    )
