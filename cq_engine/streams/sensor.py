"""The I/O half of a stream's sensor: read the new part of the trigger table's Delta log (no Spark)
and hand what it says to the pure planner in ``stream_timing``. Dagster's sensor and ``cq tick``
both call :func:`evaluate_stream`."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake import DeltaTable

from cq_engine.streams import timing as st
from cq_engine.errors import TableError
from cq_engine.model import DATA_SHAPED, Stream, statement_hash
from cq_engine.storage.log import latest_version, read_commits
from cq_engine.times import UTC

if TYPE_CHECKING:
    from cq_engine.engine import Engine

HISTORY_CHUNK_ROWS = 5_000_000


def table_span(uri: str, *, version: int | None, time_column: str, storage_options=None) -> st.Span:
    """Event-time extent and row count of a snapshot, from its files' statistics."""
    dt = DeltaTable(uri, version=version, storage_options=storage_options)
    actions = pa.table(dt.get_add_actions(flatten=True))
    names = actions.column_names
    lo_col, hi_col = f"min.{time_column}", f"max.{time_column}"
    if actions.num_rows == 0 or lo_col not in names:
        return st.Span(None, None, 0)
    mins = [v for v in actions.column(lo_col).to_pylist() if v is not None]
    maxs = [v for v in actions.column(hi_col).to_pylist() if v is not None]
    rows = sum(v or 0 for v in actions.column("num_records").to_pylist()) if "num_records" in names else 0
    return st.Span(min(mins) if mins else None, max(maxs) if maxs else None, rows)


def _cursor(text: str | None, stream: Stream) -> st.StreamCursor | None:
    if not text:
        return None
    try:
        cursor = st.StreamCursor.from_json(text)
    except (ValueError, KeyError, TypeError):
        return None  # not ours (or from an older engine): start as a new stream
    return cursor if cursor.definition == statement_hash(stream) else None


def evaluate_stream(engine: "Engine", stream: Stream, *, cursor: str | None, now: datetime) -> st.TickPlan:
    """One sensor evaluation: the runs due at ``now`` given the cursor of the previous evaluation."""
    table = stream.trigger_table
    storage = engine.storage
    uri = storage.uri(table)
    known = _cursor(cursor, stream)
    version = latest_version(uri, known=known.version if known else None, storage_options=storage.storage_options)
    if version is None:
        raise TableError(f"{stream.name}: trigger table {table!r} does not exist yet")
    time_column = engine.time_column(table)
    tz = engine.settings.timezone
    if known is None:
        span = table_span(uri, version=version, time_column=time_column, storage_options=storage.storage_options)
        plan = st.first_tick(stream, version=version, span=span, now=now, tz=tz, chunk_rows=HISTORY_CHUNK_ROWS)
        return replace(plan, cursor=replace(plan.cursor, definition=statement_hash(stream)))
    changes: list[st.Change] = []
    if version > known.version:
        for commit in read_commits(uri, after=known.version, until=version, time_column=time_column,
                                   storage_options=storage.storage_options):
            changes.append(st.Change(
                added=tuple(st.Span(f.min_time, f.max_time, f.rows or 0) for f in commit.added),
                removed=tuple(st.Span(f.min_time, f.max_time, f.rows or 0) for f in commit.removed)))
    return st.plan_tick(stream, known, version=version, changes=changes, now=now, tz=tz)


def skip_untreated(engine: "Engine", stream: Stream, cursor: str | None) -> str | None:
    """``--ignore-untreated``: a cursor (and, for data-shaped windows, a frontier) for which every row
    committed up to now is already treated, so the data written while stopped is never computed."""
    known = _cursor(cursor, stream)
    if known is None:
        return cursor
    storage = engine.storage
    uri = storage.uri(stream.trigger_table)
    version = latest_version(uri, known=known.version, storage_options=storage.storage_options)
    if version is None or version == known.version:
        return cursor
    span = table_span(uri, version=version, time_column=engine.time_column(stream.trigger_table),
                      storage_options=storage.storage_options)
    max_event = st.latest(known.max_event, span.max_time)
    closed = st.latest(known.closed_until, st.watermark(stream, max_event, datetime.now(UTC)))
    skipped = replace(known, version=version, max_event=max_event, closed_until=closed)
    if stream.trigger.kind in DATA_SHAPED and max_event is not None:
        from cq_engine.streams.frontier import move_frontier

        origin = max_event + timedelta(microseconds=1)
        move_frontier(engine, stream, to=origin)
        skipped = replace(skipped, origin=origin)
    return skipped.to_json()
