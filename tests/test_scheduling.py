"""The batch sensor's planner (``cq_engine.scheduling.batch``), without Dagster: BLOCKED and DISCARD,
leads and horizons, retries after a failed run, runs adopted from a cursor the orchestrator did not
store. Plain definitions, ticks, run statuses and ``now`` in; firings to request and the next cursor out."""

from datetime import UTC, datetime, timedelta

import pytest

from cq_engine.catalog import load_catalog, parse_options
from cq_engine.config import Settings
from cq_engine.errors import CQError
from cq_engine.schedule.ticks import ticks_of
from cq_engine.scheduling.batch import RequestedRun, adopt_runs, cursor_time, dump_cursor, load_cursor, plan_batch
from cq_engine.times import iso

T0 = datetime(2021, 5, 11, 14, 30, tzinfo=UTC)


SQL = """
CREATE TABLE IF NOT EXISTS ln (time TIMESTAMP, device STRING, temperature DOUBLE);
CREATE TABLE IF NOT EXISTS never_written (time TIMESTAMP, device STRING, temperature DOUBLE);
CREATE CQ b RESAMPLE EVERY 20s BEGIN SELECT max_value(temperature) AS m INTO b_out FROM ln GROUP BY (10s), device END;
CREATE CQ d RESAMPLE EVERY 20s TIMEOUT POLICY DISCARD BEGIN
  SELECT max_value(temperature) AS m INTO d_out FROM ln GROUP BY (10s), device END;
CREATE CQ broken_src RESAMPLE EVERY 20s BEGIN
  SELECT max_value(temperature) AS m INTO x_out FROM never_written GROUP BY (10s), device END;
"""


def make_project(root):
    """Settings and the loaded catalog of ``SQL`` under ``root``."""
    (root / "sql").mkdir()
    (root / "sql" / "cq.sql").write_text(SQL)
    settings = Settings(sql_dir=str(root / "sql"), warehouse=str(root / "wh"), home=str(root / ".cq"))
    catalog = load_catalog(settings.sql_dir, options=parse_options(settings))
    assert not catalog.errors, catalog.errors
    return settings, catalog


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_project(tmp_path_factory.mktemp("scheduling"))


def _plan(
    catalog,
    *,
    cursor=None,
    now=T0,
    status=None,
    busy=(),
    paused=(),
    names=("b", "d"),
    failed=None,
    finished=frozenset(),
    prev_done=frozenset(),
    lead=None,
    check_every=timedelta(0),
    horizon=None,
    horizon_lead=None,
    caught_up=frozenset(),
    ready=True,
):
    defs = [catalog.definition(n) for n in names]
    ticks = {d.name: ticks_of(d, timezone="UTC") for d in defs}
    return plan_batch(
        defs,
        ticks=ticks,
        cursor=cursor,
        now=now,
        run_status=status or {},
        busy=set(busy),
        paused=set(paused),
        failed=failed,
        finished=frozenset(finished),
        prev_done=frozenset(prev_done),
        lead=lead,
        check_every=check_every,
        horizon=horizon,
        horizon_lead=horizon_lead,
        caught_up=frozenset(caught_up),
        ready=ready,
    )


