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
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

import pyarrow as pa

from cq_engine.context import EngineContext
from cq_engine.model import Stream
from cq_engine.notify.ws import NotifyError, deliver
from cq_engine.streams.events import CLOSE, INVALIDATION, OPEN, Reported, public
from cq_engine.times import EPOCH, UTC, epoch_ms

log = logging.getLogger(__name__)
_TS = pa.timestamp("us", tz="UTC")
_OUTBOX = pa.schema(
    [
        ("key", pa.string()),
        ("seq", pa.int64()),
        ("window_id", pa.string()),
        ("group_id", pa.int64()),
        ("window_start", _TS),
        ("window_end", _TS),
        ("event_type", pa.string()),
        ("digest", pa.string()),
        ("table_name", pa.string()),
        ("event", pa.string()),
    ]
)
_DELIVERED = pa.schema([("key", pa.string()), ("status", pa.string()), ("at", _TS)])


def _name(stream: Stream, what: str) -> str:
    return f"streams/{stream.name}/{what}"


def _read(ctx: EngineContext, stream: Stream, what: str) -> list[dict]:
    data = ctx.storage.read_state(_name(stream, what))
    return data.to_pylist() if data is not None else []


def _outbox(ctx: EngineContext, stream: Stream) -> list[dict]:
    return sorted(_read(ctx, stream, "outbox"), key=lambda r: r["seq"])


def _reported(outbox: list[dict]) -> dict[str, Reported]:
    """Per window id, what its receivers were told last."""
    out: dict[str, Reported] = {}
    for r in outbox:
        prev = out.get(r["window_id"])
        cur = prev or Reported(
            r["window_id"], r["group_id"], r["window_start"], r["window_end"], table_name=r["table_name"]
        )
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


def _record(ctx: EngineContext, stream: Stream, outbox: list[dict], events: list[dict]) -> list[dict]:
    """Append the events not yet in ``outbox`` (a retried run's are); the rows appended."""
    known = {r["key"] for r in outbox}
    fresh = [e for e in events if e["_key"] not in known]
    if not fresh:
        return []
    start = (outbox[-1]["seq"] + 1) if outbox else 0
    rows = [
        {
            "key": e["_key"],
            "seq": start + i,
            "window_id": e["windowId"],
            "group_id": int(e["groupId"]),
            "window_start": _time(e.get("windowStart")),
            "window_end": _time(e.get("windowEnd")),
            "event_type": e["eventType"],
            "digest": e.get("_digest", ""),
            "table_name": e["tableName"],
            "event": json.dumps(public(e), separators=(",", ":")),
        }
        for i, e in enumerate(fresh)
    ]
    ctx.storage.append_state(_name(stream, "outbox"), pa.Table.from_pylist(rows, schema=_OUTBOX))
    return rows


def pending(
    ctx: EngineContext, stream: Stream, outbox: list[dict] | None = None, *, delivered: list[dict] | None = None
) -> list[dict]:
    """Events in the outbox (``outbox``: its rows, already read) not yet delivered (nor dropped), in
    order (``delivered``: the delivery marks, already read)."""
    done = {r["key"] for r in (_read(ctx, stream, "delivered") if delivered is None else delivered)}
    return [r for r in (_outbox(ctx, stream) if outbox is None else outbox) if r["key"] not in done]


def _last_status(delivered: list[dict]) -> str | None:
    """How the latest delivery attempt ended: ``sent``, ``dropped`` or None (none yet)."""
    return max(delivered, key=lambda r: r["at"])["status"] if delivered else None


def _mark(ctx: EngineContext, stream: Stream, keys: list[str], status: str) -> None:
    now = datetime.now(UTC)
    data = pa.Table.from_pylist([{"key": k, "status": status, "at": now} for k in keys], schema=_DELIVERED)
    ctx.storage.append_state(_name(stream, "delivered"), data)


def flush(ctx: EngineContext, stream: Stream, *, outbox: list[dict] | None = None, timeout: float = 5.0) -> str | None:
    """Send every pending event to every NOTIFY address. None when nothing is left pending; else
    (ON_FAILURE PAUSE) why delivery failed — the events stay pending for the next try."""
    notify = stream.notify
    if notify is None:
        return None
    delivered = _read(ctx, stream, "delivered")
    rows = pending(ctx, stream, outbox, delivered=delivered)
    if not rows:
        return None
    last = _last_status(delivered)
    events = [{**json.loads(r["event"]), "_key": r["key"]} for r in rows]  # the key makes messageIds unique
    keys = [r["key"] for r in rows]
    now_ms = epoch_ms(datetime.now(UTC))
    try:
        deliver(notify.urls, {stream.name: events}, now_ms=now_ms, timeout=timeout)
    except NotifyError as exc:
        if notify.on_failure == "pause":
            log.warning(
                "%s: %d notification(s) pending, the stream pauses until they are delivered: %s",
                stream.name,
                len(rows),
                exc,
            )
            return str(exc)
        # Said once while a receiver stays away (a sample stream notifies a `cq listen` that may
        # never run): a warning when dropping starts, then each further drop at INFO.
        if last == "dropped":
            log.info("%s: dropped %d more notification(s) (ON_FAILURE DROP): %s", stream.name, len(rows), exc)
        else:
            log.warning("%s: dropped %d notification(s) (ON_FAILURE DROP): %s", stream.name, len(rows), exc)
        _mark(ctx, stream, keys, "dropped")
        return None
    if last == "dropped":
        log.info("%s: notifications delivered again (%d sent)", stream.name, len(rows))
    _mark(ctx, stream, keys, "sent")
    return None


def publish(ctx: EngineContext, stream: Stream, build: Callable[[dict[str, Reported]], list[dict]]) -> int:
    """After a run's sink commit: the events ``build`` makes from what receivers were told before go
    into the outbox, then everything pending is sent (the outbox is read once). Returns how many
    events the run made."""
    if stream.notify is None:
        return 0
    outbox = _outbox(ctx, stream)
    events = build(_reported(outbox))
    flush(ctx, stream, outbox=outbox + _record(ctx, stream, outbox, events))
    return len(events)


def paused_by_notify(stream: Stream) -> bool:
    """Whether undelivered notifications hold the stream (``ON_FAILURE PAUSE``)."""
    return stream.notify is not None and stream.notify.on_failure == "pause"


def gate(ctx: EngineContext, stream: Stream) -> str | None:
    """Before a tick of an ``ON_FAILURE PAUSE`` stream: deliver what is pending; the reason the
    stream must stay paused, or None."""
    if not paused_by_notify(stream):
        return None
    reason = flush(ctx, stream)
    return f"paused: notification delivery failing ({reason})" if reason else None
