"""A deliberately simple pure-Python model of ``cq_engine.streams.windows.tdengine.assign_windows`` for tests.

Rows are dicts with ``t`` (int microseconds) plus value columns; conditions are Python callables.
Each function takes one group's rows (any order) and returns one dict per (row, window) with the
row's ``t`` and ``ws``, ``we``, ``last``, ``n``, ``closed`` (plus the state/event extras).
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from cq_engine.schedule.cron import period_ticks
from cq_engine.times import EPOCH, UTC

DAY = 86_400_000_000


def _dt(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=us)


def _out(members, ws, we, closed, **extra):
    last = max(r["t"] for r in members)
    return [dict(t=r["t"], ws=ws, we=we, last=last, n=len(members), closed=closed, **extra) for r in members]


def interval_windows(rows, *, interval, sliding, offset, until):
    out = []
    ts = sorted(r["t"] for r in rows)
    if not ts:
        return out
    k = (ts[0] - offset - interval) // sliding  # early enough
    while offset + k * sliding <= ts[-1]:
        ws = offset + k * sliding
        members = [r for r in rows if ws <= r["t"] < ws + interval]
        if members:
            out += _out(members, ws, ws + interval, ws + interval <= until)
        k += 1
    return out


def tick_windows(rows, *, sliding, offset, timezone, until):
    ts = sorted(r["t"] for r in rows)
    if not ts:
        return []
    tz = ZoneInfo(timezone)
    created = datetime(1970, 1, 1, tzinfo=tz).astimezone(UTC)
    lo = _dt(ts[0]) - timedelta(days=3) - timedelta(microseconds=sliding)
    hi = _dt(ts[-1]) + timedelta(days=3) + timedelta(microseconds=sliding)
    ticks = [
        (x - EPOCH) // timedelta(microseconds=1)
        for x in period_ticks(
            interval=timedelta(microseconds=sliding),
            offset=timedelta(microseconds=offset),
            timezone=timezone,
            created=created,
            start=lo,
            end=hi,
        )
    ]
    out = []
    for a, b in itertools.pairwise(ticks):
        members = [r for r in rows if a <= r["t"] < b]
        if members:
            out += _out(members, a, b, b <= until)
    return out


def session_windows(rows, *, gap, until):
    rows = sorted(rows, key=lambda r: r["t"])
    out, cur = [], []
    for r in [*rows, None]:
        if r is None or (cur and r["t"] - cur[-1]["t"] > gap):
            if cur:
                last = cur[-1]["t"]
                out += _out(cur, cur[0]["t"], last + gap, last + gap < until)
            cur = []
        if r is not None:
            cur.append(r)
    return out


def state_windows(rows, *, state, true_for, until):
    rows = [r for r in sorted(rows, key=lambda r: r["t"]) if state(r) is not None]
    runs = []
    for r in rows:
        if runs and state(runs[-1][-1]) == state(r):
            runs[-1].append(r)
        else:
            runs.append([r])
    out = []
    for i, run in enumerate(runs):
        nxt = runs[i + 1] if i + 1 < len(runs) else None
        closed = nxt is not None and nxt[0]["t"] <= until
        if closed and true_for is not None and run[-1]["t"] - run[0]["t"] < true_for:
            continue
        out += _out(
            run,
            run[0]["t"],
            run[-1]["t"],
            closed,
            state=state(run[0]),
            prev_state=state(runs[i - 1][0]) if i > 0 else None,
            next_state=state(nxt[0]) if nxt else None,
        )
    return out


def event_windows(rows, *, start, end, true_for, until, open_cols, close_cols):
    rows = sorted(rows, key=lambda r: r["t"])
    windows, cur = [], None
    for r in rows:
        if cur is None and start(r):
            cur = []
        if cur is not None:
            cur.append(r)
            if end(r):
                windows.append((cur, True))
                cur = None
    if cur is not None:
        windows.append((cur, False))
    out = []
    for members, ended in windows:
        closed = ended and members[-1]["t"] <= until
        if closed and true_for is not None and members[-1]["t"] - members[0]["t"] < true_for:
            continue
        open_row = tuple(members[0][c] for c in open_cols)
        close_row = tuple(members[-1][c] for c in close_cols) if closed else None
        out += _out(members, members[0]["t"], members[-1]["t"], closed, open_row=open_row, close_row=close_row)
    return out


def count_windows(rows, *, count, slide, columns, until):
    rows = sorted(rows, key=lambda r: r["t"])
    if columns:
        rows = [r for r in rows if any(r[c] is not None for c in columns)]
    out = []
    for j in range(0, len(rows), slide):
        members = rows[j : j + count]
        last = members[-1]["t"]
        out += _out(members, members[0]["t"], last, len(members) == count and last <= until)
    return out
