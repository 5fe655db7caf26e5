"""The batched run model (dagster_defs.batch): the batch planner's BLOCKED/DISCARD/retry rules, and
the batch sensor and job on a real ephemeral Dagster instance with real Spark and Delta tables."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest
from dagster._core.test_utils import create_run_for_test
from deltalake import write_deltalake

from cq_engine.catalog import load_catalog, parse_options
from cq_engine.config import Settings
from cq_engine.errors import CQError
from cq_engine.schedule.ticks import ticks_of
from cq_engine.times import iso
from dagster_defs import build_definitions
from dagster_defs.batch_plan import RequestedRun, adopt_runs, cursor_time, dump_cursor, load_cursor, plan_batch

DATA = Path(__file__).parent / "data"
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


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("dagster_batch")
    (root / "sql").mkdir()
    (root / "sql" / "cq.sql").write_text(SQL)
    settings = Settings(sql_dir=str(root / "sql"), warehouse=str(root / "wh"), home=str(root / ".cq"))
    catalog = load_catalog(settings.sql_dir, options=parse_options(settings))
    assert not catalog.errors, catalog.errors
    return settings, catalog


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


def test_a_failed_run_retries_its_definitions_from_their_first_firing_after_a_back_off(project):
    _, catalog = project
    first = _plan(catalog, now=_s(5))
    both = _plan(catalog, cursor=first.cursor, now=_s(25), status={first.run_key: "SUCCESS"})
    assert both.firings == {"b": [_s(20)], "d": [_s(20)]}
    failed = {both.run_key: "FAILURE"}
    assert _plan(catalog, cursor=both.cursor, now=_s(26), status=failed).firings == {}  # back-off
    retry = _plan(catalog, cursor=both.cursor, now=_s(45), status=failed)
    # BLOCKED: the failed firing again, then what is due since; DISCARD: the latest only.
    assert retry.firings == {"b": [_s(20), _s(40)], "d": [_s(40)]} and retry.attempt == 1
    assert load_cursor(retry.cursor)["b"].attempt == 1
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
    monkeypatch.setattr("dagster_defs.batch_plan.MAX_FIRINGS_PER_RUN", 1)
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
    monkeypatch.setattr("dagster_defs.batch_plan.MAX_FIRINGS_PER_RUN", 2)
    _, catalog = project
    first = _plan(catalog, now=_s(5), lead={"b": timedelta(seconds=18)})
    assert first.firings == {"b": [T0, _s(20)], "d": [T0]}
    # Firings due now do count, each: d (requested longest ago, first) and b's two (40 and 60 s)
    # are more than two, so b waits for the next batch.
    behind = _plan(catalog, cursor=first.cursor, now=_s(65), status={first.run_key: "SUCCESS"})
    assert behind.firings == {"d": [_s(60)]}


def test_a_run_is_caught_up_all_at_once_by_its_progress_tag(project):
    """The sensor follows a definition into its next horizon window once its run has done all its
    firings there but the last, by the run's cq/done_before tag (set after each round): every
    definition of the run is ready at the same tick."""
    from dagster_defs.batch import caught_up_in
    from dagster_defs.batch_plan import DefinitionState
    from dagster_defs.batch_run import KeyedRuns

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
    materialization is its last firing's, from that run, and was written before the run's latest
    progress tag (cq/progress_at, set once a round's events are all yielded): every definition a
    round finished at the same tick; one done long before a catch-up of another after its round."""
    from dagster._core.events import DagsterEvent, DagsterEventType, StepMaterializationData
    from dagster._core.events.log import EventLogEntry

    from dagster_defs.batch import finished_in
    from dagster_defs.batch_plan import DefinitionState
    from dagster_defs.batch_run import KeyedRuns

    def event(run_id: str, end, at: float) -> EventLogEntry:
        mat = dg.AssetMaterialization(asset_key="sink", metadata={"cq/range_end": iso(end)})
        return EventLogEntry(
            error_info=None,
            level=20,
            user_message="",
            run_id=run_id,
            timestamp=at,
            dagster_event=DagsterEvent(
                DagsterEventType.ASSET_MATERIALIZATION.value,
                "j",
                event_specific_data=StepMaterializationData(mat),
            ),
        )

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


# -- the sensor and the job on a real instance ------------------------------------------------------
@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


