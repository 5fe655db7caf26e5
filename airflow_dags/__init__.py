"""The Airflow adapter: the continuous queries and PERIOD streams of ``CQ_SQL_DIR`` as DAGs, one per
definition, scheduled by :class:`~airflow_dags.timetable.CQTimetable` (registered by the plugin in
``airflow_dags.plugin``). Airflow parses ``airflow_dags/dags/cq_dags.py``; importing this package
imports nothing and writes nothing."""
