"""TDengine's aggregate and selector functions computed by hand from TDengine's documentation (docs/en/
14-reference/03-taos-sql/22-function.md) and, where it is terse, its source (twa, irate, leastsquares),
over one window's rows. A row is ``(t, value)`` with ``t`` in microseconds; NULL values are skipped
unless the function says otherwise (LAST_ROW)."""

from __future__ import annotations

import math
from collections import Counter
from itertools import pairwise


def _points(rows):
    return sorted((t, v) for t, v in rows if v is not None)


def spread(rows):
    """SPREAD: the maximum minus the minimum value."""
    vs = [v for _, v in _points(rows)]
    return float(max(vs) - min(vs)) if vs else None


def _at(p, q, t):
    """The value at time ``t`` of the line through points ``p`` and ``q``."""
    return q[1] if q[0] == t else p[1] + (q[1] - p[1]) * (t - p[0]) / (q[0] - p[0])


def twa(rows, *, window=None, series=()):
    """TWA: the area under the line through the points in time order (trapezoids), divided by the time
    the line spans; one point (or one instant): its value.

    In an INTERVAL / SLIDING window (``window``: its [start, end) in µs; ``series``: every row of the
    group) the line reaches the window's bounds, as TDengine's interval operator feeds twaFunction
    (source/libs/executor/src/timewindowoperator.c: setTimeWindowInterpolationStartTs /
    setTimeWindowInterpolationEndTs / doInterpUnclosedTimeWindow → doTimeWindowInterpolation, linear
    between the rows around the bound; source/libs/function/src/builtinsimpl.c: twaFunction adds the
    area from ``pCtx->start`` and to ``pCtx->end``, twaFinalize divides by their distance):
    - at the start, the value interpolated between the group's last point before the start and the
      window's first point; none before (the group's first window) or a point at the start itself:
      the line starts at the window's first point;
    - at the end, likewise between the window's last point and the group's first point at or after
      the end; none yet: the line ends at the window's last point.
    A point is a non-NULL value (TDengine takes the adjacent rows even when their value is NULL).
    TDengine's window ends at its last tick (end - 1 in the database's precision); the engine's
    windows are half-open over microseconds and interpolate at the end itself.
    SESSION, STATE_WINDOW, EVENT_WINDOW and COUNT_WINDOW windows (``window`` None): no interpolation,
    from the window's first point to its last."""
    ps = _points(rows)
    if not ps:
        return None
    if window is not None:
        start, end = window
        before = [p for p in _points(series) if p[0] < start]
        after = [p for p in _points(series) if p[0] >= end]
        if before and ps[0][0] > start:
            ps = [(start, _at(before[-1], ps[0], start)), *ps]
        if after:
            ps = [*ps, (end, _at(ps[-1], after[0], end))]
    (t0, _), (tn, vn) = ps[0], ps[-1]
    if tn == t0:
        return float(vn)
    area = sum((a[1] + b[1]) / 2 * (b[0] - a[0]) for a, b in pairwise(ps))
    return area / (tn - t0)


def elapsed(rows, *, unit_us: int, window: tuple[int, int] | None):
    """ELAPSED(ts, unit): the time the window covers (an INTERVAL window: its whole length), else from
    its first to its last row, in units."""
    if window is not None:
        return (window[1] - window[0]) / unit_us
    ts = [t for t, _ in rows]
    return (max(ts) - min(ts)) / unit_us


def irate(rows):
    """IRATE: per second, from the last two points; when they decrease, the last value alone. One
    point: 0."""
    ps = _points(rows)
    if not ps:
        return None
    if len(ps) == 1:
        return 0.0
    (t1, v1), (t2, v2) = ps[-2], ps[-1]
    diff = v2 - v1 if v2 >= v1 else v2
    return diff / ((t2 - t1) / 1e6)


def first(rows):
    ps = _points(rows)
    return ps[0][1] if ps else None


def last(rows):
    ps = _points(rows)
    return ps[-1][1] if ps else None


def last_row(rows):
    """LAST_ROW: the value of the latest row, NULL or not."""
    return max(rows)[1] if rows else None


def percentile(rows, p):
    """PERCENTILE: linear interpolation between the closest ranks, rank (n - 1) * p / 100."""
    vs = sorted(v for _, v in _points(rows))
    if not vs:
        return None
    rank = (len(vs) - 1) * p / 100
    lo, hi = math.floor(rank), math.ceil(rank)
    return vs[lo] + (vs[hi] - vs[lo]) * (rank - lo)


