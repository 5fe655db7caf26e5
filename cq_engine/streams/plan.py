"""plan for streams: the trigger rows of a run + its windows → one Spark DataFrame of sink rows.

Placeholders are columns: every window's rows carry ``__cq_twstart``, ``__cq_twend``... (see
``model.placeholder_column``) and the trigger group's ``%%n`` values (``__cq_p1``...), so the
subquery's SELECT is evaluated per (partition group, window) by one ``groupBy`` — one Spark job for
every window of the run. A query reading another table joins that table to the run's windows on
its WHERE (a range join such as ``ts >= _twstart AND ts < _twend``).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import sqlglot
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from sqlglot import exp

from cq_engine.durations import micros
from cq_engine.errors import CQError
from cq_engine.model import (
    DATA_SHAPED,
    JOIN_ROW,
    SUB_ID,
    SUB_WEND,
    SUB_WSTART,
    OrderKey,
    PeriodTrigger,
    SlidingTrigger,
    StateTrigger,
    Stream,
    joined_column,
    partition_placeholder,
    placeholder_column,
)
from cq_engine.parse.ekuiper import ROW_TIME
from cq_engine.parse.fragments import TIME_REF, is_aggregate, is_aggregate_sql, under_aggregate
from cq_engine.streams.fill import with_fill
from cq_engine.streams.interp import with_interp
from cq_engine.streams.output import shaping_columns
from cq_engine.streams.series import with_series
from cq_engine.streams.windows.tdengine import (
    CLOSE_ROW,
    NEXT_STATE,
    OPEN_ROW,
    PREV_STATE,
    STATE,
    WCLOSED,
    WEND,
    WLAST,
    WROWS,
    WSEQ,
    WSTART,
    exact_col,
    with_next_tick,
)
from cq_engine.times import EPOCH

log = logging.getLogger(__name__)

GROUP = placeholder_column("_tgrpid")
ENGINE_COLUMNS = (WSTART, WCLOSED, WLAST, GROUP)  # kept in the result for state, dropped before writing
EMPTY = "__cq_empty"  # a window of the run without a result row (FORCE_OUTPUT's row, OPEN events)
PER_WINDOW_LIMIT = 2000
_BIN_W, _BIN_R = "__cq_bin_w", "__cq_bin_r"
_HAVING = "__cq_having"
_RANK = "__cq_rank"
IN_RANGE = "__cq_in_range"  # a row's own sink time lies in its window (see _row_checks)
# Spark refuses nondeterministic expressions in a join condition: such a WHERE runs per window.
_NONDETERMINISTIC = {
    "rand",
    "random",
    "randn",
    "uuid",
    "shuffle",
    "monotonically_increasing_id",
    "rand_str",
    "randstr",
    "uniform",
}


def _p(name: str) -> str:
    return placeholder_column(name)


def query_partition(stream: Stream, df: DataFrame) -> list[str]:
    """The columns telling apart what a query's rows are ordered within: the trigger group (``%%n``),
    its window (start, and ``WSEQ`` where windows share one) and the query's own PARTITION BY."""
    window = [c for c in (WSTART, WSEQ) if c in df.columns]
    return [*partition_columns(stream), *window, *(stream.group_by if stream.partitions_query else ())]


def partition_columns(stream: Stream) -> list[str]:
    """The engine columns holding the trigger group's PARTITION BY values (``%%1``...)."""
    return [partition_placeholder(i + 1) for i in range(len(stream.partition_by))]


def with_partition_columns(stream: Stream, df: DataFrame) -> DataFrame:
    """``%%1``... as columns of the trigger rows."""
    columns = {c: F.col(k) for c, k in zip(partition_columns(stream), stream.partition_by)}
    return df.withColumns(columns) if columns else df  # Spark Connect refuses an empty withColumns


def prepare(stream: Stream, df: DataFrame) -> DataFrame:
    """Trigger rows before windowing: the old form's PARTITION BY expressions, PRE_FILTER, and the
    old form's WHERE (SQL applies it before the window clause)."""
    if stream.partition_exprs:
        df = df.withColumns({name: F.expr(sql) for name, sql in stream.partition_exprs})
    if stream.options.pre_filter:
        df = df.filter(F.expr(stream.options.pre_filter))
    if stream.form == "old" and stream.where:
        df = df.filter(F.expr(stream.where))
    return df


