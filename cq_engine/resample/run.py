"""run for continuous queries: snapshot read → plan → one atomic range replace → ledger.

A run's output is a pure function of (definition, coverage, source version), so running it again —
after a crash, or twice — leaves the sink exactly as one run does.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import reduce

import pyarrow as pa

from cq_engine.context import EngineContext, RunResult
from cq_engine.durations import micros
from cq_engine.errors import CQError
from cq_engine.model import ContinuousQuery
from cq_engine.resample import timing
from cq_engine.resample.plan import Plan, check_columns, plan_query
from cq_engine.resample.timing import Coverage
from cq_engine.storage.base import DataFrameWriter, Scan
from cq_engine.times import EPOCH, UTC

Progress = Callable[[int, int], None]


def run_firing(ctx: EngineContext, cq: ContinuousQuery, fire_time: datetime) -> RunResult:
    """Execute the firing of ``cq`` scheduled at ``fire_time`` (must be one of its firing times)."""
    firing = timing.check_firing_time(cq.name, cq.resample, fire_time)
    return execute(ctx, cq, [firing.fire_time], kind="firing", app_version=micros(firing.fire_time - EPOCH))


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
    """The firings grouped into chunks of at most ``recalculate_chunk_windows`` windows, one Spark job each."""
    r = cq.resample
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


def execute(
    ctx: EngineContext,
    cq: ContinuousQuery,
    fires: list[datetime],
    *,
    kind: str,
    app_version: int,
    progress: Progress | None = None,
) -> RunResult:
    """The one execution path of firings and recalculations: every chunk's plan streamed into one commit."""
    _ = ctx.spark  # a session start is not part of the run's cost
    clock = time.perf_counter()
    covs = coverages(ctx, cq, fires)
    whole = (covs[0].start, covs[-1].end)
    fire_time = fires[0] if kind == "firing" else None
    scans: list[Scan] = []
    with ctx.ledger.recording(definition=cq.name, kind=kind, fire_time=fire_time, time_range=whole) as rec:
        time_column = ctx.source_time_column(cq.name, cq.source, sink=cq.sink)
        version = ctx.storage.version(cq.source)
        rec.source_versions = {cq.source: version}
        plans = _plans(ctx, cq, covs, time_column, version, scans)
        app_id = f"cq-engine/{cq.name}/{kind}"
        metadata = {
            "cq.definition": cq.name,
            "cq.kind": kind,
            "cq.range_start": whole[0].isoformat(),
            "cq.range_end": whole[1].isoformat(),
        }
        storage = ctx.storage
        if isinstance(storage, DataFrameWriter) and storage.writes_dataframes and all(p.spark_only for p in plans):
            # Spark writes the result from its executors: no row passes through this process.
            _failpoint("before-commit")
            frame = reduce(lambda a, b: a.unionByName(b), (p.frame for p in plans))
            rec.sink_version = storage.replace_range(
                cq.sink,
                frame,
                time_column=time_column,
                time_range=whole,
                app_id=app_id,
                app_version=app_version,
                source_versions=dict(rec.source_versions),
                metadata=metadata,
            )
            counted = _Counter(None, rows=storage.rows_written(cq.sink, rec.sink_version))
            if progress:
                progress(len(plans), len(plans))
        else:
            batches = _stream(plans, progress)
            first = next(batches)
            reader = pa.RecordBatchReader.from_batches(first.schema, _chain(first, batches, first.schema))
            counted = _Counter(reader)
            _failpoint("before-commit")
            rec.sink_version = ctx.storage.replace_range(
                cq.sink,
                counted.reader(),
                time_column=time_column,
                time_range=whole,
                app_id=app_id,
                app_version=app_version,
                source_versions=dict(rec.source_versions),
                metadata=metadata,
            )
        rec.rows_written = counted.rows
    return RunResult(
        definition=cq.name,
        kind=kind,
        fire_time=fire_time,
        time_range=whole,
        rows_written=counted.rows,
        sink_version=rec.sink_version,
        source_versions=dict(rec.source_versions),
        files_read=sum(s.files_read for s in scans),
        files_total=max((s.files_total for s in scans), default=0),
        seconds=time.perf_counter() - clock,
        chunks=len(covs),
    )


def _plans(
    ctx: EngineContext, cq: ContinuousQuery, covs: list[Coverage], time_column: str, version: int, scans: list[Scan]
) -> list[Plan]:
    """One Spark job (``resample.plan.Plan``) per coverage chunk."""
    # Every scan is planned before the stream starts: delta-rs consumes the stream on its own
    # runtime, from which the Delta log cannot be read again.
    plans = []
    for cov in covs:
        df, scan = ctx.storage.read_range(
            ctx.spark, cq.source, time_column=time_column, time_range=cov.read_range, version=version
        )
        scans.append(scan)
        check_columns(cq, df.columns, table=cq.source)
        plans.append(plan_query(ctx.spark, cq, df, time_column=time_column, coverage=cov))
    return plans


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
