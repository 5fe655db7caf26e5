"""``build_dags``: every continuous query, stream and eKuiper rule of ``CQ_SQL_DIR`` as a DAG of one
task (window-triggered streams and rules: ``stream_dags``, scheduled on their trigger table's asset);
in the batched form (``CQ_AIRFLOW_FORM``, ``batch``) the continuous queries and PERIOD streams fire
in the one DAG ``cq_firings``, their own DAGs unscheduled.

Runs when Airflow parses the DAG file, so it imports no Spark, Dagster or Delta code and writes
nothing but the catalog's last good versions (``cq_engine.lastgood``, as the Dagster location does).
A ``.sql`` file that fails to load becomes Airflow's import error of the DAG file (through one
stand-in DAG whose validation fails with every ``file:line:col`` message); the other DAGs load."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pendulum
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

from cq_engine.catalog import settings_catalog
from cq_engine.config import Settings, load_settings
from cq_engine.errors import CQError
from cq_engine.model import Definition

from .assets import table_asset
from .batch import BATCH_DAG_ID, airflow_form, batch_dag, batch_timetable
from .stream_dags import is_window_triggered, stream_dag
from .tasks import run_firing
from .timetable import CQTimetable, ticked_definitions, timetable_of

ERROR_DAG_ID = "cq_load_errors"
# Each firing is an idempotent replace of its range: a retry after a lost Spark connection is safe.
RETRY_ARGS = {"retries": 3, "retry_delay": timedelta(seconds=2), "retry_exponential_backoff": 2.0}


class SqlLoadError(Exception):
    """One or more ``.sql`` files of ``CQ_SQL_DIR`` did not load (one ``file:line:col: message`` a line)."""


class LoadErrorDag(DAG):
    """Stands in for the definitions that did not load: Airflow validates each DAG of a file before it
    keeps it, and records a failing one as the file's import error without dropping the others."""

    def validate(self) -> None:
        raise SqlLoadError(self.description)


def build_dags(*, settings: Settings | None = None) -> dict[str, DAG]:
    """DAG id -> DAG for every definition; a stand-in ``cq_load_errors`` when
    a file (or the directory) failed to load."""
    settings = settings or load_settings()
    errors: list[str] = []
    dags: dict[str, DAG] = {}
    try:
        catalog = settings_catalog(settings)
    except CQError as exc:  # the sql directory itself is unusable
        errors.append(str(exc))
    else:
        errors += [f"{e}; {e.consequence()}" for e in catalog.errors]
        timetables: dict[str, CQTimetable] = {}
        for definition in ticked_definitions(catalog.definitions):
            try:
                timetable = timetable_of(definition, timezone=settings.timezone)
            except CQError as exc:
                errors.append(str(exc))
            else:
                if timetable is not None:
                    timetables[definition.name] = timetable
        try:
            batched = bool(timetables) and airflow_form(list(timetables.values())) == "batched"
            if batched:
                if BATCH_DAG_ID in {d.name for d in catalog.definitions}:
                    raise CQError(f"a definition named {BATCH_DAG_ID!r} would be the batched form's DAG: rename it")
                window = batch_timetable(list(timetables.values()), timezone=settings.timezone)
                dags[BATCH_DAG_ID] = batch_dag(list(timetables), window, settings=settings, retry_args=RETRY_ARGS)
        except CQError as exc:
            errors.append(str(exc))
            batched = False
        for definition in catalog.definitions:
            if definition.name not in timetables and not is_window_triggered(definition):
                continue  # no DAG (a PERIOD of a day or more: its error is above)
            try:
                dag = build_dag(
                    definition, settings=settings, timetable=timetables.get(definition.name), batched=batched
                )
            except CQError as exc:
                errors.append(str(exc))
            else:
                if dag is not None:
                    dags[dag.dag_id] = dag
    if errors:
        dags[ERROR_DAG_ID] = LoadErrorDag(dag_id=ERROR_DAG_ID, schedule=None, description="\n".join(errors))
    return dags


def build_dag(
    definition: Definition, *, settings: Settings, timetable: CQTimetable | None = None, batched: bool = False
) -> DAG | None:
    """The definition's DAG: by its timetable, or (a window-triggered stream) on its trigger table.
    ``batched`` (the batched form, ``airflow_dags.batch``): it fires in ``cq_firings``, and its own
    DAG keeps the timetable unscheduled, for backfills and manual runs, and as its switch."""
    if is_window_triggered(definition):
        return stream_dag(definition, settings=settings, retry_args=RETRY_ARGS)  # type: ignore[arg-type]
    timetable = timetable or timetable_of(definition, timezone=settings.timezone)
    if timetable is None:
        return None
    if batched:
        timetable = timetable.unscheduled()
    blocked = definition.timeout_policy == "BLOCKED"
    sources = sorted({t for t in (definition.source, getattr(definition, "trigger_table", None)) if t})
    with DAG(
        dag_id=definition.name,
        schedule=timetable,
        # Only a bound: the first run is the first firing at or after the DAG is first scheduled.
        start_date=pendulum.instance(datetime(1970, 1, 1, tzinfo=UTC)).in_timezone(settings.timezone),
        # BLOCKED: every firing, one at a time, in order, none before the one before it succeeded;
        # DISCARD: one at a time, what came due meanwhile skipped (CQTimetable without catchup).
        catchup=blocked,
        max_active_runs=1,
        default_args={**RETRY_ARGS, "depends_on_past": blocked},
        description=f"{definition.kind} {definition.name}: {timetable.description}, {definition.timeout_policy}",
        doc_md=f"`{definition.location}`\n\n```sql\n{definition.sql}\n```",
        tags=["cq-engine", definition.kind, *(["batched"] if batched else [])],
    ) as dag:
        PythonOperator(
            task_id="fire",
            python_callable=run_firing,
            op_kwargs={"name": definition.name, "lag_us": timetable.lag // timedelta(microseconds=1)},
            inlets=[table_asset(t, settings=settings) for t in sources],
            outlets=[table_asset(definition.sink, settings=settings)] if definition.sink else [],
        )
    return dag
