"""The ``cq_maintenance_job`` and its ``cq_maintenance`` schedule (daily by default, ``CQ_MAINTENANCE_CRON``):
``cq maintain`` as a Dagster run, so a deployment's tables are kept fast without a cron entry of its own
(docs/operations/housekeeping.md)."""

from datetime import UTC, datetime

import dagster as dg
from dagster_pyspark import PySparkResource
from pydantic import Field

from cq_engine.config import Settings

from .resource import CQEngineResource

JOB_NAME, SCHEDULE_NAME = "cq_maintenance_job", "cq_maintenance"


class MaintenanceConfig(dg.Config):
    sources: bool = Field(
        default=False, description="Also the declared tables (CREATE TABLE), not only sinks and _cq/."
    )


@dg.op(
    name="cq_maintenance",
    description="Ledger retention, then compaction, VACUUM, checkpoint and log cleanup "
    "of the engine state tables and the sinks (`cq maintain`).",
)
def maintenance_op(
    context: dg.OpExecutionContext, config: MaintenanceConfig, cq_engine: CQEngineResource, pyspark: PySparkResource
) -> dg.Output:
    engine = cq_engine.engine(pyspark.spark_session)
    reports = engine.maintain(now=datetime.now(UTC), sources=config.sources)
    for report in reports:
        (context.log.error if report.error else context.log.info)(report.line())
    failed = [r.name for r in reports if r.error]
    if failed:
        raise dg.Failure(f"maintenance failed for {', '.join(failed)} (the others were maintained; see the log)")
    return dg.Output(
        None,
        metadata={
            "cq/tables": len(reports),
            "cq/files_compacted": sum(r.compacted for r in reports),
            "cq/files_vacuumed": sum(max(r.vacuumed, 0) for r in reports),
            "cq/log_files_removed": sum(r.logs_removed for r in reports),
            "cq/ledger_entries_dropped": sum(r.dropped_entries for r in reports),
        },
    )


def build_maintenance(
    settings: Settings, *, default_status: dg.DefaultScheduleStatus
) -> tuple[dg.JobDefinition, dg.ScheduleDefinition]:
    """The maintenance job (one op, in process) and its schedule at ``settings.maintenance_cron`` in
    ``settings.timezone``."""
    job = dg.JobDefinition(
        graph_def=dg.GraphDefinition(name=JOB_NAME, node_defs=[maintenance_op]),
        executor_def=dg.in_process_executor,
        description="Housekeeping of the ledger, the engine state tables and the sinks (`cq maintain`).",
        tags={"cq/maintenance": "true"},
    )
    schedule = dg.ScheduleDefinition(
        name=SCHEDULE_NAME,
        job=job,
        cron_schedule=settings.maintenance_cron,
        execution_timezone=settings.timezone,
        default_status=default_status,
        description=f"`cq maintain` at {settings.maintenance_cron} ({settings.timezone}); CQ_MAINTENANCE_CRON",
    )
    return job, schedule