def test_only_a_definition_whose_latest_firing_took_under_half_its_period_keeps_pace(instance):
    from dagster_defs.batch import keeps_pace

    def latest(seconds):
        meta = {} if seconds is None else {"cq/seconds": dg.MetadataValue.float(seconds)}
        instance.report_runless_asset_event(dg.AssetMaterialization(asset_key="b_out", metadata=meta))
        return instance.get_latest_materialization_events([dg.AssetKey("b_out")])[dg.AssetKey("b_out")]

    every = timedelta(seconds=5)
    assert keeps_pace(latest(0.04), every)  # a fused firing's share of its job and its commit
    assert not keeps_pace(latest(12.0), every)  # the e2e suite's slow definitions
    assert not keeps_pace(latest(None), every) and not keeps_pace(None, every)  # not known yet
    # Its run's latest round under its period (cq/round_seconds): known for all of the run at once.
    assert keeps_pace(None, every, round_seconds=4.0)
    assert not keeps_pace(None, every, round_seconds=12.5)
    # The tag decides for all of the run: not one sink's own event, before or against it.
    assert not keeps_pace(latest(0.04), every, round_seconds=12.5)
    assert not keeps_pace(latest(0.04), every, in_run=True)
    assert keeps_pace(latest(0.04), every, round_seconds=4.0, in_run=True)


def _checks(result) -> dict[str, tuple[bool, str, list]]:
    """The run's cq_completeness evaluations: sink -> (passed, severity, missing ranges)."""
    out = {}
    for e in result.get_asset_check_evaluations():
        assert e.check_name == "cq_completeness"
        out[e.asset_key.to_user_string()] = (e.passed, e.severity.value, e.metadata["missing_ranges"].value)
    return out