def mode(rows):
    vs = [v for _, v in _points(rows)]
    if not vs:
        return None
    counts = Counter(vs).most_common()
    best = [v for v, c in counts if c == counts[0][1]]
    return best[0] if len(best) == 1 else ("tie", sorted(best))


def stddev(rows):
    """STDDEV: the population standard deviation."""
    vs = [v for _, v in _points(rows)]
    if not vs:
        return None
    mean = sum(vs) / len(vs)
    return math.sqrt(sum((v - mean) ** 2 for v in vs) / len(vs))


def leastsquares(rows, start, step):
    """LEASTSQUARES(y, start, step): the i-th point (time order) at x = start + i * step; TDengine's
    '{slop:%.6lf, intercept:%.6lf}', NULL when the x values do not vary (one point)."""
    ys = [v for _, v in _points(rows)]
    n = len(ys)
    if not n:
        return None
    xs = [start + i * step for i in range(n)]
    sx, sy = sum(xs), sum(ys)
    sxx, sxy = sum(x * x for x in xs), sum(x * y for x, y in zip(xs, ys))
    p00 = sxx - sx * (sx / n)
    if p00 == 0:
        return None
    slope = (sxy - sy * (sx / n)) / p00
    intercept = (sy - slope * sx) / n
    return f"{{slop:{slope:.6f}, intercept:{intercept:.6f}}}"


def distinct(rows):
    """HYPERLOGLOG and COUNT(DISTINCT ...) over a few values: the number of distinct non-NULL values."""
    return len({v for _, v in rows if v is not None})


# --- a stream's query (TDengine's SELECT over one trigger window's rows): rows are dicts with ``t`` ---


def query_avg(rows, column="current"):
    """AVG over a window's rows: NULLs skipped, no value → NULL."""
    vs = [r[column] for r in rows if r[column] is not None]
    return sum(vs) / len(vs) if vs else None


def query_max(rows, column="current"):
    vs = [r[column] for r in rows if r[column] is not None]
    return max(vs) if vs else None


def groups(rows, column):
    """GROUP BY / PARTITION BY ``column``: each value's rows in time order (NULL is a group of its own)."""
    out: dict = {}
    for r in sorted(rows, key=lambda r: r["t"]):
        out.setdefault(r[column], []).append(r)
    return out


def top_n(rows, *, key, descending=False, limit, offset=0, nulls_first=None):
    """ORDER BY key [DESC] [NULLS FIRST|LAST] LIMIT limit OFFSET offset. TDengine puts NULLs first
    ascending and last descending unless told."""
    if nulls_first is None:
        nulls_first = not descending
    present = sorted((r for r in rows if r[key] is not None), key=lambda r: r[key], reverse=descending)
    missing = [r for r in rows if r[key] is None]
    ordered = missing + present if nulls_first else present + missing
    return ordered[offset : offset + limit]


def sessions(rows, *, gap):
    """SESSION(ts, gap): rows at most ``gap`` apart in one window, in time order."""
    out: list[list[dict]] = []
    for r in sorted(rows, key=lambda r: r["t"]):
        if out and r["t"] - out[-1][-1]["t"] <= gap:
            out[-1].append(r)
        else:
            out.append([r])
    return out


def query_last(rows, column="current"):
    """LAST over a window's rows: the value of the latest row where it is not NULL."""
    vs = [r[column] for r in sorted(rows, key=lambda r: r["t"]) if r[column] is not None]
    return vs[-1] if vs else None


def query_count(rows, column=None):
    """COUNT(*) (``column`` None) or COUNT(column): its non-NULL values."""
    return len(rows) if column is None else sum(r[column] is not None for r in rows)


def subquery(rows, select, *, where=lambda r: True):
    """FROM (SELECT ... FROM rows WHERE ...): each kept row as the dict ``select`` makes of it, with its
    time ``t`` (the outer query's FIRST / LAST read it)."""
    return [{"t": r["t"], **select(r)} for r in rows if where(r)]


