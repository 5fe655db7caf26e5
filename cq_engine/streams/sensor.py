"""The I/O half of a stream's sensor: read the new part of the trigger table's Delta log (no Spark)
and hand what it says to the pure planner in ``stream_timing``. Dagster's sensor and ``cq tick``
both call :func:`evaluate_stream`."""

from __future__ import annotations

import os
from dataclasses import replace
from datetime import datetime, timedelta

from cq_engine.context import EngineContext
from cq_engine.errors import CQError, TableError
from cq_engine.model import DATA_SHAPED, Stream, statement_hash
from cq_engine.storage.base import Storage
from cq_engine.storage.log import Commit
from cq_engine.streams import timing as st
from cq_engine.streams.frontier import move_frontier
from cq_engine.streams.late import drops_late_rows, find_late, record_late
from cq_engine.times import UTC

HISTORY_CHUNK_ROWS = 5_000_000  # default rows per FILL_HISTORY chunk (CQ_HISTORY_CHUNK_ROWS overrides)


def history_chunk_rows() -> int:
    """Rows per FILL_HISTORY chunk: ``CQ_HISTORY_CHUNK_ROWS``, else :data:`HISTORY_CHUNK_ROWS`."""
    value = os.environ.get("CQ_HISTORY_CHUNK_ROWS", "")
    if not value:
        return HISTORY_CHUNK_ROWS
    if not value.isdigit() or int(value) < 1:
        raise CQError(f"CQ_HISTORY_CHUNK_ROWS={value!r}: expected a positive integer")
    return int(value)


def table_span(ctx: EngineContext, table: str, *, version: int | None, time_column: str) -> st.Span:
    """Event-time extent and row count of a snapshot, from its files' statistics."""
    return st.Span(*ctx.storage.table_span(table, version=version, time_column=time_column))


def _cursor(text: str | None, stream: Stream) -> st.StreamCursor | None:
    if not text:
        return None
    try:
        cursor = st.StreamCursor.from_json(text)
    except (ValueError, KeyError, TypeError):
        return None  # not ours (or from an older engine): start as a new stream
    return cursor if cursor.definition == statement_hash(stream) else None


class TriggerLogs:
    """One sensor evaluation's reads of the trigger tables' Delta logs, shared by the streams on a
    table. Each table's latest version is read once, so every stream of the evaluation plans at the
    same snapshot (and its works then read that one version: a process holding a table at a newer
    version than a reader pins opens it again, replaying its log); a range of commits is read once."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._versions: dict[str, int] = {}
        self._commits: dict[tuple, list[Commit]] = {}

    def latest_version(self, table: str, *, known: int | None = None) -> int | None:
        """``Storage.latest_version``, read once per table (again only below a newer ``known``)."""
        seen = self._versions.get(table.lower())
        if seen is not None and (known is None or seen >= known):
            return seen
        version = self._storage.latest_version(table, known=known)
        if version is not None:
            self._versions[table.lower()] = version
        return version

    def read_commits(self, table: str, *, after: int, until: int, time_column: str) -> list[Commit]:
        """``Storage.read_commits``, read once per range."""
        key = (table.lower(), after, until, time_column.lower())
        if key not in self._commits:
            self._commits[key] = self._storage.read_commits(table, after=after, until=until, time_column=time_column)
        return self._commits[key]


def evaluate_stream(
    ctx: EngineContext, stream: Stream, *, cursor: str | None, now: datetime, logs: TriggerLogs | None = None
) -> st.TickPlan:
    """One sensor evaluation: the runs due at ``now`` given the cursor of the previous evaluation.
    ``logs``: the evaluation's reads shared with the other streams it plans."""
    table = stream.trigger_table or stream.source
    if table is None:
        raise TableError(f"{stream.name}: no trigger table")
    reads = logs or TriggerLogs(ctx.storage)
    known = _cursor(cursor, stream)
    version = reads.latest_version(table, known=known.version if known else None)
    if version is None and ctx.ensure_tables(table):  # declared, not yet created: as a CQ's source
        version = reads.latest_version(table)
    if version is None:
        raise TableError(
            f"{stream.name}: trigger table {table!r} does not exist (declare it with CREATE TABLE "
            f"in {ctx.settings.sql_dir} or load it with `cq ingest`)"
        )
    time_column = ctx.time_column(table)
    tz = ctx.settings.timezone
    if known is None:
        span = table_span(ctx, table, version=version, time_column=time_column)
        plan = st.first_tick(stream, version=version, span=span, now=now, tz=tz, chunk_rows=history_chunk_rows())
        return _noted(
            ctx, stream, table, replace(plan, cursor=replace(plan.cursor, definition=statement_hash(stream))), now=now
        )
    changes: list[st.Change] = []
    commits = []
    if version > known.version:
        commits = reads.read_commits(table, after=known.version, until=version, time_column=time_column)
        for commit in commits:
            changes.append(
                st.Change(
                    added=tuple(st.Span(f.min_time, f.max_time, f.rows or 0) for f in commit.added),
                    removed=tuple(st.Span(f.min_time, f.max_time, f.rows or 0) for f in commit.removed),
                )
            )
    plan = st.plan_tick(stream, known, version=version, changes=changes, now=now, tz=tz)
    if drops_late_rows(stream) and commits:
        # eKuiper drops rows older than the watermark before any window: found exactly, kept for the runs.
        late = find_late(ctx, stream, table, commits, max_event=known.max_event)
        record_late(ctx, stream, late)
        plan = st.with_exact_late(plan, stream, [(f.rows, f.first, f.last) for f in late], tz)
    return _noted(ctx, stream, table, plan, now=now)


def _noted(ctx: EngineContext, stream: Stream, table: str, plan: st.TickPlan, *, now: datetime) -> st.TickPlan:
    """Record the rows the tick ignored in the ledger (kind and status ``ignored``, ``error`` the why),
    so they are found after the tick's output is gone."""
    for item in plan.ignored:
        ctx.ledger.note_ignored(
            definition=stream.name,
            fire_time=now,
            span=item.span,
            source_versions={table: plan.cursor.version},
            text=item.text,
        )
    return plan


def skip_untreated(ctx: EngineContext, stream: Stream, cursor: str | None) -> str | None:
    """``--ignore-untreated``: a cursor (and, for data-shaped windows, a frontier) for which every row
    committed up to now is already treated, so the data written while stopped is never computed."""
    known = _cursor(cursor, stream)
    if known is None:
        return cursor
    table = stream.trigger_table
    assert table is not None  # window-triggered streams (those with a cursor) have a trigger table
    version = ctx.storage.latest_version(table, known=known.version)
    if version is None or version == known.version:
        return cursor
    span = table_span(ctx, table, version=version, time_column=ctx.time_column(table))
    max_event = st.latest(known.max_event, span.max_time)
    closed = st.latest(known.closed_until, st.watermark(stream, max_event, datetime.now(UTC)))
    skipped = replace(known, version=version, max_event=max_event, closed_until=closed)
    if stream.trigger.kind in DATA_SHAPED and max_event is not None:
        origin = max_event + timedelta(microseconds=1)
        move_frontier(ctx, stream, to=origin)
        skipped = replace(skipped, origin=origin)
    return skipped.to_json()
