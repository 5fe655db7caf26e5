"""What ``cq_firings``'s task runs (the batched form, ``airflow_dags.batch``): the window's firings of
every definition planned from the engine's ledger (``cq_engine.scheduling.windows.plan_window``) and
run fused in time-ordered rounds on one Spark session (``resample.rounds.execute_rounds``, the Dagster
batch run's call). Spark and the engine are imported here, when the task runs."""

from __future__ import annotations

import logging
import queue
import threading
from datetime import datetime, timedelta
from typing import Any

from airflow_dags.tasks import firing_summary
from cq_engine.times import iso

log = logging.getLogger(__name__)
SINKS_ALIAS = "cq_firings_sinks"  # each committed firing is an asset event of its sink, through this alias


def switches_off(names: list[str], get_dag: Any) -> set[str]:
    """The definitions whose own DAG is paused (``cq stop NAME --via-airflow``): ``get_dag(dag_id)``
    is the task instance's (Airflow's execution API, one request per DAG). A DAG Airflow does not know
    (yet) is on, as a new DAG is when ``dags_are_paused_at_creation`` is off."""
    off = set()
    for name in names:
        try:
            dag = get_dag(name)
        except Exception as exc:  # not parsed yet, or the API did not answer: it fires
            log.info("%s: its DAG's pause state is unknown (%s); it fires", name, exc)
            continue
        if getattr(dag, "is_paused", False):
            off.add(name)
    return off


def run_window(
    *,
    lead_us: int,
    data_interval_start: Any = None,
    data_interval_end: Any = None,
    outlet_events: Any = None,
    ti: Any = None,
    **_: Any,
) -> dict:
    """Execute the firings due in the run's window (its data interval moved ``lead_us`` later, see
    ``WindowTimetable``) of every continuous query and PERIOD stream whose DAG is not paused: each
    after its last succeeded firing in the ledger, BLOCKED all in order, DISCARD the latest due;
    each firing committed once (its sink's idempotent-write identity, as a Dagster batch run's).
    Each committed firing is an asset event of its sink (through the alias ``cq_firings_sinks``)
    whose extra is the per-definition task's record. Returns (the XCom) the window, the counts and
    per firing its outcome; fails at the end naming the firings that failed (the others committed:
    the next window's run retries them)."""
    from cq_engine.catalog import settings_catalog
    from cq_engine.config import load_settings
    from cq_engine.engine import Engine
    from cq_engine.errors import AlreadyCommitted
    from cq_engine.resample.rounds import execute_rounds
    from cq_engine.schedule.ticks import ticks_of
    from cq_engine.scheduling.windows import plan_window
    from cq_engine.times import UTC

    from .timetable import as_utc, ticked_definitions

    if data_interval_start is None or data_interval_end is None:
        raise ValueError("cq_firings: the DAG run has no data interval (its window)")
    lead = timedelta(microseconds=lead_us)
    window = (as_utc(data_interval_start) + lead, as_utc(data_interval_end) + lead)
    settings = load_settings()
    engine = Engine(settings=settings, catalog=settings_catalog(settings))
    definitions = [d for d in ticked_definitions(engine.catalog.definitions) if _scheduled(d, settings.timezone)]
    names = [d.name for d in definitions]
    paused = switches_off(names, ti.get_dag) if ti is not None and hasattr(ti, "get_dag") else set()
    plan = plan_window(
        definitions,
        ticks={d.name: ticks_of(d, timezone=settings.timezone) for d in definitions},
        last_fired=engine.ledger.last_fired(),
        window=window,
        now=datetime.now(UTC),
        paused=paused,
    )
    for note in plan.notes:
        log.info(note)
    log.info(
        "window %s .. %s: %d firing(s) of %d definition(s) (%d stopped)",
        iso(window[0]),
        iso(window[1]),
        plan.count,
        len(plan.firings),
        len(paused),
    )

    if plan.firings:
        _ = engine.spark  # the session opened within the lead, before the window's first firing is due

    out: queue.Queue = queue.Queue()
    error: list[BaseException] = []

    def rounds() -> None:
        try:
            execute_rounds(engine, plan.firings, {}, out, discard=plan.discard)
        except BaseException as exc:  # a bug in execute_rounds itself: raised below
            error.append(exc)
        finally:
            out.put(None)

    worker = threading.Thread(target=rounds, name="cq-window-rounds", daemon=True)
    worker.start()
    firings: list[dict] = []
    failed: list[str] = []
    while (item := out.get()) is not None:
        outcome, d, fire, value = item
        record: dict = {"name": d.name, "fire_time": iso(fire), "outcome": outcome}
        if outcome == "ok":
            record.update(firing_summary(d, value))
            log.info(
                "%s: firing %s committed (%s rows, %s v%s)",
                d.name,
                iso(fire),
                value.rows_written,
                d.sink,
                value.sink_version,
            )
            if outlet_events is not None and d.sink:
                from airflow.sdk import AssetAlias

                from .assets import table_asset

                outlet_events[AssetAlias(SINKS_ALIAS)].add(table_asset(d.sink, settings=settings), extra=record)
        elif outcome == "skipped" and isinstance(value, AlreadyCommitted):
            record.update(sink=d.sink, sink_version=value.version, already_committed=True)
            log.warning("%s: firing %s already committed (%s); skipped", d.name, iso(fire), value)
        elif outcome == "discarded":
            log.info("%s: DISCARD skipped firing %s (its next one was due before it ran)", d.name, iso(fire))
        elif outcome in ("failed", "handed_back"):
            record["error"] = " ".join(str(value).split())[:500]
            failed.append(f"{d.name} @ {iso(fire)}: {record['error']}")
            log.error("%s: firing %s %s: %s", d.name, iso(fire), outcome.replace("_", " "), value)
        else:
            log.info("%s: firing %s %s", d.name, iso(fire), outcome)
        firings.append(record)
    worker.join()
    if error:
        raise error[0]
    result = {
        "window_start": iso(window[0]),
        "window_end": iso(window[1]),
        "planned": plan.count,
        "committed": sum(1 for f in firings if f["outcome"] == "ok"),
        "failed": len(failed),
        "stopped": sorted(paused),
        "notes": plan.notes[:100],
        "firings": firings,
    }
    if failed:
        if ti is not None:
            ti.xcom_push(key="return_value", value=result)
        raise RuntimeError(
            f"{len(failed)} firing(s) failed (the next window's run retries them; the others are committed): "
            + "; ".join(failed[:20])
        )
    return result


def _scheduled(definition: Any, timezone: str) -> bool:
    """Whether Airflow schedules ``definition`` (a PERIOD of a day or more is not: the DAG file's
    import error names it)."""
    from cq_engine.errors import CQError

    from .timetable import timetable_of

    try:
        return timetable_of(definition, timezone=timezone) is not None
    except CQError:
        return False