def test_batch_sensor_requests_one_run_and_the_job_commits_each_firing(project, instance, spark, tmp_path, monkeypatch):
    settings, _ = project
    monkeypatch.setenv("CQ_COMPLETENESS_HORIZON", "36500d")  # the seed's firings are of 2021
    from cq_engine.engine import Engine

    engine = Engine(settings=settings, spark_session=spark)
    # On disk without the column broken_src reads: its firings fail at run time.
    write_deltalake(
        settings.table_uri("never_written"),
        pa.table({"time": pa.array([T0], pa.timestamp("us", tz="UTC")), "device": ["x"]}),
    )
    engine.ingest("ln", str(DATA / "ln.csv"))
    defs = build_definitions(settings=settings, now=T0, run_model="batch")
    # One job for the batches and for each definition on its own: no job per definition (and housekeeping's).
    assert [j.name for j in defs.jobs] == ["cq_firings_job", "cq_maintenance_job"]
    sensor = defs.resolve_sensor_def("cq_firings")
    # The switches are schedules that request nothing (a sensor each would be evaluated at every start).
    assert [s.name for s in defs.sensors] == ["cq_firings"]
    assert {s.name for s in defs.schedules} == {"b_ticks", "d_ticks", "broken_src_ticks", "cq_maintenance"}
    assert defs.resolve_schedule_def("b_ticks").cron_schedule == "0 0 1 1 *"

    # The sensor: one run for every definition, its sinks selected, the firings in the run config.
    with dg.build_sensor_context(instance=instance, cursor=None) as ctx:
        result = sensor.evaluate_tick(ctx)
    (request,) = result.run_requests
    assert {k.to_user_string() for k in request.asset_selection} == {"b_out", "d_out", "x_out"}
    # Their completeness checks too: never evaluated yet (CQ_COMPLETENESS_EVERY after that).
    assert {(k.asset_key.to_user_string(), k.name) for k in request.asset_check_keys} == {
        ("b_out", "cq_completeness"),
        ("d_out", "cq_completeness"),
        ("x_out", "cq_completeness"),
    }
    assert request.run_key.startswith("cq_firings:") and request.tags["cq/attempt"] == "0"

    # The job, on the seed's data (ln.csv: 2021-05-11 14:18 UTC): b has two firings, d one, broken_src fails.
    firings = {
        "broken_src": ["2021-05-11T14:18:40+00:00"],
        "b": ["2021-05-11T14:18:40+00:00", "2021-05-11T14:19:00+00:00"],
        "d": ["2021-05-11T14:19:00+00:00"],
    }
    job = defs.resolve_job_def("cq_firings_job")
    config = {"ops": {"cq_firings": {"config": {"firings": firings}}}}
    result = job.execute_in_process(
        instance=instance,
        run_config=config,
        raise_on_error=False,
        asset_selection=[dg.AssetKey(k) for k in ("b_out", "d_out", "x_out")],
    )
    assert not result.success
    mats = result.asset_materializations_for_node("cq_firings")
    by_sink = {}
    for m in mats:
        by_sink.setdefault(m.asset_key.to_user_string(), []).append(m.metadata["cq/range_end"].value)
    assert by_sink == {
        "b_out": ["2021-05-11T14:18:40+00:00", "2021-05-11T14:19:00+00:00"],
        "d_out": ["2021-05-11T14:19:00+00:00"],
    }
    # Dagster's table metadata on each materialization: rows written, the sink's name, location, schema.
    first = next(m for m in mats if m.asset_key == dg.AssetKey("b_out"))
    assert first.metadata["dagster/row_count"].value == first.metadata["cq/rows_written"].value > 0
    assert first.metadata["dagster/table_name"].value == "b_out"
    assert first.metadata["dagster/uri"].value == settings.table_uri("b_out")
    columns = {c.name: c.type for c in first.metadata["dagster/column_schema"].value.columns}
    assert columns["m"] == "double" and columns["device"] == "string" and "timestamp" in columns["time"]
    # The completeness check, after the batch and without Spark: broken_src's firing failed.
    checks = _checks(result)
    assert checks["b_out"] == (True, "ERROR", []) and checks["d_out"][0]
    assert checks["x_out"] == (
        False,
        "ERROR",
        [{"start": "2021-05-11T14:18:20+00:00", "end": "2021-05-11T14:18:40+00:00", "reason": "failed", "count": 1}],
    )
    tags = instance.get_run_by_id(result.run_id).tags
    assert tags["cq/failed"] == "broken_src"
    # How far its rounds got (for the sensor): after its last round, everything up to its last firing.
    assert tags["cq/done_before"] == "2021-05-11T14:19:00.000001+00:00"
    # ...tagged after the run's materializations were written (what the sensor's finished_in compares).
    written = [
        e.timestamp
        for e in instance.all_logs(result.run_id)
        if e.dagster_event and e.dagster_event.is_step_materialization
    ]
    assert len(written) == 3 and float(tags["cq/progress_at"]) >= max(written)
    assert float(tags["cq/round_seconds"]) > 0
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "broken_src @ 2021-05-11T14:18:40+00:00" in failure.event_specific_data.error.message
    ledger = Engine(settings=settings).ledger.entries()
    assert sorted((e.definition, e.status) for e in ledger) == [
        ("b", "succeeded"),
        ("b", "succeeded"),
        ("broken_src", "failed"),
        ("d", "succeeded"),
    ]

    # A retry (cq/attempt > 0) skips what the ledger holds as succeeded.
    again = job.execute_in_process(
        instance=instance,
        run_config={"ops": {"cq_firings": {"config": {"firings": {"b": firings["b"]}}}}},
        tags={"cq/attempt": "1"},
        asset_selection=[dg.AssetKey("b_out")],
    )
    assert again.success and again.asset_materializations_for_node("cq_firings") == []
    assert len(Engine(settings=settings).ledger.entries("b")) == 2

    # A gap (b's 14:19:20 never ran, 14:19:40 did) fails b's check until a recalculation fills it.
    gap = job.execute_in_process(
        instance=instance,
        run_config={"ops": {"cq_firings": {"config": {"firings": {"b": ["2021-05-11T14:19:40+00:00"]}}}}},
        asset_selection=[dg.AssetKey("b_out")],
    )
    assert gap.success and _checks(gap) == {
        "b_out": (
            False,
            "ERROR",
            [
                {
                    "start": "2021-05-11T14:19:00+00:00",
                    "end": "2021-05-11T14:19:20+00:00",
                    "reason": "missing",
                    "count": 1,
                }
            ],
        )
    }
    filled = job.execute_in_process(
        instance=instance,
        asset_selection=[dg.AssetKey("b_out")],
        run_config={
            "ops": {
                "cq_firings": {
                    "config": {"recalculate_from": "2021-05-11T14:19:00Z", "recalculate_to": "2021-05-11T14:19:20Z"}
                }
            }
        },
    )
    assert filled.success and _checks(filled) == {"b_out": (True, "ERROR", [])}

    # One definition on its own: the shared job with its sink alone selected, a firing (tag or config),
    # its latest firing (nothing given: the UI's "Materialize"), or a recalculation.
    one = job.execute_in_process(
        instance=instance,
        tags={"cq/name": "d", "cq/fire_time": "2021-05-11T14:18:40+00:00"},
        asset_selection=[dg.AssetKey("d_out")],
    )
    assert one.success
    (mat,) = one.asset_materializations_for_node("cq_firings")
    assert mat.asset_key == dg.AssetKey("d_out") and mat.metadata["cq/rows_written"].value > 0
    assert mat.metadata["cq/range_end"].value == "2021-05-11T14:18:40+00:00"
    by_config = job.execute_in_process(
        instance=instance,
        run_config={"ops": {"cq_firings": {"config": {"fire_time": "2021-05-11T14:19:00Z"}}}},
        asset_selection=[dg.AssetKey("b_out")],
    )
    (mat,) = by_config.asset_materializations_for_node("cq_firings")
    assert (mat.asset_key, mat.metadata["cq/range_end"].value) == (dg.AssetKey("b_out"), "2021-05-11T14:19:00+00:00")
    latest = job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey("b_out")])
    (mat,) = latest.asset_materializations_for_node("cq_firings")
    assert mat.metadata["cq/kind"].value == "firing"
    end = datetime.fromisoformat(mat.metadata["cq/range_end"].value)
    assert timedelta(0) <= datetime.now(UTC) - end < timedelta(seconds=20 + 60)  # EVERY 20s, time for the run
    recalc = job.execute_in_process(
        instance=instance,
        run_config={
            "ops": {
                "cq_firings": {
                    "config": {"recalculate_from": "2021-05-11T14:18:00Z", "recalculate_to": "2021-05-11T14:19:00Z"}
                }
            }
        },
        asset_selection=[dg.AssetKey("d_out")],
    )
    (mat,) = recalc.asset_materializations_for_node("cq_firings")
    assert mat.metadata["cq/kind"].value == "recalculate" and mat.metadata["cq/range_start"].value.startswith(
        "2021-05-11T14:18:00"
    )
    two = job.execute_in_process(
        instance=instance, asset_selection=[dg.AssetKey("b_out"), dg.AssetKey("d_out")], raise_on_error=False
    )
    assert not two.success
    error = next(e for e in two.all_events if e.event_type_value == "STEP_FAILURE").event_specific_data.error
    assert "select one sink" in error.message and "2 sinks are selected" in error.message

    # With a run of d in flight, the next evaluation holds d (DISCARD: skips) and requests the others:
    # a run tagged cq/name (the CLI's), or a run of the shared job selecting d's sink (the UI's).
    for tags, selection in (({"cq/name": "d"}, None), ({}, {dg.AssetKey("d_out")})):
        run = create_run_for_test(
            instance,
            job_name="cq_firings_job",
            status=dg.DagsterRunStatus.STARTED,
            tags=tags,
            asset_selection=selection,
        )
        with dg.build_sensor_context(instance=instance, cursor=None) as ctx:
            (request,) = sensor.evaluate_tick(ctx).run_requests
        assert {k.to_user_string() for k in request.asset_selection} == {"b_out", "x_out"}
        instance.report_run_canceled(run)
    # A batch run selecting d's sink is the sensor's own (its cursor tracks it), not d's own run.
    create_run_for_test(
        instance,
        job_name="cq_firings_job",
        status=dg.DagsterRunStatus.STARTED,
        tags={"cq/batch": "true"},
        asset_selection={dg.AssetKey("d_out")},
    )
    with dg.build_sensor_context(instance=instance, cursor=None) as ctx:
        (request,) = sensor.evaluate_tick(ctx).run_requests
    assert {k.to_user_string() for k in request.asset_selection} == {"b_out", "d_out", "x_out"}
    # Their completeness checks too: never evaluated yet (CQ_COMPLETENESS_EVERY after that).
    assert {(k.asset_key.to_user_string(), k.name) for k in request.asset_check_keys} == {
        ("b_out", "cq_completeness"),
        ("d_out", "cq_completeness"),
        ("x_out", "cq_completeness"),
    }


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


