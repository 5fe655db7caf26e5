"""A window-triggered stream's sensor: it reads the trigger table's new Delta commits (no Spark)
and requests the runs ``cq_engine.streams.sensor`` plans; the cursor is the stream's
``StreamCursor`` (versions seen, watermark)."""

from datetime import datetime

import dagster as dg

from cq_engine.engine import Engine
from cq_engine.errors import CQError
from cq_engine.model import Stream
from cq_engine.notify.outbox import gate, paused_by_notify
from cq_engine.streams.sensor import evaluate_stream
from cq_engine.streams.timing import StreamWork
from cq_engine.times import UTC, iso

from .builders import in_flight
from .translator import CQTranslator

PRIORITY_TAG = "dagster/priority"
WAITING = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED]


def work_request(stream: Stream, work: StreamWork, index: int, translator: CQTranslator) -> dg.RunRequest:
    """The run of one ``StreamWork``; history after real time unless FILL_HISTORY_FIRST."""
    lo, hi = work.extent
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


def build_stream_sensor(
    stream: Stream, job, translator: CQTranslator, engine: Engine, *, default_status: dg.DefaultSensorStatus
) -> dg.SensorDefinition:
    # Freshness: a closed window waits on average half this before its run is requested.
    interval = 1 if stream.options.low_latency_calc else 2

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
        context.update_cursor(plan.cursor.to_json())
        for item in plan.ignored:
            context.log.warning(f"{stream.name}: {item.text}")
        if not plan.works:
            return dg.SkipReason("; ".join([plan.reason, *[i.text for i in plan.ignored]]))
        context.log.info(f"{stream.name}: {plan.reason}")
        return [work_request(stream, w, i, translator) for i, w in enumerate(plan.works)]

    return dg.SensorDefinition(
        name=translator.get_sensor_name(stream),
        job=job,
        evaluation_fn=evaluate,
        minimum_interval_seconds=interval,
        default_status=default_status,
        description=f"Watches the Delta versions of `{stream.trigger_table}` for {stream.name} "
        f"({stream.trigger.kind} windows); cursor = versions seen and watermark.",
    )
