"""run: execute firings and recalculations: snapshot read → plan → one atomic range replace → ledger.

A run's output is a pure function of (definition, coverage, source version), so running it again —
after a crash, or twice — leaves the sink exactly as one run does.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Iterator

import pyarrow as pa

from cq_engine.resample import timing
from cq_engine.catalog import load_catalog, parse_options, require_definition
from cq_engine.config import Settings
from cq_engine.durations import micros
from cq_engine.errors import CQError, TableError
from cq_engine.storage.ledger import Ledger, LedgerEntry
from cq_engine.model import Catalog, ContinuousQuery, Definition, PeriodTrigger, Stream
from cq_engine.resample.plan import check_columns, plan_query
from cq_engine.storage.base import Scan, Storage
from cq_engine.storage.delta import DeltaRsStorage
from cq_engine.times import EPOCH, UTC
from cq_engine.resample.timing import Coverage, Firing

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class RunResult:
    """What one firing or recalculation did."""

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


@dataclass
class Engine:
    """The library every entry point (CLI, Dagster ops, benchmarks) calls."""

    settings: Settings
    catalog: Catalog | None = None
    storage: Storage | None = None
    spark_session: object | None = None
    _ledger: Ledger | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.catalog is None:
            self.catalog = load_catalog(self.settings.sql_dir, options=parse_options(self.settings))
        if self.storage is None:
            self.storage = DeltaRsStorage(warehouse=self.settings.warehouse)

    # -- plumbing ------------------------------------------------------------------------------
    @property
    def spark(self):
        if self.spark_session is None:
            from cq_engine.spark import get_session

            self.spark_session = get_session(self.settings)
        return self.spark_session

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            self._ledger = Ledger(uri=self.settings.state_uri("firings"))
        return self._ledger

    def definition(self, name: str) -> Definition:
        return require_definition(self.catalog, name, sql_dir=self.settings.sql_dir)

    def continuous_query(self, name: str) -> ContinuousQuery:
        d = self.definition(name)
        if not isinstance(d, ContinuousQuery):
            raise CQError(f"{d.name!r} is a stream, not a continuous query: its runs come from its "
                          f"{'schedule' if isinstance(d.trigger, PeriodTrigger) else 'sensor'} (`cq tick {d.name}`)")
        return d

    def stream(self, name: str) -> Stream:
        d = self.definition(name)
        if not isinstance(d, Stream):
            raise CQError(f"{d.name!r} is a continuous query, not a stream")
        return d

    def ensure_tables(self, *names: str) -> list[str]:
        """Create the declared tables among ``names`` (all declared tables if none) that are missing."""
        wanted = {n.lower() for n in names}
        created = []
        for decl in self.catalog.tables:
            if wanted and decl.name.lower() not in wanted:
                continue
            if self.storage.create_table(decl):
                created.append(decl.name)
        return created

    def source_time_column(self, name: str, source: str, *, sink: str | None, role: str = "source") -> str:
        """Create the declared sink and source if missing; the source's time column. A source that
        exists nowhere is a ``TableError`` naming the definition and the table."""
        if sink:
            self.ensure_tables(sink)
        # Each open of a long Delta log costs: the source is opened once here and once to read.
        if not self.storage.exists(source) and not self.ensure_tables(source):
            raise TableError(f"{name}: {role} table {source!r} does not exist (declare it with "
                             f"CREATE TABLE in {self.settings.sql_dir} or load it with `cq ingest`)")
        return self.time_column(source)

    def time_column(self, table: str) -> str:
        """The event-time column: declared, else ``ts``/``time``, else the first timestamp column."""
        decl = self.catalog.table(table)
        if decl is not None:
            return decl.time_column
        if not self.storage.exists(table):
            raise TableError(f"table {table!r} does not exist (declare it with CREATE TABLE in "
                             f"{self.settings.sql_dir} or load it with `cq ingest`)")
        schema = self.storage.schema(table)
        names = {f.name.lower(): f.name for f in schema}
        for candidate in ("ts", "time"):
            if candidate in names:
                return names[candidate]
        ts = next((f.name for f in schema if pa.types.is_timestamp(f.type)), None)
        if ts is None:
            raise TableError(f"table {table!r} has no time column (ts, time or a timestamp column)")
        return ts

    # -- entry points --------------------------------------------------------------------------
    def run_firing(self, name: str, fire_time: datetime) -> RunResult:
        """Execute the firing of ``name`` scheduled at ``fire_time`` (must be one of its firing times)."""
        cq = self.continuous_query(name)
        firing = timing.check_firing_time(cq.name, cq.resample, fire_time)
        return self._execute(cq, [firing.fire_time], kind="firing", app_version=micros(firing.fire_time - EPOCH))

    def recalculate(self, name: str, *, start: datetime, end: datetime | None = None, now: datetime | None = None,
                    progress: Progress | None = None) -> RunResult:
        """Recompute every firing whose range lies in ``[start, end)`` (end: the latest firing by ``now``);
        for a stream, every closed window holding event time in ``[start, end)`` (RECALCULATE STREAM)."""
        if isinstance(self.definition(name), Stream):
            from cq_engine.streams.run import recalculate_stream

            return recalculate_stream(self, self.stream(name), start=start, end=end, now=now or datetime.now(UTC))
        cq = self.continuous_query(name)
        r = cq.resample
        if end is None:
            latest = timing.latest_firing(r, now=now or datetime.now(UTC))
            if latest is None:
                raise CQError(f"recalculate: {name!r} has not fired yet (first firing {r.boundary.isoformat()})")
            end = timing.time_range(r, latest)[1]
        fires, _ = timing.recalculation_range(r, start=start, end=end)
        return self._execute(cq, fires, kind="recalculate", app_version=micros(end - EPOCH), progress=progress)

    def ingest(self, table: str, path: str) -> tuple[int, int]:
        """Append a CSV / JSON-lines / Parquet file to ``table`` in one commit, through its BEFORE
        INSERT triggers (``ingest.ingest``): (version, rows)."""
        from cq_engine.ingest import ingest

        result = ingest(table=table, data=path, engine=self)
        return result.version, result.rows

    def tables(self) -> list[str]:
        """Delta tables in the warehouse (declared or found on disk), engine state excluded."""
        from pathlib import Path

        names = {t.name for t in self.catalog.tables if self.storage.exists(t.name)}
        root = Path(self.settings.warehouse)
        if root.is_dir():
            names |= {p.name for p in root.iterdir() if (p / "_delta_log").is_dir() and not p.name.startswith("_")}
        return sorted(names, key=str.lower)

    def query(self, sql: str, *, limit: int = 1000) -> pa.Table:
        """Run Spark SQL with every warehouse table (and ``cq_firings``, the ledger) as a view."""
        for table in self.tables():
            df, _ = self.storage.read_range(self.spark, table, time_column=self.time_column(table), time_range=None)
            df.createOrReplaceTempView(table)
        self.spark.createDataFrame(self.ledger.to_arrow()).createOrReplaceTempView("cq_firings")
        try:
            return self.spark.sql(sql).limit(limit).toArrow()
        except Exception as exc:  # Spark's analysis errors are long; the first line names the problem
            raise CQError(f"query failed: {str(exc).strip().splitlines()[0]}") from None

    def run_stream(self, name: str, work) -> RunResult:
        """Execute one run a stream's sensor requested (a ``stream_timing.StreamWork``)."""
        from cq_engine.streams.run import run_work

        return run_work(self, self.stream(name), work)

    def run_period(self, name: str, tick: datetime) -> RunResult:
        """Execute a PERIOD stream's tick."""
        from cq_engine.streams.run import run_period

        stream = self.stream(name)
        if not isinstance(stream.trigger, PeriodTrigger):
            raise CQError(f"{name!r} is not a PERIOD stream: its runs come from its sensor (`cq tick {name}`)")
        return run_period(self, stream, tick, ticks=self.ticks(name, now=tick))

    def ticks(self, name: str, *, now: datetime):
        """The firing instants of a continuous query or a PERIOD stream (``ticks.Ticks``); a PERIOD
        stream's are anchored at its creation, recorded the first time it is asked for."""
        from cq_engine.streams.run import stream_created
        from cq_engine.schedule.ticks import ticks_of

        d = self.definition(name)
        created = stream_created(self, d, now=now) if isinstance(d, Stream) else now
        return ticks_of(d, timezone=self.settings.timezone, created=created)

    def firing(self, name: str, fire_time: datetime) -> Firing:
        cq = self.continuous_query(name)
        return timing.check_firing_time(cq.name, cq.resample, fire_time)

    # -- the one execution path ----------------------------------------------------------------
    def _coverages(self, cq: ContinuousQuery, fires: list[datetime]) -> list[Coverage]:
        r = cq.resample
        step = cq.time_grouping.step if cq.time_grouping else r.every
        per_firing_windows = max(1, micros(r.start_offset - r.end_offset) // micros(step))
        # Firings on different window grids cannot share one grid: then each firing is its own chunk.
        size = max(1, self.settings.recalculate_chunk_windows // per_firing_windows)
        if micros(r.every) % micros(step):
            size = 1
        chunks = timing.chunk_firings(fires, size=size)
        out = []
        for i, chunk in enumerate(chunks):
            nxt = timing.time_range(r, chunks[i + 1][0])[0] if i + 1 < len(chunks) else None
            out.append(timing.coverage_of(r, chunk, emit_end=nxt))
        return out

    def _execute(self, cq: ContinuousQuery, fires: list[datetime], *, kind: str, app_version: int,
                 progress: Progress | None = None) -> RunResult:
        self.spark  # a session start is not part of the run's cost
        started, clock = datetime.now(UTC), time.perf_counter()
        coverages = self._coverages(cq, fires)
        whole = (coverages[0].start, coverages[-1].end)
        fire_time = fires[0] if kind == "firing" else None
        versions: dict[str, int] = {}
        try:
            time_column = self.source_time_column(cq.name, cq.source, sink=cq.sink)
            version = self.storage.version(cq.source)
            versions = {cq.source: version}
            scans: list[Scan] = []
            batches = self._compute(cq, coverages, time_column, version, scans, progress)
            first = next(batches)
            reader = pa.RecordBatchReader.from_batches(first.schema, _chain(first, batches, first.schema))
            counted = _Counter(reader)
            _failpoint("before-commit")
            sink_version = self.storage.replace_range(
                cq.sink, counted.reader(), time_column=time_column, time_range=whole,
                app_id=f"cq-engine/{cq.name}/{kind}", app_version=app_version,
                metadata={"cq.definition": cq.name, "cq.kind": kind,
                          "cq.range_start": whole[0].isoformat(), "cq.range_end": whole[1].isoformat()},
            )
        except Exception as exc:
            self.ledger.record(LedgerEntry(
                definition=cq.name, kind=kind, fire_time=fire_time, range_start=whole[0], range_end=whole[1],
                source_versions=versions, rows_written=0, sink_version=None, status="failed",
                started_at=started, finished_at=datetime.now(UTC), error=str(exc)[:2000]))
            raise
        result = RunResult(
            definition=cq.name, kind=kind, fire_time=fire_time, time_range=whole, rows_written=counted.rows,
            sink_version=sink_version, source_versions=versions,
            files_read=sum(s.files_read for s in scans), files_total=max((s.files_total for s in scans), default=0),
            seconds=time.perf_counter() - clock, chunks=len(coverages))
        self.ledger.record(LedgerEntry(
            definition=cq.name, kind=kind, fire_time=fire_time, range_start=whole[0], range_end=whole[1],
            source_versions=versions, rows_written=counted.rows, sink_version=sink_version,
            status="succeeded", started_at=started, finished_at=datetime.now(UTC)))
        return result

    def _compute(self, cq, coverages, time_column, version, scans, progress) -> Iterator[pa.RecordBatch]:
        """One Spark job per coverage chunk, streamed as Arrow batches (the first chunk yields a
        schema batch even when empty, so the sink can be created from it)."""
        # Every scan is planned before the stream starts: delta-rs consumes the stream on its own
        # runtime, from which the Delta log cannot be read again.
        plans = []
        for cov in coverages:
            df, scan = self.storage.read_range(self.spark, cq.source, time_column=time_column,
                                               time_range=cov.read_range, version=version)
            scans.append(scan)
            check_columns(cq, df.columns, table=cq.source)
            plans.append(plan_query(self.spark, cq, df, time_column=time_column, coverage=cov))
        return self._stream(plans, progress)

    @staticmethod
    def _stream(plans, progress) -> Iterator[pa.RecordBatch]:
        for i, plan in enumerate(plans):
            table = plan.to_arrow()
            if progress:
                progress(i + 1, len(plans))
            batches = table.to_batches()
            if i == 0:
                yield batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)
                batches = batches[1:]
            yield from batches


def _chain(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    yield first
    for batch in rest:
        yield batch if batch.schema == schema else batch.cast(schema)


class _Counter:
    """Counts the rows a reader hands to the writer."""

    def __init__(self, reader: pa.RecordBatchReader):
        self._reader, self.rows = reader, 0

    def reader(self) -> pa.RecordBatchReader:
        def gen():
            for batch in self._reader:
                self.rows += batch.num_rows
                yield batch

        return pa.RecordBatchReader.from_batches(self._reader.schema, gen())


def _failpoint(name: str) -> None:
    """Fault injection for tests: ``CQ_FAILPOINT=before-commit`` kills the process there;
    ``CQ_FAILPOINT=sleep-before-commit:SECONDS`` makes the firing slow."""
    point = os.environ.get("CQ_FAILPOINT", "")
    if point == name:
        os._exit(75)
    if point.startswith(f"sleep-{name}:"):
        time.sleep(float(point.split(":", 1)[1]))