def sub_windows(rows, *, interval, sliding=None, offset=0):
    """INTERVAL(interval[, offset]) [SLIDING(sliding)] over rows (times in µs since the epoch): each
    sub-window start → its rows (k * sliding + offset <= t < that + interval)."""
    sliding = sliding or interval
    out: dict = {}
    for r in sorted(rows, key=lambda r: r["t"]):
        k = (r["t"] - offset) // sliding
        while k * sliding + offset + interval > r["t"]:
            out.setdefault(k * sliding + offset, []).append(r)
            k -= 1
    return dict(sorted(out.items()))


def fill(slots, rows_of, aggregates, mode, constants=()):
    """FILL over one trigger window's sub-windows: ``slots`` every start of the range, ``rows_of`` the
    rows of those holding rows, ``aggregates`` a function of a sub-window's rows giving its aggregate
    tuple → {start: tuple}. A sub-window without rows gets NULLs (NULL), the constants (VALUE), the
    nearest non-NULL value before / after (PREV / NEXT), or, per value, the line between those two
    (LINEAR; NULL at either end)."""
    real = {s: aggregates(rows_of[s]) for s in slots if s in rows_of}
    width = len(next(iter(real.values())))
    out = {}
    for s in slots:
        if s in real:
            out[s] = real[s]
            continue
        values = []
        for j in range(width):
            before = [(t, v[j]) for t, v in real.items() if t < s and v[j] is not None]
            after = [(t, v[j]) for t, v in real.items() if t > s and v[j] is not None]
            if mode == "null":
                values.append(None)
            elif mode == "value":
                values.append(constants[j])
            elif mode == "prev":
                values.append(before[-1][1] if before else None)
            elif mode == "next":
                values.append(after[0][1] if after else None)
            elif before and after:
                (t0, v0), (t1, v1) = before[-1], after[0]
                values.append(v0 + (v1 - v0) * (s - t0) / (t1 - t0))
            else:
                values.append(None)
        out[s] = tuple(values)
    return out


# --- multi-row functions: each gives {t: value} for the rows it outputs (rows in time order) ------


