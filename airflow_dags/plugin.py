"""The Airflow plugin (entry point ``airflow.plugins``): registers ``CQTimetable``, which Airflow
requires of a custom timetable before it serializes a DAG using it, and the batched form's
``WindowTimetable``."""

from airflow.plugins_manager import AirflowPlugin

from .timetable import CQTimetable, WindowTimetable


class CQEnginePlugin(AirflowPlugin):
    name = "cq_engine"
    timetables = [CQTimetable, WindowTimetable]  # noqa: RUF012 (AirflowPlugin declares it a plain class attribute)
