"""The frozen IR every stage after parsing talks in. Data only, no behaviour beyond validation."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from cq_engine.errors import ParseError

TimeoutPolicy = Literal["BLOCKED", "DISCARD"]
FillKind = Literal["previous", "linear", "constant"]


@dataclass(frozen=True)
class SourceLocation:
    """Where a definition starts: ``file:line:col``."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@dataclass(frozen=True)
class Column:
    """A declared column; ``type`` is a Spark SQL type name (``double``, ``timestamp``...)."""

    name: str
    type: str
    is_tag: bool = False


@dataclass(frozen=True)
class TableDecl:
    """``CREATE TABLE``: a Delta table the engine creates and whose schema it enforces."""

    name: str
    columns: tuple[Column, ...]
    time_column: str
    if_not_exists: bool
    location: SourceLocation
    sql: str = ""
    alias: str | None = None  # eKuiper: the stream name rules use for this table

    def column(self, name: str) -> Column | None:
        lowered = name.lower()
        return next((c for c in self.columns if c.name.lower() == lowered), None)


@dataclass(frozen=True)
class Resample:
    """IoTDB ``RESAMPLE``: firing i runs at ``boundary + i*every`` over
    ``[fire - start_offset, fire - end_offset)``."""

    every: timedelta
    start_offset: timedelta
    end_offset: timedelta
    boundary: datetime  # timezone-aware UTC

    def __post_init__(self) -> None:
        if self.boundary.tzinfo is None:
            raise ValueError("Resample.boundary must be timezone-aware")


@dataclass(frozen=True)
class TimeGrouping:
    """``GROUP BY (interval[, step])``: windows ``[lo + k*step, lo + k*step + interval)``."""

    interval: timedelta
    step: timedelta


@dataclass(frozen=True)
class Fill:
    """``FILL(PREVIOUS | LINEAR | constant)``; ``value`` is set for a constant."""

    kind: FillKind
    value: float | int | str | bool | None = None


@dataclass(frozen=True)
class OrderKey:
    """One ORDER BY key: Spark SQL over the query's rows (or its aggregates), its direction."""

    expression: str
    descending: bool = False
    nulls_first: bool = True


@dataclass(frozen=True)
class SelectItem:
    """One output column: Spark SQL for the expression, and the sink column it lands in."""

    expression: str
    name: str
    is_aggregate: bool


@dataclass(frozen=True)
class ContinuousQuery:
    """``CREATE CONTINUOUS QUERY``: one SELECT run on every RESAMPLE firing."""

    name: str
    resample: Resample
    timeout_policy: TimeoutPolicy
    source: str
    sink: str
    select: tuple[SelectItem, ...]
    where: str | None = None
    time_grouping: TimeGrouping | None = None
    group_keys: tuple[str, ...] = ()
    having: str | None = None
    fill: Fill | None = None
    limit: int | None = None
    offset: int = 0
    align_by_device: bool = False
    location: SourceLocation = field(default_factory=lambda: SourceLocation("<string>", 1, 1))
    sql: str = ""
    freshness_grace: timedelta | None = None  # `-- cq: freshness_grace 5m`; None: the setting's
    into_columns: tuple[str, ...] | None = None  # INTO sink(col, ...), positional over the expanded items

    @property
    def kind(self) -> str:
        return "continuous query"

    @property
    def is_aggregate(self) -> bool:
        return self.time_grouping is not None or any(i.is_aggregate for i in self.select)


# --- TDengine streams (seed 000) ------------------------------------------------------------------

EventType = Literal["WINDOW_OPEN", "WINDOW_CLOSE"]
OnFailure = Literal["drop", "pause"]  # NOTIFY: an undelivered notification is dropped, or pauses the stream
TriggerMode = Literal["window_close", "at_once", "max_delay", "force_window_close", "continuous_window_close"]
# "row": a timestamp the query computes (a row's own ts), which must lie in its window
KeyBound = Literal["start", "end", "tick", "row"]


@dataclass(frozen=True)
class PeriodTrigger:
    """``PERIOD(period[, offset])``: processing-time ticks (ARCHITECTURE.md §5, ``cron.period_ticks``)."""

    period: timedelta
    offset: timedelta = timedelta(0)
    kind: str = "period"