def test_the_sensor_adopts_a_batch_run_its_stored_cursor_does_not_know(project, instance):
    """Dagster stores a sensor's cursor only after its tick created the tick's runs: with the daemon
    killed in between, the next evaluation starts from the cursor before. It must hold the definitions
    of the run it cannot see in its cursor, not request their firings again under another run key."""
    settings, catalog = project
    defs = build_definitions(settings=settings, now=T0, run_model="batch")
    sensor = defs.resolve_sensor_def("cq_firings")
    past = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=2)
    stored = _plan(catalog, now=past, names=("b", "d", "broken_src"))  # the cursor Dagster kept
    create_run_for_test(  # that cursor's own run, finished
        instance,
        job_name="cq_firings_job",
        status=dg.DagsterRunStatus.SUCCESS,
        tags={"cq/batch": "true", "dagster/run_key": stored.run_key},
    )
    b = load_cursor(stored.cursor)["b"]
    ticks = ticks_of(catalog.definition("b"), timezone="UTC")
    fires = [
        b.upto,
        *(iso(f) for f in ticks.between(datetime.fromisoformat(b.upto) + timedelta(seconds=1), datetime.now(UTC))),
    ]
    assert len(fires) >= 5
    lost = create_run_for_test(  # the run of the tick whose cursor was not stored: b's firings since
        instance,
        job_name="cq_firings_job",
        status=dg.DagsterRunStatus.STARTED,
        tags={"cq/batch": "true", "dagster/run_key": "cq_firings:lost", "cq/attempt": "0"},
        run_config={"ops": {"cq_firings": {"config": {"firings": {"b": fires[1:]}}}}},
    )
    with dg.build_sensor_context(instance=instance, cursor=stored.cursor) as ctx:
        result = sensor.evaluate_tick(ctx)
    requested = [set(r.run_config["ops"]["cq_firings"]["config"]["firings"]) for r in result.run_requests]
    assert all("b" not in names for names in requested), requested  # b waits for the adopted run
    state = load_cursor(result.cursor)["b"]
    assert (state.key, state.first, state.upto) == ("cq_firings:lost", fires[1], fires[-1])
    instance.report_run_canceled(lost)


