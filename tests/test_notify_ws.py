"""Notification messages and their WebSocket delivery, against a real local receiver (no Spark)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import socket
import threading
import time

import pytest
from websockets.sync.server import serve
from ws_recorder import Recorder

from cq_engine.errors import CQError
from cq_engine.notify.ws import NotifyError, batches, deliver, message, send

NOW = 1733284887203


def open_event(win: str, **extra) -> dict:
    return {
        "tableName": "t_1",
        "eventType": "WINDOW_OPEN",
        "eventTime": NOW - 100,
        "windowId": win,
        "windowType": "Time",
        "groupId": "42",
        "windowStart": 1733284800000,
        **extra,
    }


def close_event(win: str, **extra) -> dict:
    return {
        "tableName": "t_1",
        "eventType": "WINDOW_CLOSE",
        "eventTime": NOW - 50,
        "windowId": win,
        "windowType": "Time",
        "groupId": "42",
        "windowStart": 1733284800000,
        "windowEnd": 1733284860000,
        "result": {"_wstart": 1733284800000, "avg(current)": 1.3},
        **extra,
    }


@pytest.fixture
def rec():
    with Recorder() as r:
        yield r


# -- message format ---------------------------------------------------------------------


def test_message_has_seed_fields_and_passes_events_through():
    ev_open, ev_close = open_event("w1"), close_event("w1")
    msg = message({"avg_current_stream": [ev_open, ev_close], "empty": [], "max_v": [open_event("w2")]}, now_ms=NOW)
    assert set(msg) == {"messageId", "timestamp", "streams"}
    assert isinstance(msg["messageId"], str) and msg["messageId"]
    assert msg["timestamp"] == NOW
    assert msg["streams"] == [
        {"streamName": "avg_current_stream", "events": [ev_open, ev_close]},
        {"streamName": "max_v", "events": [open_event("w2")]},
    ]


def test_message_id_is_deterministic_and_key_is_private():
    a = message({"s": [close_event("w1", _key="rev-1")]}, now_ms=NOW)
    again = message({"s": [close_event("w1", _key="rev-1")]}, now_ms=NOW + 60_000)
    assert a["messageId"] == again["messageId"]  # a re-send keeps its id
    assert "_key" not in a["streams"][0]["events"][0]
    assert a["streams"][0]["events"][0] == close_event("w1")

    ids = {
        a["messageId"],
        message({"s": [close_event("w1", _key="rev-2")]}, now_ms=NOW)["messageId"],
        message({"s": [close_event("w2", _key="rev-1")]}, now_ms=NOW)["messageId"],
        message({"s": [open_event("w1", _key="rev-1")]}, now_ms=NOW)["messageId"],
        message({"other": [close_event("w1", _key="rev-1")]}, now_ms=NOW)["messageId"],
        message({"s": [close_event("w1", revision=2)]}, now_ms=NOW)["messageId"],
        message({"s": [close_event("w1", revision=3)]}, now_ms=NOW)["messageId"],
    }
    assert len(ids) == 7
    # "revision" is an ordinary event field: it is sent.
    assert message({"s": [close_event("w1", revision=2)]}, now_ms=NOW)["streams"][0]["events"][0]["revision"] == 2


def test_batches_split_in_order():
    items = list(range(250))
    parts = batches(items)
    assert [len(p) for p in parts] == [100, 100, 50]
    assert [x for p in parts for x in p] == items
    assert batches([], max_events=3) == []
    assert batches([1, 2, 3], max_events=3) == [[1, 2, 3]]
    with pytest.raises(ValueError):
        batches([1], max_events=0)


def test_notify_error_is_a_cq_error():
    err = NotifyError("ws://h:1/n", "connection refused")
    assert isinstance(err, CQError)
    assert str(err) == "ws://h:1/n: connection refused"


# -- delivery -----------------------------------------------------------------------------


def test_deliver_sends_exact_json(rec):
    events = {"avg_current_stream": [open_event("w1"), close_event("w1", _key="k1")], "max_v": [open_event("w2")]}
    sent = deliver([rec.url("/notify?key=foo")], events, now_ms=NOW)
    assert len(sent) == 1  # several streams share one message
    got = rec.wait_for(1)
    assert got == sent
    assert got == [
        {
            "messageId": sent[0]["messageId"],
            "timestamp": NOW,
            "streams": [
                {"streamName": "avg_current_stream", "events": [open_event("w1"), close_event("w1")]},
                {"streamName": "max_v", "events": [open_event("w2")]},
            ],
        }
    ]
    assert rec.paths == ["/notify?key=foo"]
    assert [e["streamName"] for e in rec.events()] == ["avg_current_stream"] * 2 + ["max_v"]
    assert rec.events()[1]["result"] == {"_wstart": 1733284800000, "avg(current)": 1.3}


def test_deliver_batches_over_one_connection(rec):
    events = {"a": [close_event(f"a{i}") for i in range(150)], "b": [close_event(f"b{i}") for i in range(100)]}
    sent = deliver([rec.url()], events, now_ms=NOW)
    assert [sum(len(s["events"]) for s in m["streams"]) for m in sent] == [100, 100, 50]
    # the middle message holds the tail of "a" and the head of "b"
    assert [s["streamName"] for s in sent[1]["streams"]] == ["a", "b"]
    assert rec.wait_for(3) == sent
    assert len(rec.paths) == 1  # one connection for all three messages
    assert [e["windowId"] for e in rec.events()] == [f"a{i}" for i in range(150)] + [f"b{i}" for i in range(100)]
    assert len({m["messageId"] for m in sent}) == 3
    # same events again: same ids, so the receiver can de-duplicate a retry
    assert [m["messageId"] for m in deliver([rec.url()], events, now_ms=NOW + 1)] == [m["messageId"] for m in sent]


def test_deliver_nothing_connects_nowhere():
    assert deliver(["ws://127.0.0.1:9/notify"], {"s": []}, now_ms=NOW) == []


def test_two_urls_both_receive():
    with Recorder() as r1, Recorder() as r2:
        sent = deliver([r1.url(), r2.url("/other")], {"s": [close_event("w1")]}, now_ms=NOW)
        assert r1.wait_for(1) == sent
        assert r2.wait_for(1) == sent
        assert r2.paths == ["/other"]


def test_stopped_receiver_fails_fast_and_restart_works(rec):
    url = rec.url()
    deliver([url], {"s": [close_event("w0")]}, now_ms=NOW)
    rec.wait_for(1)
    rec.stop()
    t0 = time.monotonic()
    with pytest.raises(NotifyError) as info:
        deliver([url], {"s": [close_event("w1")]}, now_ms=NOW, timeout=2)
    assert time.monotonic() - t0 < 3
    assert str(info.value).startswith(url + ": ")
    assert "refused" in str(info.value)
    assert info.value.url == url

    rec.start()
    assert rec.url() == url  # same port after restart
    sent = deliver([url], {"s": [close_event("w1")]}, now_ms=NOW)
    assert rec.wait_for(2)[1] == sent[0]


def test_first_failing_url_raises(rec):
    with Recorder() as down:
        dead = down.url()
    with pytest.raises(NotifyError, match=dead.replace("?", r"\?")):
        deliver([dead, rec.url()], {"s": [close_event("w1")]}, now_ms=NOW, timeout=2)


def test_rejected_handshake_is_a_notify_error(rec):
    rec.reject_status = 503
    with pytest.raises(NotifyError, match="HTTP 503"):
        send(rec.url(), ["{}"], timeout=2)


def _closing_server(code: int):
    """A bare server that completes the upgrade, then at once sends a close frame with
    ``code`` and stops writing: deterministic, unlike a websockets handler, whose library
    would already have answered the sender's own close frame with 1000."""
    listener = socket.create_server(("127.0.0.1", 0))

    def run():
        conn, _ = listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(4096)
            key = next(
                line.split(":", 1)[1].strip()
                for line in data.decode().split("\r\n")
                if line.lower().startswith("sec-websocket-key:")
            )
            accept = base64.b64encode(
                hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()
            ).decode()
            conn.sendall(
                (
                    "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    f"Sec-WebSocket-Accept: {accept}\r\n\r\n"
                ).encode()
            )
            body = code.to_bytes(2, "big") + b"bye"
            conn.sendall(bytes([0x88, len(body)]) + body)
            # Half-close, then drain until the sender hangs up: closing with the
            # sender's frames unread would answer them with a RST, and a RST can
            # discard the close frame from the sender's receive buffer before it
            # is read (then the cause is "no close frame", not the code).
            conn.shutdown(socket.SHUT_WR)
            conn.settimeout(5)
            with contextlib.suppress(OSError):
                while conn.recv(65536):
                    pass

    threading.Thread(target=run, daemon=True).start()
    return listener


