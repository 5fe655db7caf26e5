"""The facade every entry point (CLI, Dagster ops, benchmarks) calls: fire, tick, recalculate, ingest,
query, stream runs. It holds an :class:`~cq_engine.context.EngineContext` and dispatches to the layers
(``resample.run``, ``streams.run``, ``ingest``), which take that context, never the facade."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from cq_engine.catalog import require_definition
from cq_engine.config import Settings
from cq_engine.context import EngineContext, RunResult
from cq_engine.errors import CQError, reported
from cq_engine.model import Catalog, ContinuousQuery, Definition, PeriodTrigger, Stream
from cq_engine.resample import run as resample_run
from cq_engine.resample import timing
from cq_engine.resample.run import Progress
from cq_engine.resample.timing import Firing
from cq_engine.schedule.ticks import Ticks, ticks_of
from cq_engine.storage.base import Storage
from cq_engine.storage.ledger import Ledger
from cq_engine.times import UTC

if TYPE_CHECKING:  # imported where used: a `cq run` of a continuous query needs neither (docs/cli.md)
    import pyarrow as pa

    from cq_engine.storage.maintain import TableReport
    from cq_engine.streams.timing import StreamWork

__all__ = ["Engine", "RunResult"]


class Engine:
    """Entry points over one engine context (``ctx``); its services are readable here too."""

    def __init__(
        self,
        settings: Settings,
        catalog: Catalog | None = None,
        storage: Storage | None = None,
        spark_session: Any = None,
    ):
        self.ctx = EngineContext.open(settings=settings, catalog=catalog, storage=storage, spark_session=spark_session)

    # -- the context's services ----------------------------------------------------------------
    @property
    def settings(self) -> Settings:
        return self.ctx.settings

    @property
    def catalog(self) -> Catalog:
        return self.ctx.catalog

    @property
    def storage(self) -> Storage:
        return self.ctx.storage

    @property
    def ledger(self) -> Ledger:
        return self.ctx.ledger

    @property
    def spark(self):
        return self.ctx.spark

    @property
    def spark_session(self) -> Any:
        return self.ctx.spark_session

    def ensure_tables(self, *names: str) -> list[str]:
        return self.ctx.ensure_tables(*names)

    def time_column(self, table: str) -> str:
        return self.ctx.time_column(table)

    def source_time_column(self, name: str, source: str, *, sink: str | None, role: str = "source") -> str:
        return self.ctx.source_time_column(name, source, sink=sink, role=role)

    def tables(self) -> list[str]:
        return self.ctx.tables()

    # -- definitions ---------------------------------------------------------------------------
    def definition(self, name: str) -> Definition:
        return require_definition(self.catalog, name, sql_dir=self.settings.sql_dir)

    def continuous_query(self, name: str) -> ContinuousQuery:
        d = self.definition(name)
        if not isinstance(d, ContinuousQuery):
            raise CQError(
                f"{d.name!r} is a stream, not a continuous query: its runs come from its "
                f"{'schedule' if isinstance(d.trigger, PeriodTrigger) else 'sensor'} (`cq tick {d.name}`)"
            )
        return d

    def stream(self, name: str) -> Stream:
        d = self.definition(name)
        if not isinstance(d, Stream):
            raise CQError(f"{d.name!r} is a continuous query, not a stream")
        return d

    # -- entry points --------------------------------------------------------------------------
    def run_firing(self, name: str, fire_time: datetime, *, once: bool = False) -> RunResult:
        """Execute the firing of ``name`` scheduled at ``fire_time`` (must be one of its firing times);
        ``once``: ``AlreadyCommitted`` where its sink holds it already (``resample.run.run_firing``)."""
        cq = self.continuous_query(name)
        with reported(cq.name, cq.location):
            return resample_run.run_firing(self.ctx, cq, fire_time, once=once)

    def recalculate(
        self,
        name: str,
        *,
        start: datetime,
        end: datetime | None = None,
        now: datetime | None = None,
        progress: Progress | None = None,
    ) -> RunResult:
        """Recompute every firing whose range lies in ``[start, end)`` (end: the latest firing by ``now``);
        for a stream, every closed window holding event time in ``[start, end)`` (RECALCULATE STREAM)."""
        d = self.definition(name)
        with reported(d.name, d.location):
            if isinstance(d, Stream):
                from cq_engine.streams import run as stream_run

                return stream_run.recalculate_stream(self.ctx, d, start=start, end=end, now=now or datetime.now(UTC))
            return resample_run.recalculate(self.ctx, d, start=start, end=end, now=now, progress=progress)

    def ingest(self, table: str, path: str) -> tuple[int, int]:
        """Append a CSV / JSON-lines / Parquet file to ``table`` in one commit, through its BEFORE
        INSERT triggers (``ingest.ingest``): (version, rows)."""
        from cq_engine.ingest import ingest

        result = ingest(table=table, data=path, ctx=self.ctx)
        return result.version, result.rows

    def query(self, sql: str, *, limit: int = 1000, allow_writes: bool = False) -> pa.Table:
        """Run Spark SQL with the warehouse tables it names (and ``cq_firings``, the ledger) as views;
        only a read (``parse.safety.check_read_only``) unless ``allow_writes``."""
        from cq_engine.parse.safety import check_read_only, table_names

        if not allow_writes:
            check_read_only(sql)
        named = table_names(sql)  # each view costs a snapshot read: only the tables the query names
        for table in self.tables():
            if named is None or table.lower() in named:
                df, _ = self.storage.read_range(self.spark, table, time_column=self.time_column(table), time_range=None)
                df.createOrReplaceTempView(table)
        if named is None or "cq_firings" in named:
            self.spark.createDataFrame(self.ledger.to_arrow()).createOrReplaceTempView("cq_firings")
        try:
            return self.spark.sql(sql).limit(limit).toArrow()
        except Exception as exc:  # Spark's analysis errors are long; the first line names the problem
            raise CQError(f"query failed: {str(exc).strip().splitlines()[0]}") from None

    def maintain(self, *, now: datetime | None = None, sources: bool = False) -> list[TableReport]:
        """Housekeeping of the ledger, the engine state tables and the sinks (``housekeeping.maintain``)."""
        from cq_engine.housekeeping import maintain

        return maintain(self.ctx, now=now or datetime.now(UTC), sources=sources)

    def run_stream(self, name: str, work: StreamWork) -> RunResult:
        """Execute one run a stream's sensor requested."""
        from cq_engine.streams import run as stream_run

        stream = self.stream(name)
        with reported(stream.name, stream.location):
            return stream_run.run_work(self.ctx, stream, work)

    def run_period(self, name: str, tick: datetime, *, once: bool = False) -> RunResult:
        """Execute a PERIOD stream's tick (``once``: ``streams.run.run_period``'s)."""
        stream = self.stream(name)
        if not isinstance(stream.trigger, PeriodTrigger):
            raise CQError(f"{name!r} is not a PERIOD stream: its runs come from its sensor (`cq tick {name}`)")
        from cq_engine.streams import run as stream_run

        with reported(stream.name, stream.location):
            return stream_run.run_period(self.ctx, stream, tick, ticks=self.ticks(name, now=tick), once=once)

    def ticks(self, name: str, *, now: datetime) -> Ticks:
        """The firing instants of a continuous query or a PERIOD stream; a PERIOD stream's are anchored
        at its creation, recorded the first time it is asked for."""
        d = self.definition(name)
        created = now
        if isinstance(d, Stream):
            from cq_engine.streams import run as stream_run

            created = stream_run.stream_created(self.ctx, d, now=now)
        return ticks_of(d, timezone=self.settings.timezone, created=created)

    def firing(self, name: str, fire_time: datetime) -> Firing:
        cq = self.continuous_query(name)
        return timing.check_firing_time(cq.name, cq.resample, fire_time)
