"""NOTIFY end to end: streams from ``.sql`` on real Spark and Delta send seed 000's JSON to a real local
WebSocket server (``ws_recorder.Recorder``); outages with ON_FAILURE PAUSE and DROP."""

from __future__ import annotations

import logging
from collections import Counter

import pytest
from streams_util import NOW, T0, Bench, M
from ws_recorder import Recorder

from cq_engine.notify import outbox as notify_outbox
from cq_engine.streams.events import window_id

MS = 1000


def ms(t) -> int:
    return int(t.timestamp() * 1000)


@pytest.fixture
def recorder():
    with Recorder() as r:
        yield r


def _bench(tmp_path, spark, recorder, body: str) -> Bench:
    return Bench(tmp_path, spark, body.replace("URL", recorder.url()))


def gated_tick(b: Bench, name: str, now=NOW):
    """What the sensor does: with ON_FAILURE PAUSE, undelivered events hold the cursor."""
    reason = notify_outbox.gate(b.engine, b.engine.stream(name))
    if reason:
        return reason
    return b.tick(name, now=now)


def _meters(b: Bench, seconds, *, meters=("d1001",), current=lambda s: float(s)) -> None:
    b.append([(s, d, current(s)) for s in seconds for d in meters])


@pytest.mark.usefixtures("on_both_storages")
def test_time_window_open_and_close_events_carry_the_seed_fields(tmp_path, spark, recorder):
    b = _bench(
        tmp_path,
        spark,
        recorder,
        """CREATE STREAM avg_current_stream INTERVAL(1m) SLIDING(1m) FROM meters
        PARTITION BY tbname NOTIFY('URL') ON (WINDOW_OPEN|WINDOW_CLOSE)
        INTO avg_current AS SELECT _twstart, _twend, avg(current) AS c FROM %%trows;""",
    )
    b.tick("avg_current_stream")
    _meters(b, range(0, 30, 10))
    b.tick("avg_current_stream")  # the first window opens
    _meters(b, range(30, 70, 10))
    b.tick("avg_current_stream")  # it closes (60 s arrived), the second opens
    msgs = recorder.wait_for(2)
    stream = engine_stream = b.engine.stream("avg_current_stream")
    gid = b.sink("avg_current")[0]["group_id"]
    wid = window_id(engine_stream, gid, T0)
    first, second = (m["streams"][0] for m in msgs)
    assert first["streamName"] == "avg_current_stream" and set(msgs[0]) == {"messageId", "timestamp", "streams"}
    (opened,) = first["events"]
    assert {k: v for k, v in opened.items() if k != "eventTime"} == {
        "tableName": opened["tableName"],
        "eventType": "WINDOW_OPEN",
        "windowId": wid,
        "windowType": "Time",
        "groupId": str(gid),
        "windowStart": ms(T0),
    }
    assert opened["tableName"].startswith("t_") and len(opened["tableName"]) == 34
    closed, opened2 = second["events"]
    assert {k: v for k, v in closed.items() if k != "eventTime"} == {
        "tableName": opened["tableName"],
        "eventType": "WINDOW_CLOSE",
        "windowId": wid,
        "windowType": "Time",
        "groupId": str(gid),
        "windowStart": ms(T0),
        "windowEnd": ms(T0 + M),
        "result": {"_twstart": ms(T0), "_twend": ms(T0 + M), "c": 25.0},
    }
    assert (opened2["eventType"], opened2["windowStart"]) == ("WINDOW_OPEN", ms(T0 + M))
    assert stream.notify.on_failure == "drop"


