"""The batched run model (dagster_defs.batch): the batch sensor and job on a real ephemeral Dagster
instance with real Spark and Delta tables (the planner's own rules: tests/test_scheduling.py)."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest
from dagster._core.test_utils import create_run_for_test
from deltalake import DeltaTable, write_deltalake
from test_scheduling import SQL, T0, _plan, make_project

from cq_engine.config import Settings
from cq_engine.schedule.ticks import ticks_of
from cq_engine.scheduling.batch import load_cursor
from cq_engine.times import iso
from dagster_defs import build_definitions

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_project(tmp_path_factory.mktemp("dagster_batch"))


# -- the sensor and the job on a real instance ------------------------------------------------------
@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


def test_only_a_definition_whose_latest_firing_took_under_half_its_period_keeps_pace(instance):
    """The sensor's pace rule (cq_engine.scheduling.runs) on sink commits read off a real instance's
    materializations (their cq/seconds and cq/range_end)."""
    from cq_engine.scheduling.runs import keeps_pace
    from dagster_defs.batch_run import latest_commits

    def latest(seconds):
        meta = {"cq/range_end": iso(T0)} if seconds is None else {"cq/seconds": dg.MetadataValue.float(seconds)}
        instance.report_runless_asset_event(dg.AssetMaterialization(asset_key="b_out", metadata=meta))
        commit = latest_commits(instance, {"b": dg.AssetKey("b_out")})["b"]
        assert commit is not None and commit.range_end == (T0 if seconds is None else None)
        return commit

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
    assert [s.name for s in defs.sensors] == ["cq_firings", "cq_health"]
    assert {s.name for s in defs.schedules} == {"b_ticks", "d_ticks", "broken_src_ticks", "cq_maintenance"}
    assert defs.resolve_schedule_def("b_ticks").cron_schedule == "0 0 1 1 *"

    # The sensor: one run for every definition, its sinks selected, the firings in the run config.
    with dg.build_sensor_context(instance=instance, cursor=None) as ctx:
        result = sensor.evaluate_tick(ctx)
    (request,) = result.run_requests
    assert {k.to_user_string() for k in request.asset_selection} == {"b_out", "d_out", "x_out"}
    # Their completeness checks too: every batch run evaluates them (CQ_COMPLETENESS_EVERY=0s).
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
    # Dagster's table metadata on each materialization: the sink's rows (its last materialization's
    # count is the table's), the rows the firing wrote, the sink's name, location, schema.
    first = next(m for m in mats if m.asset_key == dg.AssetKey("b_out"))
    last = [m for m in mats if m.asset_key == dg.AssetKey("b_out")][-1]
    assert first.metadata["dagster/row_count"].value >= first.metadata["cq/rows_written"].value > 0
    b_rows = DeltaTable(settings.table_uri("b_out")).to_pyarrow_table().num_rows
    assert last.metadata["dagster/row_count"].value == b_rows
    assert first.metadata["dagster/table_name"].value == "b_out"
    assert first.metadata["dagster/uri"].value == settings.table_uri("b_out")
    columns = {c.name: c.type for c in first.metadata["dagster/column_schema"].value.columns}
    assert columns["m"] == "double" and columns["device"] == "string" and "timestamp" in columns["time"]
    # The completeness checks, at the run's start (before its firings: nothing ran yet) and without Spark.
    checks = _checks(result)
    assert checks == {k: (True, "ERROR", []) for k in ("b_out", "d_out", "x_out")}
    order = [e.event_type_value for e in result.all_events]
    assert order.index("ASSET_MATERIALIZATION") > max(i for i, t in enumerate(order) if t == "ASSET_CHECK_EVALUATION")
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
    # The retry of broken_src's firing reports its check first: the failed firing, not redone yet.
    retry = job.execute_in_process(
        instance=instance,
        run_config={"ops": {"cq_firings": {"config": {"firings": {"broken_src": firings["broken_src"]}}}}},
        tags={"cq/attempt": "1"},
        asset_selection=[dg.AssetKey("x_out")],
        raise_on_error=False,
    )
    assert _checks(retry)["x_out"] == (
        False,
        "ERROR",
        [{"start": "2021-05-11T14:18:20+00:00", "end": "2021-05-11T14:18:40+00:00", "reason": "failed", "count": 1}],
    )
    assert len(Engine(settings=settings).ledger.entries("b")) == 2
    # Not a retry (a second run of the same firings: a lost cursor, a run failed while it ran): the
    # sink holds each firing's identity, so nothing is computed into it or recorded again.
    twice = job.execute_in_process(
        instance=instance,
        run_config={"ops": {"cq_firings": {"config": {"firings": {"b": firings["b"]}}}}},
        asset_selection=[dg.AssetKey("b_out")],
    )
    assert twice.success and twice.asset_materializations_for_node("cq_firings") == []
    assert len(Engine(settings=settings).ledger.entries("b")) == 2
    said = [
        e.user_message for e in instance.all_logs(twice.run_id) if "already committed by another run" in e.user_message
    ]
    assert len(said) == len(firings["b"]), said

    # A gap (b's 14:19:20 never ran, 14:19:40 did) fails b's check, from the next run's start on,
    # until a recalculation fills it.
    gap = job.execute_in_process(
        instance=instance,
        run_config={"ops": {"cq_firings": {"config": {"firings": {"b": ["2021-05-11T14:19:40+00:00"]}}}}},
        asset_selection=[dg.AssetKey("b_out")],
    )
    assert gap.success and _checks(gap)["b_out"][0]  # at its start: the gap is not behind a firing yet
    gap = job.execute_in_process(
        instance=instance,
        run_config={"ops": {"cq_firings": {"config": {"firings": {"b": ["2021-05-11T14:20:00+00:00"]}}}}},
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
    # Their completeness checks too: every batch run evaluates them (CQ_COMPLETENESS_EVERY=0s).
    assert {(k.asset_key.to_user_string(), k.name) for k in request.asset_check_keys} == {
        ("b_out", "cq_completeness"),
        ("d_out", "cq_completeness"),
        ("x_out", "cq_completeness"),
    }


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


def test_the_planners_run_statuses_are_dagsters_in_flight_ones():
    from cq_engine.scheduling.batch import RUNNING
    from dagster_defs.builders import IN_FLIGHT

    assert {s.value for s in IN_FLIGHT} == RUNNING
