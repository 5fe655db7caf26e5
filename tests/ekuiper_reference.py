"""A deliberately simple pure-Python model of eKuiper's windows (seed 003) as assign_windows makes them.

Each function takes one group's row times (ints, microseconds, unique, any order) and returns one
``dict(start, end, members, closed)`` per window, ``members`` the frozenset of its row times.
Rows may still arrive at times >= ``until`` (but not at a time where the group has a row): a window
is closed once none of them could join it.
"""

from __future__ import annotations


def _window(start, end, members, closed):
    return dict(start=start, end=end, members=frozenset(members), closed=closed)


def sliding_windows(times, *, size, delay, triggers=None, until):
    """One window per triggering time t (``triggers``: the set of triggering times, None = all):
    the rows in ``(t - size, t + delay]``."""
    out = []
    for t in sorted(times):
        if triggers is not None and t not in triggers:
            continue
        members = [x for x in times if t - size < x <= t + delay]
        end = t + delay
        # rows could still arrive at any time in [until, end] where no row already is (times are
        # unique); and a window holding rows after until is never closed
        closed = end < until or (end == until and end in members)
        out.append(_window(t - size, end, members, closed))
    return out


def session_windows(times, *, timeout, max_duration, until):
    """Rows at most ``timeout`` apart share a window; a window starting at s is cut at the first
    multiple c of ``max_duration`` with c >= s + max_duration (rows at or after c start a new one)."""
    windows = []
    for t in sorted(times):
        if windows:
            cur = windows[-1]
            if t - cur["rows"][-1] <= timeout and t < cur["cut"]:
                cur["rows"].append(t)
                continue
        cut = -(-(t + max_duration) // max_duration) * max_duration  # ceil to a multiple
        windows.append(dict(rows=[t], cut=cut))
    out = []
    for w in windows:
        rows, cut = w["rows"], w["cut"]
        last = rows[-1]
        # the latest time a row could still join at: within the timeout and before the cut
        deadline = min(last + timeout, cut - 1)
        closed = deadline < until or (deadline == until and deadline in rows)
        out.append(_window(rows[0], min(last + timeout, cut), rows, closed))
    return out


def count_windows(times, *, count, interval, phase=None, until):
    """eKuiper COUNTWINDOW(count, interval): fires when the i-th row (1-based) arrives if i is a
    multiple of ``interval`` and i >= count, holding the last ``count`` rows. With ``phase`` (a
    resumed group whose row ``phase`` starts a window) it fires at i = phase + count + m*interval.
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
