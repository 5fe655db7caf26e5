"""A stream's notifications between its run and the receivers: an outbox of events (a Delta table
under ``_cq/streams/<name>/outbox``) and the keys delivered (``.../delivered``).

A run appends its events after its sink commit and then sends every pending event. Delivery that
fails is, with ``ON_FAILURE DROP``, logged and marked dropped; with PAUSE the events stay pending and
:func:`gate` — called by the stream's sensor and ``cq tick`` before anything else — retries them and
holds the stream (its cursor does not move) until they are through. Events are keyed by window,
type and run, so a retried run or a resend never delivers an event twice from here.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Callable

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from cq_engine.model import Stream
from cq_engine.streams.events import CLOSE, INVALIDATION, OPEN, Reported, public
from cq_engine.times import EPOCH, UTC, epoch_ms

if TYPE_CHECKING:
    from cq_engine.engine import Engine

log = logging.getLogger(__name__)
_TS = pa.timestamp("us", tz="UTC")
_OUTBOX = pa.schema([("key", pa.string()), ("seq", pa.int64()), ("window_id", pa.string()),
                     ("group_id", pa.int64()), ("window_start", _TS), ("window_end", _TS),
                     ("event_type", pa.string()), ("digest", pa.string()), ("table_name", pa.string()),
                     ("event", pa.string())])
_DELIVERED = pa.schema([("key", pa.string()), ("status", pa.string()), ("at", _TS)])


def _uri(engine: "Engine", stream: Stream, what: str) -> str:
    return engine.settings.state_uri(f"streams/{stream.name}/{what}")


def _read(uri: str) -> list[dict]:
    return pa.table(DeltaTable(uri).scan()).to_pylist() if DeltaTable.is_deltatable(uri) else []


def _outbox(engine: "Engine", stream: Stream) -> list[dict]:
    return sorted(_read(_uri(engine, stream, "outbox")), key=lambda r: r["seq"])


def _reported(outbox: list[dict]) -> dict[str, Reported]:
    """Per window id, what its receivers were told last."""
    out: dict[str, Reported] = {}
    for r in outbox:
        prev = out.get(r["window_id"])
        cur = prev or Reported(r["window_id"], r["group_id"], r["window_start"], r["window_end"],
                               table_name=r["table_name"])
        kind = r["event_type"]
        if kind == OPEN:
            cur = replace(cur, opened=True)
        elif kind == CLOSE:
            cur = replace(cur, closed_digest=r["digest"], window_end=r["window_end"], table_name=r["table_name"])
        elif kind == INVALIDATION:
            cur = replace(cur, closed_digest=None)
        out[r["window_id"]] = cur
    return out


def _time(ms: int | None) -> datetime | None:
    return EPOCH + timedelta(milliseconds=ms) if ms is not None else None


def _record(engine: "Engine", stream: Stream, outbox: list[dict], events: list[dict]) -> list[dict]:
    """Append the events not yet in ``outbox`` (a retried run's are); the rows appended."""
    known = {r["key"] for r in outbox}
    fresh = [e for e in events if e["_key"] not in known]
    if not fresh:
        return []
    start = (outbox[-1]["seq"] + 1) if outbox else 0
    rows = [{"key": e["_key"], "seq": start + i, "window_id": e["windowId"], "group_id": int(e["groupId"]),
             "window_start": _time(e.get("windowStart")), "window_end": _time(e.get("windowEnd")),
             "event_type": e["eventType"], "digest": e.get("_digest", ""), "table_name": e["tableName"],
             "event": json.dumps(public(e), separators=(",", ":"))} for i, e in enumerate(fresh)]
    write_deltalake(_uri(engine, stream, "outbox"), pa.Table.from_pylist(rows, schema=_OUTBOX), mode="append")
    return rows


def pending(engine: "Engine", stream: Stream, outbox: list[dict] | None = None) -> list[dict]:
    """Events in the outbox (``outbox``: its rows, already read) not yet delivered (nor dropped), in order."""
    done = {r["key"] for r in _read(_uri(engine, stream, "delivered"))}
    return [r for r in (_outbox(engine, stream) if outbox is None else outbox) if r["key"] not in done]


def _mark(engine: "Engine", stream: Stream, keys: list[str], status: str) -> None:
    now = datetime.now(UTC)
    data = pa.Table.from_pylist([{"key": k, "status": status, "at": now} for k in keys], schema=_DELIVERED)
    write_deltalake(_uri(engine, stream, "delivered"), data, mode="append")


def flush(engine: "Engine", stream: Stream, *, outbox: list[dict] | None = None, timeout: float = 5.0) -> str | None:
    """Send every pending event to every NOTIFY address. None when nothing is left pending; else
    (ON_FAILURE PAUSE) why delivery failed — the events stay pending for the next try."""
    from cq_engine.notify.ws import NotifyError, deliver

    notify = stream.notify
    rows = pending(engine, stream, outbox) if notify is not None else []
    if not rows:
        return None
    events = [{**json.loads(r["event"]), "_key": r["key"]} for r in rows]  # the key makes messageIds unique
    keys = [r["key"] for r in rows]
    now_ms = epoch_ms(datetime.now(UTC))
    try:
        deliver(notify.urls, {stream.name: events}, now_ms=now_ms, timeout=timeout)
    except NotifyError as exc:
        if notify.on_failure == "pause":
            log.warning("%s: %d notification(s) pending, the stream pauses until they are delivered: %s",
                        stream.name, len(rows), exc)
            return str(exc)
        log.warning("%s: dropped %d notification(s) (ON_FAILURE DROP): %s", stream.name, len(rows), exc)
        _mark(engine, stream, keys, "dropped")
        return None
    _mark(engine, stream, keys, "sent")
    return None


def publish(engine: "Engine", stream: Stream, build: Callable[[dict[str, Reported]], list[dict]]) -> int:
    """After a run's sink commit: the events ``build`` makes from what receivers were told before go
    into the outbox, then everything pending is sent (the outbox is read once). Returns how many
    events the run made."""
    if stream.notify is None:
        return 0
    outbox = _outbox(engine, stream)
    events = build(_reported(outbox))
    flush(engine, stream, outbox=outbox + _record(engine, stream, outbox, events))
    return len(events)


def paused_by_notify(stream: Stream) -> bool:
    """Whether undelivered notifications hold the stream (``ON_FAILURE PAUSE``)."""
    return stream.notify is not None and stream.notify.on_failure == "pause"


def gate(engine: "Engine", stream: Stream) -> str | None:
    """Before a tick of an ``ON_FAILURE PAUSE`` stream: deliver what is pending; the reason the
    stream must stay paused, or None."""
    if not paused_by_notify(stream):
        return None
    reason = flush(engine, stream)
    return f"paused: notification delivery failing ({reason})" if reason else None