def test_a_tick_names_at_most_twenty_held_definitions_then_counts_the_rest():
    from dagster_defs.batch import first_lines

    lines = [f"q{i:03d}: BLOCKED holds 1 firing(s) until its run finishes" for i in range(1000)]
    assert first_lines(lines[:20]) == lines[:20]
    shown = first_lines(lines)
    assert shown[:20] == lines[:20] and shown[20:] == ["... and 980 more definition(s) held or skipped"]


def test_checks_of_definitions_that_started_together_come_due_spread_out():
    from dagster_defs.batch_plan import check_stagger

    every = timedelta(minutes=5)
    offsets = [check_stagger(f"q{i:03d}", every) for i in range(1000)]
    assert all(0 <= o < 150 for o in offsets) and check_stagger("q001", every) == offsets[1]  # stable
    # Their next checks fall due over the half period before five minutes, not in one run.
    per_30s = [sum(1 for o in offsets if k * 30 <= o < (k + 1) * 30) for k in range(5)]
    assert max(per_30s) < 300, per_30s


def test_a_pipelined_batch_waits_for_the_commit_it_follows_and_leaves_a_definition_out_if_it_never_comes(
    tmp_path, instance, spark, monkeypatch
):
    """The run side of pipelining, on a real instance, Spark and Delta: a definition named in the
    run config's ``after`` starts once the run it follows has its firing in the sink's
    materializations; if that run ended without it, the definition is left out (tag cq/left_out,
    nothing written, the others run)."""
    import threading

    from cq_engine.engine import Engine

    monkeypatch.setenv("CQ_COMPLETENESS_HORIZON", "36500d")
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "cq.sql").write_text(SQL)
    settings = Settings(sql_dir=str(tmp_path / "sql"), warehouse=str(tmp_path / "wh"), home=str(tmp_path / ".cq"))
    Engine(settings=settings, spark_session=spark).ingest("ln", str(DATA / "ln.csv"))
    job = build_definitions(settings=settings, now=T0, run_model="batch").resolve_job_def("cq_firings_job")
    sinks = [dg.AssetKey("b_out"), dg.AssetKey("d_out")]

    def batch(firings: dict, after: dict, key: str):
        config = {"ops": {"cq_firings": {"config": {"firings": firings, "after": after}}}}
        return job.execute_in_process(
            instance=instance,
            run_config=config,
            asset_selection=sinks,
            tags={"cq/batch": "true", "dagster/run_key": key},
            raise_on_error=False,
        )

    def ends(result, sink="b_out"):
        return [
            m.metadata["cq/range_end"].value
            for m in result.asset_materializations_for_node("cq_firings")
            if m.asset_key.to_user_string() == sink
        ]

    first = batch({"b": ["2021-05-11T14:18:40+00:00"]}, {}, "k1")
    assert first.success and ends(first) == ["2021-05-11T14:18:40+00:00"]
    # Following k1, whose firing is committed: b runs at once.
    second = batch({"b": ["2021-05-11T14:19:00+00:00"]}, {"b": ["k1", "2021-05-11T14:18:40+00:00"]}, "k2")
    assert second.success and ends(second) == ["2021-05-11T14:19:00+00:00"]

    # Following a run still going (STARTED) whose firing ends 14:19:20: b waits; d, not pipelined, runs.
    # Its commit arrives 3 s later (a materialization of that range, as the run would report it).
    going = create_run_for_test(
        instance,
        job_name="cq_firings_job",
        status=dg.DagsterRunStatus.STARTED,
        tags={"cq/batch": "true", "dagster/run_key": "k3"},
    )
    commit = threading.Timer(
        3,
        lambda: instance.report_runless_asset_event(
            dg.AssetMaterialization(asset_key="b_out", metadata={"cq/range_end": "2021-05-11T14:19:20+00:00"})
        ),
    )
    commit.start()
    fourth = batch(
        {"b": ["2021-05-11T14:19:40+00:00"], "d": ["2021-05-11T14:19:40+00:00"]},
        {"b": ["k3", "2021-05-11T14:19:20+00:00"]},
        "k4",
    )
    commit.join()
    assert fourth.success and ends(fourth) == ["2021-05-11T14:19:40+00:00"]
    assert ends(fourth, "d_out") == ["2021-05-11T14:19:40+00:00"]
    # b's firing came after the commit it waited for, in the event log's order; d's did not wait.
    events = instance.fetch_materializations(dg.AssetKey("b_out"), limit=10, ascending=True).records
    order = [e.asset_materialization.metadata["cq/range_end"].value for e in events]
    assert order[-2:] == ["2021-05-11T14:19:20+00:00", "2021-05-11T14:19:40+00:00"]

    # Following a run that ended without committing b's firing: b is left out, d goes on.
    instance.report_run_failed(going)
    fifth = batch(
        {"b": ["2021-05-11T14:20:00+00:00"], "d": ["2021-05-11T14:20:00+00:00"]},
        {"b": ["k3", "2021-05-11T14:19:50+00:00"]},
        "k5",
    )
    assert fifth.success and ends(fifth) == [] and ends(fifth, "d_out") == ["2021-05-11T14:20:00+00:00"]
    assert instance.get_run_by_id(fifth.run_id).tags["cq/left_out"] == "b"
    warning = next(e.message for e in instance.all_logs(fifth.run_id) if e.message and "left out" in e.message)
    assert "b: left out: run key k3 ended without committing its firing ending 2021-05-11T14:19:50" in warning
    fires = {e.fire_time for e in Engine(settings=settings).ledger.entries("b")}
    assert datetime(2021, 5, 11, 14, 20, tzinfo=UTC) not in fires and len(fires) == 3