def instant(t: datetime) -> Column:
    """A TIMESTAMP literal: ``F.lit(datetime)`` asks a Connect server for a setting first (a round trip
    per literal), ``timestamp_micros`` of an integer does not."""
    return F.timestamp_micros(F.lit(micros(t - EPOCH)))


def group_id(keys: list[str]) -> Column:
    """``_tgrpid``: a BIGINT that is the same for a partition group in every run."""
    return F.xxhash64(*[F.col(k) for k in keys]) if keys else F.lit(0).cast("long")


def with_placeholders(stream: Stream, df: DataFrame, *, tick: datetime | None, tz: str) -> DataFrame:
    """Add the window-constant placeholder columns the SELECT may use."""
    keys = list(stream.partition_by)
    start, end = F.col(WSTART), F.col(WEND)
    df = with_partition_columns(stream, df)
    df = df.withColumn(_p("_twduration"), ((F.unix_micros(end) - F.unix_micros(start)) / 1000).cast("long"))
    df = df.withColumn(GROUP, group_id(keys))
    df = df.withColumn(_p("_tlocaltime"), instant(tick) if tick else F.current_timestamp())
    if isinstance(stream.trigger, SlidingTrigger) and stream.trigger.interval is None:
        df = df.withColumn(_p("_tprev_ts"), start).withColumn(_p("_tcurrent_ts"), end)
        df = with_next_tick(df, stream.trigger, column=WEND, out=_p("_tnext_ts"), timezone=tz)
    return df


def with_row_time(stream: Stream, df: DataFrame, time_column: str) -> DataFrame:
    """Each row's event time where the query reads it: eKuiper rules as ``ROW_TIME``, for the value of
    a window group's first row (``parse.ekuiper.first_row_values``); TDengine's time-ordered functions
    (FIRST, LAST, TWA...) as ``TIME_REF`` (``parse.tdengine.functions``)."""
    sqls = [i.expression for i in stream.select] + [stream.having or "", stream.where or ""]
    if stream.form == "ekuiper" and any(ROW_TIME in sql for sql in sqls):
        df = df.withColumn(ROW_TIME, exact_col(time_column))
    if reads_time(stream):
        df = df.withColumn(TIME_REF, exact_col(time_column))
    return df


def reads_time(stream: Stream) -> bool:
    """The query (or a query it is made of) reads each row's event time (``TIME_REF``): a function of
    the rows' time order, or INTERVAL's sub-windows."""
    return any(
        q.sub_windows is not None
        or bool(q.series)
        or q.interp is not None
        or any(TIME_REF in sql for sql in [i.expression for i in q.select] + [q.having or ""])
        for q in stream.layers
    )


_CONSTANT = {WSTART, WSEQ, WEND, WLAST, WROWS, WCLOSED} | {
    placeholder_column(p)
    for p in (
        "_twduration",
        "_tgrpid",
        "_tlocaltime",
        "_tprev_ts",
        "_tcurrent_ts",
        "_tnext_ts",
        "_tprev_localtime",
        "_tnext_localtime",
    )
}


def _sql_of(stream: Stream) -> str:
    parts = [i.expression for i in stream.select] + [sql for _, sql in shaping_columns(stream)] + [stream.where or ""]
    return " ".join(parts).lower()


