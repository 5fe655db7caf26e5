"""Dagster's PostgreSQL storage, waiting out a database that is away for up to ``OUTAGE_SECONDS``
(the Deployment's dagster.yaml: ``storage: custom: {module: dagster_defs.pgstorage, class:
PatientPostgresStorage}``; docs/operations/deployment.md).

dagster-postgres retries a refused connection five times over about six seconds, then raises
(``DagsterPostgresException: too many retries for DB connection``). A PostgreSQL restart takes longer
than that, and every process of the deployment meets it: a run worker whose event cannot be written
fails its run, or dies, and run monitoring fails the run once the database is back; either way a
firing in flight is shown failed for a fault that passed. Here every connection is retried until the
database answers, for up to ``OUTAGE_SECONDS``, every second at most: a run waits for its events to be
written and carries on the moment the database is back, the daemon's ticks resume, and an outage
longer than that fails as before. Statements are not retried (a transaction cut by a stopping server
is rolled back by it, and only the connection is sure to be safe to try again).

Every process gets these classes from dagster.yaml; a run worker, which gets its instance from the
code server, too: the composite's ``*_storage_data`` name the patient classes, not Dagster's.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any, cast

import sqlalchemy
from dagster_postgres import (
    DagsterPostgresStorage,
    PostgresEventLogStorage,
    PostgresRunStorage,
    PostgresScheduleStorage,
)
from dagster_postgres.utils import DagsterPostgresException, get_token_provider_from_config, pg_url_from_config

from .internals import ConfigurableClassData

LOG = logging.getLogger(__name__)
OUTAGE_SECONDS = 180.0  # a database away longer than this fails the call, as dagster-postgres would
MAX_WAIT_SECONDS = 1.0  # between attempts: a database that is back is used within a second
_REFUSED = (sqlalchemy.exc.OperationalError, sqlalchemy.exc.DatabaseError, sqlalchemy.exc.TimeoutError)


def patient_connect(engine: sqlalchemy.engine.Engine, *, outage: float = OUTAGE_SECONDS):
    """``engine.connect()``, tried again (0.2 s, doubling to ``MAX_WAIT_SECONDS``) for ``outage`` seconds."""
    deadline = time.monotonic() + outage
    wait, said = 0.2, False
    while True:
        try:
            return engine.connect()
        except _REFUSED as exc:
            if time.monotonic() + wait > deadline:
                raise
            if not said:  # once per outage and call, not once per attempt
                LOG.warning("PostgreSQL does not answer; waiting up to %.0f s for it: %s", outage, exc)
                said = True
        time.sleep(wait)
        wait = min(wait * 2, MAX_WAIT_SECONDS)


@contextlib.contextmanager
def patient_connection(engine: sqlalchemy.engine.Engine) -> Iterator[sqlalchemy.engine.Connection]:
    conn = patient_connect(engine)
    try:
        yield conn
    finally:
        conn.close()


def await_database(postgres_url: str, *, outage: float = OUTAGE_SECONDS) -> None:
    """Wait until the database answers: a storage's construction reads its tables through
    dagster-postgres' own retries (six seconds), and a run's process (or a step's) may start while the
    database is away."""
    engine = sqlalchemy.create_engine(postgres_url, poolclass=sqlalchemy.pool.NullPool)
    try:
        patient_connect(engine, outage=outage).close()
    finally:
        engine.dispose()


class _Patient:
    """Waits for the database before Dagster's constructor reads the storage's tables, and again if it
    went away in between (the constructor's own retries last six seconds)."""

    def __init__(self, postgres_url: str, *args, **kwargs):
        deadline = time.monotonic() + OUTAGE_SECONDS
        while True:
            await_database(postgres_url, outage=max(0.0, deadline - time.monotonic()))
            try:
                cast(Any, super()).__init__(postgres_url, *args, **kwargs)  # the storage class after this one
                return
            except (*_REFUSED, DagsterPostgresException):
                if time.monotonic() >= deadline:
                    raise


def _from_config(cls, inst_data, config_value):
    """Each class's ``from_config_value``: dagster-postgres' names its own class, not ``cls``."""
    return cls(
        inst_data=inst_data,
        postgres_url=pg_url_from_config(config_value),
        should_autocreate_tables=config_value.get("should_autocreate_tables", True),
        token_provider=get_token_provider_from_config(config_value),
    )


class PatientRunStorage(_Patient, PostgresRunStorage):
    from_config_value = classmethod(_from_config)

    def connect(self):
        return patient_connection(self._engine)


class PatientEventLogStorage(_Patient, PostgresEventLogStorage):
    from_config_value = classmethod(_from_config)

    def _connect(self):
        return patient_connection(self._engine)


class PatientScheduleStorage(_Patient, PostgresScheduleStorage):
    from_config_value = classmethod(_from_config)

    def connect(self, run_id: str | None = None):
        return patient_connection(self._engine)


class PatientPostgresStorage(DagsterPostgresStorage):
    """``DagsterPostgresStorage`` (same configuration) made of the patient storages above."""

    def __init__(
        self,
        postgres_url: str,
        should_autocreate_tables: bool = True,
        inst_data: ConfigurableClassData | None = None,
        token_provider=None,
    ):
        # Not DagsterPostgresStorage.__init__: it would build (and connect) Dagster's own three first.
        self.postgres_url = postgres_url
        self.should_autocreate_tables = should_autocreate_tables
        self._inst_data = inst_data
        self._run_storage = PatientRunStorage(postgres_url, should_autocreate_tables, token_provider=token_provider)
        self._event_log_storage = PatientEventLogStorage(
            postgres_url, should_autocreate_tables, token_provider=token_provider
        )
        self._schedule_storage = PatientScheduleStorage(
            postgres_url, should_autocreate_tables, token_provider=token_provider
        )
        super(DagsterPostgresStorage, self).__init__()

    from_config_value = classmethod(_from_config)

    def _data(self, name: str) -> ConfigurableClassData | None:
        return ConfigurableClassData(__name__, name, self.inst_data.config_yaml) if self.inst_data else None

    @property
    def event_storage_data(self) -> ConfigurableClassData | None:
        return self._data(PatientEventLogStorage.__name__)

    @property
    def run_storage_data(self) -> ConfigurableClassData | None:
        return self._data(PatientRunStorage.__name__)

    @property
    def schedule_storage_data(self) -> ConfigurableClassData | None:
        return self._data(PatientScheduleStorage.__name__)
