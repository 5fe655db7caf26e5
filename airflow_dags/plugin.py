"""The Airflow plugin (entry point ``airflow.plugins``): registers ``CQTimetable``, which Airflow
requires of a custom timetable before it serializes a DAG using it."""

from airflow.plugins_manager import AirflowPlugin

from .timetable import CQTimetable


class CQEnginePlugin(AirflowPlugin):
    name = "cq_engine"
    timetables = [CQTimetable]  # noqa: RUF012 (AirflowPlugin declares it a plain class attribute)
