"""The per-group state of data-shaped stream windows (SESSION, STATE_WINDOW, EVENT_WINDOW,
COUNT_WINDOW): per partition group, the start of its first window not yet closed (the *frontier*)
and its group id, in a Delta table under ``_cq/streams/<name>/frontier``."""

from __future__ import annotations

from datetime import datetime, timedelta

import pyarrow as pa
from pyspark.sql import Window
from pyspark.sql import functions as F

from cq_engine.context import EngineContext
from cq_engine.model import CountTrigger, Stream
from cq_engine.storage.delta import storable_schema
from cq_engine.streams.output import GROUP_ID
from cq_engine.streams.plan import GROUP
from cq_engine.streams.sink import sink_time, writes
from cq_engine.times import EPOCH

RESUME = "__cq_resume"


def state_name(stream: Stream, what: str) -> str:
    """The name of one of a stream's state tables (``storage.read_state``): ``streams/<name>/<what>``."""
    return f"streams/{stream.name}/{what}"


def load_frontier(
    ctx: EngineContext, stream: Stream, keys: list[str]
) -> tuple[dict[tuple, datetime], dict[tuple, int], list[pa.Field]]:
    """Per partition group (its key values): the start of its first window not yet closed and its
    group id; and the key columns' Arrow fields."""
    data = ctx.storage.read_state(state_name(stream, "frontier"))
    if data is None:
        return {}, {}, []
    names = {n.lower(): n for n in data.column_names}
    stored = [names.get(k.lower(), k) for k in keys]
    if any(k not in data.column_names for k in stored) or set(data.column_names) - {*stored, GROUP, RESUME}:
        return {}, {}, []  # the partitioning changed (other or fewer keys): the groups start over
    resume, gids = _frontier_of(data, stored)
    return (
        resume,
        gids,
        list(storable_schema(pa.schema([data.schema.field(k).with_name(key) for k, key in zip(stored, keys)]))),
    )


def _frontier_of(data: pa.Table, keys: list[str]) -> tuple[dict[tuple, datetime], dict[tuple, int]]:
    rows = data.to_pylist()
    resume = {tuple(row[k] for k in keys): row[RESUME] for row in rows}
    gids = {tuple(row[k] for k in keys): row[GROUP] for row in rows if row.get(GROUP) is not None}
    return resume, gids


def frontier_table(frontier: dict[tuple, datetime], gids: dict[tuple, int], key_fields: list[pa.Field]) -> pa.Table:
    """The frontier as Arrow: the key columns (typed as in the trigger table), the group id, ``RESUME``."""
    schema = pa.schema([*key_fields, pa.field(GROUP, pa.int64()), pa.field(RESUME, pa.timestamp("us", tz="UTC"))])
    columns = (
        [[g[i] for g in frontier] for i in range(len(key_fields))]
        + [[gids.get(g) for g in frontier]]
        + [list(frontier.values())]
    )
    return pa.table(columns, schema=schema)


def save_frontier(
    ctx: EngineContext,
    stream: Stream,
    frontier: dict[tuple, datetime],
    gids: dict[tuple, int],
    key_fields: list[pa.Field],
    *,
    app_id: str,
    app_version: int,
) -> None:
    ctx.storage.overwrite_state(
        state_name(stream, "frontier"),
        frontier_table(frontier, gids, key_fields),
        app_id=app_id,
        app_version=app_version,
    )


def move_frontier(ctx: EngineContext, stream: Stream, *, to: datetime) -> None:
    """Every group resumes at ``to`` or later (``--ignore-untreated``)."""
    current = ctx.storage.read_state(state_name(stream, "frontier"))
    if current is None:
        return
    keys = [n for n in current.column_names if n not in (RESUME, GROUP)]
    resume, gids = _frontier_of(current, keys)
    frontier = {g: max(t, to) for g, t in resume.items()}
    save_frontier(
        ctx,
        stream,
        frontier,
        gids,
        [current.schema.field(k) for k in keys],
        app_id=f"cq-engine/{stream.name}/untreated",
        app_version=0,
    )


def restarts(ctx: EngineContext, stream: Stream, at: datetime) -> dict[int, datetime]:
    """Per group id, a window start at or before ``at`` from which segmenting again reproduces every
    window before it: the latest one (for sliding COUNT_WINDOWs, the earliest still holding ``at``)."""
    if not writes(stream) or not ctx.storage.exists(stream.sink_table):
        return {}
    column = sink_time(ctx, stream)
    df, _ = ctx.storage.read_range(
        ctx.spark, stream.sink_table, time_column=column, time_range=(EPOCH, at + timedelta(microseconds=1))
    )
    trig = stream.trigger
    back = -(-trig.count // trig.slide) if isinstance(trig, CountTrigger) else 1
    starts = df.select(GROUP_ID, column).distinct()
    rank = F.row_number().over(Window.partitionBy(GROUP_ID).orderBy(F.col(column).desc()))
    rows = (
        starts.withColumn("__cq_rank", rank)
        .filter(F.col("__cq_rank") <= back)
        .groupBy(GROUP_ID)
        .agg(F.min(column).alias("restart"))
        .toArrow()
    )
    return {r[GROUP_ID]: r["restart"] for r in rows.to_pylist()}
