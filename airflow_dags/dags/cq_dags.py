"""cq-engine's Airflow DAG file: one DAG per continuous query, stream and eKuiper rule of ``CQ_SQL_DIR``
(``airflow_dags.dags.build_dags``). Point Airflow's dags_folder here, or copy this file into it."""

from airflow_dags.dags import build_dags

globals().update(build_dags())
