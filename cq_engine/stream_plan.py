"""plan for streams: the trigger rows of a run + its windows → one Spark DataFrame of sink rows.

Placeholders are columns: every window's rows carry ``__cq_twstart``, ``__cq_twend``... (see
``model.placeholder_column``), so the subquery's SELECT is evaluated per (partition group, window)
by one ``groupBy`` — one Spark job for every window of the run.
"""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from .model import PeriodTrigger, SlidingTrigger, Stream, placeholder_column
from .windows import WCLOSED, WEND, WLAST, WROWS, WSTART, with_next_tick

ENGINE_COLUMNS = (WSTART, WCLOSED, WLAST)  # kept in the result for state, dropped before writing


def _p(name: str) -> str:
    return placeholder_column(name)


def pre_window_filter(stream: Stream, df: DataFrame) -> DataFrame:
    """PRE_FILTER, and the old form's WHERE (SQL applies it before the window clause)."""
    if stream.options.pre_filter:
        df = df.filter(F.expr(stream.options.pre_filter))
    if stream.form == "old" and stream.where:
        df = df.filter(F.expr(stream.where))
    return df


def group_id(keys: list[str]) -> Column:
    """``_tgrpid``: a BIGINT that is the same for a partition group in every run."""
    return F.xxhash64(*[F.col(k) for k in keys]) if keys else F.lit(0).cast("long")


def with_placeholders(stream: Stream, df: DataFrame, *, tick: datetime | None, tz: str) -> DataFrame:
    """Add the window-constant placeholder columns the SELECT may use."""
    keys = list(stream.partition_by)
    start, end = F.col(WSTART), F.col(WEND)
    df = df.withColumn(_p("_twduration"), ((F.unix_micros(end) - F.unix_micros(start)) / 1000).cast("long"))
    df = df.withColumn(_p("_tgrpid"), group_id(keys))
    df = df.withColumn(_p("_tlocaltime"), F.lit(tick).cast("timestamp") if tick else F.current_timestamp())
    if isinstance(stream.trigger, SlidingTrigger) and stream.trigger.interval is None:
        df = df.withColumn(_p("_tprev_ts"), start).withColumn(_p("_tcurrent_ts"), end)
        df = with_next_tick(df, stream.trigger, column=WEND, out=_p("_tnext_ts"), timezone=tz)
    return df


def evaluate(stream: Stream, df: DataFrame, *, keep_state: bool, window_columns: list[str] | None = None) -> DataFrame:
    """The subquery's SELECT per (group, window), plus the partition columns the sink holds.

    Aggregates group on the window start and the window-constant columns the SQL uses (so
    placeholders may appear in an aggregate SELECT); columns it does not use are left out, so Spark
    prunes what computes them (a window function per row for ``_twrownum``). With ``keep_state``
    the window's start/closed/last columns stay in the result for the caller's bookkeeping."""
    if stream.form == "new" and stream.where:
        df = df.filter(F.expr(stream.where))
    keys = list(stream.partition_by)
    names = {i.name.lower() for i in stream.select}
    extra = [F.col(k) for k in keys if k.lower() not in names]
    state = [F.col(c) for c in ENGINE_COLUMNS] if keep_state else []
    items = [F.expr(i.expression).alias(i.name) for i in stream.select]
    if stream.is_aggregate:
        if window_columns is None:
            window_columns = _used_window_columns(stream, df, keep_state)
        grouped = df.groupBy(*keys, *window_columns).agg(*items)
        return grouped.select(*[F.col(i.name) for i in stream.select], *extra, *state)
    return df.select(*items, *extra, *state)


_CONSTANT = {WSTART, WEND, WLAST, WROWS, WCLOSED} | {placeholder_column(p) for p in (
    "_twduration", "_tgrpid", "_tlocaltime", "_tprev_ts", "_tcurrent_ts", "_tnext_ts",
    "_tprev_localtime", "_tnext_localtime")}


def _used_window_columns(stream: Stream, df: DataFrame, keep_state: bool) -> list[str]:
    sql = " ".join([i.expression for i in stream.select] + [stream.where or ""]).lower()
    wanted = {WSTART} | (set(ENGINE_COLUMNS) if keep_state else set())
    return [c for c in df.columns if c in _CONSTANT and (c in wanted or c.lower() in sql)]


def period_frame(stream: Stream, df: DataFrame, *, tick: datetime, prev_tick: datetime, next_tick: datetime) -> DataFrame:
    """A PERIOD stream's rows for one tick: placeholders are the tick times."""
    assert isinstance(stream.trigger, PeriodTrigger)
    keys = list(stream.partition_by)
    df = (df.withColumn(_p("_tlocaltime"), F.lit(tick).cast("timestamp"))
            .withColumn(_p("_tprev_localtime"), F.lit(prev_tick).cast("timestamp"))
            .withColumn(_p("_tnext_localtime"), F.lit(next_tick).cast("timestamp"))
            .withColumn(_p("_tgrpid"), group_id(keys)))
    return evaluate(stream, df, window_columns=[_p(n) for n in ("_tlocaltime", "_tprev_localtime",
                                                                "_tnext_localtime", "_tgrpid")], keep_state=False)
