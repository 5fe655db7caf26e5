"""run for continuous queries: snapshot read → plan → one atomic cell upsert (a MERGE) → ledger.

A run's output is a pure function of (definition, coverage, source version), and its write upserts
cells (IoTDB's ``SELECT ... INTO``: non-NULL cells overwrite, nothing is deleted), so running it
again — after a crash, or twice — leaves the sink exactly as one run does.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from functools import reduce

import pyarrow as pa

from cq_engine.context import EngineContext, RunResult
from cq_engine.durations import micros
from cq_engine.errors import CQError
from cq_engine.model import ContinuousQuery
from cq_engine.resample import timing
from cq_engine.resample.plan import Groups, Plan, check_columns, group_columns, needs_groups, plan_query
from cq_engine.resample.timing import Coverage
from cq_engine.storage.base import DataFrameWriter, Scan
from cq_engine.storage.ledger import Recording
from cq_engine.times import EPOCH, UTC

Progress = Callable[[int, int], None]
SINGLE_PARTITION_BYTES = 16 * 2**20  # of Parquet read: below it a run's Spark job has one partition


def run_firing(ctx: EngineContext, cq: ContinuousQuery, fire_time: datetime, *, once: bool = False) -> RunResult:
    """Execute the firing of ``cq`` scheduled at ``fire_time`` (must be one of its firing times).
    ``once``: a firing whose sink holds it, or a later firing of ``cq``, already (committed by another
    run) raises ``AlreadyCommitted`` and is recorded nowhere (``Prepared.once``)."""
    firing = timing.check_firing_time(cq.name, cq.resample, fire_time)
    return execute(ctx, cq, [firing.fire_time], kind="firing", app_version=micros(firing.fire_time - EPOCH), once=once)


def recalculate(
    ctx: EngineContext,
    cq: ContinuousQuery,
    *,
    start: datetime,
    end: datetime | None = None,
    now: datetime | None = None,
    progress: Progress | None = None,
) -> RunResult:
    """Recompute every firing whose range lies in ``[start, end)`` (end: the latest firing by ``now``)."""
    r = cq.resample
    if end is None:
        latest = timing.latest_firing(r, now=now or datetime.now(UTC))
        if latest is None:
            raise CQError(f"recalculate: {cq.name!r} has not fired yet (first firing {r.boundary.isoformat()})")
        end = timing.time_range(r, latest)[1]
    fires, _ = timing.recalculation_range(r, start=start, end=end)
    return execute(ctx, cq, fires, kind="recalculate", app_version=micros(end - EPOCH), progress=progress)


def coverages(ctx: EngineContext, cq: ContinuousQuery, fires: list[datetime]) -> list[Coverage]:
    """The firings grouped into chunks of at most ``recalculate_chunk_windows`` windows, one Spark job
    each; each firing its own whole chunk where the firings' results are not one grid's (``by_firing``)."""
    r = cq.resample
    if len(fires) > 1 and by_firing(cq):
        return [timing.coverage_of(r, [fire]) for fire in fires]
    step = cq.time_grouping.step if cq.time_grouping else r.every
    per_firing_windows = max(1, micros(r.start_offset - r.end_offset) // micros(step))
    # Firings on different window grids cannot share one grid: then each firing is its own chunk.
    size = max(1, ctx.settings.recalculate_chunk_windows // per_firing_windows)
    if micros(r.every) % micros(step):
        size = 1
    chunks = timing.chunk_firings(fires, size=size)
    out = []
    for i, chunk in enumerate(chunks):
        nxt = timing.time_range(r, chunks[i + 1][0])[0] if i + 1 < len(chunks) else None
        out.append(timing.coverage_of(r, chunk, emit_end=nxt))
    return out


def by_firing(cq: ContinuousQuery) -> bool:
    """Must a recalculation compute each firing on its own and keep the union of their cells (IoTDB
    runs every firing's ``SELECT ... INTO``, later non-NULL cells overwriting earlier ones)? When the
    ranges overlap (a window, FILL's neighbours or LIMIT's numbering then differ between firings) or
    a firing cuts its last window at its range end; otherwise each window belongs to one firing and
    one grid over all the ranges computes exactly what the firings do."""
    r = cq.resample
    length = micros(r.start_offset - r.end_offset)
    if length > micros(r.every):
        return True
    if cq.time_grouping is None:
        return False
    step, interval = micros(cq.time_grouping.step), micros(cq.time_grouping.interval)
    return ((length - 1) // step) * step + interval > length


@dataclass
class Prepared:
    """A run planned but not yet executed: its coverage chunks, pinned source version and plans."""

    cq: ContinuousQuery
    kind: str
    fires: list[datetime]
    app_version: int
    covs: list[Coverage]
    time_column: str = ""
    version: int = -1
    plans: list[Plan] = field(default_factory=list)
    scans: list[Scan] = field(default_factory=list)
    inputs: list = field(default_factory=list)  # each plan's source frame (Spark DataFrames)
    groups: Groups = None  # the known group values at ``version`` (``plan.needs_groups``)
    # The commit is Delta's idempotent write of (write_identity, app_version): a firing's versions grow
    # with its time and a definition's firings commit in order (BLOCKED, DISCARD), so a sink holding
    # this identity at this version or later holds this firing, and computing it again would record
    # it twice (two runs of one firing under a lost sensor cursor or a run failed while it ran).
    once: bool = False

    @property
    def whole(self) -> tuple[datetime, datetime]:
        return (self.covs[0].start, self.covs[-1].end)

    @property
    def fire_time(self) -> datetime | None:
        return self.fires[0] if self.kind == "firing" else None

    @property
    def input_bytes(self) -> int:
        """The size of the files the plans read (-1: unknown)."""
        sizes = [s.bytes_read for s in self.scans]
        return -1 if any(b < 0 for b in sizes) else sum(sizes)

    @property
    def union(self) -> bool:
        """Are the plans separate firings whose cells are combined (``by_firing``)?"""
        return len(self.covs) > 1 and by_firing(self.cq)

    def executor_writes(self, ctx: EngineContext) -> bool:
        """Is the result handed to the storage as Spark frames, for its executors to write?"""
        storage = ctx.storage
        return (
            isinstance(storage, DataFrameWriter)
            and not self.union  # the firings' cells are combined in Arrow
            and all(p.spark_only for p in self.plans)
            and storage.writes_frame(self.cq.sink, input_bytes=self.input_bytes)
        )

    def recording(self, ctx: EngineContext, *, into: list | None = None):
        """The ledger entry of this run (``Ledger.recording``)."""
        return ctx.ledger.recording(
            definition=self.cq.name, kind=self.kind, fire_time=self.fire_time, time_range=self.whole, into=into
        )

    def plan(
        self, ctx: EngineContext, rec: Recording | None = None, *, version: int | None = None, reads: dict | None = None
    ) -> None:
        """Pin the source version (``version``, else the latest; noted in ``rec``) and plan every
        chunk (no Spark job runs). ``reads`` shares identical snapshot reads between runs."""
        cq = self.cq
        self.time_column = ctx.source_time_column(cq.name, cq.source, sink=cq.sink)
        self.version = ctx.storage.version(cq.source) if version is None else version
        if rec is not None:
            rec.source_versions = {cq.source: self.version}
        self.plans = _plans(ctx, self, reads)

    def commit(self, ctx: EngineContext, data) -> int:
        """Write the run's cells into the sink as IoTDB's ``SELECT ... INTO`` does (README, IoTDB
        continuous queries): ``data`` (Arrow, or a Spark frame for a storage that writes DataFrames)
        upserts its non-NULL cells keyed on time and the group columns and deletes nothing, in one
        commit carrying the run's identity; the sink's new version."""
        _failpoint("before-commit")
        whole = self.whole
        keys = group_columns(self.cq)
        if not self.cq.is_aggregate:  # a source may hold two rows of one time and device: one point
            data = _one_row_per_point(data, (self.time_column, *keys))
        return ctx.storage.upsert_cells(
            self.cq.sink,
            data,
            time_column=self.time_column,
            keys=keys,
            time_range=whole,
            app_id=write_identity(self.cq, self.kind),
            app_version=self.app_version,
            source_versions={self.cq.source: self.version},
            once=self.once,
            metadata={
                "cq.definition": self.cq.name,
                "cq.kind": self.kind,
                "cq.range_start": whole[0].isoformat(),
                "cq.range_end": whole[1].isoformat(),
            },
        )

    def result(self, *, rows: int, sink_version: int, seconds: float) -> RunResult:
        return RunResult(
            definition=self.cq.name,
            kind=self.kind,
            fire_time=self.fire_time,
            time_range=self.whole,
            rows_written=rows,
            sink_version=sink_version,
            source_versions={self.cq.source: self.version},
            files_read=sum(s.files_read for s in self.scans),
            files_total=max((s.files_total for s in self.scans), default=0),
            seconds=seconds,
            chunks=len(self.covs),
        )


def write_identity(cq: ContinuousQuery, kind: str) -> str:
    """The application id of ``cq``'s ``kind`` commits: it names the statement's exact text, so after
    the definition changes Delta's idempotent-write skip (same range, same source version) cannot
    keep the old definition's rows."""
    return f"cq-engine/{cq.name}/{kind}#{hashlib.sha256(cq.sql.encode()).hexdigest()[:12]}"


def prepare(
    ctx: EngineContext, cq: ContinuousQuery, fires: list[datetime], *, kind: str, app_version: int, once: bool = False
) -> Prepared:
    """The run of ``fires`` cut into coverage chunks (not planned yet: see ``Prepared.plan``)."""
    covs = coverages(ctx, cq, fires)
    return Prepared(cq=cq, kind=kind, fires=fires, app_version=app_version, covs=covs, once=once)


def execute(
    ctx: EngineContext,
    cq: ContinuousQuery,
    fires: list[datetime],
    *,
    kind: str,
    app_version: int,
    progress: Progress | None = None,
    once: bool = False,
) -> RunResult:
    """The one execution path of firings and recalculations: every chunk's plan streamed into one commit."""
    _ = ctx.spark  # a session start is not part of the run's cost
    clock = time.perf_counter()
    run = prepare(ctx, cq, fires, kind=kind, app_version=app_version, once=once)
    with run.recording(ctx) as rec:
        run.plan(ctx, rec)
        plans, storage = run.plans, ctx.storage
        if run.executor_writes(ctx):
            assert isinstance(storage, DataFrameWriter)
            # Spark writes the result from its executors: no row passes through this process.
            frame = reduce(lambda a, b: a.unionByName(b), (p.frame for p in plans))
            rec.sink_version = run.commit(ctx, frame)
            counted = _Counter(None, rows=storage.rows_written(cq.sink, rec.sink_version))
            if progress:
                progress(len(plans), len(plans))
        elif run.union:
            # Each firing computed on its own; later firings' non-NULL cells overwrite earlier ones.
            table = union_of_firings(
                [_whole(plan, i, len(plans), progress) for i, plan in enumerate(plans)],
                keys=(run.time_column, *group_columns(cq)),
            )
            counted = _Counter(None, rows=table.num_rows)
            rec.sink_version = run.commit(ctx, table)
        else:
            batches = _stream(plans, progress)
            first = next(batches)
            reader = pa.RecordBatchReader.from_batches(first.schema, _chain(first, batches, first.schema))
            counted = _Counter(reader)
            rec.sink_version = run.commit(ctx, counted.reader())
        rec.rows_written = counted.rows
    return run.result(rows=counted.rows, sink_version=rec.sink_version, seconds=time.perf_counter() - clock)


def _plans(ctx: EngineContext, run: Prepared, reads: dict | None = None) -> list[Plan]:
    """One Spark job (``resample.plan.Plan``) per coverage chunk of ``run``."""
    # Every scan is planned before the stream starts: delta-rs consumes the stream on its own
    # runtime, from which the Delta log cannot be read again.
    cq, time_column, version = run.cq, run.time_column, run.version
    plans: list[Plan] = []
    for cov in run.covs:
        key = (cq.source, time_column, cov.read_range, version)
        if reads is not None and key in reads:
            df, scan = reads[key]
        else:
            df, scan = ctx.storage.read_range(
                ctx.spark, cq.source, time_column=time_column, time_range=cov.read_range, version=version
            )
            if reads is not None:
                reads[key] = (df, scan)
        run.scans.append(scan)
        check_columns(cq, list(scan.columns) or df.columns, table=cq.source)
        if not plans and needs_groups(cq):
            run.groups = known_groups(ctx, cq, time_column=time_column, version=version)
        if 0 <= scan.bytes_read <= SINGLE_PARTITION_BYTES:
            # Small input (a firing's few seconds of data): one partition, so the aggregation needs
            # no shuffle and the job is one stage; larger reads keep Spark's parallelism.
            df = df.coalesce(1)
        run.inputs.append(df)
        plans.append(plan_query(ctx.spark, cq, df, time_column=time_column, coverage=cov, groups=run.groups))
    return plans


def known_groups(ctx: EngineContext, cq: ContinuousQuery, *, time_column: str, version: int) -> Groups:
    """Every value of ``cq``'s group columns its source holds at ``version``: from the engine's state
    (``storage.groups``, no Spark job), or for a table whose files cannot be read one by one, a
    distinct over the snapshot's key columns inside the run's own Spark job."""
    keys = group_columns(cq)
    known = ctx.storage.known_groups(cq.source, keys, version=version, time_column=time_column)
    if known is not None:
        return known
    df, _ = ctx.storage.read_range(ctx.spark, cq.source, time_column=time_column, time_range=None, version=version)
    return df.select(*keys).distinct()


def _whole(plan: Plan, i: int, total: int, progress: Progress | None) -> pa.Table:
    table = plan.to_arrow()
    if progress:
        progress(i + 1, total)
    return table


def union_of_firings(tables: list[pa.Table], *, keys: tuple[str, ...]) -> pa.Table:
    """The cells IoTDB's firings leave, in order: per key, each column's last non-NULL value."""
    schema = tables[0].schema
    whole = pa.concat_tables([t.cast(schema) if t.schema != schema else t for t in tables])
    values = [c for c in schema.names if c not in keys]
    if not values or not whole.num_rows:
        return whole
    grouped = whole.group_by(list(keys), use_threads=False).aggregate([(c, "last") for c in values])
    return pa.table({c: grouped.column(c if c in keys else f"{c}_last") for c in schema.names}, schema=schema)


def _one_row_per_point(data, keys: tuple[str, ...]):
    """Rows of a raw query sharing a time and device (a source's duplicate rows) as one point: the
    MERGE takes one source row per sink row (the first; IoTDB keeps one point per time and series)."""
    if hasattr(data, "sparkSession"):
        return data.dropDuplicates(list(keys))
    table = data.read_all() if isinstance(data, pa.RecordBatchReader) else data
    if not table.num_rows:
        return table
    indexed = table.append_column("__cq_i", pa.array(range(table.num_rows), pa.int64()))
    first = indexed.group_by(list(keys), use_threads=False).aggregate([("__cq_i", "min")])
    if first.num_rows == table.num_rows:
        return table
    return table.take(first.column("__cq_i_min"))


def _stream(plans: list[Plan], progress: Progress | None) -> Iterator[pa.RecordBatch]:
    """The plans' results as Arrow batches (the first chunk yields a schema batch even when empty,
    so the sink can be created from it)."""
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

    def __init__(self, reader: pa.RecordBatchReader | None, *, rows: int = 0):
        self._reader, self.rows = reader, rows

    def reader(self) -> pa.RecordBatchReader:
        reader = self._reader
        assert reader is not None, "rows counted by the storage: no reader"

        def gen():
            for batch in reader:
                self.rows += batch.num_rows
                yield batch

        return pa.RecordBatchReader.from_batches(reader.schema, gen())


def _failpoint(name: str) -> None:
    """Fault injection for tests: ``CQ_FAILPOINT=before-commit`` kills the process there;
    ``CQ_FAILPOINT=sleep-before-commit:SECONDS`` makes the firing slow."""
    point = os.environ.get("CQ_FAILPOINT", "")
    if point == name:
        os._exit(75)
    if point.startswith(f"sleep-{name}:"):
        time.sleep(float(point.split(":", 1)[1]))