@dataclass(frozen=True)
class SlidingTrigger:
    """``[INTERVAL(interval[, interval_offset])] SLIDING(sliding[, offset])`` (and the old form's
    ``INTERVAL(i[, o]) [SLIDING(s)]``). Without INTERVAL the ticks follow PERIOD's day-reset rule in
    event time and each window is ``[previous tick, tick)``."""

    sliding: timedelta
    interval: timedelta | None = None
    interval_offset: timedelta = timedelta(0)
    sliding_offset: timedelta = timedelta(0)
    kind: str = "sliding"


@dataclass(frozen=True)
class SessionTrigger:
    """``SESSION(ts_col, gap)``: rows at most ``gap`` apart share a window. ``ts_column`` is the
    column as written (the catalog checks it is the trigger table's time column)."""

    gap: timedelta
    kind: str = "session"
    ts_column: str | None = None


@dataclass(frozen=True)
class StateTrigger:
    """``STATE_WINDOW(col) [TRUE_FOR(d)]``: a run of equal values of ``column`` (Spark SQL)."""

    column: str
    true_for: timedelta | None = None
    kind: str = "state"


@dataclass(frozen=True)
class EventTrigger:
    """``EVENT_WINDOW(START WITH c1 END WITH c2) [TRUE_FOR(d)]``; conditions are Spark SQL."""

    start: str
    end: str
    true_for: timedelta | None = None
    kind: str = "event"


@dataclass(frozen=True)
class CountTrigger:
    """``COUNT_WINDOW(n[, slide][, cols])``; with ``columns`` only rows where any is non-null count."""

    count: int
    slide: int
    columns: tuple[str, ...] = ()
    kind: str = "count"
    # eKuiper's COUNTWINDOW(n, k) fires at every k-th event once n arrived, so a group's windows
    # start ``ceil(n/k)*k - n`` rows in; only full windows are ever emitted.
    ekuiper: bool = False


@dataclass(frozen=True)
class EkSessionTrigger:
    """eKuiper ``SESSIONWINDOW(unit, max_duration, timeout)``: rows at most ``timeout`` apart share a
    window, which is also cut at the first check point (``offset`` plus a multiple of
    ``max_duration``, in event time) after ``start + max_duration``."""

    timeout: timedelta
    max_duration: timedelta
    offset: timedelta = timedelta(0)  # the check points' phase: local midnight of CQ_TIMEZONE
    kind: str = "ek_session"


@dataclass(frozen=True)
class EkSlidingTrigger:
    """eKuiper ``SLIDINGWINDOW(unit, size[, delay]) [OVER(WHEN cond)]``: one window per triggering
    row (``over`` true, or every row) at time t, holding the rows in ``[t - size, t]`` (no delay) or
    ``[t - size, t + delay)``."""

    size: timedelta
    delay: timedelta = timedelta(0)
    over: str | None = None
    kind: str = "ek_sliding"


# What makes a stream run (its windows, or PERIOD ticks); ``cq_engine.triggers.Trigger`` is the
# unrelated user-code API of CREATE TRIGGER.
WindowTrigger = (
    PeriodTrigger
    | SlidingTrigger
    | SessionTrigger
    | StateTrigger
    | EventTrigger
    | CountTrigger
    | EkSessionTrigger
    | EkSlidingTrigger
)
DATA_SHAPED = ("session", "state", "event", "count", "ek_session", "ek_sliding")


@dataclass(frozen=True)
class TriggerDef:
    """IoTDB-style ``CREATE [STATELESS | STATEFUL] TRIGGER name BEFORE | AFTER INSERT ON pattern AS
    'module:Class' [WITH ("k" = "v", ...)]`` (seed 004, with Python classes for Java ones)."""

    name: str
    stateful: bool
    event: Literal["before", "after"]
    pattern: str  # a table name, ``*`` matching any run of characters
    target: str  # 'package.module:Class'
    attributes: tuple[tuple[str, str], ...] = ()
    location: SourceLocation = field(default_factory=lambda: SourceLocation("<string>", 1, 1))
    sql: str = ""


@dataclass(frozen=True)
class StreamOptions:
    """``OPTIONS(...)`` of the new form and the old form's clauses, in one shape (defaults per seed 000)."""

    watermark: timedelta = timedelta(0)
    expired_time: timedelta | None = None
    ignore_disorder: bool = False  # old form: IGNORE EXPIRED 1 (its default) sets it
    delete_recalc: bool = False  # old form: IGNORE UPDATE 0 sets it
    delete_output_table: bool = False
    fill_history: bool = False
    fill_history_first: bool = False
    history_start: datetime | None = None
    calc_notify_only: bool = False
    low_latency_calc: bool = False
    pre_filter: str | None = None
    force_output: bool = False
    max_delay: timedelta | None = None
    event_types: tuple[EventType, ...] = ("WINDOW_CLOSE",)
    trigger_mode: TriggerMode = "window_close"
    recalc_every: timedelta | None = None  # CONTINUOUS_WINDOW_CLOSE [t]
    delete_mark: timedelta | None = None


