"""What the window assigners (``windows.tdengine``, ``windows.ekuiper``) share: the output columns
of ``assign_windows`` and the helper columns and window specs both build on. Times in helper columns
are integer microseconds."""

from __future__ import annotations

from datetime import timedelta

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

WSTART, WEND, WLAST, WROWS, WCLOSED = "__cq_twstart", "__cq_twend", "__cq_wlast", "__cq_twrownum", "__cq_wclosed"
STATE, PREV_STATE, NEXT_STATE = "__cq_state", "__cq_prev_state", "__cq_next_state"
OPEN_ROW, CLOSE_ROW = "__cq_open_row", "__cq_close_row"
WSEQ = "__cq_twseq"  # tells apart windows sharing a start (eKuiper: one sliding window per triggering row)
SHORT = "__cq_short"  # a closed window TRUE_FOR drops (``assign_windows(mark_short=True)``)

# Internal helper columns (all dropped from the output).
T_US, WS_US, WE_US, LAST_US, SEG = "__cq_w_t", "__cq_w_ws", "__cq_w_we", "__cq_w_last", "__cq_w_seg"
UNBOUNDED = (Window.unboundedPreceding, Window.unboundedFollowing)


def exact_col(name: str) -> Column:
    """A column by its exact name (dots and other characters are not parsed)."""
    return F.col("`" + name.replace("`", "``") + "`")


def lag_non_null(sql: str, k: int) -> Column:
    """The value of ``sql`` k non-NULL values back (``.over`` a window): Spark's ``lag ... IGNORE NULLS``,
    which the Python API does not offer."""
    return F.expr(f"lag({sql}, {k}) IGNORE NULLS")


def floor_div(x: Column, b: int) -> Column:
    """Exact floor division of a long column by a positive int (Spark's ``div`` truncates)."""
    return F.call_function("div", x - F.pmod(x, F.lit(b)), F.lit(b))


def ordered(keys: list[str]):
    return Window.partitionBy(*[exact_col(k) for k in keys]).orderBy(F.col(T_US))


def running(keys: list[str]):
    return ordered(keys).rowsBetween(Window.unboundedPreceding, Window.currentRow)


def per_window(keys: list[str], *cols: str):
    """The whole window (frame over all its rows), ordered by time so first/last are well defined."""
    return (
        Window.partitionBy(*[exact_col(k) for k in keys], *[F.col(c) for c in cols])
        .orderBy(F.col(T_US))
        .rowsBetween(*UNBOUNDED)
    )


def window_stats(df: DataFrame, keys: list[str], *segs: str) -> DataFrame:
    """Per-window first/last row time and row count over windows ``(keys, *segs)``."""
    w = per_window(keys, *segs)
    return df.withColumns({WS_US: F.min(T_US).over(w), LAST_US: F.max(T_US).over(w), WROWS: F.count(F.lit(1)).over(w)})


def check_positive(value: timedelta | int, what: str) -> None:
    if (value <= timedelta(0)) if isinstance(value, timedelta) else (value <= 0):
        raise ValueError(f"{what} must be positive: {value!r}")