def test_receiver_closing_early_is_a_notify_error():
    with _closing_server(1011) as listener:
        url = f"ws://127.0.0.1:{listener.getsockname()[1]}/notify"
        t0 = time.monotonic()
        with pytest.raises(NotifyError, match="1011") as info:
            send(url, ['{"n": 1}'] * 3, timeout=2)
        assert time.monotonic() - t0 < 3
        assert str(info.value).startswith(url + ": ")


def test_receiver_that_stops_reading_cannot_stall_send():
    # The handler never reads and the server queues at most one message, so the
    # kernel buffers fill and the sender's socket write blocks: the watchdog must cut it.
    release = threading.Event()
    server = serve(
        lambda ws: release.wait(10),
        "127.0.0.1",
        0,
        ping_interval=None,
        max_size=None,
        max_queue=1,
        compression=None,
        close_timeout=0.5,
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"ws://127.0.0.1:{server.socket.getsockname()[1]}/notify"
        big = base64.b64encode(os.urandom(1_500_000)).decode()  # incompressible
        t0 = time.monotonic()
        with pytest.raises(NotifyError, match="timed out"):
            send(url, [big] * 40, timeout=0.5)
        assert time.monotonic() - t0 < 1.5
    finally:
        release.set()
        server.shutdown()


def test_unresponsive_receiver_times_out():
    # Accepts TCP (kernel backlog) but never answers the HTTP upgrade.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        url = f"ws://127.0.0.1:{silent.getsockname()[1]}/notify"
        t0 = time.monotonic()
        with pytest.raises(NotifyError, match="timed out") as info:
            send(url, ["{}"], timeout=0.5)
        assert time.monotonic() - t0 < 2
        assert str(info.value).startswith(url)


def test_bad_url_is_a_notify_error():
    with pytest.raises(NotifyError, match=r"^http://127\.0\.0\.1:9/x: "):
        send("http://127.0.0.1:9/x", ["{}"], timeout=1)


# -- TLS --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_rec():
    with Recorder(tls=True) as r:
        yield r


def test_wss_with_ca_file(tls_rec, monkeypatch):
    monkeypatch.setenv("CQ_NOTIFY_CA_FILE", tls_rec.ca_file)
    url = tls_rec.url("/notify?key=foo")
    assert url.startswith("wss://")
    sent = deliver([url], {"s": [close_event("w1")]}, now_ms=NOW)
    assert tls_rec.wait_for(lambda msgs: sent[0] in msgs)
    # hostname form of the same receiver also verifies (SAN covers localhost)
    deliver([url.replace("127.0.0.1", "localhost")], {"s": [close_event("w2")]}, now_ms=NOW, timeout=20)
    tls_rec.wait_for(lambda msgs: any(e["windowId"] == "w2" for e in tls_rec.events()))


def test_wss_without_ca_file_fails(tls_rec, monkeypatch):
    monkeypatch.delenv("CQ_NOTIFY_CA_FILE", raising=False)
    with pytest.raises(NotifyError, match="certificate") as info:
        deliver([tls_rec.url()], {"s": [close_event("w1")]}, now_ms=NOW, timeout=2)
    assert str(info.value).startswith(tls_rec.url() + ": ")