def row_stats_needed(stream: Stream) -> bool:
    """Whether a time-window run needs ``_twrownum`` on every row (``assign_windows(row_stats=True)``:
    a window function, so a sort of every (row, window) pair). Otherwise it is the window's
    ``count(1)``: an aggregate of the query's own ``groupBy`` (``evaluate``) or of ``window_frame``.
    Per row only when a row-level expression reads it: the WHERE over ``%%trows`` (it filters before
    the aggregate), HAVING, the output shaping, or an aggregate's argument."""
    rownum = WROWS.lower()
    if stream.composed:  # read under a subquery or a UNION: per row whenever a query reads %%trows
        used = any(rownum in _sql_of(q) or rownum in (q.having or "").lower() for q in stream.layers)
        return used and any(q.reads == "trows" for q in stream.leaves)
    if rownum not in _sql_of(stream) and rownum not in (stream.having or "").lower():
        return False
    if stream.reads != "trows":  # the frame of the windows carries it into the joined rows
        return False
    if not stream.is_aggregate:  # one result row per input row
        return True
    row_level = [stream.where or "", stream.having or "", *[sql for _, sql in shaping_columns(stream)]]
    return any(rownum in sql.lower() for sql in row_level) or any(
        _rownum_in_aggregate(sqlglot.parse_one(i.expression, read="spark")) for i in stream.select
    )


def _rownum_in_aggregate(tree: exp.Expr) -> bool:
    return any(c.name.lower() == WROWS.lower() and under_aggregate(c) for c in tree.find_all(exp.Column))


