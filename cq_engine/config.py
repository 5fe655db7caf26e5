"""Engine settings: environment variables over an optional ``cq.toml``, over documented defaults (and,
for the Spark port, the one the running local server recorded in ``CQ_HOME``)."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, fields, replace
from datetime import timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cq_engine.configfile import DEFAULT_HOME, config_path, read_config, state_dir
from cq_engine.durations import parse_duration
from cq_engine.errors import CQError
from cq_engine.names import check_name

DEFAULT_SPARK_PORT = 15002


@dataclass(frozen=True)
class Settings:
    """Every knob of the engine; docs/operations/configuration.md lists them (its table is
    generated from these fields by cq_engine/cli/reference.py)."""

    sql_dir: str = "./sql"
    warehouse: str = "./warehouse"
    spark_remote: str | None = None
    spark_master: str | None = None
    timezone: str = "UTC"
    min_every: str = "1s"
    home: str = DEFAULT_HOME  # project-local state: Spark Connect server pid, logs
    spark_port: int = DEFAULT_SPARK_PORT
    recalculate_chunk_windows: int = 100_000
    trigger_path: str = ""  # where trigger modules are imported from; default: the parent of sql_dir
    # "spark": Delta through Spark's own connector (delta-spark), falling back to "deltars" when its
    # jars are not in the local Maven repository; "deltars": the deltalake package (docs/operations/spark-and-storage.md).
    storage: str = "spark"
    # Under "spark": a Spark result computed from less input than this is collected and committed by
    # delta-rs (a firing's few rows: a Spark write costs several jobs); larger ones, by the executors.
    # 0: the executors write every commit, also results already in Arrow (stream runs).
    spark_write_bytes: int = 16 * 1024 * 1024
    # Dagster health (docs/dagster/health.md): how late a sink may be past its schedule before its
    # freshness policy fails (a definition's `-- cq: freshness_grace` overrides it), and how far back
    # the completeness check compares the firings owed with the ledger, and how often batch runs
    # evaluate it per definition (0s: every run).
    freshness_grace: str = "30s"
    completeness_horizon: str = "1h"
    completeness_every: str = "0s"  # every batch run: each materialization shows its check
    # Housekeeping (docs/operations/housekeeping.md, `cq maintain`): ledger entries older than this are dropped
    # (each definition's newest run is kept); Delta log files (past the newest checkpoint) and data
    # files no longer in the table are deleted once older than theirs; when the Dagster schedule runs.
    ledger_retention: str = "30d"
    # As long as the data files (Delta's own advice: not shorter): an older version's files may be gone
    # already (VACUUM), and a month of a 30 s sink's log is 86,000 files every open lists.
    log_retention: str = "7d"
    file_retention: str = "7d"
    maintenance_cron: str = "0 3 * * *"

    @property
    def tz(self) -> ZoneInfo:
        try:
            return ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise CQError(f"CQ_TIMEZONE: unknown time zone {self.timezone!r}") from None

    @property
    def min_every_delta(self) -> timedelta:
        return parse_duration(self.min_every, what="CQ_MIN_EVERY")

    @property
    def freshness_grace_delta(self) -> timedelta:
        return parse_duration(self.freshness_grace, what="CQ_FRESHNESS_GRACE")

    @property
    def completeness_horizon_delta(self) -> timedelta:
        horizon = parse_duration(self.completeness_horizon, what="CQ_COMPLETENESS_HORIZON")
        if horizon <= timedelta(0):
            raise CQError(f"CQ_COMPLETENESS_HORIZON: expected a positive duration, got {self.completeness_horizon!r}")
        return horizon

    @property
    def completeness_every_delta(self) -> timedelta:
        every = parse_duration(self.completeness_every, what="CQ_COMPLETENESS_EVERY")
        if every < timedelta(0):
            raise CQError(f"CQ_COMPLETENESS_EVERY: expected a duration >= 0, got {self.completeness_every!r}")
        return every

    @property
    def retention(self) -> tuple[timedelta, timedelta, timedelta]:
        """(ledger, Delta log, data file) retention, each at least an hour."""
        values = []
        for name, var in (
            ("ledger_retention", "CQ_LEDGER_RETENTION"),
            ("log_retention", "CQ_LOG_RETENTION"),
            ("file_retention", "CQ_FILE_RETENTION"),
        ):
            value = parse_duration(getattr(self, name), what=var)
            if value < timedelta(hours=1):
                raise CQError(f"{var}: {getattr(self, name)!r} is below the minimum of 1h")
            values.append(value)
        return values[0], values[1], values[2]

    def table_uri(self, table: str) -> str:
        return f"{self.warehouse.rstrip('/')}/{check_name(table, what='table')}"

    def state_uri(self, name: str) -> str:
        """``<warehouse>/_cq/<name>``; each segment of ``name`` (``streams/<stream>/frontier``) follows
        the name rule, so engine state never lands outside ``_cq``."""
        for part in name.split("/"):
            check_name(part, what="engine state path segment")
        return f"{self.warehouse.rstrip('/')}/_cq/{name}"


_ENV = {
    "sql_dir": "CQ_SQL_DIR",
    "warehouse": "CQ_WAREHOUSE",
    "spark_remote": "CQ_SPARK_REMOTE",
    "spark_master": "CQ_SPARK_MASTER",
    "timezone": "CQ_TIMEZONE",
    "min_every": "CQ_MIN_EVERY",
    "home": "CQ_HOME",
    "spark_port": "CQ_SPARK_PORT",
    "recalculate_chunk_windows": "CQ_RECALCULATE_CHUNK_WINDOWS",
    "trigger_path": "CQ_TRIGGER_PATH",
    "storage": "CQ_STORAGE",
    "spark_write_bytes": "CQ_SPARK_WRITE_BYTES",
    "freshness_grace": "CQ_FRESHNESS_GRACE",
    "completeness_horizon": "CQ_COMPLETENESS_HORIZON",
    "completeness_every": "CQ_COMPLETENESS_EVERY",
    "ledger_retention": "CQ_LEDGER_RETENTION",
    "log_retention": "CQ_LOG_RETENTION",
    "file_retention": "CQ_FILE_RETENTION",
    "maintenance_cron": "CQ_MAINTENANCE_CRON",
}
STORAGES = ("spark", "deltars")


def recorded_port_file(home: str | Path) -> Path:
    """Where the local Spark Connect server's port is recorded while it runs (``cq dev`` may have
    picked another than the default because that was taken)."""
    return Path(state_dir(str(home))) / "port"


def _recorded_port(home: str) -> int | None:
    from cq_engine.statefile import read_state

    text = read_state(recorded_port_file(home), what="Spark Connect server port")
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise CQError(f"{recorded_port_file(home)}: expected a port number, got {text.strip()!r}") from None


def load_settings(*, environ: dict[str, str] | None = None, config_file: str | None = None) -> Settings:
    """Defaults, then ``cq.toml`` (``[cq]`` table, keys as field names), then ``CQ_*`` variables."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}  # from TOML (typed by TOML) or the environment (strings)
    path = config_path(env, config_file)
    if os.path.isfile(path):
        try:
            data = read_config(path)
        except tomllib.TOMLDecodeError as exc:
            raise CQError(f"{path}: {exc}") from None
        known = {f.name for f in fields(Settings)}
        for key, value in data.items():
            if key not in known:
                raise CQError(f"{path}: unknown setting {key!r} (known: {', '.join(sorted(known))})")
            values[key] = value
    for name, var in _ENV.items():
        if env.get(var):
            values[name] = env[var]
    for name in ("spark_port", "recalculate_chunk_windows", "spark_write_bytes"):
        if name in values:
            try:
                values[name] = int(values[name])
            except ValueError:
                raise CQError(f"{_ENV[name]}: expected an integer, got {values[name]!r}") from None
    if "spark_port" not in values:  # not configured: the port our running server was started on, if any
        recorded = _recorded_port(str(values.get("home", Settings.home)))
        if recorded is not None:
            values["spark_port"] = recorded
    settings = replace(Settings(), **values)
    if settings.storage not in STORAGES:
        raise CQError(f"CQ_STORAGE: unknown storage {settings.storage!r} (known: {', '.join(STORAGES)})")
    if settings.spark_write_bytes < 0:
        raise CQError(f"CQ_SPARK_WRITE_BYTES: expected a byte count >= 0, got {settings.spark_write_bytes}")
    _ = (
        settings.tz,
        settings.min_every_delta,
        settings.freshness_grace_delta,
        settings.completeness_horizon_delta,
        settings.completeness_every_delta,
        settings.retention,
    )
    if settings.maintenance_cron != Settings.maintenance_cron:
        from croniter import croniter  # only when set: most commands never read a cron string

        if len(settings.maintenance_cron.split()) != 5 or not croniter.is_valid(settings.maintenance_cron):
            raise CQError(f"CQ_MAINTENANCE_CRON: {settings.maintenance_cron!r} is not a 5-field cron expression")
    return settings
