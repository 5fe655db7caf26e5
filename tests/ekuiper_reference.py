"""A deliberately simple pure-Python model of eKuiper's windows, written from how eKuiper computes them
in event time (lf-edge/ekuiper ``internal/topo/node``: ``event_window_trigger.go`` and
``window_op.go``; the rule's watermark is the latest event time minus ``lateTolerance``).

An eKuiper window is over the whole stream: each function takes the stream's row times (ints,
microseconds, any order; several rows may share a time) and returns one ``dict(start, end, members,
closed)`` per window, ``members`` the sorted tuple of its row times (a multiset). A rule's GROUP BY
then splits each window's rows (``split``). Rows may still arrive at times >= ``until`` (the
watermark T; several at one time): a window is closed once eKuiper would have emitted it.
"""

from __future__ import annotations

from collections import defaultdict


def _window(start, end, members, closed):
    return dict(start=start, end=end, members=tuple(sorted(members)), closed=closed)


def sliding_windows(times, *, size, delay, triggers=None, until):
    """One window per triggering row (``triggers``: a bool per row of ``times``, None = all), even
    when rows share its time t. eKuiper's ``handleInputs``: without a delay the window holds
    ``[t - size, t]``; with one, the trigger is replayed at t + delay and holds ``[t - size, t +
    delay)`` (a row exactly ``size`` before the trigger is in, one exactly at t + delay is not).
    eKuiper emits it when the watermark reaches t + delay."""
    out = []
    rows = sorted(zip(times, triggers if triggers is not None else [True] * len(times)))
    for t, fires in rows:
        if not fires:
            continue
        if delay == 0:
            members = [x for x in times if t - size <= x <= t]
        else:
            members = [x for x in times if t - size <= x < t + delay]
        out.append(_window(t - size, t + delay, members, t + delay <= until))
    return out


def _next_session(rows, *, timeout, d, offset):
    """eKuiper's ``getNextSessionWindow`` over the rows left (sorted): the window's end and whether a
    check point ended it ("ticked"). Check points lie at ``offset`` plus multiples of ``d`` (eKuiper:
    aligned to natural time, ``getAlignedWindowEndTime``); one check point is looked at per row, and
    it cuts only a window already longer than ``d`` there. The stream goes on: after the last row
    comes one much later (so a window's end is what eKuiper emits once a later row is there)."""
    et = rows[0]
    tick = offset + ((et - offset) // d + 1) * d
    p, ticked = None, False
    for t in rows:
        r = None
        if p is not None and t - p > timeout:
            r = p + timeout
        if t > tick:
            if tick - d > et and (r is None or tick < r):
                r, ticked = tick, True
            tick += d
        if r is not None:
            return r, ticked
        p = t
    if tick - d > et and tick < p + timeout:  # the row much later: a gap, and the check point
        return tick, True
    return p + timeout, ticked


def session_windows(times, *, timeout, max_duration, offset=0, until):
    """eKuiper's SESSIONWINDOW(unit, max_duration, timeout) in event time: each window holds the rows
    before the end ``_next_session`` finds; the window after a cut starts at the check point (eKuiper's
    ``triggerTime``), any other at its first row. Closed once the row after it is there (at or before
    ``until``) or the timeout has passed: when eKuiper's watermark determines its end. Exact for
    ``timeout <= max_duration``; with a longer timeout eKuiper may look at a check point one row late."""
    rows = sorted(times)
    out, cut_at = [], None
    while rows:
        end, ticked = _next_session(rows, timeout=timeout, d=max_duration, offset=offset)
        members = [t for t in rows if t < end]
        rows = rows[len(members) :]
        last = members[-1]
        closed = (bool(rows) and rows[0] <= until) or last + timeout < until
        out.append(_window(cut_at if cut_at is not None else members[0], end, members, closed))
        cut_at = end if ticked else None
    return out


def count_windows(times, *, count, interval, phase=None, until):
    """eKuiper COUNTWINDOW(count, interval): fires when the i-th row (1-based) of the stream arrives if
    i is a multiple of ``interval`` and i >= count, holding the last ``count`` rows. With ``phase`` (a
    resumed stream whose row ``phase`` starts a window) it fires at i = phase + count + m*interval.
    Windows whose firing row has not arrived yet but whose first row has are open, with the rows
    they have."""
    ts = sorted(times)

    def fires(i):
        if phase is None:
            return i % interval == 0 and i >= count
        return i >= phase + count and (i - phase - count) % interval == 0

    out = []
    for i in range(1, len(ts) + count + 1):
        first = i - count  # 0-based index of the window's first row
        if fires(i) and 0 <= first < len(ts):
            members = ts[first:i]
            full = i <= len(ts)
            out.append(_window(members[0], members[-1], members, full and members[-1] <= until))
    return out


def tumbling_windows(times, *, size, hop=None, offset=0):
    """TUMBLINGWINDOW / HOPPINGWINDOW: windows ``[end - size, end)`` ending on natural time, at
    ``offset`` plus multiples of the hop (eKuiper aligns the first end with ``getAlignedWindowEndTime``
    in its time zone, then adds the hop)."""
    hop = hop or size
    ends: dict[int, list[int]] = defaultdict(list)
    for t in times:
        end = offset + ((t - offset) // hop + 1) * hop
        while end - size <= t:
            ends[end].append(t)
            end += hop
    return [_window(e - size, e, m, True) for e, m in sorted(ends.items())]


def split(windows, rows, key):
    """A rule's GROUP BY: each window's rows (``rows``: dicts with ``t``) split by ``key(row)``;
    one (window, key, rows) per key present in the window, in window order."""
    out = []
    for w in windows:
        pool = defaultdict(list)
        for r in rows:
            pool[r["t"]].append(r)
        taken: dict = defaultdict(list)
        seen = defaultdict(int)
        for t in w["members"]:
            r = pool[t][seen[t]]
            seen[t] += 1
            taken[key(r)].append(r)
        out += [(w, k, rs) for k, rs in taken.items()]
    return out


def kept_rows(batches, *, tolerance):
    """eKuiper's ``WatermarkOp.track`` over batches of row times (one Delta commit each, its rows
    arriving together): a row passes only at or after the watermark it arrives under, the latest
    event time before its batch minus ``lateTolerance``; the others reach no window."""
    out, latest = [], None
    for batch in batches:
        watermark = None if latest is None else latest - tolerance
        out += [t for t in batch if watermark is None or t >= watermark]
        latest = max([*([latest] if latest is not None else []), *batch])
    return out
