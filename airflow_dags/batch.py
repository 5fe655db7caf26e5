"""The batched form: one DAG, ``cq_firings``, whose runs execute every due firing of the continuous
queries and PERIOD streams of ``CQ_SQL_DIR`` fused, as the Dagster batch run does; and which form a
location gets (``CQ_AIRFLOW_FORM``).

One DAG per definition costs a worker process, a DAG-file parse and a Spark session per firing: the
``airflow`` benchmark at 100 continuous queries every minute on the two-core machine committed about
60 firings a minute of the 100 due, with some 80 task instances waiting. ``cq_firings`` pays that
once per window for all of them (docs/airflow.md, *Which form*). Its runs are ``WindowTimetable``'s
aligned windows; its task (``batch_tasks.run_window``) plans from the engine's ledger
(``cq_engine.scheduling.windows``) and runs the firings through ``resample.rounds.execute_rounds``.
The definitions keep their own DAGs, unscheduled (``CQTimetable.unscheduled``): a backfill, a manual
run, and the definition's switch (its DAG paused: ``cq stop --via-airflow``; ``cq_firings`` leaves it
out)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import pendulum
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, AssetAlias

from cq_engine.config import Settings
from cq_engine.errors import CQError
from cq_engine.scheduling import batch_lead, env_seconds
from cq_engine.scheduling.windows import firings_per_minute, window_cadence

from .batch_tasks import SINKS_ALIAS, run_window
from .timetable import CQTimetable, WindowTimetable

BATCH_DAG_ID = "cq_firings"
FORMS = ("per_definition", "batched", "auto")
# `auto`: the batched form above this many firings a minute across the definitions. The per-definition
# form's ceiling on the two-core machine was about 60 firings a minute (the `airflow` benchmark, 100
# continuous queries every minute); half of it leaves the machine room for the sources and Spark.
AUTO_BATCHED_ABOVE = 30.0


def airflow_form(timetables: list[CQTimetable], *, environ: dict[str, str] | None = None) -> str:
    """``per_definition`` or ``batched``: ``CQ_AIRFLOW_FORM`` if it names one, else (``auto``, the
    default) batched when the definitions fire more than ``AUTO_BATCHED_ABOVE`` times a minute."""
    env = os.environ if environ is None else environ
    form = env.get("CQ_AIRFLOW_FORM", "auto").strip().lower().replace("-", "_") or "auto"
    if form not in FORMS:
        raise CQError(f"CQ_AIRFLOW_FORM={form!r}: expected one of {', '.join(FORMS)}")
    if form != "auto":
        return form
    return "batched" if firings_per_minute([t.ticks for t in timetables]) > AUTO_BATCHED_ABOVE else "per_definition"


def batch_timetable(
    timetables: list[CQTimetable], *, timezone: str, environ: dict[str, str] | None = None
) -> WindowTimetable:
    """``cq_firings``'s windows: ``CQ_AIRFLOW_BATCH_EVERY`` seconds if set, else the greatest common
    divisor of the definitions' periods (``window_cadence``), each run created ``CQ_BATCH_LEAD``
    seconds early (default 25, at most half the window)."""
    env = os.environ if environ is None else environ
    override = None
    if env.get("CQ_AIRFLOW_BATCH_EVERY"):
        value = env["CQ_AIRFLOW_BATCH_EVERY"]
        try:
            seconds = float(value)
        except ValueError:
            seconds = 0.0
        if not seconds >= 1:
            raise CQError(f"CQ_AIRFLOW_BATCH_EVERY={value!r}: expected a number of seconds >= 1")
        override = timedelta(seconds=seconds)
    cadence = window_cadence([t.ticks.every for t in timetables], override=override)
    env_seconds("CQ_BATCH_LEAD", 25)  # a bad value is the DAG file's error, not the task's
    return WindowTimetable.of(cadence=cadence, lead=batch_lead(cadence, "DISCARD"), timezone=timezone)


def batch_dag(names: list[str], timetable: WindowTimetable, *, settings: Settings, retry_args: dict) -> DAG:
    """``cq_firings``: one task, ``fire``, executing each window's firings of ``names``' definitions
    (the catalog as the task loads it decides which are due; ``names`` are for the DAG's docs)."""
    listed = ", ".join(f"`{n}`" for n in names[:50]) + (f" and {len(names) - 50} more" if len(names) > 50 else "")
    with DAG(
        dag_id=BATCH_DAG_ID,
        schedule=timetable,
        start_date=pendulum.instance(datetime(1970, 1, 1, tzinfo=UTC)).in_timezone(settings.timezone),
        catchup=False,
        max_active_runs=1,  # the ledger read at a run's start is the truth about the runs before it
        # A failed firing is retried by the next window's run (BLOCKED: from that firing), not by
        # running the window again; a lost Spark session is ridden out inside the run.
        default_args={**retry_args, "retries": 0},
        description=f"every firing of {len(names)} continuous queries and PERIOD streams, fused: "
        f"{timetable.description}",
        doc_md=f"The batched form (`CQ_AIRFLOW_FORM`): each run executes the firings due in its window "
        f"of every definition whose own DAG is not paused: {listed}.",
        tags=["cq-engine", "batched"],
    ) as dag:
        PythonOperator(
            task_id="fire",
            python_callable=run_window,
            op_kwargs={"lead_us": timetable.lead // timedelta(microseconds=1)},
            outlets=[AssetAlias(SINKS_ALIAS)],
        )
    return dag
