"""The shared stream sensor's pure bookkeeping (cq_engine.streams.rounds): run states, where works
go, fairness, run keys, the ledger identity of a work and the journal of a lost cursor."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from cq_engine.errors import CQError
from cq_engine.storage.ledger import LedgerEntry
from cq_engine.streams import rounds as r
from cq_engine.streams.timing import StreamWork

T = datetime(2026, 1, 1, tzinfo=UTC)
LIVE = StreamWork(version=3, windows=((T, T + timedelta(seconds=10)),), tick=T)
HISTORY = StreamWork(version=3, kind="history", windows=((T, T + timedelta(seconds=10)),))


def test_cursor_round_trips_and_rejects_other_versions():
    cursor = r.Cursor(seq=4, streams={"a": r.StreamState(cursor="{}", backlog=[LIVE.to_json()], key="k", since=1.5)})
    again = r.load_cursor(cursor.to_json())
    assert again.seq == 4 and again.streams["a"] == cursor.streams["a"]
    assert r.load_cursor(None).streams == {}
    with pytest.raises(CQError, match="cursor version 9 is not 1"):
        r.load_cursor('{"v": 9}')
    with pytest.raises(CQError, match="not JSON"):
        r.load_cursor("{")


def test_settle_holds_in_flight_clears_success_and_retries_failures_once_spark_answers():
    s = r.StreamState(backlog=["w"], key="k", since=100.0)
    assert r.settle(s, now=101, status="STARTED", failed=None, name="a") == "held"
    assert r.settle(s, now=101, status=None, failed=None, name="a") == "held"  # requested, not created yet
    assert r.settle(s, now=101, status="SUCCESS", failed=None, name="a") == "free"
    assert (s.key, s.backlog, s.attempt) == (None, [], 0)
    # Failed in a run whose cq/failed tag names another stream: its works committed.
    s = r.StreamState(backlog=["w"], key="k", since=100.0)
    assert r.settle(s, now=101, status="FAILURE", failed={"b"}, name="a") == "free" and s.backlog == []
    # Handed back by a run that succeeded (cq/left_out names it): a retry, not done.
    s = r.StreamState(backlog=["w"], key="k", since=100.0)
    assert r.settle(s, now=101, status="SUCCESS", failed={"a"}, name="a") == "retry" and s.backlog == ["w"]
    # Failed itself: held while Spark does not answer, retried the moment it does; a second failure
    # waits 5 s, a third 10 s.
    s = r.StreamState(backlog=["w"], key="k", since=100.0)
    assert r.settle(s, now=130, status="FAILURE", failed={"a"}, name="a", ready=False) == "held"
    assert r.settle(s, now=130, status="FAILURE", failed={"a"}, name="a") == "retry"
    assert (s.key, s.backlog, s.attempt) == (None, ["w"], 1)
    s.key, s.since = "k2", 200.0
    assert r.settle(s, now=203, status="FAILURE", failed=None, name="a") == "held"  # 5 s now
    assert r.settle(s, now=206, status="FAILURE", failed=None, name="a") == "retry" and s.attempt == 2
    s.key, s.since = "k3", 300.0
    assert r.settle(s, now=306, status="FAILURE", failed=None, name="a") == "held"  # 10 s then
    # A run that never appeared is requested again after LOST_AFTER.
    s = r.StreamState(backlog=["w"], key="k", since=0.0)
    assert r.settle(s, now=r.LOST_AFTER_SECONDS + 1, status=None, failed=None, name="a") == "retry"


def test_live_works_go_to_the_sensor_history_retries_and_no_server_to_the_run():
    assert r.destination(r.StreamState(), [LIVE], inline=True) == r.SENSOR
    assert r.destination(r.StreamState(), [LIVE], inline=False) == r.RUN
    assert r.destination(r.StreamState(), [LIVE, HISTORY], inline=True) == r.RUN
    assert r.destination(r.StreamState(attempt=1), [LIVE], inline=True) == r.RUN


def test_least_recently_served_streams_go_first_and_run_keys_are_stable():
    states = {"a": r.StreamState(served=30.0), "b": r.StreamState(served=10.0), "c": r.StreamState()}
    assert r.service_order(states, ["a", "b", "c"]) == ["c", "b", "a"]
    works = {"a": [LIVE.to_json()], "b": [HISTORY.to_json()]}
    assert r.run_key(works, 0) == r.run_key(dict(reversed(works.items())), 0) != r.run_key(works, 1)


def test_a_work_in_the_ledger_is_recognised_as_done(tmp_path):
    from cq_engine.catalog import load_catalog

    (tmp_path / "s.sql").write_text(
        "CREATE TABLE meters (ts TIMESTAMP, current DOUBLE) TAGS (location STRING);\n"
        "CREATE STREAM s INTERVAL(10s) SLIDING(10s) FROM meters INTO s_out AS SELECT _twstart, count(*) AS n FROM %%trows;"
    )
    stream = load_catalog(str(tmp_path)).definition("s")
    kind, _, lo, hi, version = r.work_identity(stream, LIVE, "UTC")
    entry = LedgerEntry(
        definition="s",
        kind=kind,
        fire_time=LIVE.tick,
        range_start=lo,
        range_end=hi,
        source_versions={"meters": version},
        rows_written=1,
        sink_version=1,
        status="succeeded",
        started_at=T,
        finished_at=T,
    )
    assert r.work_identity(stream, LIVE, "UTC") in r.done_works([entry], stream)
    later = StreamWork(version=4, windows=LIVE.windows, tick=T)
    assert r.work_identity(stream, later, "UTC") not in r.done_works([entry], stream)
    # Planned again later from a lost cursor: the same windows over the same commit are done.
    again = StreamWork(version=LIVE.version, windows=LIVE.windows, tick=LIVE.tick + timedelta(seconds=30))
    assert r.work_identity(stream, again, "UTC") in r.done_works([entry], stream)
    # A recalculation is its own: asked for again (a new tick), it runs again.
    recalc = StreamWork(version=LIVE.version, kind="recalculate", windows=LIVE.windows, tick=LIVE.tick)
    redo = LedgerEntry(**{**entry.__dict__, "kind": "recalculate"})
    assert r.work_identity(stream, recalc, "UTC") in r.done_works([redo], stream)
    assert r.work_identity(stream, replace(recalc, tick=T + timedelta(minutes=1)), "UTC") not in r.done_works(
        [redo], stream
    )
    failed = LedgerEntry(**{**entry.__dict__, "status": "failed"})
    assert r.done_works([failed], stream) == set()


def test_the_journal_is_adopted_only_by_the_cursor_it_was_derived_from(tmp_path):
    path = r.journal_path(tmp_path, "cq_streams", "loc")
    saved = r.Cursor(seq=7, streams={"a": r.StreamState(cursor="c7")})
    assert r.adopt(path, saved) is None  # no journal yet
    r.write_journal(path, r.Journal(base=7, cursor=r.Cursor(seq=8).to_json(), events=[["a", {"cq/kind": "realtime"}]]))
    lost = r.adopt(path, saved)  # the daemon returned seq 7 again: evaluation 8's cursor was lost
    assert lost is not None and r.load_cursor(lost.cursor).seq == 8 and lost.events == [["a", {"cq/kind": "realtime"}]]
    assert r.adopt(path, r.Cursor(seq=8, streams={"a": r.StreamState()})) is None  # saved: nothing to adopt
    assert r.adopt(path, r.Cursor()) is None  # a reset cursor never takes an old journal
    # The evaluation that adopted it (from 8) lost its cursor too: Dagster still returns seq 7, and
    # the newest journal (based on 8) is the one to take, else evaluation 8's windows run again.
    r.write_journal(path, r.Journal(base=8, cursor=r.Cursor(seq=9).to_json(), events=[["a", {}], ["b", {}]]))
    again = r.adopt(path, saved)
    assert again is not None and r.load_cursor(again.cursor).seq == 9 and len(again.events) == 2
    assert r.adopt(path, r.Cursor(seq=9, streams={"a": r.StreamState()})) is None


def test_streams_an_unfinished_evaluation_was_computing_go_to_runs(tmp_path):
    path = r.journal_path(tmp_path, "cq_streams", "loc")
    cursor = r.Cursor(seq=3, streams={"a": r.StreamState(cursor="c")})
    assert r.unfinished(path, cursor) == []
    r.mark_inflight(path, base=3, streams=["b", "a"])
    assert r.unfinished(path, cursor) == ["a", "b"]  # that evaluation never returned
    assert r.unfinished(path, r.Cursor(seq=4)) == []  # a later cursor: it did
    r.clear_inflight(path)
    assert r.unfinished(path, cursor) == []


def test_a_call_holds_as_many_works_as_its_fitted_cost_allows():
    cost = r.CallCost()
    assert cost.fitting(20, most=50) == 1  # the first call of a process pays the session's warm-up
    cost.observe(1, 4.0)
    assert cost.estimate() == (2.0, 2.0)  # one size seen: half of it taken as fixed
    assert cost.fitting(20, most=50) == 9
    cost.observe(9, 5.0)  # nine streams fused cost about one
    fixed, each = cost.estimate()
    assert (round(fixed, 3), round(each, 3)) == (3.875, 0.125)
    assert cost.fitting(20, most=50) == 50 and cost.fitting(4.0, most=50) == 1
    linear = r.CallCost()  # works that share nothing: the fit finds no fixed part
    linear.observe(1, 2.0)
    linear.observe(4, 8.0)
    assert linear.estimate() == (0.0, 2.0) and linear.fitting(20, most=50) == 10
    noisy = r.CallCost()  # a larger call that happened to be faster: the slope has a floor
    noisy.observe(2, 6.0)
    noisy.observe(8, 5.0)
    assert noisy.estimate()[1] == pytest.approx(0.0625) and noisy.fitting(20, most=50) == 50
    for _ in range(r.CallCost.KEEP):  # only recent calls count: a slower machine is seen at once
        noisy.observe(1, 30.0)
    assert noisy.fitting(20, most=50) == 1


def test_under_load_calls_grow_to_every_stream_instead_of_one_each():
    """A machine where a call costs 12 s plus 0.5 s per stream, ten streams, 20 s per evaluation:
    fitted, the third call holds all ten (the cost per work of one-stream calls held them at one)."""
    cost, sizes = r.CallCost(), []
    for _ in range(4):
        size = cost.fitting(20, most=10)
        sizes.append(size)
        cost.observe(size, 12 + 0.5 * size)
    assert sizes == [1, 2, 10, 10]
