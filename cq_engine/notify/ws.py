"""Stream event notifications over WebSocket (the seed's NOTIFY clause).

A notification message is the seed's JSON document::

    {"messageId": "...", "timestamp": <ms>, "streams": [
        {"streamName": "...", "events": [{"eventType": "WINDOW_CLOSE", ...}, ...]}, ...]}

Delivery is at-least-once: the caller re-sends everything after a failure, so
``messageId`` is derived from the events (not from the clock) and receivers can
de-duplicate by it or by ``windowId``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import ssl
import threading
from collections.abc import Mapping, Sequence
from typing import TypeVar

from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.sync.client import connect

from cq_engine.errors import CQError

T = TypeVar("T")

#: Private event key used only for the messageId; never sent.
KEY = "_key"

# Close codes that mean the receiver answered our close frame normally (1005:
# it answered without a status code). Anything else, e.g. 1006 (no close frame)
# or 1001 (receiver going away), is not taken as an acknowledgement.
_CLEAN_CLOSE = {1000, 1005}


class NotifyError(CQError):
    """A notification could not be delivered; the message names the URL and the cause."""

    def __init__(self, url: str, cause: str):
        self.url, self.cause = url, cause
        super().__init__(f"{url}: {cause}")


def _identity(stream: str, event: Mapping) -> list:
    return [stream, event.get("windowId"), event.get("eventType"), event.get("revision"), event.get(KEY)]


def message(streams: Mapping[str, Sequence[dict]], *, now_ms: int) -> dict:
    """One notification message holding the events of each stream, in the given order.

    ``messageId`` is a digest of each event's (streamName, windowId, eventType,
    revision, ``_key``), so the same events always give the same id. Events are
    copied unchanged except that ``_key`` is dropped. Streams without events are left out.
    """
    ids: list = []
    out: list[dict] = []
    for name, events in streams.items():
        if not events:
            continue
        ids.extend(_identity(name, ev) for ev in events)
        out.append({"streamName": name, "events": [{k: v for k, v in ev.items() if k != KEY} for ev in events]})
    digest = hashlib.sha256(json.dumps(ids, separators=(",", ":"), ensure_ascii=False, default=str).encode())
    return {"messageId": digest.hexdigest()[:32], "timestamp": int(now_ms), "streams": out}


def batches(events: Sequence[T], *, max_events: int = 100) -> list[list[T]]:
    """Split ``events`` in order into lists of at most ``max_events``."""
    if max_events < 1:
        raise ValueError("max_events must be at least 1")
    return [list(events[i : i + max_events]) for i in range(0, len(events), max_events)]


def _ssl_context(url: str) -> ssl.SSLContext | None:
    if not url.lower().startswith("wss:"):
        return None
    # An extra CA lets tests and private deployments use self-signed receivers.
    return ssl.create_default_context(cafile=os.environ.get("CQ_NOTIFY_CA_FILE") or None)


def _describe(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return f"timed out after {timeout:g}s ({exc})" if str(exc) else f"timed out after {timeout:g}s"
    if isinstance(exc, InvalidStatus):
        return f"handshake rejected with HTTP {exc.response.status_code}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS error: {getattr(exc, 'verify_message', None) or exc}"
    if isinstance(exc, ConnectionClosed):
        return f"connection closed early ({exc})"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[:1].lower() + exc.strerror[1:]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def send(url: str, payloads: Sequence[str], *, timeout: float = 5.0) -> None:
    """Send ``payloads`` as text frames over one connection to ``url``, then close cleanly.

    The receiver answering our close frame is the acknowledgement. Any failure
    raises :class:`NotifyError`; the call takes at most about ``2 * timeout``.
    """
    try:
        # proxy=None: receivers are addressed directly; an ambient HTTP(S)_PROXY
        # must not silently reroute (or break) notifications to local hosts.
        ws = connect(
            url, open_timeout=timeout, close_timeout=timeout, ssl=_ssl_context(url), proxy=None, ping_interval=None
        )
    except (OSError, WebSocketException, ValueError) as exc:
        raise NotifyError(url, _describe(exc, timeout)) from exc

    # send() writes with a blocking socket and no deadline; a receiver that stops
    # reading could stall it forever, so a watchdog cuts the socket after `timeout`.
    expired = threading.Event()

    def cut() -> None:
        expired.set()
        with contextlib.suppress(OSError):
            ws.socket.shutdown(socket.SHUT_RDWR)

    watchdog = threading.Timer(timeout, cut)
    watchdog.daemon = True
    watchdog.start()
    try:
        for payload in payloads:
            ws.send(payload)
        ws.close()  # waits up to close_timeout for the receiver's close frame
    except (OSError, WebSocketException) as exc:
        ws.close_socket()
        # A close frame from the receiver is a better cause than our own watchdog.
        if expired.is_set() and not (isinstance(exc, ConnectionClosed) and exc.rcvd is not None):
            raise NotifyError(url, f"timed out after {timeout:g}s while sending") from exc
        raise NotifyError(url, _describe(exc, timeout)) from exc
    finally:
        watchdog.cancel()
    if ws.close_code in _CLEAN_CLOSE:
        return
    if expired.is_set():
        raise NotifyError(url, f"timed out after {timeout:g}s while closing")
    reason = f" {ws.close_reason}" if ws.close_reason else ""
    raise NotifyError(url, f"connection closed without acknowledgement (close code {ws.close_code}{reason})")


def dumps(msg: dict) -> str:
    """The wire form of a message (compact JSON, UTF-8 kept as is)."""
    return json.dumps(msg, ensure_ascii=False, separators=(",", ":"))


def deliver(
    urls: Sequence[str],
    events_by_stream: Mapping[str, Sequence[dict]],
    *,
    now_ms: int,
    max_events: int = 100,
    timeout: float = 5.0,
) -> list[dict]:
    """Send all events to every URL in messages of at most ``max_events`` events.

    Events are taken stream by stream in order, so one message may hold several
    streams. Returns the messages sent. Fails fast with :class:`NotifyError` on
    the first URL that fails; the caller retries everything and receivers dedupe
    by ``messageId``/``windowId``. Events must be JSON-serialisable.
    """
    flat = [(name, ev) for name, events in events_by_stream.items() for ev in events]
    msgs = []
    for chunk in batches(flat, max_events=max_events):
        grouped: dict[str, list[dict]] = {}
        for name, ev in chunk:
            grouped.setdefault(name, []).append(ev)
        msgs.append(message(grouped, now_ms=now_ms))
    if not msgs:
        return []
    payloads = [dumps(m) for m in msgs]
    for url in urls:
        send(url, payloads, timeout=timeout)
    return msgs