def test_a_retry_reports_the_materialization_of_a_firing_committed_by_a_run_killed_before_reporting_it(
    tmp_path, instance, spark, monkeypatch
):
    """A batch run commits a firing (sink, then ledger) and then yields its materialization; a worker
    killed in between leaves the firing committed but unreported. The retried run skips it (the
    ledger) and reports its materialization, once, from the ledger's entry."""
    from cq_engine.engine import Engine

    monkeypatch.setenv("CQ_COMPLETENESS_HORIZON", "36500d")
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "cq.sql").write_text(SQL)
    settings = Settings(sql_dir=str(tmp_path / "sql"), warehouse=str(tmp_path / "wh"), home=str(tmp_path / ".cq"))
    engine = Engine(settings=settings, spark_session=spark)
    engine.ingest("ln", str(DATA / "ln.csv"))
    committed = engine.run_firing("b", datetime(2021, 5, 11, 14, 18, 40, tzinfo=UTC))  # no Dagster event
    job = build_definitions(settings=settings, now=T0, run_model="batch").resolve_job_def("cq_firings_job")
    firings = {"b": ["2021-05-11T14:18:40+00:00", "2021-05-11T14:19:00+00:00"]}

    def retry():
        result = job.execute_in_process(
            instance=instance,
            run_config={"ops": {"cq_firings": {"config": {"firings": firings}}}},
            asset_selection=[dg.AssetKey("b_out")],
            tags={"cq/batch": "true", "cq/attempt": "1"},
        )
        assert result.success
        return [
            (m.metadata["cq/range_end"].value, m.metadata["cq/rows_written"].value, m.metadata["cq/sink_version"].value)
            for m in result.asset_materializations_for_node("cq_firings")
        ]

    first = retry()
    # The skipped firing, as the ledger recorded it, then the one this run computed.
    assert first[0] == ("2021-05-11T14:18:40+00:00", committed.rows_written, committed.sink_version)
    assert [end for end, _, _ in first] == ["2021-05-11T14:18:40+00:00", "2021-05-11T14:19:00+00:00"]
    assert retry() == []  # both reported: nothing again
    assert len(Engine(settings=settings).ledger.entries("b")) == 2  # and nothing recomputed