@dataclass(frozen=True)
class Notify:
    """``NOTIFY(url, ...) [ON (events)] [WHERE cond] [NOTIFY_OPTIONS(...)]`` (and the old form)."""

    urls: tuple[str, ...]
    events: tuple[EventType, ...] = ()
    where: str | None = None
    history: bool = False
    on_failure: OnFailure = "drop"


@dataclass(frozen=True)
class TagDecl:
    """``TAGS (name type [COMMENT '...'] AS expr)``."""

    name: str
    type: str
    expression: str | None = None
    comment: str | None = None


SubFill = Literal["none", "null", "value", "prev", "next", "linear"]


@dataclass(frozen=True)
class SubWindows:
    """A window clause inside a new-form query: the sub-windows the rows it reads are aggregated by,
    within each trigger window. ``INTERVAL(interval[, offset]) [SLIDING(sliding)]`` (aligned as
    INTERVAL triggers are; ``_wstart`` is the sub-window's start, ``SUB_WSTART``) or, ``over`` set, a
    data-shaped window of the rows in time order: ``SESSION`` / ``STATE_WINDOW`` / ``EVENT_WINDOW`` /
    ``COUNT_WINDOW`` (``_wstart`` and ``_wend`` its first and last row's time, ``SUB_WEND``)."""

    interval: timedelta = timedelta(0)
    sliding: timedelta = timedelta(0)
    offset: timedelta = timedelta(0)
    fill: SubFill = "none"  # FILL(...) (``streams.fill``)
    fill_values: tuple[str, ...] = ()  # FILL(VALUE, v1, ...): Spark SQL constants, one per aggregate
    over: SessionTrigger | StateTrigger | EventTrigger | CountTrigger | None = None

    @property
    def kind(self) -> str:
        return "interval" if self.over is None else self.over.kind


SUB_WSTART = "__cq_sw_start"  # the engine column of a row's sub-window start (TIMESTAMP)
SUB_WEND = "__cq_sw_end"  # a data-shaped sub-window's last row time (TIMESTAMP)
SUB_ID = "__cq_sw_id"  # a data-shaped sub-window's number within its trigger window


SeriesFunction = Literal[
    "diff", "csum", "mavg", "derivative", "statecount", "stateduration",
    "top", "bottom", "tail", "unique", "sample", "histogram", "interp",
]  # fmt: skip


@dataclass(frozen=True)
class SeriesCall:
    """A TDengine multi-row function of a new-form query's SELECT (``DIFF(current)``, ``TOP(x, 3)``...):
    computed over each (group, window)'s rows in time order into the engine column ``column``, which
    the select item reads (``streams.series``). ``argument`` is Spark SQL over a row; ``params`` the
    call's other arguments as checked at load (numbers, a comparison, histogram bins)."""

    column: str
    function: SeriesFunction
    argument: str
    params: tuple = ()


@dataclass(frozen=True)
class Interp:
    """``INTERP(x[, ignore_null_values]) ... [RANGE(start[, end])] EVERY(every) [FILL(...)]`` of a new-form
    query: a row per time point ``start + k * every`` of the range (closed, as TDengine's RANGE;
    without RANGE, the trigger window's ``[start, end)``) per trigger window and query partition, each
    call's value there (``streams.interp``); ``_irowts`` is the point (``IROWTS``), ``_isfilled``
    whether it was filled (``ISFILLED``)."""

    every: timedelta
    calls: tuple[SeriesCall, ...]
    start: str | None = None  # Spark SQL
    end: str | None = None
    fill: SubFill = "none"
    fill_values: tuple[str, ...] = ()


IROWTS, ISFILLED = "__cq_irowts", "__cq_isfilled"


JoinKind = Literal["inner", "left", "asof", "window"]


