"""Many continuous-query firings, one Spark job: how a batch run executes the firings it holds.

A firing's Spark work is small (a few seconds of data) and a Spark job has a fixed cost (analysis,
scheduling, a round trip to a Connect server), so a batch of a hundred firings run one by one pays
that cost a hundred times. Here every firing is planned exactly as on its own (``run.Prepared``: its
own coverage, its own pinned source version, the same ``plan_query`` frame); the frames are put side by
side in one ``UNION ALL`` (each firing's columns renamed to ``__f<i>_<n>`` and its rows tagged with
``i``, so frames of any schema fit), collected with one job, split back per firing in Arrow, and
each firing commits its own sink range and ledger entry exactly as ``run.execute`` would. The
result, the commit and its identity (``app_id``/``app_version``) are those of the firing run alone.

If the fused job fails (one definition's expression fails at run time, say), every firing of the
group runs again on its own, so a bad definition costs only itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime
from functools import reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cq_engine.context import EngineContext, RunResult
from cq_engine.durations import micros
from cq_engine.errors import AlreadyCommitted, located
from cq_engine.model import ContinuousQuery
from cq_engine.resample import timing
from cq_engine.resample.run import Prepared, prepare, run_firing
from cq_engine.times import EPOCH

log = logging.getLogger(__name__)
_JOB = "__cq_firing"
FUSE_GROUP = 10  # branches (plans) per fused Spark job
FUSE_CHUNK = 200  # firings planned, computed and committed together while the next ones plan
# Commits at once (each its own sink's Delta transaction). A commit waits on files as much as it
# computes: a round of 1,000 commits took 11-12 s on 2 threads, 8-9.5 s on 4, 7.5 s on 8 (2 cores).
COMMIT_THREADS = 8
Outcome = RunResult | Exception


@dataclass(frozen=True)
class FiringRequest:
    """One firing of a continuous query to execute in a fused group."""

    cq: ContinuousQuery
    fire_time: datetime


def run_firings(
    ctx: EngineContext,
    firings: Sequence[FiringRequest],
    *,
    on_outcome: Callable[[FiringRequest, Outcome], None] | None = None,
    commit_threads: int = COMMIT_THREADS,
) -> list[Outcome]:
    """Execute ``firings`` (at most one per definition: their sinks' ranges are committed
    independently) with one Spark job where they can share it; the outcome of each, in order: its
    ``RunResult``, the exception that failed it (recorded in the ledger as a failed firing), or
    ``AlreadyCommitted`` for a firing another run committed (``Prepared.once``: recorded nowhere).
    ``on_outcome`` hears each outcome as it is known."""
    names = [f.cq.name for f in firings]
    if len(set(names)) != len(names):
        raise ValueError("run_firings: at most one firing per definition")
    outcomes: list[Outcome | None] = [None] * len(firings)

    def done(i: int, outcome: Outcome) -> None:
        outcomes[i] = outcome
        if on_outcome is not None:
            on_outcome(firings[i], outcome)

    _ = ctx.spark
    runs: dict[int, Prepared] = {}
    alone: list[int] = []
    versions: dict[str, int] = {}  # one snapshot per source for the whole group
    reads: dict = {}  # and one read of it per range

    def planned(chunk: range) -> dict[int, Prepared]:
        out: dict[int, Prepared] = {}
        for i in chunk:
            f = firings[i]
            try:
                firing = timing.check_firing_time(f.cq.name, f.cq.resample, f.fire_time)
                run = prepare(
                    ctx,
                    f.cq,
                    [firing.fire_time],
                    kind="firing",
                    app_version=micros(firing.fire_time - EPOCH),
                    once=True,
                )
                if f.cq.source not in versions and ctx.storage.exists(f.cq.source):
                    versions[f.cq.source] = ctx.storage.version(f.cq.source)
                run.plan(ctx, version=versions.get(f.cq.source), reads=reads)
            except Exception:  # planned again on its own, where the ledger records the failure
                alone.append(i)
                continue
            if len(run.plans) != 1 or run.executor_writes(ctx):
                alone.append(i)  # an executor-written result takes its own job (the rows stay on the executors)
            else:
                out[i] = run
        return out

    def groups() -> Iterator[list[_Job]]:
        # Planned a chunk at a time, lazily: fuse_groups starts a chunk's job (and then its commits)
        # as soon as it is planned, while the next chunk plans. One chunk of a thousand firings
        # committed nothing until all were planned and computed (10 s a round, the first commit
        # after 4 s); the plan of a fused job also grows with (branches x columns of all of them).
        for k in range(0, len(firings), FUSE_CHUNK):
            chunk = planned(range(k, min(k + FUSE_CHUNK, len(firings))))
            runs.update(chunk)
            jobs = _jobs(ctx, chunk)
            yield from (jobs[j : j + FUSE_GROUP] for j in range(0, len(jobs), FUSE_GROUP))

    def commit(i: int, table: pa.Table | None, share: float, entries: list) -> Outcome:
        assert table is not None  # every fused firing computes
        run = runs[i]
        started = time.perf_counter()
        try:
            with run.recording(ctx, into=entries) as rec:
                rec.source_versions = {run.cq.source: run.version}
                data = run.plans[0].complete(table)
                rec.sink_version = run.commit(ctx, data)
                rec.rows_written = data.num_rows
        except Exception as exc:
            return exc
        seconds = share + time.perf_counter() - started
        return run.result(rows=data.num_rows, sink_version=rec.sink_version, seconds=seconds)

    alone += fuse_groups(
        ctx,
        groups(),
        members=lambda group: [m.index for job in group for m in job.members],
        collect=_collect,
        commit=commit,
        done=done,
        commit_threads=commit_threads,
    )
    for i in sorted(alone):
        f = firings[i]
        try:
            done(i, run_firing(ctx, f.cq, f.fire_time, once=True))
        except AlreadyCommitted as exc:
            done(i, exc)
        except Exception as exc:
            done(i, located(f.cq.name, f.cq.location, exc))
    return [o for o in outcomes if o is not None]


def fuse_groups(
    ctx: EngineContext,
    groups: Iterable[list[Any]],
    *,
    members: Callable[[list[Any]], list[int]],
    collect: Callable[[list[Any]], dict[int, pa.Table]],
    commit: Callable[[int, pa.Table | None, float, list], Outcome],
    done: Callable[[int, Outcome], None],
    commit_threads: int = COMMIT_THREADS,
    apart: bool = False,
) -> list[int]:
    """Each group's one Spark job (``collect``: its members' rows by index), then their commits
    (``commit(index, rows, share of the job's seconds, ledger entries)``) on a pool of
    ``commit_threads`` and one ledger commit of the group's entries; two groups' jobs run at once, so
    one group commits while the other computes. ``groups`` may be lazy: each is started as soon as
    it is made, while the next one is being made. Returns the members to run alone: those of a group
    whose job failed (``apart``: a failed group's branches are first tried in a job each)."""

    def fuse(group: list[Any]) -> list[int]:
        clock = time.perf_counter()
        indexes = members(group)
        try:
            tables = collect(group)
        except Exception as exc:  # one member's failure must not take its neighbours
            log.warning("a fused job of %d runs failed, running them apart: %s", len(indexes), exc)
            if apart and len(group) > 1:
                return [i for branch in group for i in fuse([branch])]
            return indexes
        share = (time.perf_counter() - clock) / max(1, len(indexes))
        entries: list = []
        futures = [committer.submit(commit, i, tables.get(i), share, entries) for i in indexes]
        results = [f.result() for f in futures]
        # The ledger learns of the group in one commit (one per run would contend on one table).
        ctx.ledger.record_many(entries)
        for i, outcome in zip(indexes, results):
            done(i, outcome)
        return []

    left: list[int] = []
    # Each commit is one Delta transaction on its own sink (delta-rs releases the GIL while it writes).
    with (
        ThreadPoolExecutor(max_workers=max(1, commit_threads), thread_name_prefix="cq-commit") as committer,
        ThreadPoolExecutor(max_workers=2, thread_name_prefix="cq-fuse") as fuser,
    ):
        # Submitted as made (a lazy ``groups`` makes the next while the pool runs this one).
        futures = [fuser.submit(fuse, group) for group in groups]
        for future in futures:
            left.extend(future.result())
    return left


@dataclass(frozen=True)
class _Job:
    """One branch of a fused Spark job: a frame, its columns, and the firings it answers, each with
    the frame's columns that hold its own (in the order of its plan's columns)."""

    frame: Any  # a Spark DataFrame
    columns: tuple[str, ...]
    members: tuple[_Member, ...]


@dataclass(frozen=True)
class _Member:
    """A firing answered by a branch: which of the branch's columns are its own, under which names,
    and (in a shared aggregation) how many trailing value columns decide that a row is empty."""

    index: int
    source: tuple[str, ...]
    names: tuple[str, ...]
    values: int = 0  # 0: the branch is the firing's own plan, empty rows already dropped


def _shape(run: Prepared) -> tuple | None:
    """What firings must share to be answered by one aggregation over one scan (None: never)."""
    cq, cov = run.cq, run.covs[0]
    if cq.fill is not None or cq.having is not None or cq.limit is not None or cq.offset:
        return None
    return (
        cq.source,
        run.version,
        run.time_column,
        cov,
        cq.time_grouping,
        cq.group_keys,
        cq.where,
        cq.align_by_device,
        cq.is_aggregate,
    )


def _jobs(ctx: EngineContext, runs: dict[int, Prepared]) -> list[_Job]:
    """The branches: firings of the same shape (``_shape``) share one scan and one aggregation whose
    columns are all of theirs; any other firing is a branch of its own plan."""
    from cq_engine.resample.plan import plan_query

    shapes: dict[tuple, list[int]] = {}
    jobs = []
    for i, run in runs.items():
        shape = _shape(run)
        if shape is None:
            jobs.append(_own(i, run))
        else:
            shapes.setdefault(shape, []).append(i)
    for members in shapes.values():
        first = runs[members[0]]
        if len(members) == 1:
            jobs.append(_own(members[0], first))
            continue
        select = tuple(replace(item, name=f"__m{i}_{n}") for i in members for n, item in enumerate(runs[i].cq.select))
        try:
            merged = plan_query(
                ctx.spark,
                replace(first.cq, select=select),
                first.inputs[0],
                time_column=first.time_column,
                coverage=first.covs[0],
                groups=first.groups,
            )
        except Exception:  # planning it failed: each keeps its own plan (and its own error, if any)
            jobs.extend(_own(i, runs[i]) for i in members)
            continue
        lead = merged.columns[: len(merged.columns) - len(select)]  # time column and group keys
        jobs.append(
            _Job(
                merged.frame,
                merged.columns,
                tuple(
                    _Member(
                        i,
                        (*lead, *[f"__m{i}_{n}" for n in range(len(runs[i].cq.select))]),
                        runs[i].plans[0].columns,
                        len(runs[i].cq.select),
                    )
                    for i in members
                ),
            )
        )
    return jobs


def _collect(group: list[_Job]) -> dict[int, pa.Table]:
    """One Spark job for every branch of ``group``; each firing's rows as an Arrow table with its
    plan's columns, before its plan's Arrow step (``Plan.complete``)."""
    from pyspark.sql import functions as F

    frames = [
        job.frame.select(
            F.lit(j).alias(_JOB), *[F.col(f"`{c}`").alias(f"__j{j}_{n}") for n, c in enumerate(job.columns)]
        )
        for j, job in enumerate(group)
    ]
    whole = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames).toArrow()
    tag = whole.column(_JOB)
    out = {}
    for j, job in enumerate(group):
        part = whole.filter(pc.equal(tag, j))
        position = {c: f"__j{j}_{n}" for n, c in enumerate(job.columns)}
        for m in job.members:
            table = part.select([position[c] for c in m.source]).rename_columns(list(m.names))
            if m.values:  # what the firing's own plan drops: rows whose values are all NULL
                keep = reduce(pc.or_, [pc.is_valid(table.column(c)) for c in m.names[-m.values :]])
                table = table.filter(keep)
            out[m.index] = table
    return out


def _own(i: int, run: Prepared) -> _Job:
    plan = run.plans[0]
    return _Job(plan.frame, plan.columns, (_Member(i, plan.columns, plan.columns),))