def test_a_definition_stopped_while_its_batch_run_holds_later_firings_is_left_out_from_there(
    tmp_path, instance, spark, monkeypatch
):
    """Under a horizon a batch run holds firings ahead of time. Stopping a definition's switch (its
    `<name>_ticks` schedule, on a real instance) while the run goes on leaves the definition's later
    firings out of it (tag cq/left_out, a warning, nothing written for them); the others go on."""
    import threading

    from dagster._core.definitions.run_request import InstigatorType
    from dagster._core.remote_origin import GrpcServerCodeLocationOrigin, RemoteInstigatorOrigin, RemoteRepositoryOrigin
    from dagster._core.scheduler.instigation import InstigatorState, InstigatorStatus, ScheduleInstigatorData

    from cq_engine.engine import Engine

    monkeypatch.setenv("CQ_COMPLETENESS_HORIZON", "36500d")
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "cq.sql").write_text(
        "CREATE TABLE IF NOT EXISTS ln (time TIMESTAMP, device STRING, temperature DOUBLE);\n"
        + "".join(
            f"CREATE CQ {n} RESAMPLE EVERY 2s BEGIN SELECT max_value(temperature) AS m INTO {n}_out FROM ln "
            "GROUP BY (1s), device END;\n"
            for n in ("f", "g")
        )
    )
    settings = Settings(sql_dir=str(tmp_path / "sql"), warehouse=str(tmp_path / "wh"), home=str(tmp_path / ".cq"))
    Engine(settings=settings, spark_session=spark).ingest("ln", str(DATA / "ln.csv"))
    job = build_definitions(settings=settings, run_model="batch").resolve_job_def("cq_firings_job")
    start = datetime.fromtimestamp((int(datetime.now(UTC).timestamp()) // 2 + 3) * 2, UTC)
    fires = [iso(start + timedelta(seconds=2 * i)) for i in range(7)]  # 6 s to 18 s ahead, as a horizon holds them

    def stop_f():
        origin = RemoteInstigatorOrigin(
            RemoteRepositoryOrigin(GrpcServerCodeLocationOrigin(host="localhost", port=1, location_name="x"), "r"),
            "f_ticks",
        )
        state = InstigatorState(
            origin, InstigatorType.SCHEDULE, InstigatorStatus.STOPPED, ScheduleInstigatorData("0 0 1 1 *")
        )
        instance.add_instigator_state(state)

    stopper = threading.Timer((start - datetime.now(UTC)).total_seconds() + 3, stop_f)
    stopper.start()
    result = job.execute_in_process(
        instance=instance,
        run_config={"ops": {"cq_firings": {"config": {"firings": {"f": fires, "g": fires}}}}},
        asset_selection=[dg.AssetKey("f_out"), dg.AssetKey("g_out")],
        tags={"cq/batch": "true", "dagster/run_key": "h1"},
        raise_on_error=False,
    )
    stopper.join()
    assert result.success
    assert instance.get_run_by_id(result.run_id).tags["cq/left_out"] == "f"
    ledger = Engine(settings=settings).ledger
    done_f = sorted(iso(e.fire_time) for e in ledger.entries("f") if e.status == "succeeded")
    assert 1 <= len(done_f) < len(fires) and done_f == fires[: len(done_f)]  # in order, then none
    assert sorted(iso(e.fire_time) for e in ledger.entries("g") if e.status == "succeeded") == fires
    warning = next(e.message for e in instance.all_logs(result.run_id) if e.message and "stopped:" in e.message)
    assert f"f: stopped: its firings from {fires[len(done_f)]} are left out of this run" in warning
