"""An AFTER INSERT trigger's sensor ``<name>_trigger``: each evaluation fires the trigger on the new
Delta versions of the tables its pattern matches (``cq_engine.triggers.runtime.deliver_after``); it
requests no runs. The cursor (JSON: registration generation, last version handled per table) is
returned with the result, so Dagster stores it only after every ``fire`` of the evaluation returned."""

from __future__ import annotations

import contextlib
from datetime import datetime

import dagster as dg

from cq_engine.engine import Engine
from cq_engine.errors import CQError
from cq_engine.model import TriggerDef
from cq_engine.times import UTC
from cq_engine.triggers.after import deliver_after
from cq_engine.triggers.runtime import load_class, sensor_name

INTERVAL_SECONDS = 2


def build_trigger_sensor(
    trigger: TriggerDef, engine: Engine, *, default_status: dg.DefaultSensorStatus
) -> dg.SensorDefinition:
    # Import the class now: Dagster puts the location's working_directory on sys.path only while it
    # loads the code, and the module stays imported for the evaluations. A failure shows at the tick.
    with contextlib.suppress(CQError):
        load_class(trigger, settings=engine.settings)

    def evaluate(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        # A trigger that cannot be created (import error, validate() refusing) raises: the tick fails
        # with that message and the cursor stays.
        delivery = deliver_after(trigger, ctx=engine.ctx, cursor=context.cursor, now=datetime.now(UTC))
        for failure in delivery.failures:
            context.log.warning(failure)
        if delivery.blocked:
            context.log.error(delivery.blocked)
        elif delivery.delivered:
            context.log.info(delivery.reason)
        return dg.SensorResult(skip_reason=delivery.reason, cursor=delivery.cursor)

    kind = "STATEFUL" if trigger.stateful else "STATELESS"
    return dg.SensorDefinition(
        name=sensor_name(trigger),
        evaluation_fn=evaluate,
        minimum_interval_seconds=INTERVAL_SECONDS,
        default_status=default_status,
        description=f"{kind} trigger `{trigger.name}` ({trigger.location}): fires `{trigger.target}` AFTER INSERT "
        f"on every new Delta version of the tables matching `{trigger.pattern}`, once each, in order."
        f"\n\n```sql\n{trigger.sql}\n```",
    )
