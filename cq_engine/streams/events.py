"""The events a stream run notifies (seed 000, 流式计算的事件通知): pure functions from the run's
result rows and what was reported before to the event objects of the seed's JSON format.

Per window: ``WINDOW_OPEN`` once, when the window is first seen; ``WINDOW_CLOSE`` when it closes,
with its result; when a recomputation changes (or removes) a window already reported closed,
``WINDOW_INVALIDATION`` for the old one and then the new ``WINDOW_CLOSE``. A recomputation that
yields the same window and result sends nothing, so a receiver sees each window closed once unless
its result really changed. ``windowId`` is derived from the stream, the group and the window start,
so it is the same across retries and restarts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from cq_engine.model import Stream
from cq_engine.streams.output import SUBTABLE
from cq_engine.streams.windows.tdengine import CLOSE_ROW, NEXT_STATE, OPEN_ROW, PREV_STATE, STATE, WCLOSED, WEND, WSTART
from cq_engine.times import epoch_ms

GROUP = "__cq_tgrpid"
EMPTY = "__cq_empty"
NOTIFY_OK = "__cq_notify_ok"  # NOTIFY ... WHERE on the result row
OPEN, CLOSE, INVALIDATION = "WINDOW_OPEN", "WINDOW_CLOSE", "WINDOW_INVALIDATION"
WINDOW_TYPES = {
    "sliding": "Time",
    "period": "Time",
    "session": "Session",
    "state": "State",
    "event": "Event",
    "count": "Count",
}


@dataclass(frozen=True)
class Reported:
    """What receivers were last told about a window (from the outbox)."""

    window_id: str
    group_id: int
    window_start: datetime
    window_end: datetime | None
    opened: bool = False
    closed_digest: str | None = None  # the last WINDOW_CLOSE still valid (None: none, or invalidated)
    table_name: str = ""


def window_id(stream: Stream, group: int, start: datetime) -> str:
    """Stable across retries and restarts: the stream, the partition group and the window start."""
    text = f"{stream.name.lower()}|{group}|{_ms(start)}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def table_name(stream: Stream, row: dict) -> str:
    """The output subtable: OUTPUT_SUBTABLE's value, else (as TDengine) an MD5-derived name."""
    if stream.output_subtable and row.get(SUBTABLE) is not None:
        return str(row[SUBTABLE])
    return "t_" + hashlib.md5(f"{stream.sink or stream.name}_{row[GROUP]}".encode()).hexdigest()


def _ms(t: datetime | None) -> int | None:
    return epoch_ms(t) if t is not None else None


def _value(v):
    if isinstance(v, datetime):
        return _ms(v)
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, dict):
        return {k: _value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_value(x) for x in v]
    return v


def _result(stream: Stream, rows: list[dict]) -> dict:
    """Result columns → value (one row: an aggregate); a projection's rows → lists per column."""
    names = [i.name for i in stream.select]
    if len(rows) == 1:
        return {n: _value(rows[0].get(n)) for n in names}
    return {n: [_value(r.get(n)) for r in rows] for n in names}


def _digest(event: dict) -> str:
    body = {k: event.get(k) for k in ("windowEnd", "result", "curState", "nextState", "triggerCondition")}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _windows(rows: Iterable[dict]) -> dict[tuple[int, datetime], list[dict]]:
    out: dict[tuple[int, datetime], list[dict]] = {}
    for r in rows:
        out.setdefault((r[GROUP], r[WSTART]), []).append(r)
    return dict(sorted(out.items(), key=lambda kv: (kv[0][1], kv[0][0])))


def build_events(
    stream: Stream,
    rows: list[dict],
    *,
    reported: dict[str, Reported],
    replaced: Callable[[int, datetime], bool],
    revision: str,
    now_ms: int,
) -> list[dict]:
    """The run's events in order. ``rows``: the result with the engine columns (``GROUP``,
    ``WSTART``, ``WEND``, ``WCLOSED``, the state/event extras, ``EMPTY``, ``NOTIFY_OK``);
    ``replaced(group, start)``: whether the run replaced that window's rows (so a reported window it
    no longer yields is invalidated); ``revision`` identifies the run (same on a retry). Every event
    carries a private ``_key`` (outbox identity) and ``_digest``."""
    notify = stream.notify
    if notify is None:
        return []
    wanted = set(notify.events)
    wtype = WINDOW_TYPES[stream.trigger.kind]
    events: list[dict] = []
    seen: set[str] = set()
    for (group, start), wrows in _windows(rows).items():
        wid = window_id(stream, group, start)
        seen.add(wid)
        first, before = wrows[0], reported.get(wid)
        base = {
            "tableName": table_name(stream, first),
            "eventTime": now_ms,
            "windowId": wid,
            "windowType": wtype,
            "groupId": str(group),
            "windowStart": _ms(start),
        }
        if OPEN in wanted and not (before and before.opened):
            event = {**base, "eventType": OPEN, **_open_fields(stream, first)}
            events.append({**event, "_key": f"{wid}/{OPEN}", "_digest": ""})
        if not first.get(WCLOSED) or CLOSE not in wanted:
            continue
        results = [r for r in wrows if not r.get(EMPTY) or stream.options.force_output]
        results = [r for r in results if r.get(NOTIFY_OK, True)]
        if not results:
            continue
        event = {
            **base,
            "eventType": CLOSE,
            "windowEnd": _ms(first.get(WEND)),
            **_close_fields(stream, first),
            "result": _result(stream, results),
        }
        digest = _digest(event)
        if before is not None and before.closed_digest == digest:
            continue  # recomputed to the same window and result: nothing new to tell
        if before is not None and before.closed_digest is not None:
            events.append(_invalidation(before, wtype, now_ms, revision))
        events.append({**event, "_key": f"{wid}/{CLOSE}/{revision}", "_digest": digest})
    for wid, before in reported.items():
        if wid not in seen and before.closed_digest is not None and replaced(before.group_id, before.window_start):
            events.append(_invalidation(before, wtype, now_ms, revision))
    return events


def _invalidation(before: Reported, wtype: str, now_ms: int, revision: str) -> dict:
    return {
        "tableName": before.table_name,
        "eventType": INVALIDATION,
        "eventTime": now_ms,
        "windowId": before.window_id,
        "windowType": wtype,
        "groupId": str(before.group_id),
        "windowStart": _ms(before.window_start),
        "windowEnd": _ms(before.window_end),
        "_key": f"{before.window_id}/{INVALIDATION}/{revision}",
        "_digest": "",
    }


def _condition(index: int, values) -> dict:
    return {"conditionIndex": index, "fieldValue": _value(values or {})}


def _open_fields(stream: Stream, row: dict) -> dict:
    kind = stream.trigger.kind
    if kind == "state":
        return {"prevState": _value(row.get(PREV_STATE)), "curState": _value(row.get(STATE))}
    if kind == "event":
        return {"triggerCondition": _condition(0, row.get(OPEN_ROW))}
    return {}


def _close_fields(stream: Stream, row: dict) -> dict:
    kind = stream.trigger.kind
    if kind == "state":
        return {"curState": _value(row.get(STATE)), "nextState": _value(row.get(NEXT_STATE))}
    if kind == "event":
        # Conditions are numbered across START WITH then END WITH, as in seed 000's example (0, then 1).
        return {"triggerCondition": _condition(1, row.get(CLOSE_ROW))}
    return {}


def public(event: dict) -> dict:
    """The event as sent: without the private keys."""
    return {k: v for k, v in event.items() if not k.startswith("_")}


__all__ = ["CLOSE", "INVALIDATION", "OPEN", "Reported", "build_events", "public", "table_name", "window_id"]
