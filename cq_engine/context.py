"""The engine context: the shared services every execution layer takes (settings, catalog, storage,
Spark, the run ledger, the time-column lookup). ``Engine`` (``cq_engine.engine``) is a thin facade over
the entry points built on one of these; the layers below take the context, never the facade."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from cq_engine.catalog import settings_catalog
from cq_engine.config import Settings
from cq_engine.errors import TableError
from cq_engine.model import Catalog
from cq_engine.storage.base import Storage
from cq_engine.storage.factory import make_storage
from cq_engine.storage.ledger import Ledger

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class RunResult:
    """What one firing, recalculation or stream run did."""

    definition: str
    kind: str
    fire_time: datetime | None
    time_range: tuple[datetime, datetime]
    rows_written: int
    sink_version: int
    source_versions: dict[str, int]
    files_read: int
    files_total: int
    seconds: float
    chunks: int = 1
    notified: int = 0  # events a stream run put in its outbox (NOTIFY)
    ignored: tuple[str, ...] = ()  # what a stream run dropped (TRUE_FOR windows) and why; also in the ledger


@dataclass
class EngineContext:
    """Settings, catalog, storage and ledger, and a Spark session opened on first use (once)."""

    settings: Settings
    catalog: Catalog
    storage: Storage
    ledger: Ledger
    spark_session: Any = field(default=None, repr=False)
    # Tables this context found present (and, if declared, as declared): a batch run asks for its
    # sources and sinks every firing, and on an object store each look at a table costs requests.
    _present: set[str] = field(default_factory=set, repr=False)
    _time_columns: dict[str, str] = field(default_factory=dict, repr=False)  # undeclared tables'

    @classmethod
    def open(
        cls,
        *,
        settings: Settings,
        catalog: Catalog | None = None,
        storage: Storage | None = None,
        spark_session: Any = None,
    ) -> EngineContext:
        """A context with the catalog loaded from ``settings.sql_dir`` and the storage ``CQ_STORAGE``
        chooses (``storage.factory``) under the warehouse unless given."""
        if catalog is None:
            catalog = settings_catalog(settings)
        opened: list[EngineContext] = []  # the storage's writes of Arrow data use this context's session
        if storage is None:
            storage = make_storage(settings, session=lambda: opened[0].spark)
        ctx = cls(
            settings=settings,
            catalog=catalog,
            storage=storage,
            ledger=Ledger(store=storage),
            spark_session=spark_session,
        )
        opened.append(ctx)
        return ctx

    @property
    def spark(self) -> SparkSession:
        if self.spark_session is None:
            from cq_engine.spark import get_session  # pyspark starts slowly: only when a run needs it

            self.spark_session = get_session(self.settings)
        return self.spark_session

    def drop_spark(self) -> None:
        """Forget a Spark session that failed, so the next use opens a new one (``spark.forget_session``)."""
        if self.spark_session is not None:
            from cq_engine.spark import forget_session

            forget_session(self.spark_session)
        self.spark_session = None

    def ensure_tables(self, *names: str) -> list[str]:
        """Create the declared tables among ``names`` (all declared tables if none) that are missing."""
        wanted = {n.lower() for n in names}
        created = []
        for decl in self.catalog.tables:
            key = decl.name.lower()
            if wanted and (key not in wanted or key in self._present):
                continue
            if self.storage.create_table(decl):
                created.append(decl.name)
            self._present.add(key)
        return created

    def source_time_column(self, name: str, source: str, *, sink: str | None, role: str = "source") -> str:
        """Create the declared sink and source if missing; the source's time column. A source that
        exists nowhere is a ``TableError`` naming the definition and the table."""
        if sink:
            self.ensure_tables(sink)
        # Each open of a long Delta log costs: the source is opened once here and once to read.
        if source.lower() not in self._present:
            if not self.storage.exists(source) and not self.ensure_tables(source):
                raise TableError(
                    f"{name}: {role} table {source!r} does not exist (declare it with "
                    f"CREATE TABLE in {self.settings.sql_dir} or load it with `cq ingest`)"
                )
            self._present.add(source.lower())
        return self.time_column(source)

    def time_column(self, table: str) -> str:
        """The event-time column: declared, else ``ts``/``time``, else the first timestamp column."""
        decl = self.catalog.table(table)
        if decl is not None:
            return decl.time_column
        known = self._time_columns.get(table.lower())
        if known is not None:
            return known
        if not self.storage.exists(table):
            raise TableError(
                f"table {table!r} does not exist (declare it with CREATE TABLE in "
                f"{self.settings.sql_dir} or load it with `cq ingest`)"
            )
        schema = self.storage.schema(table)
        names = {f.name.lower(): f.name for f in schema}
        found = next((names[c] for c in ("ts", "time") if c in names), None)
        found = found or next((f.name for f in schema if pa.types.is_timestamp(f.type)), None)
        if found is None:
            raise TableError(f"table {table!r} has no time column (ts, time or a timestamp column)")
        self._time_columns[table.lower()] = found
        return found

    def tables(self) -> list[str]:
        """Delta tables in the warehouse (declared or found on disk), engine state excluded."""
        names = {t.name for t in self.catalog.tables if self.storage.exists(t.name)}
        root = Path(self.settings.warehouse)
        if root.is_dir():
            names |= {p.name for p in root.iterdir() if (p / "_delta_log").is_dir() and not p.name.startswith("_")}
        return sorted(names, key=str.lower)