@pytest.mark.parametrize("kind", ["state", "event", "session", "count"])
def test_each_window_type_reports_its_fields(tmp_path, spark, recorder, kind):
    trigger = {
        "state": "STATE_WINDOW(status)",
        "event": "EVENT_WINDOW(START WITH current > 5 END WITH current > 8)",
        "session": "SESSION(ts, 15s)",
        "count": "COUNT_WINDOW(3)",
    }[kind]
    b = _bench(
        tmp_path,
        spark,
        recorder,
        f"""CREATE STREAM w {trigger} FROM meters PARTITION BY tbname
        NOTIFY('URL') ON (WINDOW_OPEN|WINDOW_CLOSE) INTO w_out AS SELECT _twstart, count(*) AS n FROM %%trows;""",
    )
    b.tick("w")
    # status 1 for 0..20 s, then 2; currents 0, 1, ... 9; a 30 s gap before the last row
    b.append(
        [(s, "d1001", float(s // 10), 220, 1 if s < 30 else 2) for s in range(0, 100, 10)]
        + [(130, "d1001", 0.0, 220, 3)]
    )
    b.tick("w")
    events = recorder.wait_for(1) and recorder.events()
    by_type = Counter(e["eventType"] for e in events)
    closes = [e for e in events if e["eventType"] == "WINDOW_CLOSE"]
    opens = [e for e in events if e["eventType"] == "WINDOW_OPEN"]
    assert {e["windowType"] for e in events} == {kind.capitalize() if kind != "state" else "State"}
    assert by_type["WINDOW_OPEN"] >= by_type["WINDOW_CLOSE"] >= 1
    first_close = closes[0]
    assert first_close["result"]["_twstart"] == first_close["windowStart"]
    if kind == "state":
        assert (opens[0]["prevState"], opens[0]["curState"]) == (None, 1)
        assert (first_close["curState"], first_close["nextState"], first_close["result"]["n"]) == (1, 2, 3)
        assert first_close["windowEnd"] == ms(T0 + 20 * M / 60)
    if kind == "event":  # opens at current 6 (60 s), closes at current 9 (90 s)
        assert opens[0]["triggerCondition"] == {"conditionIndex": 0, "fieldValue": {"current": 6.0}}
        assert first_close["triggerCondition"] == {"conditionIndex": 1, "fieldValue": {"current": 9.0}}
        assert (first_close["windowStart"], first_close["windowEnd"]) == (ms(T0 + M), ms(T0 + 90 * M / 60))
    if kind == "session":  # 0..90 s, then 130 s opens the next (15 s gap)
        assert (first_close["windowStart"], first_close["windowEnd"], first_close["result"]["n"]) == (
            ms(T0),
            ms(T0 + 105 * M / 60),
            10,
        )
    if kind == "count":
        assert [(e["windowStart"], e["result"]["n"]) for e in closes] == [
            (ms(T0), 3),
            (ms(T0 + 30 * M / 60), 3),
            (ms(T0 + 60 * M / 60), 3),
        ]
    for e in events:
        assert set(e) >= {"tableName", "eventType", "eventTime", "windowId", "windowType", "groupId", "windowStart"}


def test_where_filters_and_events_batch_into_one_message(tmp_path, spark, recorder):
    b = _bench(
        tmp_path,
        spark,
        recorder,
        """CREATE STREAM hot INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname
        NOTIFY('URL') ON (WINDOW_CLOSE) WHERE c > 30
        INTO hot_out AS SELECT _twstart, avg(current) AS c FROM %%trows;""",
    )
    b.tick("hot")
    _meters(b, range(0, 250, 10), meters=("d1001", "d1002", "d1003"))
    b.tick("hot")  # 4 windows per meter close; the first (avg 25) is filtered out
    (msg,) = recorder.wait_for(1)
    events = msg["streams"][0]["events"]
    assert len(events) == 9 and {e["eventType"] for e in events} == {"WINDOW_CLOSE"}
    assert sorted({e["result"]["c"] for e in events}) == [85.0, 145.0, 205.0]
    assert len(b.sink("hot_out")) == 12  # WHERE shapes notifications, not the sink


@pytest.mark.usefixtures("on_both_storages")
def test_recomputation_invalidates_a_reported_window_once(tmp_path, spark, recorder):
    b = _bench(
        tmp_path,
        spark,
        recorder,
        """CREATE STREAM late INTERVAL(1m) SLIDING(1m) FROM meters
        NOTIFY('URL') ON (WINDOW_CLOSE) INTO late_out AS SELECT _twstart, count(*) AS n FROM %%trows;""",
    )
    b.tick("late")
    _meters(b, range(0, 130, 10))
    b.tick("late")
    recorder.wait_for(1)
    _meters(b, [15])  # late row in the first window: it is recomputed
    b.tick("late")
    recorder.wait_for(2)
    _meters(b, [200])  # nothing reported changes
    b.tick("late")
    events = recorder.events()
    first = window_id(b.engine.stream("late"), 0, T0)
    assert [(e["eventType"], e["windowId"] == first, e.get("result", {}).get("n")) for e in events] == [
        ("WINDOW_CLOSE", True, 6),
        ("WINDOW_CLOSE", False, 6),
        ("WINDOW_INVALIDATION", True, None),
        ("WINDOW_CLOSE", True, 7),
        ("WINDOW_CLOSE", False, 1),
    ]
    inv = events[2]
    assert (inv["windowStart"], inv["windowEnd"], inv["windowType"]) == (ms(T0), ms(T0 + M), "Time")


def test_pause_holds_the_stream_until_the_server_is_back_and_loses_nothing(tmp_path, spark, recorder):
    b = _bench(
        tmp_path,
        spark,
        recorder,
        """CREATE STREAM p INTERVAL(1m) SLIDING(1m) FROM meters
        NOTIFY('URL') ON (WINDOW_OPEN|WINDOW_CLOSE) NOTIFY_OPTIONS(ON_FAILURE_PAUSE)
        INTO p_out AS SELECT _twstart, count(*) AS n FROM %%trows;""",
    )
    gated_tick(b, "p")
    _meters(b, range(0, 70, 10))
    gated_tick(b, "p")
    recorder.wait_for(1)
    recorder.stop()
    _meters(b, range(70, 130, 10))
    plan = gated_tick(b, "p")  # this run commits its window, but its events cannot go out
    assert len(b.sink("p_out")) == 2 and notify_outbox.pending(b.engine, b.engine.stream("p"))
    cursor = b.cursors["p"]
    _meters(b, range(130, 250, 10))
    for _ in range(2):
        reason = gated_tick(b, "p")
        assert isinstance(reason, str) and "paused: notification delivery failing" in reason and "refused" in reason
    assert b.cursors["p"] == cursor and len(b.sink("p_out")) == 2  # the stream did not advance
    recorder.start()
    plan = gated_tick(b, "p")
    assert not isinstance(plan, str) and plan.works
    recorder.wait_for(lambda msgs: sum(len(s["events"]) for m in msgs for s in m["streams"]) >= 9)
    events = recorder.events()
    keys = Counter((e["windowId"], e["eventType"]) for e in events)
    assert max(keys.values()) == 1  # none twice
    closes = sorted(e["windowStart"] for e in events if e["eventType"] == "WINDOW_CLOSE")
    assert closes == [ms(T0 + k * M) for k in range(4)]
    opens = sorted(e["windowStart"] for e in events if e["eventType"] == "WINDOW_OPEN")
    assert opens == [ms(T0 + k * M) for k in range(5)]
    assert not notify_outbox.pending(b.engine, b.engine.stream("p"))


def test_drop_loses_events_while_down_and_continues(tmp_path, spark, recorder, caplog):
    b = _bench(
        tmp_path,
        spark,
        recorder,
        """CREATE STREAM d INTERVAL(1m) SLIDING(1m) FROM meters
        NOTIFY('URL') ON (WINDOW_CLOSE) INTO d_out AS SELECT _twstart, count(*) AS n FROM %%trows;""",
    )
    b.tick("d")
    _meters(b, range(0, 70, 10))
    b.tick("d")
    recorder.wait_for(1)
    recorder.stop()
    caplog.set_level(logging.INFO, logger="cq_engine.notify.outbox")
    _meters(b, range(70, 130, 10))
    b.tick("d")  # the second window's close is dropped
    _meters(b, range(130, 190, 10))
    b.tick("d")  # and the third's
    recorder.start()
    _meters(b, range(190, 250, 10))
    b.tick("d")
    recorder.wait_for(2)
    assert [e["windowStart"] for e in recorder.events()] == [ms(T0), ms(T0 + 3 * M)]
    assert len(b.sink("d_out")) == 4 and not notify_outbox.pending(b.engine, b.engine.stream("d"))
    # Said once while the receiver is away: a warning when dropping starts, then INFO.
    said = [(r.levelname, r.getMessage().split(":")[1].strip()) for r in caplog.records if r.name.endswith("outbox")]
    assert said == [
        ("WARNING", "dropped 1 notification(s) (ON_FAILURE DROP)"),
        ("INFO", "dropped 1 more notification(s) (ON_FAILURE DROP)"),
        ("INFO", "notifications delivered again (1 sent)"),
    ], said


def test_history_is_notified_only_with_notify_history(tmp_path, spark, recorder):
    b = _bench(
        tmp_path,
        spark,
        recorder,
        """CREATE STREAM quiet INTERVAL(1m) SLIDING(1m) FROM meters
            OPTIONS(FILL_HISTORY) NOTIFY('URL') ON (WINDOW_CLOSE) INTO quiet_out AS SELECT _twstart, count(*) AS n FROM %%trows;
        CREATE STREAM loud INTERVAL(1m) SLIDING(1m) FROM meters
            OPTIONS(FILL_HISTORY) NOTIFY('URL') ON (WINDOW_CLOSE) NOTIFY_OPTIONS(NOTIFY_HISTORY)
            INTO loud_out AS SELECT _twstart, count(*) AS n FROM %%trows;""",
    )
    _meters(b, range(0, 130, 10))
    b.tick("quiet")
    b.tick("loud")
    recorder.wait_for(1)
    assert len(b.sink("quiet_out")) == len(b.sink("loud_out")) == 2
    assert {m["streams"][0]["streamName"] for m in recorder.messages} == {"loud"}
    assert len(recorder.events()) == 2


def test_old_form_notify_defaults_to_pause(tmp_path, spark, recorder):
    b = _bench(
        tmp_path,
        spark,
        recorder,
        """CREATE STREAM avg_current_stream FILL_HISTORY 1
        AS SELECT _wstart, _wend, AVG(current) FROM meters INTERVAL (1m)
        NOTIFY ('URL') ON ('WINDOW_OPEN', 'WINDOW_CLOSE') NOTIFY_HISTORY 0;""",
    )
    stream = b.engine.stream("avg_current_stream")
    assert (stream.sink, stream.notify.on_failure, stream.notify.history) == (None, "pause", False)
    b.tick("avg_current_stream")
    _meters(b, range(0, 70, 10))
    b.tick("avg_current_stream")
    closes = [e for e in recorder.wait_for(1) and recorder.events() if e["eventType"] == "WINDOW_CLOSE"]
    assert closes[0]["result"] == {"_wstart": ms(T0), "_wend": ms(T0 + M), "avg_current": 25.0}


def test_cq_listen_prints_each_message(tmp_path):
    import json
    import subprocess
    import sys
    import time

    from netutil import free_port

    from cq_engine.notify.ws import NotifyError, dumps, message, send

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cq_engine.cli.main", "listen", "--port", str(port), "--count", "1"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert proc.stdout.readline().startswith(f"listening on ws://127.0.0.1:{port}/")
        event = {"windowId": "w1", "eventType": "WINDOW_CLOSE", "result": {"n": 3}}
        sent = message({"s": [event]}, now_ms=5)
        deadline = time.monotonic() + 30
        while True:
            try:
                send(f"ws://127.0.0.1:{port}/notify", [dumps(sent)], timeout=10)
                break
            except NotifyError:
                # On a loaded machine the listener may take the message and exit (--count 1)
                # before our close handshake ends: then the message is in its output, and
                # sending again would only find the port closed.
                if proc.poll() is not None:
                    break
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert json.loads(proc.stdout.readline()) == sent
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()


def test_stream_without_query_notifies_its_trigger_windows(tmp_path, spark, recorder):
    b = _bench(
        tmp_path,
        spark,
        recorder,
        """CREATE STREAM bare SESSION(ts, 15s) FROM meters PARTITION BY tbname
        NOTIFY('URL') ON (WINDOW_OPEN|WINDOW_CLOSE);""",
    )
    b.tick("bare")
    _meters(b, [0, 10, 20, 60, 70])
    b.tick("bare")  # [0, 20] closes (60 is more than 15 s later), [60, 70] stays open
    recorder.wait_for(1)
    assert [(e["eventType"], e["windowStart"], e.get("windowEnd"), e.get("result")) for e in recorder.events()] == [
        ("WINDOW_OPEN", ms(T0), None, None),
        ("WINDOW_CLOSE", ms(T0), ms(T0 + 35 * M / 60), {}),
        ("WINDOW_OPEN", ms(T0 + M), None, None),
    ]
