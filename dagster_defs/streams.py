"""A window-triggered stream's sensor: it reads the trigger table's new Delta commits (no Spark)
and requests the runs ``cq_engine.streams.sensor`` plans; the cursor is the stream's
``StreamCursor`` (versions seen, watermark)."""

from datetime import datetime

import dagster as dg

from cq_engine.engine import Engine
from cq_engine.errors import CQError
from cq_engine.model import Stream
from cq_engine.notify.outbox import gate, paused_by_notify
from cq_engine.spark import server_status
from cq_engine.streams.sensor import evaluate_stream
from cq_engine.streams.timing import StreamWork, work_range
from cq_engine.times import UTC, iso

from .builders import in_flight, materialization
from .translator import CQTranslator

PRIORITY_TAG = "dagster/priority"
WAITING = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED]


def work_request(stream: Stream, work: StreamWork, index: int, translator: CQTranslator, *, tz: str) -> dg.RunRequest:
    """The run of one ``StreamWork``; history after real time unless FILL_HISTORY_FIRST."""
    lo, hi = work_range(stream, work, tz)
    tags = {
        **translator.get_tags(stream),
        "cq/work": work.to_json(),
        "cq/work_kind": work.kind,
        "cq/version": str(work.version),
        "cq/range_start": iso(lo),
        "cq/range_end": iso(hi),
    }
    if work.kind == "history" and not stream.options.fill_history_first:
        tags[PRIORITY_TAG] = "-1"
    key = f"{stream.name}@v{work.version}:{work.kind}:{iso(work.tick or lo)}#{index}"
    return dg.RunRequest(run_key=key, tags=tags)


def computes_inline(engine: Engine, works: list[StreamWork]) -> bool:
    """LOW_LATENCY_CALC computes a stream's new windows in its sensor when they are live windows (not
    history) and a Spark Connect server serves the code server (never a JVM inside it)."""
    if any(w.kind == "history" for w in works):
        return False
    return bool(engine.settings.spark_remote) or server_status(engine.settings).running


def compute_inline(context, engine: Engine, stream: Stream, works: list[StreamWork], sink_key) -> list:
    """Run ``works`` in order in this process; one materialization per work done, up to the first
    failure (logged; the caller hands it and the rest to runs, which retry and show it)."""
    events = []
    for work in works:
        try:
            result = engine.run_stream(stream.name, work)
        except Exception as exc:  # the run that takes over shows the failure in full
            context.log.warning(f"{stream.name}: computing in the sensor failed, a run takes over: {exc}")
            engine.ctx.spark_session = None  # a broken Connect session is not reused
            break
        context.log.info(
            f"{stream.name}: computed in the sensor (LOW_LATENCY_CALC): {result.kind} "
            f"[{iso(result.time_range[0])}, {iso(result.time_range[1])}) wrote {result.rows_written} rows"
        )
        metadata = dict(materialization(stream, result, ignored=work.ignored, engine=engine).metadata or {})
        events.append(dg.AssetMaterialization(asset_key=sink_key, metadata={**metadata, "cq/computed_in": "sensor"}))
    return events


def build_stream_sensor(
    stream: Stream, job, translator: CQTranslator, engine: Engine, *, default_status: dg.DefaultSensorStatus
) -> dg.SensorDefinition:
    # Freshness: a closed window waits on average half this before its run is requested.
    interval = 1 if stream.options.low_latency_calc else 2
    sink_key = translator.get_sink_asset_spec(stream).key

    def evaluate(context: dg.SensorEvaluationContext):
        # Back-pressure: while a run of the stream still waits in the queue, leave the cursor where it
        # is; the next evaluation puts everything that arrived meanwhile into one run.
        if in_flight(context.instance, stream, statuses=WAITING):
            return dg.SkipReason(f"a run of {stream.name} is still queued; new commits wait for the next tick")
        # ON_FAILURE PAUSE: undelivered notifications hold the cursor until a retry gets them through
        # (not while a run is in progress: it is delivering them itself).
        if paused_by_notify(stream) and not in_flight(context.instance, stream):
            try:
                reason = gate(engine.ctx, stream)
            except CQError as exc:
                reason = str(exc)
            if reason:
                return dg.SkipReason(f"{stream.name} {reason}")
        try:
            plan = evaluate_stream(engine.ctx, stream, cursor=context.cursor, now=datetime.now(UTC))
        except CQError as exc:
            return dg.SkipReason(str(exc))
        cursor = plan.cursor.to_json()
        for item in plan.ignored:
            context.log.warning(f"{stream.name}: {item.text}")
        if not plan.works:
            return dg.SensorResult(skip_reason="; ".join([plan.reason, *[i.text for i in plan.ignored]]), cursor=cursor)
        context.log.info(f"{stream.name}: {plan.reason}")
        works, events = list(plan.works), []
        if (
            stream.options.low_latency_calc
            and computes_inline(engine, works)
            and not in_flight(context.instance, stream)
        ):
            events = compute_inline(context, engine, stream, works, sink_key)
            works = works[len(events) :]  # what failed (and what follows it) goes to a run, in order
        tz = engine.settings.timezone
        requests = [work_request(stream, w, i, translator, tz=tz) for i, w in enumerate(works)]
        return dg.SensorResult(run_requests=requests, asset_events=events, cursor=cursor)

    return dg.SensorDefinition(
        name=translator.get_sensor_name(stream),
        job=job,
        evaluation_fn=evaluate,
        minimum_interval_seconds=interval,
        default_status=default_status,
        description=f"Watches the Delta versions of `{stream.trigger_table}` for {stream.name} "
        f"({stream.trigger.kind} windows); cursor = versions seen and watermark.",
    )