@dataclass(frozen=True)
class Join:
    """``[INNER | LEFT [OUTER] | LEFT ASOF | LEFT WINDOW] JOIN table [AS] alias ...`` of a new-form query
    over ``%%trows``: the n-th joined table's columns are ``join_column(n, col)``, the trigger rows'
    ``join_column(0, col)``."""

    table: str
    kind: JoinKind
    on: str  # Spark SQL over both sides' columns (ASOF, WINDOW: its equalities, ``TRUE`` for none)
    # LEFT ASOF JOIN: (trigger rows' column, the table's column, operator) of its time comparison;
    # None: the two tables' time columns with >= (TDengine's default)
    asof: tuple[str, str, str] | None = None
    # ASOF, WINDOW: the ON's equalities as (trigger rows' column, the table's column), the groups joined
    keys: tuple[tuple[str, str], ...] = ()
    offsets: tuple[timedelta, timedelta] | None = None  # WINDOW_OFFSET(start, end), both bounds closed
    limit: int | None = None  # JLIMIT: the matched rows per trigger row (ASOF: 1; WINDOW: None, all)


JOIN_ROW = "__cq_join_row"  # a WINDOW join's trigger row, the group of its aggregates


def join_column(n: int, column: str) -> str:
    """A column of a join's n-th side (0: the trigger rows) under a name no other side has."""
    return f"__cq_j{n}_{column}"


def joined_column(name: str) -> tuple[int, str] | None:
    """``join_column``'s (side, column), or None for another name."""
    m = re.fullmatch(r"__cq_j(\d+)_(.+)", name, re.IGNORECASE)
    return (int(m.group(1)), m.group(2)) if m else None


@dataclass(frozen=True)
class Stream:
    """``CREATE STREAM`` (new or old form) as one shape.

    ``select`` is Spark SQL over the trigger rows of one window of one partition group, with the
    placeholders renamed to engine columns (``placeholder_column``). The first select item is the
    sink's time column: a window's start or end (``key_bound``), or for PERIOD the tick."""

    name: str
    trigger: WindowTrigger
    trigger_table: str | None
    source: str | None  # the table the subquery reads; %%trows and the old form: the trigger table
    sink: str | None
    select: tuple[SelectItem, ...] = ()
    partition_by: tuple[str, ...] = ()  # the groups' column names (old-form aliases included)
    # eKuiper rules: GROUP BY columns splitting each window's rows (the windows are the whole stream's)
    group_by: tuple[str, ...] = ()
    partition_exprs: tuple[tuple[str, str], ...] = ()  # old form: (alias, Spark SQL) computed before windowing
    # %%trows, another table (range join), %%tbname, or ``subquery``'s result rows (FROM (SELECT ...))
    reads: Literal["trows", "table", "tbname", "query"] = "trows"
    where: str | None = None
    having: str | None = None  # eKuiper rules and the new form: on each window's aggregated row
    # The new form's query: PARTITION BY inside it (LIMIT counts per partition) rather than GROUP BY
    partitions_query: bool = False
    order_by: tuple[OrderKey, ...] = ()  # the new form's ORDER BY, for LIMIT / SLIMIT per window
    limit: int | None = None  # LIMIT n [OFFSET m]: rows per window (and query partition)
    offset: int = 0
    slimit: int | None = None  # SLIMIT n [SOFFSET m]: the query's groups per window
    soffset: int = 0
    # TDengine's TWA in INTERVAL / SLIDING windows over %%trows: the Spark SQL of each argument whose
    # points around every window the plan supplies (``streams.bounds``)
    interpolated: tuple[str, ...] = ()
    # FROM (SELECT ...): the inner query, a Stream of the same trigger whose result rows this one reads
    subquery: Stream | None = None
    # UNION ALL: the queries after the first (each a Stream of the same trigger), their result columns
    # taken by position under this one's names
    union: tuple[Stream, ...] = ()
    joins: tuple[Join, ...] = ()  # the tables %%trows is joined with, in order
    sub_windows: SubWindows | None = None  # INTERVAL ... inside the query
    series: tuple[SeriesCall, ...] = ()  # DIFF, CSUM, TOP... of the SELECT, in the order written
    interp: Interp | None = None  # INTERP(...) RANGE(...) EVERY(...) FILL(...)
    options: StreamOptions = field(default_factory=StreamOptions)
    notify: Notify | None = None
    sink_columns: tuple[str, ...] | None = None
    output_subtable: str | None = None
    tags: tuple[TagDecl, ...] = ()
    key_bound: KeyBound = "start"
    form: Literal["new", "old", "ekuiper"] = "new"
    if_not_exists: bool = False
    location: SourceLocation = field(default_factory=lambda: SourceLocation("<string>", 1, 1))
    sql: str = ""
    timeout_policy: TimeoutPolicy = "BLOCKED"  # stream runs of one definition never overlap
    freshness_grace: timedelta | None = None  # `-- cq: freshness_grace 5m`; None: the setting's

    @property
    def kind(self) -> str:
        return "stream"

    @property
    def is_aggregate(self) -> bool:
        return any(i.is_aggregate for i in self.select)

    @property
    def empty_window_rows(self) -> bool:
        """Does a window of the run without rows get a row: TDengine's FORCE_OUTPUT, and eKuiper's
        ungrouped aggregate TUMBLINGWINDOW / HOPPINGWINDOW rules, which emit every window from the
        first event on, an empty one as one row whose aggregates are all NULL (a HAVING over NULLs
        keeps none, so a rule with HAVING gets no such row)."""
        if self.options.force_output:
            return True
        return (
            self.form == "ekuiper"
            and isinstance(self.trigger, SlidingTrigger)
            and self.is_aggregate
            and not self.group_by
            and self.having is None
        )

    @property
    def time_column(self) -> str:
        """The sink's time column: the first select item."""
        return self.select[0].name

    @property
    def trigger_source(self) -> str:
        """The table whose commits drive the runs: the trigger table, else the table the subquery reads
        (the parser gives every stream one of them)."""
        table = self.trigger_table or self.source
        assert table is not None, f"stream {self.name} names no table"
        return table

    @property
    def layers(self) -> tuple[Stream, ...]:
        """This query and every query it is made of (its FROM subquery's, its UNION ALL branches')."""
        inner = self.subquery.layers if self.subquery is not None else ()
        return (self, *inner, *[layer for b in self.union for layer in b.layers])

    @property
    def leaves(self) -> tuple[Stream, ...]:
        """The queries that read a table (``%%trows``, ``%%tbname`` or a named one), not a subquery."""
        return tuple(q for q in self.layers if q.reads != "query")

    @property
    def composed(self) -> bool:
        """A query with a FROM subquery, UNION ALL, a join or INTERVAL (in any of its queries)."""
        return (
            self.subquery is not None
            or bool(self.union)
            or any(q.joins or q.sub_windows is not None for q in self.layers)
        )

    @property
    def read_table(self) -> str:
        """The table the subquery reads (%%trows and the old form: the trigger table)."""
        assert self.source is not None, f"stream {self.name} reads no table"
        return self.source

    @property
    def sink_table(self) -> str:
        """The INTO table; only streams that run reach for it (the catalog gives each a sink)."""
        assert self.sink is not None, f"stream {self.name} has no sink table"
        return self.sink


