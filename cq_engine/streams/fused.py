"""Many window-triggered stream runs, few Spark jobs: the stream counterpart of ``resample.fused``.

A round holds at most one work item per stream. Each is planned exactly as on its own
(``run.plan_work``), its trigger-table read shared with every other of the round that reads the same
table, version and range (one ``read_range``, one snapshot load). Time-window runs of one *shape*
(same read, window grid, windows, partitioning, filters and output shaping; an aggregate query over
``%%trows`` without HAVING, FORCE_OUTPUT or NOTIFY) are answered by one aggregation holding all their
items, each under its own prefix: their windows are assigned once. Every other run is a branch of
its own plan. Branches share one Spark job per group of ``FUSE_GROUP`` (a ``UNION ALL``, each
branch's row as one struct column of its own and tagged, so any schemas fit without asking Spark
for them). The result is split back per run in Arrow and each run commits exactly as alone
(``run.record_work`` with the plan's own finish step: its sink's replace, frontier, outbox, the same
``RunResult``); the ledger learns of a group in one commit.

If a fused job fails, each of its branches runs again in a job of its own, and the runs of a branch
that fails again run one by one (``run.run_work``), so a bad stream costs only itself and its
neighbours one more job; a run whose planning or commit fails fails alone, as it would on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cq_engine.context import EngineContext, RunResult
from cq_engine.errors import located
from cq_engine.model import Stream
from cq_engine.resample.fused import FUSE_GROUP, fuse_groups
from cq_engine.streams.output import shaping_columns
from cq_engine.streams.plan import ROW_TIME, evaluate, reads_time, row_stats_needed
from cq_engine.streams.run import Planned, plan_work, record_work, run_work
from cq_engine.streams.timing import StreamWork

Outcome = RunResult | Exception
_BRANCH = "__cq_branch"


@dataclass(frozen=True)
class WorkRequest:
    """One stream's work item in a round of ``run_works``."""

    stream: Stream
    work: StreamWork


def run_works(
    ctx: EngineContext,
    requests: Sequence[WorkRequest],
    *,
    on_outcome: Callable[[WorkRequest, Outcome], None] | None = None,
    commit_threads: int = 4,
) -> list[Outcome]:
    """At most one request per stream (a round). Each stream's work is done exactly as
    ``streams.run.run_work`` would do it alone: the same sink rows, frontier, ledger entry, NOTIFY
    outbox events and ``RunResult``; a failing request returns its exception (recorded in the
    ledger as failed, as ``run_work`` does) and never affects the others. ``on_outcome`` hears each
    outcome as it is known."""
    names = [r.stream.name for r in requests]
    if len(set(names)) != len(names):
        raise ValueError("run_works: at most one work item per stream")
    outcomes: list[Outcome | None] = [None] * len(requests)

    def done(i: int, outcome: Outcome) -> None:
        outcomes[i] = outcome
        if on_outcome is not None:
            on_outcome(requests[i], outcome)

    _ = ctx.spark
    planned: dict[int, Planned] = {}
    alone: list[int] = []
    reads: dict = {}  # one snapshot read per (table, time column, range, version) for the round
    for i, r in enumerate(requests):
        try:
            planned[i] = plan_work(ctx, r.stream, r.work, reads=reads)
        except Exception:  # planned again on its own, where the ledger records the failure
            alone.append(i)

    def commit(i: int, table: pa.Table | None, share: float, entries: list) -> Outcome:
        p = planned[i]
        try:
            result = record_work(ctx, p.stream, p.work, body=lambda: p.finish(table), into=entries)
        except Exception as exc:
            return exc
        return replace(result, seconds=result.seconds + share)

    branches = _branches(planned)
    # Shared aggregations first, in jobs of their own: each answers many streams at the cost of about
    # one (the plain INTERVAL streams), so their windows reach the sinks seconds into the round rather
    # than after every data-shaped window's job (fuse_groups runs the groups in this order, two at once).
    # Time windows' (an aggregate) apart from data-shaped ones' (window functions first: slower jobs).
    shared = [b for b in branches if b.build is not None and len(b.members) > 1]
    timed = [b for b in shared if planned[b.members[0].index].state is None]
    shaped = [b for b in shared if planned[b.members[0].index].state is not None]
    single = [b for b in branches if b.build is not None and len(b.members) == 1]
    parts = (timed, shaped, single)
    groups = [part[k : k + FUSE_GROUP] for part in parts for k in range(0, len(part), FUSE_GROUP)]
    idle = [b for b in branches if b.build is None]  # nothing to compute: only commits
    alone += fuse_groups(
        ctx,
        [*groups, idle] if idle else groups,
        members=lambda group: [m.index for b in group for m in b.members],
        collect=_collect,
        commit=commit,
        done=done,
        commit_threads=commit_threads,
        apart=True,
    )
    for i in sorted(alone):
        r = requests[i]
        try:
            done(i, run_work(ctx, r.stream, r.work))
        except Exception as exc:
            done(i, located(r.stream.name, r.stream.location, exc))
    return [o for o in outcomes if o is not None]


