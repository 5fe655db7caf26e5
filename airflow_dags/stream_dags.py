"""``stream_dag``: a window-triggered stream (INTERVAL/SLIDING, SESSION, STATE_WINDOW, EVENT_WINDOW,
COUNT_WINDOW) or eKuiper rule as a DAG scheduled on its trigger table's asset.

The asset (``assets.table_asset``, one per table, shared by every stream of the table) carries the
``DeltaCommitTrigger`` watcher: each new version of the table's Delta log is an asset event, and each
event (or the events queued while a run was active, together) starts one run of every DAG scheduled
on it. The run's task evaluates the stream from its cursor and runs what is due
(``stream_tasks.run_stream_tick``): what the event says only wakes it, the plan is the engine's.
Runs parse nothing heavy: the engine is imported when the task runs."""

from __future__ import annotations

from datetime import UTC, datetime

import pendulum
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

from cq_engine.config import Settings
from cq_engine.model import PeriodTrigger, Stream

from .assets import table_asset
from .stream_tasks import run_stream_tick

TASK_ID = "tick"


def is_window_triggered(definition: object) -> bool:
    """A stream whose runs come from its trigger table's commits (not a PERIOD stream's clock)."""
    return isinstance(definition, Stream) and not isinstance(definition.trigger, PeriodTrigger)


def stream_dag(stream: Stream, *, settings: Settings, retry_args: dict) -> DAG:
    """The stream's DAG: scheduled on its trigger table's asset, one run at a time, one task."""
    table = stream.trigger_source
    sources = sorted({t for t in (table, stream.source) if t})
    what = "eKuiper rule" if stream.form == "ekuiper" else f"{stream.trigger.kind} stream"
    with DAG(
        dag_id=stream.name,
        schedule=[table_asset(table, settings=settings)],
        start_date=pendulum.instance(datetime(1970, 1, 1, tzinfo=UTC)),
        catchup=False,
        # One evaluation at a time: events that arrive meanwhile make one more run, which plans from
        # the cursor this one saved.
        max_active_runs=1,
        # A retry resumes the plan the failed attempt recorded (stream_tasks), never recomputes a
        # committed work.
        default_args=retry_args,
        description=f"{what} {stream.name}: on each commit to {table}",
        doc_md=f"`{stream.location}`\n\n```sql\n{stream.sql}\n```",
        tags=["cq-engine", "stream", "ekuiper" if stream.form == "ekuiper" else stream.trigger.kind],
    ) as dag:
        PythonOperator(
            task_id=TASK_ID,
            python_callable=run_stream_tick,
            op_kwargs={"name": stream.name},
            inlets=[table_asset(t, settings=settings) for t in sources],
            outlets=[table_asset(stream.sink, settings=settings)] if stream.sink else [],
        )
    return dag
