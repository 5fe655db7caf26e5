"""What a DAG's task runs: the firing through the engine (``Engine.run_firing`` or ``run_period``, the
calls the Dagster adapter makes). Spark and the engine are imported here, when the task runs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from cq_engine.errors import AlreadyCommitted
from cq_engine.times import iso


def run_firing(
    *, name: str, lag_us: int, data_interval_end: Any = None, outlet_events: Any = None, dag_run: Any = None, **_: Any
) -> dict:
    """Run the firing of ``name`` whose range ends at the run's data interval end (plus ``lag_us``:
    the RANGE end offset); the result (XCom and the sink's asset event extra): the sink's Delta
    version, the rows written, the source versions read and the range.

    A scheduled run's firing is committed once, as a Dagster batch run's is: a sink that holds it
    already (the task retried after its commit, a second run of the interval) is left alone and the
    result says ``already_committed``, nothing recorded twice. A backfill or a manual run rewrites
    its range on purpose, as ``cq recalculate`` does."""
    from cq_engine.catalog import settings_catalog
    from cq_engine.config import load_settings
    from cq_engine.engine import Engine
    from cq_engine.model import ContinuousQuery

    from .timetable import as_utc

    if data_interval_end is None:
        raise ValueError(f"{name}: the DAG run has no data interval (a firing needs one)")
    settings = load_settings()
    engine = Engine(settings=settings, catalog=settings_catalog(settings))
    fire = as_utc(data_interval_end) + timedelta(microseconds=lag_us)
    definition = engine.definition(name)
    run = engine.run_firing if isinstance(definition, ContinuousQuery) else engine.run_period
    once = str(getattr(dag_run, "run_type", "")) == "scheduled"  # DagRunType is a str enum
    try:
        result = run(name, fire, once=once)
    except AlreadyCommitted as exc:
        return _reported(
            {"fire_time": iso(fire), "sink": definition.sink, "sink_version": exc.version, "already_committed": True},
            definition=definition,
            settings=settings,
            outlet_events=outlet_events,
        )
    summary = {"fire_time": iso(fire), **firing_summary(definition, result)}
    return _reported(summary, definition=definition, settings=settings, outlet_events=outlet_events)


def firing_summary(definition: Any, result: Any) -> dict:
    """A committed firing as a task reports it (XCom and the sink's asset event): its range, the sink's
    version and rows, the source versions it read."""
    return {
        "range_start": iso(result.time_range[0]),
        "range_end": iso(result.time_range[1]),
        "sink": definition.sink,
        "sink_version": result.sink_version,
        "rows_written": result.rows_written,
        "source_versions": dict(result.source_versions),
        "files_read": result.files_read,
        "seconds": round(result.seconds, 3),
        "already_committed": False,
    }


def _reported(summary: dict, *, definition: Any, settings: Any, outlet_events: Any) -> dict:
    """``summary`` as the sink asset's event extra too; the task's XCom."""
    if outlet_events is not None and definition.sink:
        from .assets import table_asset

        outlet_events[table_asset(definition.sink, settings=settings)].extra = summary
    return summary
