"""eKuiper's ``lateTolerance``: the rows its watermark drops before any window (README, eKuiper rules).

eKuiper's ``WatermarkOp.track`` passes a row only when its event time is at or after the watermark
at its arrival: the latest event time seen before it minus ``lateTolerance``. Here rows arrive by
Delta commit (the rows of one commit together): a row of commit ``c`` is dropped when it is older
than the latest event time of the commits before ``c`` minus the tolerance. The sensor finds those
rows exactly (it reads the time column of each added file whose statistics reach below that
watermark, no Spark) and keeps, per file holding any, the watermark it arrived under in the state
table ``streams/<name>/late``; every run of the rule leaves those rows out before its windows, so
they trigger and join no window (a recalculation still computes them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from cq_engine.context import EngineContext
from cq_engine.durations import micros
from cq_engine.model import Stream
from cq_engine.storage.log import Commit
from cq_engine.streams.frontier import state_name
from cq_engine.times import EPOCH

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_FILE, _BEFORE = "__cq_late_file", "__cq_late_before"


@dataclass(frozen=True)
class LateFile:
    """The rows of one added file older than the watermark they arrived under."""

    name: str  # the file's base name (what Spark's ``_metadata.file_path`` ends with)
    before: datetime  # the watermark: rows of the file before it are dropped
    rows: int
    first: datetime  # the dropped rows' event-time span
    last: datetime


def drops_late_rows(stream: Stream) -> bool:
    """An eKuiper rule with ``WITH (lateTolerance = ms)``."""
    return stream.form == "ekuiper" and stream.options.ignore_disorder


def find_late(
    ctx: EngineContext, stream: Stream, table: str, commits: Sequence[Commit], *, max_event: datetime | None
) -> list[LateFile]:
    """The late rows of ``commits`` (in order) for a rule whose latest event time before them is
    ``max_event``: only the files whose minimum lies below the watermark are read."""
    time_column = ctx.time_column(table)
    out: list[LateFile] = []
    latest = max_event
    for commit in commits:
        watermark = latest - stream.options.watermark if latest is not None else None
        for f in commit.added:
            if watermark is not None and (f.min_time is None or f.min_time < watermark):
                times = ctx.storage.read_file(table, f.path, columns=(time_column,)).column(0)
                late = times.filter(pc.less(times, pa.scalar(watermark, times.type)))
                if len(late):
                    bounds = pc.min_max(late).as_py()
                    name = f.path.rsplit("/", 1)[-1]
                    out.append(LateFile(name, watermark, len(late), bounds["min"], bounds["max"]))
        tops = [f.max_time for f in commit.added if f.max_time is not None]
        if tops and (latest is None or max(tops) > latest):
            latest = max(tops)
    return out


def record_late(ctx: EngineContext, stream: Stream, files: Sequence[LateFile]) -> None:
    """Keep the late files' watermarks for every later run (a retried tick adds the same entries)."""
    if files:
        ctx.storage.append_state(
            state_name(stream, "late"),
            pa.table(
                {
                    "file": [f.name for f in files],
                    "before_us": pa.array([micros(f.before - EPOCH) for f in files], pa.int64()),
                }
            ),
        )


def late_entries(ctx: EngineContext, stream: Stream) -> tuple[tuple[str, int], ...]:
    """Every (file name, watermark µs) recorded for ``stream`` (none for other rules)."""
    if not drops_late_rows(stream):
        return ()
    table = ctx.storage.read_state(state_name(stream, "late"))
    if table is None:
        return ()
    pairs = zip(table.column("file").to_pylist(), table.column("before_us").to_pylist())
    return tuple(sorted({(f, int(b)) for f, b in pairs}))


def without_late(
    ctx: EngineContext, df: DataFrame, entries: tuple[tuple[str, int], ...], time_column: str
) -> DataFrame:
    """``df`` (a file scan) without the rows ``entries`` drop: one broadcast join on the file name."""
    from pyspark.sql import functions as F  # the sensor imports this module without Spark

    if not entries:
        return df
    drops = F.broadcast(ctx.spark.createDataFrame(list(entries), f"{_FILE} string, {_BEFORE} long"))
    name = F.element_at(F.split(F.col("_metadata.file_path"), "/"), -1)
    joined = df.withColumn("__cq_late_name", name).join(drops, F.col("__cq_late_name") == F.col(_FILE), "left")
    kept = F.col(_BEFORE).isNull() | (F.unix_micros(F.col(time_column)) >= F.col(_BEFORE))
    return joined.filter(kept).drop("__cq_late_name", _FILE, _BEFORE)
