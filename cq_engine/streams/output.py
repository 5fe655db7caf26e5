"""What a stream writes besides its query's items (seed 000: OUTPUT_SUBTABLE, TAGS; seed 002:
SUBTABLE, custom TAG, writing into an existing table).

A sink row is the query's items, then the output subtable's name (``tbname``, with
OUTPUT_SUBTABLE/SUBTABLE), then the tag columns (TAGS, or else the PARTITION BY columns the items do
not already hold), then ``group_id``: the partition group, the same BIGINT in every run (``_tgrpid``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cq_engine.errors import CQError
from cq_engine.model import Stream, partition_placeholder, placeholder_column

if TYPE_CHECKING:  # the catalog imports this module: `cq validate` needs no pyarrow
    import pyarrow as pa

GROUP_ID = "group_id"
SUBTABLE = "tbname"
_GROUP = placeholder_column("_tgrpid")


def shaping_columns(stream: Stream) -> list[tuple[str, str]]:
    """(sink column, Spark SQL over a window's rows) after the query's items."""
    items = {i.name.lower() for i in stream.select}
    out: list[tuple[str, str]] = []
    if stream.output_subtable:
        sql = f"CAST(({stream.output_subtable}) AS STRING)"
        if stream.form == "old":
            # seed 000 (v3.2.3.0+): SUBTABLE names get "_<stable>_<groupId>" so two groups never share one
            sql = f"CONCAT({sql}, '_{stream.sink}_', CAST({_GROUP} AS STRING))"
        out.append((SUBTABLE, sql))
    if stream.tags:
        out += [(t.name, f"CAST(({t.expression}) AS {t.type})") for t in stream.tags]
    else:
        for i, name in enumerate(stream.partition_by):
            if name.lower() in items:
                continue
            # With OUTPUT_SUBTABLE, ``tbname`` is the output subtable's name; the trigger's moves aside.
            column = "tag_tbname" if name.lower() == "tbname" and stream.output_subtable else name
            out.append((column, partition_placeholder(i + 1)))
        # eKuiper: the GROUP BY columns the items leave out, so each row says whose it is
        if not stream.union:  # a UNION's rows are its queries' columns (their GROUP BY columns differ)
            # (a join's alias.col is the engine's name for it, not a column to write)
            out += [(k, f"`{k}`") for k in stream.group_by if k.lower() not in items and not k.startswith("__cq")]
    out.append((GROUP_ID, _GROUP))
    return out


def output_names(stream: Stream) -> list[str]:
    """The columns a stream writes, in order."""
    return [i.name for i in stream.select] + [name for name, _ in shaping_columns(stream)]


def sink_mismatch(stream: Stream, table: str, data_columns: list[str]) -> str | None:
    """Seed 002's check of an existing sink: without a column list, its data columns (those the
    shaping does not fill) must match the query's items in number; with one, each listed column must
    exist. The error text, or None."""
    n = len(stream.select)
    known = {c.lower() for c in data_columns}
    if stream.sink_columns is not None:
        missing = [c for c in stream.sink_columns if c.lower() not in known]
        if missing:
            return f"{stream.name!r}: table {table!r} has no column {missing[0]!r} (columns: {', '.join(data_columns)})"
        return None
    if len(data_columns) != n:
        return (
            f"{stream.name!r}: table {table!r} has {len(data_columns)} columns ({', '.join(data_columns)}) but the "
            f"query yields {n}; give INTO {table} (col, ...) to map them"
        )
    return None


def data_columns(stream: Stream, sink_columns: list[str], tags: tuple[str, ...] = ()) -> list[str]:
    """The sink's columns the query's items fill: all but the shaping columns and declared ``tags``."""
    shaped = {name.lower() for name, _ in shaping_columns(stream)} | {t.lower() for t in tags}
    return [c for c in sink_columns if c.lower() not in shaped]


def column_map(stream: Stream, sink_columns: list[str] | None, tags: tuple[str, ...] = ()) -> dict[str, str]:
    """Item name → the existing sink's column it fills: by position without a column list (the
    parser already named the items after a column list); the storage then casts types and fills the
    columns nobody writes with NULL. ``sink_columns`` None: the sink is new, names stay."""
    names = {i.name: i.name for i in stream.select}
    if sink_columns is None:
        return names
    targets = data_columns(stream, sink_columns, tags)
    problem = sink_mismatch(stream, stream.sink or "", targets)
    if problem:
        raise CQError(problem)
    if stream.sink_columns is not None:
        return names
    return {i.name: t for i, t in zip(stream.select, targets)}


def renamed(data: pa.Table, mapping: dict[str, str]) -> pa.Table:
    return data.rename_columns([mapping.get(c, c) for c in data.column_names])