def diff(rows, option=0, *, millis=False):
    """DIFF(x, ignore_option): x minus the previous non-NULL value (NULL when either is missing);
    options 1 / 3: a negative difference is NULL; 2 / 3: a row whose difference is NULL is not output.
    ``millis``: x is a TIMESTAMP in µs, its difference in milliseconds."""
    out, prev = {}, None
    for t, v in rows:
        d = None if v is None or prev is None else (v // 1000 - prev // 1000 if millis else v - prev)
        if d is not None and d < 0 and option in (1, 3):
            d = None
        if d is not None or option in (0, 1):
            out[t] = d
        if v is not None:
            prev = v
    return out


def csum(rows):
    """CSUM(x): the running sum of the non-NULL values, output on those rows."""
    out, total = {}, 0
    for t, v in rows:
        if v is not None:
            total += v
            out[t] = total
    return out


def mavg(rows, k):
    """MAVG(x, k): the mean of the last k non-NULL values, from the k-th one on."""
    seen, out = [], {}
    for t, v in rows:
        if v is not None:
            seen.append(v)
            if len(seen) >= k:
                out[t] = sum(seen[-k:]) / k
    return out


def derivative(rows, interval_us, ignore_negative):
    """DERIVATIVE(x, interval, ignore_negative): (v - v') / ((t - t') / interval) between each non-NULL
    point and the previous one; ignore_negative drops the negative ones."""
    points = [(t, v) for t, v in rows if v is not None]
    out = {}
    for (t0, v0), (t1, v1) in pairwise(points):
        rate = (v1 - v0) / ((t1 - t0) / interval_us)
        if not (ignore_negative and rate < 0):
            out[t1] = rate
    return out


_COMPARE = {
    "LT": lambda a, b: a < b,
    "GT": lambda a, b: a > b,
    "LE": lambda a, b: a <= b,
    "GE": lambda a, b: a >= b,
    "NE": lambda a, b: a != b,
    "EQ": lambda a, b: a == b,
}


def statecount(rows, op, value):
    """STATECOUNT(x, op, v): on every row, the count of consecutive rows meeting ``x op v`` up to it,
    -1 on a row that does not, NULL on a NULL row (the run goes on across it)."""
    out, count = {}, 0
    for t, v in rows:
        if v is None:
            out[t] = None
        elif _COMPARE[op](v, value):
            count += 1
            out[t] = count
        else:
            count, out[t] = 0, -1
    return out


def stateduration(rows, op, value, unit_us):
    """STATEDURATION(x, op, v, unit): as STATECOUNT, the time since the run's first row in ``unit``."""
    out, start = {}, None
    for t, v in rows:
        if v is None:
            out[t] = None
        elif _COMPARE[op](v, value):
            start = t if start is None else start
            out[t] = (t - start) // unit_us
        else:
            start, out[t] = None, -1
    return out


def top(rows, k, *, largest=True):
    """TOP / BOTTOM(x, k): the k largest / smallest non-NULL values, the earliest of equal ones."""
    ranked = sorted(((t, v) for t, v in rows if v is not None), key=lambda p: (-p[1] if largest else p[1], p[0]))
    return dict(ranked[:k])


def tail(rows, k, offset=0):
    """TAIL(x, k, offset): the last k rows before the last ``offset`` ones, NULLs included."""
    chosen = rows[::-1][offset : offset + k]
    return dict(chosen)


def unique(rows):
    """UNIQUE(x): each value's first row, NULL once."""
    out, seen = {}, set()
    for t, v in rows:
        if v not in seen:
            seen.add(v)
            out[t] = v
    return out


def histogram(rows, edges, normalized=False):
    """HISTOGRAM over the bins (edges[i-1], edges[i]]: each bin's JSON text as TDengine writes it
    (C's %g for the bounds); no rows without a non-NULL value."""
    values = [v for _, v in rows if v is not None]
    if not values:
        return []
    counts = [sum(lo < v <= hi for v in values) for lo, hi in pairwise(edges)]
    total = sum(counts)
    shown = [f"{c / total if total else 0:f}" if normalized else str(c) for c in counts]
    return [f'{{"lower_bin":{lo:g}, "upper_bin":{hi:g}, "count":{s}}}' for (lo, hi), s in zip(pairwise(edges), shown)]


# --- a query's data-shaped sub-windows: each gives the member lists of one trigger window's rows --


def state_windows(rows, key):
    """STATE_WINDOW(key): runs of equal non-NULL values; NULL rows belong to none."""
    out: list[list[dict]] = []
    for r in sorted(rows, key=lambda r: r["t"]):
        if r[key] is None:
            continue
        if out and out[-1][-1][key] == r[key]:
            out[-1].append(r)
        else:
            out.append([r])
    return out


def event_windows(rows, start, end):
    """EVENT_WINDOW START WITH start END WITH end: opened by a row meeting ``start`` when none is open,
    closed by the first row from it on meeting ``end``; a window left open is not output."""
    out, current = [], None
    for r in sorted(rows, key=lambda r: r["t"]):
        if current is None and start(r):
            current = []
        if current is not None:
            current.append(r)
            if end(r):
                out.append(current)
                current = None
    return out


def count_windows(rows, count, slide):
    """COUNT_WINDOW(count, slide): windows of ``count`` rows starting every ``slide`` rows, the last
    ones shorter."""
    ordered = sorted(rows, key=lambda r: r["t"])
    return [ordered[j : j + count] for j in range(0, len(ordered), slide)]


def interp(rows, points, fill, *, ignore_null=False, value=None):
    """INTERP(x[, ignore_null_values]) at each time point → {point: (value, filled)}: the row at that
    time, else FILL's (NONE: no output; NULL; VALUE; PREV / NEXT: the nearest row before / after;
    LINEAR: the line between them). ``ignore_null``: rows whose x is NULL are not rows here."""
    valid = sorted((t, v) for t, v in rows if v is not None or not ignore_null)
    out = {}
    for p in points:
        at = [v for t, v in valid if t == p]
        before = [(t, v) for t, v in valid if t < p]
        after = [(t, v) for t, v in valid if t > p]
        if at:
            out[p] = (at[-1], False)
        elif fill == "none":
            continue
        elif fill == "prev":
            out[p] = (before[-1][1] if before else None, True)
        elif fill == "next":
            out[p] = (after[0][1] if after else None, True)
        elif fill == "linear":
            if before and after and before[-1][1] is not None and after[0][1] is not None:
                (t0, v0), (t1, v1) = before[-1], after[0]
                out[p] = (v0 + (v1 - v0) * (p - t0) / (t1 - t0), True)
            else:
                out[p] = (None, True)
        else:
            out[p] = (value if fill == "value" else None, True)
    return out