def _s(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


# -- the planner ------------------------------------------------------------------------------------
def test_first_evaluation_requests_only_the_latest_firing_and_repeats_are_the_same_run(project):
    _, catalog = project
    first = _plan(catalog, now=_s(5))
    assert first.firings == {"b": [T0], "d": [T0]}
    again = _plan(catalog, now=_s(5))
    assert again.run_key == first.run_key and again.cursor == first.cursor  # a repeated evaluation: same key
    state = load_cursor(first.cursor)
    assert state["b"].key == first.run_key and state["b"].first == state["b"].upto == T0.isoformat()


def test_a_firing_due_within_its_lead_is_requested_early(project, monkeypatch):
    from cq_engine.scheduling import batch_lead

    _, catalog = project
    first = _plan(catalog, now=_s(5))
    lead = {"b": timedelta(seconds=10)}
    # At 12 s, b's firing at 20 s is within its 10 s lead: requested now (the run waits for it).
    early = _plan(catalog, cursor=first.cursor, now=_s(12), status={first.run_key: "SUCCESS"}, lead=lead)
    assert early.firings == {"b": [_s(20)]}
    # At 9 s it is not yet.
    assert _plan(catalog, cursor=first.cursor, now=_s(9), status={first.run_key: "SUCCESS"}, lead=lead).firings == {}
    # A first evaluation: the latest firing due now, then those within the lead (none skipped).
    assert _plan(catalog, now=_s(15), lead=lead).firings["b"] == [T0, _s(20)]
    # The lead: CQ_BATCH_LEAD (default 25 s); a bad value is a clear error.
    # BLOCKED: up to its period less 5 s (a run following one still going waits for its commit);
    # DISCARD: half its period (it decides to skip a firing when it requests the next one).
    assert batch_lead(timedelta(seconds=30)) == timedelta(seconds=25)
    assert batch_lead(timedelta(seconds=30), "DISCARD") == timedelta(seconds=15)
    assert batch_lead(timedelta(seconds=5)) == batch_lead(timedelta(seconds=5), "DISCARD") == timedelta(seconds=2.5)
    assert batch_lead(timedelta(minutes=5)) == timedelta(seconds=25)
    monkeypatch.setenv("CQ_BATCH_LEAD", "0")
    assert batch_lead(timedelta(minutes=5)) == timedelta(0)
    monkeypatch.setenv("CQ_BATCH_LEAD", "soon")
    with pytest.raises(CQError, match="CQ_BATCH_LEAD='soon'"):
        batch_lead(timedelta(minutes=5))


def test_blocked_holds_while_its_run_is_in_flight_then_runs_every_firing_in_order(project):
    _, catalog = project
    first = _plan(catalog, now=_s(5))
    key = first.run_key
    # 65 s later the run is still going: b holds its 3 due firings, d (DISCARD) skips them.
    held = _plan(catalog, cursor=first.cursor, now=_s(65), status={key: "STARTED"})
    assert held.firings == {}
    assert any("BLOCKED holds 3" in s for s in held.skipped) and any("DISCARD skipped 3" in s for s in held.skipped)
    assert load_cursor(held.cursor)["d"].upto == _s(60).isoformat()
    # Not yet created by the daemon counts as in flight too.
    assert _plan(catalog, cursor=first.cursor, now=_s(65)).firings == {}
    # Done: b gets all its firings since, in order; d only those due after what it skipped.
    done = _plan(catalog, cursor=held.cursor, now=_s(85), status={key: "SUCCESS"})
    assert done.firings == {"b": [_s(20), _s(40), _s(60), _s(80)], "d": [_s(80)]}
    assert done.run_key != key


def test_another_run_of_the_definition_in_flight_holds_it(project):
    _, catalog = project
    first = _plan(catalog, now=_s(5))
    later = _plan(catalog, cursor=first.cursor, now=_s(25), status={first.run_key: "SUCCESS"}, busy={"b"})
    assert later.firings == {"d": [_s(20)]}
    resumed = _plan(catalog, cursor=later.cursor, now=_s(45), status={later.run_key: "SUCCESS"})
    assert resumed.firings == {"b": [_s(20), _s(40)], "d": [_s(40)]}


def test_a_failed_run_retries_its_definitions_from_their_first_firing_once_spark_answers(project):
    _, catalog = project
    first = _plan(catalog, now=_s(5))
    both = _plan(catalog, cursor=first.cursor, now=_s(25), status={first.run_key: "SUCCESS"})
    assert both.firings == {"b": [_s(20)], "d": [_s(20)]}
    failed = {both.run_key: "FAILURE"}
    # Held while its Connect server is starting again, retried the moment it answers (no back-off).
    assert _plan(catalog, cursor=both.cursor, now=_s(45), status=failed, ready=False).firings == {}
    retry = _plan(catalog, cursor=both.cursor, now=_s(45), status=failed)
    # BLOCKED: the failed firing again, then what is due since; DISCARD: the latest only.
    assert retry.firings == {"b": [_s(20), _s(40)], "d": [_s(40)]} and retry.attempt == 1
    assert load_cursor(retry.cursor)["b"].attempt == 1
    # A second failure waits 5 s: a definition that fails on its own is not retried in a loop.
    again = {retry.run_key: "FAILURE"}
    assert _plan(catalog, cursor=retry.cursor, now=_s(46), status=again).firings == {}
    assert _plan(catalog, cursor=retry.cursor, now=_s(51), status=again).attempt == 2
    ok = _plan(catalog, cursor=retry.cursor, now=_s(65), status={retry.run_key: "SUCCESS"})
    assert ok.firings == {"b": [_s(60)], "d": [_s(60)]} and ok.attempt == 0


def test_a_definitions_completeness_check_is_evaluated_every_check_every_and_by_every_retry(project):
    _, catalog = project
    every = timedelta(seconds=60)
    first = _plan(catalog, now=_s(5), check_every=every)
    assert first.checks == {"b", "d"}  # never evaluated: the first run does
    second = _plan(catalog, cursor=first.cursor, now=_s(25), status={first.run_key: "SUCCESS"}, check_every=every)
    assert second.firings == {"b": [_s(20)], "d": [_s(20)]} and second.checks == frozenset()
    # b's run fails: its retry evaluates the check (the failure shows at once), d's next run does not.
    failed = {second.run_key: "FAILURE"}
    retry = _plan(
        catalog, cursor=second.cursor, now=_s(45), status=failed, failed={second.run_key: {"b"}}, check_every=every
    )
    assert retry.firings == {"b": [_s(20), _s(40)], "d": [_s(40)]}
    assert retry.checks == {"b"}
    # A minute after its last evaluation, the next run evaluates it again (b's was its retry's, at 45 s).
    later = _plan(catalog, cursor=retry.cursor, now=_s(65), status={retry.run_key: "SUCCESS"}, check_every=every)
    assert later.checks == {"d"}
    # 0 s: every run.
    assert _plan(catalog, cursor=first.cursor, now=_s(25), status={first.run_key: "SUCCESS"}).checks == {"b", "d"}


def test_a_stopped_switch_leaves_the_definition_out(project):
    _, catalog = project
    first = _plan(catalog, now=_s(5), paused={"b"})
    assert first.firings == {"d": [T0]}
    # Started again: it continues from where it was (first evaluation: the latest only).
    assert _plan(catalog, cursor=first.cursor, now=_s(25), status={first.run_key: "SUCCESS"}).firings == {
        "b": [_s(20)],
        "d": [_s(20)],
    }


def test_a_long_outage_is_caught_up_in_bounded_batches(project):
    _, catalog = project
    first = _plan(catalog, now=_s(5), names=("b",))
    later = _plan(catalog, cursor=first.cursor, now=_s(5 + 20 * 150), status={first.run_key: "SUCCESS"}, names=("b",))
    assert len(later.firings["b"]) == 100 and later.firings["b"][0] == _s(20)
    rest = _plan(catalog, cursor=later.cursor, now=_s(5 + 20 * 150), status={later.run_key: "SUCCESS"}, names=("b",))
    assert rest.firings["b"][0] == _s(20 * 101) and rest.firings["b"][-1] == _s(20 * 150)


def test_a_full_batch_leaves_out_what_was_requested_last_not_the_same_definitions(project, monkeypatch):
    monkeypatch.setattr("cq_engine.scheduling.batch.MAX_FIRINGS_PER_RUN", 1)
    _, catalog = project
    first = _plan(catalog, now=_s(5))
    assert first.firings == {"b": [T0]}  # full: d waits
    second = _plan(catalog, cursor=first.cursor, now=_s(25), status={first.run_key: "SUCCESS"})
    assert second.firings == {"d": [_s(20)]}  # never requested: first now, though b is due again
    done = {first.run_key: "SUCCESS", second.run_key: "SUCCESS"}
    third = _plan(catalog, cursor=second.cursor, now=_s(26), status=done)
    assert third.firings == {"b": [_s(20)]}


def test_a_runs_size_counts_the_firings_due_now_not_those_requested_early(project, monkeypatch):
    """A firing within the lead runs a period later, in a round of its own: counted toward
    MAX_FIRINGS_PER_RUN it cut a cold start of a thousand definitions (each its firing due now and
    the next within the lead) into runs of 500, which queued for the two slots and never merged."""
    monkeypatch.setattr("cq_engine.scheduling.batch.MAX_FIRINGS_PER_RUN", 2)
    _, catalog = project
    first = _plan(catalog, now=_s(5), lead={"b": timedelta(seconds=18)})
    assert first.firings == {"b": [T0, _s(20)], "d": [T0]}
    # Firings due now do count, each: d (requested longest ago, first) and b's two (40 and 60 s)
    # are more than two, so b waits for the next batch.
    behind = _plan(catalog, cursor=first.cursor, now=_s(65), status={first.run_key: "SUCCESS"})
    assert behind.firings == {"d": [_s(60)]}


def test_a_failed_run_retries_only_the_definitions_that_failed_in_it(project):
    _, catalog = project
    first = _plan(catalog, now=_s(5))
    both = _plan(catalog, cursor=first.cursor, now=_s(25), status={first.run_key: "SUCCESS"})
    retry = _plan(
        catalog, cursor=both.cursor, now=_s(45), status={both.run_key: "FAILURE"}, failed={both.run_key: {"b"}}
    )
    assert retry.firings == {"b": [_s(20), _s(40)], "d": [_s(40)]}
    assert load_cursor(retry.cursor)["d"].attempt == 0 and load_cursor(retry.cursor)["b"].attempt == 1


def test_a_definition_done_inside_a_still_running_batch_goes_on_without_waiting_for_it(project):
    _, catalog = project
    first = _plan(catalog, now=_s(5))
    later = _plan(catalog, cursor=first.cursor, now=_s(25), status={first.run_key: "STARTED"}, finished={"b"})
    assert later.firings == {"b": [_s(20)]}  # d (DISCARD) is still in that run: skipped


# -- pipelining: the next firing requested while the run of the previous one is still going --------
LEAD = {"b": timedelta(seconds=10), "d": timedelta(seconds=10)}


def test_a_definition_keeping_up_is_requested_again_while_its_run_goes_on_and_waits_for_its_commit(project):
    _, catalog = project
    first = _plan(catalog, now=_s(5), lead=LEAD)
    k1 = first.run_key
    # 12 s: b's firing at 20 s is within its lead and its run has started: requested now, after k1's
    # firing ending at 0 s. d (DISCARD) is never pipelined: it skips while its run goes on.
    second = _plan(catalog, cursor=first.cursor, now=_s(12), status={k1: "STARTED"}, lead=LEAD)
    assert second.firings == {"b": [_s(20)]} and second.after == {"b": [k1, iso(T0)]}
    b = load_cursor(second.cursor)["b"]
    assert (b.key, b.first, b.prev, b.prev_first, b.prev_end) == (
        second.run_key,
        iso(_s(20)),
        k1,
        iso(T0),
        iso(T0),
    )
    # A queued run is not followed (it could start after its follower); nor is a definition whose run
    # is behind (more than its next firing due: BLOCKED holds it, as ever).
    assert _plan(catalog, cursor=first.cursor, now=_s(12), status={k1: "QUEUED"}, lead=LEAD).firings == {}
    assert _plan(catalog, cursor=first.cursor, now=_s(35), status={k1: "STARTED"}, lead=LEAD).firings == {}
    # At most two runs: with both still going, b's firing at 40 s waits.
    k2 = second.run_key
    held = _plan(catalog, cursor=second.cursor, now=_s(32), status={k1: "STARTED", k2: "STARTED"}, lead=LEAD)
    assert "b" not in held.firings and any("b: BLOCKED holds 1" in line for line in held.skipped)
    # k1 committed b (its sink's latest materialization): k2 is b's only run and may be followed in turn.
    third = _plan(
        catalog, cursor=second.cursor, now=_s(32), status={k1: "STARTED", k2: "STARTED"}, prev_done={"b"}, lead=LEAD
    )
    assert third.firings["b"] == [_s(40)] and third.after == {"b": [k2, iso(_s(20))]}
    assert load_cursor(third.cursor)["b"].prev == k2
    # Both ended well: b goes on as usual, with no run before its own.
    done = _plan(catalog, cursor=second.cursor, now=_s(32), status={k1: "SUCCESS", k2: "SUCCESS"}, lead=LEAD)
    assert done.firings["b"] == [_s(40)] and done.after == {}
    assert load_cursor(done.cursor)["b"].prev is None


def test_under_a_horizon_a_run_holds_its_window_and_the_next_window_follows_it(project, monkeypatch):
    from cq_engine.scheduling import batch_horizon, batch_lead

    _, catalog = project
    lead, early = {"b": timedelta(seconds=10)}, {"b": timedelta(seconds=30)}
    horizon = {"b": timedelta(seconds=60), "d": timedelta(seconds=60)}

    def plan(**kw):
        return _plan(catalog, lead=lead, horizon=horizon, horizon_lead=early, **kw)

    # A first run is no horizon's: what is due within the lead, as ever.
    first = plan(now=_s(5))
    k1 = first.run_key
    assert first.firings == {"b": [T0], "d": [T0]}
    # Followed (12 s: k1 has started, b's next firing is within the horizon lead): every firing of
    # the aligned minute it falls in. d (DISCARD) is never followed.
    second = plan(cursor=first.cursor, now=_s(12), status={k1: "STARTED"})
    k2 = second.run_key
    assert second.firings == {"b": [_s(20), _s(40)]} and second.after == {"b": [k1, iso(T0)]}
    # 32 s: the next minute is within the horizon lead; k2 runs b's firings at 20 and 40 s. Followed
    # only once k2 has committed all of them but the last (caught up): the next minute waits for it.
    held = plan(cursor=second.cursor, now=_s(32), status={k1: "SUCCESS", k2: "STARTED"})
    assert "b" not in held.firings and held.unready == {"b"}  # the sensor then plans with the usual lead
    nxt = plan(cursor=second.cursor, now=_s(32), status={k1: "SUCCESS", k2: "STARTED"}, caught_up={"b"})
    assert nxt.firings["b"] == [_s(60), _s(80), _s(100)] and nxt.after == {"b": [k2, iso(_s(40))]}
    assert nxt.unready == frozenset()
    # A queued run is not followed.
    assert "b" not in plan(cursor=second.cursor, now=_s(32), status={k2: "QUEUED"}, caught_up={"b"}).firings
    # Behind by a window: BLOCKED holds it, as ever.
    late = plan(cursor=second.cursor, now=_s(125), status={k2: "STARTED"}, caught_up={"b"})
    assert "b" not in late.firings and late.unready == frozenset()
    # Once k2 is done, everything since, in order, within the lead: a catch-up is no horizon's.
    done = plan(cursor=second.cursor, now=_s(125), status={k1: "SUCCESS", k2: "SUCCESS"})
    assert done.firings["b"] == [_s(60), _s(80), _s(100), _s(120)]
    # CQ_BATCH_HORIZON (default 120 s, at most 600): none for DISCARD or a period over half of it.
    assert batch_horizon(timedelta(seconds=30)) == timedelta(seconds=120)
    assert batch_horizon(timedelta(seconds=30), "DISCARD") == timedelta(0)
    assert batch_horizon(timedelta(seconds=61)) == timedelta(0)
    # Under a horizon a window's batch may be asked for up to half the window (at most 60 s) early.
    assert batch_lead(timedelta(seconds=30), horizon=timedelta(seconds=120)) == timedelta(seconds=60)
    assert batch_lead(timedelta(seconds=10), horizon=timedelta(seconds=60)) == timedelta(seconds=30)
    monkeypatch.setenv("CQ_BATCH_HORIZON", "0")
    assert batch_horizon(timedelta(seconds=30)) == timedelta(0)
    monkeypatch.setenv("CQ_BATCH_HORIZON", "3600")
    assert batch_horizon(timedelta(seconds=30)) == timedelta(seconds=600)


def test_a_run_behind_by_less_than_a_window_is_followed_into_the_window_its_horizon_lead_reaches(project):
    """A catch-up run (not a window's) that has done all but its last firing is followed, even a
    period or two behind, with everything up to the end of the window the horizon lead reaches: its
    successor starts during its last round. Caught up run after run instead (each start a gap), a
    thousand definitions three periods late stayed three periods late."""
    _, catalog = project
    horizon, early = {"b": timedelta(seconds=60)}, {"b": timedelta(seconds=30)}
    first = _plan(catalog, now=_s(5), names=("b",), lead={"b": timedelta(seconds=18)})
    assert first.firings == {"b": [T0, _s(20)]}
    k1 = first.run_key

    def plan(**kw):
        return _plan(
            catalog,
            cursor=first.cursor,
            status={k1: "STARTED"},
            names=("b",),
            lead={"b": timedelta(seconds=10)},
            horizon=horizon,
            horizon_lead=early,
            **kw,
        )

    # 32 s: the horizon lead reaches the next minute; b's next firing (40 s) is in this one.
    nxt = plan(now=_s(32), caught_up={"b"})
    assert nxt.firings == {"b": [_s(40), _s(60), _s(80), _s(100)]} and nxt.after == {"b": [k1, iso(_s(20))]}
    # Not yet caught up: the sensor waits (and plans with the usual lead meanwhile).
    assert plan(now=_s(32)).unready == {"b"}
    # Two periods behind (40 and 60 s within the usual lead): still followed.
    assert plan(now=_s(52), caught_up={"b"}).firings == {"b": [_s(40), _s(60), _s(80), _s(100)]}
    # More than a window behind (40-100 s): BLOCKED holds it until its run ends.
    late = plan(now=_s(95), caught_up={"b"})
    assert late.firings == {} and late.unready == frozenset()


def test_a_definition_whose_run_failed_while_it_was_stopped_is_retried_when_it_is_started(project):
    _, catalog = project
    first = _plan(catalog, now=_s(5))
    k1 = first.run_key
    second = _plan(catalog, cursor=first.cursor, now=_s(25), status={k1: "SUCCESS"})
    k2 = second.run_key
    assert second.firings["b"] == [_s(20)]
    # k2 left b out (its switch was stopped mid-run: tag cq/left_out, read as failed) and b is stopped.
    stopped = _plan(catalog, cursor=second.cursor, now=_s(70), status={k2: "SUCCESS"}, failed={k2: {"b"}}, paused={"b"})
    assert "b" not in stopped.firings
    # Started again: its firings from k2's first are requested again (the run skips what the ledger
    # holds), then what came due meanwhile.
    again = _plan(catalog, cursor=stopped.cursor, now=_s(85))
    assert again.firings["b"] == [_s(20), _s(40), _s(60), _s(80)] and again.attempt == 1


def test_a_definition_a_running_run_left_out_is_requested_again_without_waiting_for_that_run(project):
    """A batch under a horizon runs for minutes; a definition it left out (its switch stopped, its
    Spark server gone) is no longer in it: the run tags it at once (cq/left_out), and the sensor
    requests its firings again as soon as it may run, while that run goes on with the others."""
    _, catalog = project
    horizon, early = {"b": timedelta(seconds=60)}, {"b": timedelta(seconds=30)}
    first = _plan(catalog, now=_s(5), names=("b",))
    k1 = first.run_key
    kw = {"names": ("b",), "lead": {"b": timedelta(seconds=10)}, "horizon": horizon, "horizon_lead": early}
    second = _plan(catalog, cursor=first.cursor, now=_s(12), status={k1: "STARTED"}, **kw)
    k2 = second.run_key
    assert second.firings == {"b": [_s(20), _s(40)]}
    # b stopped; k2, still running, left it out: nothing while it is stopped.
    left = {k2: {"b"}}
    status = {k1: "SUCCESS", k2: "STARTED"}
    stopped = _plan(catalog, cursor=second.cursor, now=_s(32), status=status, failed=left, paused={"b"}, **kw)
    assert stopped.firings == {}
    # Started again while k2 still runs: its firings from k2's first are requested now, not followed
    # after k2 (which will never commit them).
    again = _plan(catalog, cursor=stopped.cursor, now=_s(45), status=status, failed=left, caught_up={"b"}, **kw)
    assert again.firings == {"b": [_s(20), _s(40)]} and again.after == {} and again.attempt == 1


def test_a_follower_of_a_run_that_left_its_definition_out_is_not_followed_in_turn(project):
    """Before the left-out tag is known the sensor may follow the run (k3 after k2). Once k2 has left
    b out, k3 will too: b is retried from k2's first firing when k3 lets it go, and k3 is never
    followed into the next window (which skipped k2's firings for good: a stopped and started query
    under `cq dev` fired nothing again)."""
    _, catalog = project
    horizon, early = {"b": timedelta(seconds=60)}, {"b": timedelta(seconds=30)}
    kw = {"names": ("b",), "lead": {"b": timedelta(seconds=10)}, "horizon": horizon, "horizon_lead": early}
    first = _plan(catalog, now=_s(5), names=("b",))
    k1 = first.run_key
    second = _plan(catalog, cursor=first.cursor, now=_s(12), status={k1: "STARTED"}, **kw)
    k2 = second.run_key
    third = _plan(
        catalog, cursor=second.cursor, now=_s(32), status={k1: "SUCCESS", k2: "STARTED"}, caught_up={"b"}, **kw
    )
    k3 = third.run_key
    assert third.firings == {"b": [_s(60), _s(80), _s(100)]} and third.after == {"b": [k2, iso(_s(40))]}
    # k2 ended having left b out; k3 runs (for others) and its rounds are caught up.
    status = {k2: "SUCCESS", k3: "STARTED"}
    held = _plan(catalog, cursor=third.cursor, now=_s(92), status=status, failed={k2: {"b"}}, caught_up={"b"}, **kw)
    assert held.firings == {} and held.unready == frozenset()
    state = load_cursor(held.cursor)["b"]
    assert (state.key, state.first, state.redo) == (k3, iso(_s(20)), True)
    # k3 left b out too (its tag): everything from k2's first, in order, as a retry.
    failed = {k2: {"b"}, k3: {"b"}}
    retry = _plan(catalog, cursor=held.cursor, now=_s(95), status=status, failed=failed, caught_up={"b"}, **kw)
    assert (
        retry.firings == {"b": [_s(20), _s(40), _s(60), _s(80), _s(100)]} and retry.after == {} and retry.attempt == 1
    )
    assert not load_cursor(retry.cursor)["b"].redo


def test_a_pipelined_definition_whose_first_run_failed_is_retried_from_that_runs_firing(project):
    _, catalog = project
    first = _plan(catalog, now=_s(5), lead=LEAD)
    k1 = first.run_key
    second = _plan(catalog, cursor=first.cursor, now=_s(12), status={k1: "STARTED"}, lead=LEAD)
    k2 = second.run_key
    # k1 failed b; k2 is still running (it will leave b out): b waits for it.
    failed = {k1: {"b"}}
    waiting = _plan(
        catalog, cursor=second.cursor, now=_s(25), status={k1: "FAILURE", k2: "STARTED"}, failed=failed, lead=LEAD
    )
    assert "b" not in waiting.firings
    state = load_cursor(waiting.cursor)["b"]
    assert (state.key, state.first, state.prev) == (k2, iso(T0), None)  # retried from k1's firing
    # k2 ended having left b out (tag cq/left_out, read as failed): after the back-off, b's firings
    # from 0 s are requested again, in order, as a retry.
    failed[k2] = {"b"}
    retry = _plan(catalog, cursor=waiting.cursor, now=_s(45), status={k2: "SUCCESS"}, failed=failed, lead=LEAD)
    assert retry.firings["b"] == [T0, _s(20), _s(40)] and retry.attempt == 1 and retry.after == {}
    # Had k2 committed b (k1 failed elsewhere): b is done with both, nothing to redo.
    ok = _plan(
        catalog,
        cursor=second.cursor,
        now=_s(45),
        status={k1: "FAILURE", k2: "SUCCESS"},
        failed={k1: {"d"}},
        lead=LEAD,
    )
    assert ok.firings["b"] == [_s(40)] and load_cursor(ok.cursor)["b"].attempt == 0  # d's retry is attempt 1


def test_an_adopted_pipelined_run_keeps_the_run_it_follows(project):
    _, catalog = project
    first = _plan(catalog, now=_s(5), lead=LEAD)
    states = load_cursor(first.cursor)
    follower = RequestedRun(
        key="k2",
        created=_s(12).timestamp(),
        attempt=0,
        firings={"b": [iso(_s(20))]},
        after={"b": [first.run_key, iso(T0)]},
    )
    adopt_runs(states, [follower])
    b = states["b"]
    assert (b.key, b.first, b.prev, b.prev_first, b.prev_end) == ("k2", iso(_s(20)), first.run_key, iso(T0), iso(T0))
    # The cursor round-trips (version 2), and a version 1 cursor still reads.
    assert load_cursor(dump_cursor(states))["b"] == b
    assert load_cursor('{"v":1,"defs":{"b":{"upto":"x"}}}')["b"].prev is None


# -- a cursor Dagster did not store -----------------------------------------------------------------
def test_runs_created_after_the_cursor_it_does_not_know_are_adopted_in_order(project):
    _, catalog = project
    first = _plan(catalog, now=_s(5))
    assert cursor_time(first.cursor) == _s(5).timestamp()
    states = load_cursor(first.cursor)
    lost = [
        RequestedRun(key="k2", created=_s(46).timestamp(), attempt=0, firings={"b": [_s(40).isoformat()]}),
        RequestedRun(
            key="k1", created=_s(26).timestamp(), attempt=1, firings={"b": [_s(0).isoformat(), _s(20).isoformat()]}
        ),
        RequestedRun(key=first.run_key, created=_s(6).timestamp(), attempt=0, firings={"d": [T0.isoformat()]}),
    ]
    notes = adopt_runs(states, lost)
    assert [n.split()[3] for n in notes] == ["k1", "k2"]  # oldest first; the cursor's own run is known
    b = states["b"]
    assert (b.key, b.first, b.upto, b.since, b.attempt) == (
        "k2",
        _s(40).isoformat(),
        _s(40).isoformat(),
        _s(46).timestamp(),
        0,
    )
    assert states["d"].key == first.run_key  # untouched
    # Planning from the adopted state holds b behind its run (BLOCKED), never requests its firings again.
    held = _plan(
        catalog,
        cursor=dump_cursor(states, at=_s(5).timestamp()),
        now=_s(50),
        status={first.run_key: "SUCCESS", "k2": "STARTED"},
    )
    assert "b" not in held.firings and held.firings == {"d": [_s(40)]}
    after = _plan(catalog, cursor=held.cursor, now=_s(65), status={"k2": "SUCCESS", held.run_key: "SUCCESS"})
    assert after.firings == {"b": [_s(60)], "d": [_s(60)]}


def test_checks_of_definitions_that_started_together_come_due_spread_out():
    from cq_engine.scheduling.batch import check_stagger

    every = timedelta(minutes=5)
    offsets = [check_stagger(f"q{i:03d}", every) for i in range(1000)]
    assert all(0 <= o < 150 for o in offsets) and check_stagger("q001", every) == offsets[1]  # stable
    # Their next checks fall due over the half period before five minutes, not in one run.
    per_30s = [sum(1 for o in offsets if k * 30 <= o < (k + 1) * 30) for k in range(5)]
    assert max(per_30s) < 300, per_30s


def test_a_run_is_caught_up_all_at_once_by_its_progress_tag(project):
    """The sensor follows a definition into its next horizon window once its run has done all its
    firings there but the last, by the run's cq/done_before tag (set after each round): every
    definition of the run is ready at the same tick."""
    from cq_engine.scheduling.batch import DefinitionState
    from cq_engine.scheduling.runs import KeyedRuns, caught_up_in

    _, catalog = project
    ticks = {"b": ticks_of(catalog.definition("b"), timezone="UTC")}
    states = {"b": DefinitionState(upto=iso(_s(40)), key="k", first=iso(T0))}  # b's firings 0, 20, 40 s in k
    running = {"b": ("run-id", iso(_s(40)))}

    def caught_up(done_before):
        return caught_up_in(states, ticks, running, KeyedRuns(done_before=done_before))

    assert caught_up({}) == set()
    assert caught_up({"k": _s(20)}) == set()  # the round of 20 s is still going
    assert caught_up({"k": _s(40)}) == {"b"}  # every firing before 40 s is done
    assert caught_up({"other": _s(40)}) == set()


def test_a_run_is_finished_all_at_once_by_its_progress_tag():
    """The sensor goes on with a definition of a still-running run once its sink's latest
    commit is its last firing's, from that run, and was written before the run's latest
    progress tag (cq/progress_at, set once a round's commits are all recorded): every definition a
    round finished at the same tick; one done long before a catch-up of another after its round."""
    from cq_engine.scheduling.batch import DefinitionState
    from cq_engine.scheduling.runs import KeyedRuns, SinkCommit, finished_in

    def event(run_id: str, end, at: float) -> SinkCommit:
        return SinkCommit(run_id=run_id, timestamp=at, range_end=end)

    states = {n: DefinitionState(upto=iso(_s(40)), key="k", first=iso(T0)) for n in ("b", "d", "x")}
    running = {"b": ("r", iso(_s(60))), "d": ("r", iso(_s(20))), "x": ("r", iso(_s(60)))}
    # d's one firing (ending at 20 s) was written at t=100; b's last at t=200; x's last failed.
    latest = {"d": event("r", _s(20), 100.0), "b": event("r", _s(60), 200.0), "x": event("r", _s(40), 150.0)}

    def finished(progress_at, events=latest):
        return finished_in(states, running, KeyedRuns(progress_at=progress_at), events)

    assert finished({}) == set()  # no tag: they go on when the run ends
    assert finished({"k": 99.0}) == set()  # d's round is still yielding its events
    assert finished({"k": 100.5}) == {"d"}  # d's round is done, b and x catch up
    assert finished({"k": 200.5}) == {"b", "d"}  # x's last firing has no event: retried when the run ends
    assert finished({"other": 200.5}) == set()
    assert finished({"k": 200.5}, {**latest, "b": event("another run", _s(60), 190.0)}) == {"d"}


def test_a_batch_run_opens_its_sinks_while_it_waits_for_its_first_firing(tmp_path, monkeypatch):
    import dataclasses

    import pyarrow as pa
    from conftest import sql_project

    from cq_engine.engine import Engine
    from cq_engine.resample import rounds

    settings = sql_project(
        tmp_path,
        monkeypatch,
        {
            "q.sql": "CREATE TABLE t (ts TIMESTAMP, device STRING, v DOUBLE);\n"
            + "".join(
                f"CREATE CQ q{i} RESAMPLE EVERY 10s BEGIN SELECT max_value(v) AS m INTO q{i}_out FROM t "
                "GROUP BY (10s), device END;\n"
                for i in range(3)
            )
        },
    )
    engine = Engine(settings=dataclasses.replace(settings, storage="deltars"))
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(2):  # q2's sink does not exist yet
        engine.storage.append(
            f"q{i}_out", pa.table({"ts": pa.array([t0], pa.timestamp("us", tz="UTC")), "device": ["d"], "m": [1.0]})
        )
    warmed = []
    real = engine.storage.warm
    monkeypatch.setattr(engine.ctx.storage, "warm", lambda table, **kw: (warmed.append((table, kw)), real(table, **kw)))
    soon = datetime.now(UTC) + timedelta(seconds=3)
    assert rounds.warm_sinks(engine, ["q0", "q1", "q2"], until=soon) == 3
    ids = {table: kw["app_id"] for table, kw in warmed}
    assert sorted(ids) == ["q0_out", "q1_out", "q2_out"] and ids["q0_out"].startswith("cq-engine/q0/firing#")
    # Kept open for the first commit: the storage takes it back without loading the table again.
    assert engine.storage.open_tables.take(engine.storage.uri("q0_out")) is not None
    # A first firing due now (or a deadline already passed): nothing is opened ahead of it.
    assert rounds.warm_sinks(engine, ["q0"], until=datetime.now(UTC)) == 0
