"""A stream run's writes to its sink: the due rows of its result, mapped onto an existing sink's
columns, replacing exactly the rows the run recomputed (and, with DELETE_OUTPUT_TABLE, those of the
groups gone from the trigger table) in one Delta commit."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F

from cq_engine.context import EngineContext
from cq_engine.errors import CQError
from cq_engine.model import DATA_SHAPED, Stream
from cq_engine.storage.predicates import quote_ident
from cq_engine.streams.output import GROUP_ID, column_map, output_names, renamed
from cq_engine.streams.plan import EMPTY, IN_RANGE, group_id, prepare
from cq_engine.streams.windows.tdengine import WCLOSED, WSTART


def _sink_schema(ctx: EngineContext, stream: Stream) -> pa.Schema | None:
    """The existing sink's schema (one Delta snapshot load), or None."""
    if stream.sink is None or not ctx.storage.exists(stream.sink):
        return None
    return ctx.storage.schema(stream.sink)


def _column_map(ctx: EngineContext, stream: Stream, schema: pa.Schema | None) -> dict[str, str]:
    decl = ctx.catalog.table(stream.sink) if stream.sink else None
    tags = tuple(c.name for c in decl.columns if c.is_tag) if decl is not None else ()
    return column_map(stream, list(schema.names) if schema is not None else None, tags)


def writes(stream: Stream) -> bool:
    return stream.sink is not None and not stream.options.calc_notify_only


def write_sink(
    ctx: EngineContext,
    stream: Stream,
    result: pa.Table | None,
    *,
    open_ok: bool,
    ranges_of,
    gone: list[int],
    app_version: int,
    kind: str,
    once: bool = False,
) -> tuple[int, int | None]:
    """Write the result rows that are due (closed, or open when ``open_ok``; FORCE_OUTPUT's rows),
    replacing the rows ``ranges_of(sink time column)`` selects and the groups in ``gone``. ``once``:
    a sink that holds this write's identity ``(kind, app_version)`` already raises ``AlreadyCommitted``."""
    if not writes(stream):
        return 0, None
    schema = _sink_schema(ctx, stream)
    mapping = _column_map(ctx, stream, schema)
    sink_time = mapping[stream.time_column]
    predicate = ranges_of(sink_time)
    if gone:
        predicate = f"({predicate}) OR {quote_ident(GROUP_ID)} IN ({', '.join(str(g) for g in gone)})"
    data = _due(stream, result, open_ok=open_ok) if result is not None else _empty(stream, schema)
    data = renamed(data, mapping)
    if schema is not None and GROUP_ID not in {c.lower() for c in schema.names}:
        # A table the user made may leave group_id out, unless the engine must find a group's rows.
        if stream.trigger.kind in DATA_SHAPED or stream.options.delete_output_table:
            raise CQError(
                f"{stream.name}: table {stream.sink!r} has no {GROUP_ID!r} column, which this stream "
                f"needs to replace one partition group's rows: add {GROUP_ID} BIGINT to it"
            )
        data = data.drop_columns([c for c in data.column_names if c.lower() == GROUP_ID])
    version = ctx.storage.replace_where(
        stream.sink_table,
        data,
        predicate=predicate,
        time_column=sink_time,
        app_id=f"cq-engine/{stream.name}/{kind}",
        app_version=app_version,
        metadata={"cq.definition": stream.name, "cq.kind": kind},
        once=once,
    )
    return data.num_rows, version


def _due(stream: Stream, result: pa.Table, *, open_ok: bool) -> pa.Table:
    keep = pc.equal(result.column(WCLOSED), True)
    if open_ok:
        keep = pa.array([True] * result.num_rows, pa.bool_())
    if EMPTY in result.column_names and not stream.empty_window_rows:
        keep = pc.and_(keep, pc.invert(result.column(EMPTY)))
    rows = result.filter(keep)
    if IN_RANGE in rows.column_names:
        _check_in_range(stream, rows)
    return rows.select(output_names(stream))


def _check_in_range(stream: Stream, rows: pa.Table) -> None:
    """A row's own time as the sink's time column must lie in its window: the window's replace
    covers only that range, so a row outside it is refused (nothing of the run is written)."""
    inside = rows.column(IN_RANGE)
    if pc.all(inside).as_py() is not False:
        return
    i = pc.index(inside, False).as_py()
    value = rows.column(stream.time_column)[i].as_py()
    start = rows.column(WSTART)[i].as_py() if WSTART in rows.column_names else None
    raise CQError(
        f"{stream.name}: the sink's time column {stream.time_column!r} is {value} in the window starting "
        f"at {start}, outside that window's range: a stream's time column must lie in its trigger window "
        "(or PERIOD tick); nothing of this run was written"
    )


def _empty(stream: Stream, schema: pa.Schema | None) -> pa.Table:
    """No rows (a pure delete), in the sink's schema when it exists."""
    if schema is None:
        return pa.table({stream.time_column: pa.array([], pa.timestamp("us", tz="UTC"))})
    return schema.empty_table()


def gone_groups(ctx: EngineContext, stream: Stream, version: int) -> list[int]:
    """DELETE_OUTPUT_TABLE: the sink's groups no trigger-table row belongs to any more."""
    if not (stream.options.delete_output_table and writes(stream) and ctx.storage.exists(stream.sink_table)):
        return []
    table = stream.trigger_table
    assert table is not None  # DELETE_OUTPUT_TABLE needs a trigger table (the catalog checks)
    time_column = ctx.time_column(table)
    trig, _ = ctx.storage.read_range(ctx.spark, table, time_column=time_column, time_range=None, version=version)
    live = prepare(stream, trig).select(group_id(list(stream.partition_by)).alias("__cq_live")).distinct()
    sink, _ = ctx.storage.read_range(ctx.spark, stream.sink_table, time_column=sink_time(ctx, stream), time_range=None)
    gone = sink.select(GROUP_ID).distinct().join(live, F.col(GROUP_ID) == F.col("__cq_live"), "left_anti").toArrow()
    return sorted(g for g in gone.column(GROUP_ID).to_pylist() if g is not None)


def sink_time(ctx: EngineContext, stream: Stream) -> str:
    """The sink's column holding the query's time column (renamed when mapped onto an existing sink)."""
    return _column_map(ctx, stream, _sink_schema(ctx, stream))[stream.time_column]
