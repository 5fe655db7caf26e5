"""A translator subclass that renames every per-definition job and sensor (the e2e stack's slow
location loads it through CQ_TRANSLATOR; the CLI must find the renamed objects the same way)."""

from dagster_defs import CQTranslator


class Renamed(CQTranslator):
    def get_job_name(self, definition):
        return f"run_{definition.name}"

    def get_recalculate_job_name(self, definition):
        return f"recalc_{definition.name}"

    def get_sensor_name(self, definition):
        return f"{definition.name}_switch"

    def get_schedule_name(self, definition):
        return f"{definition.name}_cron"