# Placeholders of seed 000 → the engine column that carries their value in a window's rows.
PLACEHOLDERS = (
    "_twstart",
    "_twend",
    "_twduration",
    "_twrownum",
    "_wstart",
    "_wend",
    "_wduration",
    "_tprev_ts",
    "_tcurrent_ts",
    "_tnext_ts",
    "_tprev_localtime",
    "_tnext_localtime",
    "_tlocaltime",
    "_tgrpid",
)


def partition_placeholder(n: int) -> str:
    """``%%n`` (1-based) → the engine column holding the n-th PARTITION BY value of the trigger group.
    A column of its own (not the partition column's name) so a range join can tell the trigger
    group's value from the joined table's column of the same name."""
    return f"__cq_p{n}"


def placeholder_column(name: str) -> str:
    """``_twstart`` → ``__cq_twstart``; old-form ``_wstart`` shares ``_twstart``'s column."""
    lowered = name.lower()
    if lowered in ("_wstart", "_wend", "_wduration"):
        lowered = "_tw" + lowered[2:]
    return "__cq" + lowered


Definition = ContinuousQuery | Stream


def statement_hash(statement: Definition | TriggerDef) -> str:
    """Changes when the statement's text does (case aside): a redefined stream or trigger starts over,
    and Dagster sees a new code version."""
    return hashlib.sha256(statement.sql.lower().encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Catalog:
    """Everything loaded from the sql directory: tables, definitions and per-file errors."""

    tables: tuple[TableDecl, ...] = ()
    definitions: tuple[Definition, ...] = ()
    errors: tuple[ParseError, ...] = ()  # one per file that failed, or per definition removed
    triggers: tuple[TriggerDef, ...] = ()  # IoTDB-style triggers (not definitions: no sink, no schedule)

    def definition(self, name: str) -> Definition | None:
        lowered = name.lower()
        return next((d for d in self.definitions if d.name.lower() == lowered), None)

    def table(self, name: str) -> TableDecl | None:
        """The table called ``name``, or declared as the eKuiper stream ``name``."""
        lowered = name.lower()
        return next((t for t in self.tables if t.name.lower() == lowered or (t.alias or "").lower() == lowered), None)