@dataclass(frozen=True)
class _Member:
    """A run answered by a branch: its rows are the branch's ``source`` columns named ``names``
    (all of them, as they are, when ``source`` is empty)."""

    index: int
    source: tuple[str, ...] = ()
    names: tuple[str, ...] = ()

    def cut(self, table: pa.Table) -> pa.Table:
        if not self.source:
            return table
        return table.select(list(self.source)).rename_columns(list(self.names))


@dataclass(frozen=True)
class _Branch:
    """One branch of a fused job: how to build its frame (None: nothing to compute), and its runs."""

    build: Callable[[], Any] | None  # -> a Spark DataFrame
    members: tuple[_Member, ...]


def _shape(p: Planned) -> tuple | None:
    """What runs must share to be answered by one aggregation (None: never): time windows, or
    data-shaped ones with the same frontier (``Planned.state``)."""
    s, w = p.stream, p.work
    if p.windows is None or s.reads != "trows" or not s.is_aggregate or s.having is not None:
        return None
    if s.group_by or s.limit is not None or s.slimit is not None or s.key_bound == "row" or s.composed:  # own plan
        return None
    if s.empty_window_rows or s.notify is not None:  # their empty windows take a frame of their own
        return None
    if s.interpolated:  # TWA's points outside the read are found when its own plan is built
        return None
    return (
        p.read,
        s.trigger,
        s.partition_by,
        s.partition_exprs,
        s.options.pre_filter,
        s.form,
        s.where,
        w.windows,
        w.close_until,
        w.tick,
        row_stats_needed(s),
        any(ROW_TIME in i.expression for i in s.select),  # its windowed rows carry ROW_TIME (eKuiper)
        reads_time(s),  # ... and TIME_REF (TDengine's time-ordered functions)
        s.output_subtable,
        s.tags,
        p.keep,
        p.state,  # data-shaped: the read (origin, open windows), the frontier (recomputation) included
    )


def _branches(planned: dict[int, Planned]) -> list[_Branch]:
    """Runs of the same shape (``_shape``) share one aggregation whose items are all of theirs; any
    other run is a branch of its own plan."""
    shapes: dict[tuple, list[int]] = {}
    out = []
    for i, p in planned.items():
        shape = _shape(p)
        if shape is None:
            out.append(_Branch(p.build, (_Member(i),)))
        else:
            shapes.setdefault(shape, []).append(i)
    for members in shapes.values():
        if len(members) == 1:
            out.append(_Branch(planned[members[0]].build, (_Member(members[0]),)))
            continue
        out.extend(_shared(planned, members))
    return out


def _shared(planned: dict[int, Planned], members: list[int]) -> list[_Branch]:
    """One aggregation for ``members`` (of one shape): the first one's stream with every member's
    items, renamed ``__s<i>_<n>``; the output shaping (tags, subtable, ``group_id``) is the first's,
    so a member whose own shaping is not among it keeps its own plan."""
    first = planned[members[0]]

    def items_of(indexes: list[int]) -> tuple:
        return tuple(
            replace(item, name=f"__s{i}_{n}") for i in indexes for n, item in enumerate(planned[i].stream.select)
        )

    shaping = shaping_columns(replace(first.stream, select=items_of(members)))
    own = [i for i in members if not set(shaping_columns(planned[i].stream)) <= set(shaping)]
    shared = [i for i in members if i not in own]
    out = [_Branch(planned[i].build, (_Member(i),)) for i in own]
    if len(shared) < 2:
        return out + [_Branch(planned[i].build, (_Member(i),)) for i in shared]
    merged = replace(first.stream, select=items_of(shared))
    windows, keep = first.windows, list(first.keep)
    assert windows is not None  # a shape is of time windows

    def member(i: int) -> _Member:
        stream = planned[i].stream
        names = [n for n, _ in shaping_columns(stream)]
        kept = [k for k in keep if k in windows.columns]  # what evaluate keeps (its schema, already known)
        source = [f"__s{i}_{n}" for n in range(len(stream.select))] + names + kept
        return _Member(i, tuple(source), tuple([item.name for item in stream.select] + names + kept))

    build = lambda: evaluate(merged, windows, keep=keep)
    return [*out, _Branch(build, tuple(member(i) for i in shared))]


def _collect(group: list[_Branch]) -> dict[int, pa.Table]:
    """One Spark job for every branch of ``group``; each run's result rows as Arrow, as its own plan
    would give them."""
    from pyspark.sql import functions as F

    computing = [(j, b) for j, b in enumerate(group) if b.build is not None]
    out: dict[int, pa.Table] = {}
    if not computing:
        return out
    frames = []
    for j, b in computing:
        assert b.build is not None
        # The branch's row as one column, without asking Spark for its schema: a list of one struct,
        # so the rows of other branches are NULL lists (a NULL struct would put NULLs in its fields,
        # which Arrow refuses where they are NOT NULL, as count(*) is).
        row = F.array(F.struct(F.col("*")))
        frames.append(b.build().select(F.lit(j).alias(_BRANCH), row.alias(f"__b{j}")))
    whole = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames).toArrow()
    tag = whole.column(_BRANCH)
    for j, b in computing:
        part = pc.list_flatten(whole.column(f"__b{j}").filter(pc.equal(tag, j))).combine_chunks()
        table = pa.Table.from_struct_array(part)
        for m in b.members:
            out[m.index] = m.cut(table)
    return out
