"""The ``cq_health`` sensor: a stopped or stale sink shows as unhealthy in the catalog's list.

Dagster OSS (1.13) lists an asset in red when a check of its latest materialization failed with
severity ERROR; its asset health (the Dagster+ "Health" column) is compiled out of the OSS UI, and the
freshness policy's verdict shows on the asset's page only. So every ``HEALTH_INTERVAL_SECONDS`` this
sensor looks at every sink (one query for the switches, one for the latest materializations) and, when
a definition is stopped or its sink stale (older than its freshness policy's fail window), reports its
``cq_completeness`` check failed, runless, saying why; when it runs and is fresh again, the check's
real result (from the ledger). Reported only on a change, so a healthy location writes nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta

import dagster as dg

from cq_engine.durations import format_duration
from cq_engine.model import Definition
from cq_engine.times import UTC

from . import health
from .batch import instigator_states
from .internals import InstigatorType

HEALTH_INTERVAL_SECONDS = 30  # the freshness daemon's default interval


def sink_state(stopped: bool, age: float | None, fail_seconds: float) -> str:
    """``stopped``, ``stale`` (its newest materialization older than the fail window) or ``ok``
    (also a sink never materialized: Dagster shows that already)."""
    if stopped:
        return "stopped"
    if age is not None and age > fail_seconds:
        return "stale"
    return "ok"


def build_health_sensor(
    definitions: list[Definition],
    sink_keys: dict[str, dg.AssetKey],
    switch_kinds: dict[str, InstigatorType],
    translator,
    engine,
    *,
    default_status: dg.DefaultSensorStatus,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> dg.SensorDefinition:
    """``switch_kinds``: definition name -> whether its switch is a schedule or a sensor."""
    by_name = {d.name: d for d in definitions}
    windows = {d.name: health.sink_freshness(d, engine.settings) for d in definitions}
    switches = {
        kind: {translator.get_sensor_name(by_name[n]): n for n, k in switch_kinds.items() if k == kind}
        for kind in set(switch_kinds.values())
    }

    def evaluate(context: dg.SensorEvaluationContext):
        now = clock()
        reported: dict[str, list] = json.loads(context.cursor) if context.cursor else {}
        origin = context.code_location_origin
        location = origin.location_name if origin else None
        running: dict[str, bool] = {}
        for kind, names in switches.items():
            running |= {
                n: on for n, (on, _) in instigator_states(context.instance, names, kind, location=location).items()
            }
        records = {
            r.asset_entry.asset_key: r.asset_entry for r in context.instance.get_asset_records(list(sink_keys.values()))
        }
        events: list = []
        recovered: list[Definition] = []
        lines: list[str] = []
        for name, key in sink_keys.items():
            entry = records.get(key)
            last = entry.last_materialization_record if entry else None
            age = now.timestamp() - last.timestamp if last else None
            window = windows[name]
            state = sink_state(not running.get(name, True), age, window.fail.total_seconds())
            mark = [state, last.storage_id if last else None]
            if state == "ok":
                if name in reported:
                    recovered.append(by_name[name])
                    del reported[name]
                continue
            if reported.get(name) == mark:
                continue
            reported[name] = mark
            switch = translator.get_sensor_name(by_name[name])
            if state == "stopped":
                why = f"Stopped: its switch {switch} is off, so nothing is computed (cq start {name} resumes it)."
            else:
                why = (
                    f"Stale: newest materialization {format_duration_s(age)} ago; it should change every "
                    f"{format_duration(window.expected)} and is stale after {format_duration(window.fail)} "
                    f"({window.why})."
                )
            lines.append(f"{name}: {why}")
            events.append(
                dg.AssetCheckEvaluation(
                    asset_key=key,
                    check_name=health.CHECK_NAME,
                    passed=False,
                    severity=dg.AssetCheckSeverity.ERROR,
                    description=why,
                    metadata={"cq/state": state, "cq/switch": switch},
                )
            )
        if recovered:
            keys = {d.name: sink_keys[d.name] for d in recovered}
            try:
                events += health.completeness_results(engine, recovered, keys, runless=True)
                lines += [f"{d.name}: running and fresh again" for d in recovered]
            except Exception as exc:  # the next evaluation of a run reports it
                context.log.warning(f"{health.CHECK_NAME}: not evaluated for {', '.join(keys)}: {exc}")
        for line in lines:
            context.log.info(line)
        return dg.SensorResult(
            asset_events=events,
            cursor=json.dumps(reported, separators=(",", ":"), sort_keys=True),
            skip_reason=None
            if events
            else f"{len(sink_keys) - len(reported)} sink(s) running and fresh, {len(reported)} stopped or stale",
        )

    return dg.SensorDefinition(
        name=translator.get_health_sensor_name(),
        evaluation_fn=evaluate,
        minimum_interval_seconds=HEALTH_INTERVAL_SECONDS,
        default_status=default_status,
        description="Marks a sink unhealthy in the asset catalog while its definition is stopped or its sink is "
        "stale (older than its freshness policy allows): its cq_completeness check fails saying why, until it "
        "runs again. Its cursor lists the sinks it marked.",
    )


def format_duration_s(seconds: float | None) -> str:
    """Whole seconds as a duration (``12m30s``)."""
    return format_duration(timedelta(seconds=int(seconds or 0)))