def _rownum_as_count(sql: str) -> str:
    """``sql`` with ``_twrownum`` (outside aggregates, see ``row_stats_needed``) read as ``count(1)``."""

    def swap(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.name.lower() == WROWS.lower():
            return sqlglot.parse_one("count(1)", read="spark")
        return node

    return sqlglot.parse_one(sql, read="spark").transform(swap).sql(dialect="spark")


def _window_columns(stream: Stream, df: DataFrame, keep: list[str]) -> list[str]:
    """The window-constant columns to group on: the window start (and ``WSEQ``, telling apart windows
    sharing it), those the SQL uses, ``keep``."""
    sql = _sql_of(stream)
    ids = (WSTART, WSEQ)
    return [c for c in df.columns if c in _CONSTANT | set(keep) and (c in ids or c in keep or c.lower() in sql)]


def evaluate(
    stream: Stream,
    df: DataFrame,
    *,
    keep: list[str] | tuple[str, ...] = (),
    window_columns: list[str] | None = None,
    where: bool = True,
    shaped: bool = True,
) -> DataFrame:
    """The subquery's SELECT per (group, window), then the output-shaping columns (subtable, tags,
    ``group_id``) and the engine columns in ``keep`` (window-constant; for the caller's bookkeeping).

    Aggregates group on the partition columns, the window start and the window-constant columns the
    SQL uses; columns it does not use are left out, so Spark prunes what computes them (a window
    function per row for ``_twrownum``). ``where=False``: the new form's WHERE was already applied
    (as the join condition of a query reading another table); ``shaped=False``: no output-shaping
    columns (a subquery's, a UNION branch's)."""
    if where and stream.form != "old" and stream.where:  # the old form's WHERE ran before windowing
        df = df.filter(F.expr(stream.where))
    pcols = partition_columns(stream)
    shaping = shaping_columns(stream) if shaped else []
    if aggregated(stream):
        # _twrownum not computed per row (row_stats_needed): the window's row count
        as_count = WROWS not in df.columns and any(WROWS.lower() in i.expression.lower() for i in stream.select)
        items = [
            F.expr(_rownum_as_count(i.expression) if as_count else i.expression).alias(i.name) for i in stream.select
        ]
        if window_columns is None:
            window_columns = _window_columns(stream, df, list(keep))
        if stream.sub_windows is not None and stream.sub_windows.fill != "none":  # the range FILL fills
            window_columns = [*window_columns, *[c for c in (WSTART, WEND) if c not in window_columns]]
        # The PARTITION BY columns themselves (tbname, tags) are constant per group: the query may name them.
        named = [c for c in stream.partition_by if c in df.columns] if stream.reads == "trows" else []
        group = list(dict.fromkeys([*pcols, *named, *window_columns, *[k for k in keep if k in df.columns]]))
        # GROUP BY (eKuiper's, TDengine's) and the query's INTERVAL sub-windows split each window's rows
        subs = sub_window_keys(stream, df)
        keys = [exact_col(k) for k in [*stream.group_by, *subs, *join_row_keys(stream, df)]]
        extra = [
            (F.expr(sql) if _over_columns(sql, [*group, *stream.group_by, *subs]) else F.first(F.expr(sql))).alias(name)
            for name, sql in shaping
        ]
        having = []
        # over the window's rows (the new form's HAVING always: it names the query's own columns)
        if stream.having and (stream.form == "new" or is_aggregate_sql(stream.having)):
            having = [F.expr(stream.having).alias(_HAVING)]
        # Aggregated under engine names, renamed after: an item may share a GROUP BY column's name.
        names = [i.name for i in stream.select] + [n for n, _ in shaping]
        inner = [f"__cq_out{n}" for n in range(len(names))]
        checks = [F.expr(sql).alias(name) for name, sql in _row_checks(stream, aggregated=True)]
        orders = [F.expr(k.expression).alias(n) for n, k in _order_keys(stream)]  # over the aggregates
        aggregates = [c.alias(a) for c, a in zip(items + extra, inner)]
        out = df.groupBy(*group, *keys).agg(*aggregates, *having, *checks, *orders)
        if having:
            out = out.filter(F.col(_HAVING))
        if stream.sub_windows is not None and stream.sub_windows.fill != "none":
            sqls = [i.expression for i in stream.select] + [sql for _, sql in shaping]
            kinds = ["aggregate" if i.is_aggregate else "constant" for i in stream.select]
            kinds += ["constant" if _over_columns(sql, group) else "other" for _, sql in shaping]
            out = with_fill(stream, out, ids=group, columns=list(zip(inner, sqls, kinds)))
        out = limited(stream, out, group)
        out = out.select(
            *[F.col(a).alias(n) for a, n in zip(inner, names)], *_kept(keep, group), *[F.col(IN_RANGE)] * len(checks)
        )
        if stream.having and not having:  # over the result's columns
            out = out.filter(F.expr(stream.having))
        return out
    if stream.having:  # eKuiper: an aggregate HAVING keeps or drops a whole window's rows
        ids = [*pcols, *(window_columns or _window_columns(stream, df, list(keep)))]
        passed = df.groupBy(*ids).agg(F.expr(stream.having).alias(_HAVING)).filter(F.col(_HAVING))
        df = df.alias("__cq_l").join(
            passed.alias("__cq_r"),
            on=[_side("__cq_l", c).eqNullSafe(_side("__cq_r", c)) for c in ids],
            how="left_semi",
        )
    if stream.series:  # DIFF, TOP...: over each window's (and query partition's) rows
        df = with_series(stream, df, query_partition(stream, df))
    if stream.interp is not None:  # INTERP: a row per time point instead of the rows
        df = with_interp(stream, df, query_partition(stream, df))
    items = [F.expr(i.expression).alias(i.name) for i in stream.select]
    extra = [F.expr(sql).alias(name) for name, sql in shaping]
    checks = [F.expr(sql).alias(name) for name, sql in _row_checks(stream, aggregated=False)]
    if stream.limit is not None or stream.slimit is not None:
        ids = [*pcols, *(window_columns or _window_columns(stream, df, list(keep)))]
        df = limited(stream, df, list(dict.fromkeys(ids)))
    return df.select(*items, *extra, *checks, *[F.col(k) for k in _kept(keep, df.columns)])


def sub_window_keys(stream: Stream, df: DataFrame) -> list[str]:
    """What the query's sub-windows add to the aggregate's keys: their start, and for a data-shaped
    one its number, its end and (STATE_WINDOW of a column) the state, which the query may select."""
    w = stream.sub_windows
    if w is None:
        return []
    if w.over is None:
        return [SUB_WSTART]
    state = [w.over.column.strip("`")] if isinstance(w.over, StateTrigger) else []
    return [SUB_ID, SUB_WSTART, SUB_WEND, *[c for c in state if c in df.columns]]


def join_row_keys(stream: Stream, df: DataFrame) -> list[str]:
    """A WINDOW join's aggregates group each trigger row's matches: the row, and its columns, which
    the query may select beside them."""
    if not any(j.kind == "window" for j in stream.joins) or JOIN_ROW not in df.columns:
        return []
    return [JOIN_ROW, *[c for c in df.columns if (side := joined_column(c)) is not None and side[0] == 0]]


def aggregated(stream: Stream) -> bool:
    """The query gives one row per window and group, not rows of its own: no query (NOTIFY only),
    an aggregate, or a GROUP BY (eKuiper's, TDengine's)."""
    return stream.is_aggregate or not stream.select or bool(stream.group_by and not stream.partitions_query)


def _row_checks(stream: Stream, *, aggregated: bool) -> list[tuple[str, str]]:
    """A row's own time as the sink's time column (``key_bound == "row"``): ``IN_RANGE`` tells
    whether it lies in its window, ``[start, end)`` (data-shaped windows: ``[first row, last row]``)."""
    if stream.key_bound != "row":
        return []
    first = stream.select[0].expression
    end, op = (WLAST, "<=") if stream.trigger.kind in DATA_SHAPED else (WEND, "<")
    bound = (lambda c: f"first({c})") if aggregated else (lambda c: c)
    return [(IN_RANGE, f"coalesce(({first}) >= {bound(WSTART)} AND ({first}) {op} {bound(end)}, false)")]


def _order_keys(stream: Stream) -> list[tuple[str, OrderKey]]:
    """LIMIT's order (engine column, key): ORDER BY, else the sink's time column."""
    if stream.limit is None:
        return []
    keys = stream.order_by or (OrderKey(stream.select[0].expression),)
    return [(f"__cq_order{n}", k) for n, k in enumerate(keys)]


def limited(stream: Stream, df: DataFrame, window_ids: list[str]) -> DataFrame:
    """SLIMIT's first groups and LIMIT's first rows by ORDER BY, per window (``window_ids``): one
    window function each, so the whole run stays one Spark job. LIMIT counts per query partition
    under PARTITION BY, per window under GROUP BY; without ORDER BY rows go by the sink's time."""
    ids = [exact_col(c) for c in window_ids]
    if stream.slimit is not None:
        rank = F.dense_rank().over(Window.partitionBy(*ids).orderBy(*[exact_col(k) for k in stream.group_by]))
        df = df.withColumn(_RANK, rank)
        df = df.filter((F.col(_RANK) > stream.soffset) & (F.col(_RANK) <= stream.soffset + stream.slimit)).drop(_RANK)
    if stream.limit is None:
        return df
    keys = _order_keys(stream)
    missing = {name: F.expr(k.expression) for name, k in keys if name not in df.columns}  # row-level
    df = df.withColumns(missing) if missing else df
    names = [name for name, _ in keys]
    # Ties (rows equal on the ORDER BY keys) broken by every other column, so which rows LIMIT keeps is
    # a function of the window's rows: a rerun of the window writes the same ones.
    ties = [exact_col(c).asc_nulls_first() for c in df.columns if c not in names and c not in window_ids]
    order = [_sorted(F.col(name), k) for name, k in keys] + ties
    part = ids + ([exact_col(k) for k in stream.group_by] if stream.partitions_query else [])
    df = df.withColumn(_RANK, F.row_number().over(Window.partitionBy(*part).orderBy(*order)))
    lo, hi = stream.offset, stream.offset + stream.limit
    return df.filter((F.col(_RANK) > lo) & (F.col(_RANK) <= hi)).drop(_RANK, *names)


def _sorted(col: Column, key: OrderKey) -> Column:
    if key.descending:
        return col.desc_nulls_first() if key.nulls_first else col.desc_nulls_last()
    return col.asc_nulls_first() if key.nulls_first else col.asc_nulls_last()


def _side(alias: str, column: str) -> Column:
    return F.col(f"{alias}.`{column.replace('`', '``')}`")


def _over_columns(sql: str, columns: list[str]) -> bool:
    """``sql`` is computed from ``columns`` alone (the groupBy's keys): no ``first()`` needed, which on
    a string would make Spark fall back from a hash aggregate to a sort aggregate."""
    tree = sqlglot.parse_one(sql, read="spark")
    names = {c.name.lower() for c in tree.find_all(exp.Column)}
    return not is_aggregate(tree) and names <= {c.lower() for c in columns}


def _kept(keep, available) -> list[str]:
    return [k for k in dict.fromkeys(keep) if k in available]


# --- queries reading another table: the range join -------------------------------------------------


def window_frame(stream: Stream, windows: DataFrame) -> DataFrame:
    """One row per (group, window) of the windowed trigger rows: its window-constant columns."""
    pcols = partition_columns(stream)
    constant = [c for c in windows.columns if _is_window_constant(c) and c != WSTART]
    rownum = [] if WROWS in windows.columns else [F.count(F.lit(1)).alias(WROWS)]  # see row_stats_needed
    return windows.groupBy(*pcols, WSTART).agg(*[F.first(c).alias(c) for c in constant], *rownum)


# Columns with one value per (group, window): what a subquery's rows carry up (``streams.compose``).
WINDOW_CONSTANTS = frozenset(_CONSTANT | {STATE, PREV_STATE, NEXT_STATE, OPEN_ROW, CLOSE_ROW})


def _is_window_constant(column: str) -> bool:
    return column in WINDOW_CONSTANTS


def join_condition(stream: Stream) -> str | None:
    """The condition joining the read table's rows to the run's windows (None: every row joins)."""
    parts = [f"({stream.where})"] if stream.where else []
    if stream.reads == "tbname":
        n = [p.lower() for p in stream.partition_by].index("tbname") + 1
        parts.append(f"tbname = {partition_placeholder(n)}")
    return " AND ".join(parts) or None


def nondeterministic(sql: str | None) -> list[str]:
    """Functions in ``sql`` that Spark cannot evaluate in a join condition."""
    if not sql:
        return []
    tree = sqlglot.parse_one(sql, read="spark")
    names = {(f.sql_name() if not isinstance(f, exp.Anonymous) else f.name).lower() for f in tree.find_all(exp.Func)}
    return sorted(names & _NONDETERMINISTIC)


def time_bounds(where: str | None, time_column: str) -> tuple[str, str] | None:
    """``(P, P')`` when ``where`` holds ``time_column >= P`` and ``time_column < P'`` (either way round,
    strict or not) for window-time placeholders P, P': the joined rows then lie within the run's event
    time, and each window within [P, P'] — what the range join bins on."""
    if not where:
        return None
    bounds = {placeholder_column(p) for p in ("_twstart", "_twend", "_tprev_ts", "_tcurrent_ts", "_tnext_ts")}
    lower = upper = None
    tree = sqlglot.parse_one(where, read="spark").unnest()
    for cond in tree.flatten() if isinstance(tree, exp.And) else [tree]:
        if not isinstance(cond, (exp.GTE, exp.GT, exp.LTE, exp.LT)):
            continue
        for a, b, flipped in ((cond.this, cond.expression, False), (cond.expression, cond.this, True)):
            if (
                isinstance(a, exp.Column)
                and a.name.lower() == time_column.lower()
                and isinstance(b, exp.Column)
                and b.name.lower() in bounds
            ):
                greater = isinstance(cond, (exp.GTE, exp.GT)) != flipped  # time column >= / > P
                if greater:
                    lower = lower or b.name
                else:
                    upper = upper or b.name
    return (lower, upper) if lower and upper else None


def join_source(stream: Stream, frame: DataFrame, source: DataFrame, *, time_column: str, bin: timedelta) -> DataFrame:
    """The read table's rows joined to every window whose condition they meet: one Spark join, or —
    when the WHERE is nondeterministic — one filter per window over literal placeholder values, logged.

    When the WHERE bounds the time column by window placeholders, the join also matches on a time
    bucket of size ``bin`` (each window exploded into the buckets it spans, each row in its own), so
    Spark runs an equi-join instead of comparing every row with every window."""
    cond = join_condition(stream)
    bad = nondeterministic(cond)
    if not bad:
        if cond is None:
            log.warning(
                "%s: the query's WHERE does not relate %s to the window: every window reads the whole table",
                stream.name,
                stream.source,
            )
            return source.crossJoin(frame)
        bounds = time_bounds(stream.where, time_column)
        if bounds is None:
            return source.join(frame, on=F.expr(cond), how="inner")
        size = max(1, micros(bin))
        bucket = lambda c: F.floor(F.unix_micros(c) / F.lit(size)).cast("long")
        frame = frame.withColumn(_BIN_W, F.explode(F.sequence(bucket(F.col(bounds[0])), bucket(F.col(bounds[1])))))
        source = source.withColumn(_BIN_R, bucket(F.col(time_column)))
        joined = source.join(frame, on=(F.col(_BIN_R) == F.col(_BIN_W)) & F.expr(cond), how="inner")
        return joined.drop(_BIN_R, _BIN_W)
    rows = frame.toArrow().to_pylist()
    if len(rows) > PER_WINDOW_LIMIT:
        raise CQError(
            f"{stream.name}: the WHERE uses {', '.join(bad)}, which Spark cannot evaluate in a join, and "
            f"per-window evaluation is limited to {PER_WINDOW_LIMIT} windows (this run has {len(rows)})"
        )
    log.warning(
        "%s: per-window evaluation of %d window(s): the WHERE uses %s, which Spark cannot evaluate in a join condition",
        stream.name,
        len(rows),
        ", ".join(bad),
    )
    assert cond is not None  # only a condition can call what Spark cannot join on
    types = dict(frame.dtypes)
    parts = [
        source.withColumns({c: F.lit(v).cast(types[c]) for c, v in row.items()}).filter(F.expr(cond)) for row in rows
    ]
    out = parts[0] if parts else source.crossJoin(frame).limit(0)
    for part in parts[1:]:
        out = out.unionByName(part)
    return out


# --- windows without a result: FORCE_OUTPUT's row and OPEN events ---------------------------------


def is_constant(sql: str) -> bool:
    """An item FORCE_OUTPUT keeps: no aggregate, and only placeholders and the group's values."""
    tree = sqlglot.parse_one(sql, read="spark")
    return not is_aggregate(tree) and all(c.name.lower().startswith("__cq_") for c in tree.find_all(exp.Column))


def with_empty_windows(stream: Stream, result: DataFrame, frame: DataFrame, keep: list[str]) -> DataFrame:
    """``result`` plus a row marked ``EMPTY`` for each window of ``frame`` without a result row:
    constants (placeholders, ``%%n``) keep their value, every other column is NULL (FORCE_OUTPUT)."""
    ids = [GROUP, WSTART]
    missing = frame.join(result.select(*ids).distinct(), on=ids, how="left_anti")
    types = dict(result.dtypes)
    cols = []
    for item in stream.select:
        value = F.expr(item.expression) if is_constant(item.expression) else F.lit(None)
        cols.append(value.cast(types[item.name]).alias(item.name))
    for name, sql in shaping_columns(stream):
        cols.append(F.expr(sql).cast(types[name]).alias(name))
    cols += [F.col(k) for k in _kept(keep, result.columns) if k in frame.columns]
    empty = missing.select(*cols)
    return result.withColumn(EMPTY, F.lit(False)).unionByName(
        empty.withColumn(EMPTY, F.lit(True)), allowMissingColumns=True
    )


def period_frame(
    stream: Stream, df: DataFrame, *, tick: datetime, prev_tick: datetime, next_tick: datetime
) -> DataFrame:
    """A PERIOD stream's rows for one tick: placeholders are the tick times."""
    assert isinstance(stream.trigger, PeriodTrigger)
    keys = list(stream.partition_by)
    df = with_partition_columns(stream, df)
    df = (
        df.withColumn(_p("_tlocaltime"), instant(tick))
        .withColumn(_p("_tprev_localtime"), instant(prev_tick))
        .withColumn(_p("_tnext_localtime"), instant(next_tick))
        .withColumn(GROUP, group_id(keys))
        .withColumns({WSTART: instant(prev_tick), WEND: instant(tick), WCLOSED: F.lit(True)})
    )
    return df


# Constant over a PERIOD tick: what its SELECT may group on.
PERIOD_COLUMNS = [_p(n) for n in ("_tlocaltime", "_tprev_localtime", "_tnext_localtime")]
