"""The one resource ops use: cq-engine's configuration, and Spark through dagster-pyspark."""

from __future__ import annotations

import dagster as dg
from dagster_pyspark import PySparkResource
from pydantic import Field, PrivateAttr

from cq_engine.catalog import parse_options, settings_catalog
from cq_engine.config import Settings, load_settings
from cq_engine.engine import Engine
from cq_engine.model import Catalog
from cq_engine.parse import sql_files
from cq_engine.recovery import RECONNECT_SECONDS
from cq_engine.spark import (
    BASE_CONF,
    await_server,
    bound_retries,
    client_url,
    default_connect_session,
    drop_inherited_mode,
    get_session,
    in_process_notice,
    release_session,
    server_expected,
    server_status,
)


class CQEngineResource(dg.ConfigurableResource):
    """Where the definitions and tables live; defaults come from the ``CQ_*`` environment."""

    sql_dir: str = Field(description="Directory of the .sql definitions (CQ_SQL_DIR).")
    warehouse: str = Field(description="Warehouse root: Delta tables at <warehouse>/<table> (CQ_WAREHOUSE).")
    timezone: str = Field(default="UTC", description="Zone for times without offset and schedules (CQ_TIMEZONE).")
    min_every: str = Field(default="1s", description="Smallest RESAMPLE EVERY allowed (CQ_MIN_EVERY).")
    home: str = Field(default="./.cq", description="Engine state directory (CQ_HOME).")

    @classmethod
    def from_settings(cls, settings: Settings) -> CQEngineResource:
        return cls(
            sql_dir=settings.sql_dir,
            warehouse=settings.warehouse,
            timezone=settings.timezone,
            min_every=settings.min_every,
            home=settings.home,
        )

    def settings(self) -> Settings:
        base = load_settings()
        return Settings(
            **{
                **base.__dict__,
                "sql_dir": self.sql_dir,
                "warehouse": self.warehouse,
                "timezone": self.timezone,
                "min_every": self.min_every,
                "home": self.home,
            }
        )

    def engine(self, spark) -> Engine:
        settings = self.settings()
        return Engine(settings=settings, catalog=cached_catalog(settings), spark_session=spark)


_CATALOGS: dict[tuple, Catalog] = {}


def cached_catalog(settings: Settings) -> Catalog:
    """The catalog of ``settings.sql_dir``, parsed once per process for the same file contents: a
    run loads the code location and then builds its engine from the same files."""
    import hashlib

    digest = hashlib.sha1()
    for file in sql_files(settings.sql_dir):
        digest.update(str(file).encode() + b"\0" + file.read_bytes() + b"\0")
    options = parse_options(settings)
    key = (str(settings.sql_dir), repr(options), digest.hexdigest())
    if key not in _CATALOGS:
        _CATALOGS.clear()  # one sql dir per process: keep only the current contents
        _CATALOGS[key] = settings_catalog(settings)  # a failing file keeps its last good version
    return _CATALOGS[key]


class CQPySparkResource(PySparkResource):
    """dagster-pyspark's resource, saying in the run's log (a warning) when the run opens an
    in-process session only because the engine's local Spark Connect server was not running."""

    in_process_notice: str = Field(default="", description="Why this run's session is in-process (empty: chosen).")
    server_home: str = Field(
        default="", description="CQ_HOME of a Connect server that crashed and is expected back (empty: none)."
    )
    server_port: int = Field(default=0, description="That server's port.")
    _opened_session: bool = PrivateAttr(default=False)

    @classmethod
    def _is_dagster_maintained(cls) -> bool:
        return False

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # A run is a child of the code server, whose cq_streams sensor holds a Connect session: its
        # pyspark mode variables would make this run's classic builder demand a Connect URL
        # (CONNECT_URL_NOT_SET: every run failed while the Connect server was down).
        drop_inherited_mode()
        before = default_connect_session()
        if self.server_home and self._await_server(context):
            # Its crashed server is back (same token): the run uses it, not a JVM of its own.
            self._spark_session = get_session(self._server_settings())  # type: ignore[assignment]
        else:
            if self.in_process_notice and context.log is not None:
                context.log.warning(f"this run starts an in-process Spark session: {self.in_process_notice}")
            super().setup_for_execution(context)
        bound_retries(self.spark_session)  # a lost Connect server fails a call in about 12 s: the rounds recover it
        # A run worker opens its own session; a process that already had one (a test, an in-process
        # job) goes on using it after the run.
        self._opened_session = self.spark_session is not before

    def _server_settings(self) -> Settings:
        return Settings(**{**load_settings().__dict__, "home": self.server_home, "spark_port": self.server_port})

    def _await_server(self, context: dg.InitResourceContext) -> bool:
        """Wait (at most ``RECONNECT_SECONDS``) for the crashed server to run again; True once it does."""
        settings = self._server_settings()
        if context.log is not None:
            context.log.info(
                f"the Spark Connect server on port {self.server_port} is starting again: "
                f"this run waits for it (at most {RECONNECT_SECONDS:.0f} s)"
            )
        return await_server(settings, RECONNECT_SECONDS)

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._opened_session:
            release_session(self.spark_session)  # or the server keeps it, and its plans, for an hour
        super().teardown_after_execution(context)


def pyspark_resource(settings: Settings) -> CQPySparkResource:
    """dagster-pyspark's resource: Spark Connect (remote or the engine's own server) or classic."""
    conf: dict[str, str] = dict(BASE_CONF)
    remote: str | None = settings.spark_remote
    notice = ""
    expected = False
    if remote is None and settings.spark_master is None:
        status = server_status(settings)
        remote = client_url(settings) if status.running else None
        notice = "" if status.running else in_process_notice(settings)
        expected = not status.running and server_expected(settings)
    if remote:
        conf = {"spark.remote": remote}
    else:
        conf["spark.master"] = settings.spark_master or "local[*]"
    return CQPySparkResource(
        spark_config=conf,
        in_process_notice=notice,
        server_home=settings.home if expected else "",
        server_port=settings.spark_port if expected else 0,
    )
