"""The batched Airflow form without Spark: the window planner (``cq_engine.scheduling.windows``),
DISCARD inside a window run's rounds, the ledger's last firings, ``WindowTimetable``, the
per-definition DAGs left unscheduled (backfills still walk them), and which form ``CQ_AIRFLOW_FORM``
gives."""

import queue
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from cq_engine.parse import ParseOptions, parse_text
from cq_engine.schedule.ticks import ticks_of
from cq_engine.scheduling.batch import MAX_FIRINGS_PER_DEFINITION
from cq_engine.scheduling.windows import firings_per_minute, plan_window, window_cadence, window_of

T0 = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
SQL = """
CREATE TABLE IF NOT EXISTS sensors (ts TIMESTAMP, device STRING, temperature DOUBLE);
CREATE CQ blocked RESAMPLE EVERY 20s BEGIN
  SELECT max_value(temperature) AS tmax INTO blocked_out FROM sensors GROUP BY (20s)
END;
CREATE CQ dropping RESAMPLE EVERY 20s TIMEOUT POLICY DISCARD BEGIN
  SELECT count(temperature) AS n INTO dropping_out FROM sensors GROUP BY (20s)
END;
CREATE CQ hourly RESAMPLE EVERY 1h BEGIN
  SELECT count(temperature) AS n INTO hourly_out FROM sensors GROUP BY (1h)
END;
CREATE STREAM ticking PERIOD(30s) FROM sensors INTO ticking_out AS SELECT _tlocaltime, count(*) AS n FROM %%trows;
"""
S = timedelta(seconds=1)


def parsed(text: str = SQL) -> dict:
    from zoneinfo import ZoneInfo

    statements = parse_text(text, file="t.sql", options=ParseOptions(tz=ZoneInfo("UTC"), min_every=S))
    return {d.name: d for d in statements if hasattr(d, "sink")}


def plan(names, *, last=None, window=(T0, T0 + 60 * S), now=T0, paused=frozenset()):
    defs = parsed()
    chosen = [defs[n] for n in names]
    ticks = {d.name: ticks_of(d, timezone="UTC") for d in chosen}
    return plan_window(chosen, ticks=ticks, last_fired=last or {}, window=window, now=now, paused=set(paused))


def test_cadence_is_the_periods_gcd_within_bounds():
    assert window_cadence([60 * S, 90 * S]) == 30 * S
    assert window_cadence([60 * S, 3600 * S]) == 60 * S
    assert window_cadence([5 * S, 7 * S]) == 10 * S  # a run holds several rounds rather than a run a second
    assert window_cadence([timedelta(hours=1)]) == timedelta(minutes=10)
    assert window_cadence([60 * S], override=45 * S) == 45 * S
    assert window_of(T0 + 61 * S, 60 * S) == (T0 + 60 * S, T0 + 120 * S)
    assert firings_per_minute([ticks_of(d, timezone="UTC") for d in parsed().values()]) == pytest.approx(
        3 + 3 + 1 / 60 + 2
    )


def test_a_window_runs_each_definitions_firings_after_its_last_in_the_ledger():
    # Never fired: from the first firing at or after the window's start (IoTDB: from deployment).
    p = plan(["blocked", "hourly", "ticking"])
    assert p.firings == {"blocked": [T0, T0 + 20 * S, T0 + 40 * S], "hourly": [T0], "ticking": [T0, T0 + 30 * S]}
    # BLOCKED: every firing after its last succeeded one, the backlog first, in order.
    p = plan(["blocked", "hourly"], last={"blocked": T0 - 60 * S, "hourly": T0})
    assert p.firings == {"blocked": [T0 + k * 20 * S for k in range(-2, 3)]}
    assert p.discard == frozenset()
    # Nothing after the window's end: the next run's.
    assert plan(["blocked"], last={"blocked": T0 + 40 * S}).firings == {}


def test_discard_keeps_the_latest_due_and_the_windows_later_firings():
    p = plan(["dropping"], last={"dropping": T0 - 100 * S}, now=T0 + 5 * S)
    assert p.firings == {"dropping": [T0, T0 + 20 * S, T0 + 40 * S]}
    assert p.discard == {"dropping"}
    assert p.notes == [f"dropping: DISCARD skipped 4 firing(s) up to {(T0 - 20 * S).isoformat()} (due while none ran)"]
    # A run started late (after its window): only the latest of what is due.
    late = plan(["dropping", "blocked"], last={"dropping": T0 - 20 * S, "blocked": T0 - 20 * S}, now=T0 + 300 * S)
    assert late.firings == {"dropping": [T0 + 40 * S], "blocked": [T0, T0 + 20 * S, T0 + 40 * S]}


def test_a_stopped_definition_waits_and_a_backlog_is_cut():
    p = plan(["blocked", "dropping"], paused={"blocked"})
    assert list(p.firings) == ["dropping"] and p.notes == ["blocked: stopped (its DAG is paused); its firings wait"]
    # Started again a day later: BLOCKED runs its backlog, MAX_FIRINGS_PER_DEFINITION a window.
    p = plan(["blocked"], last={"blocked": T0 - timedelta(days=1)})
    assert len(p.firings["blocked"]) == MAX_FIRINGS_PER_DEFINITION
    assert p.firings["blocked"][0] == T0 - timedelta(days=1) + 20 * S and "the rest in the next" in p.notes[0]


class FakeEngine:
    """``execute_rounds``'s view of an engine: PERIOD-like definitions (not continuous queries, so
    each firing is a ``run_period`` call) recorded in order."""

    def __init__(self):
        self.ran: list[tuple[str, datetime]] = []

    def definition(self, name):
        return SimpleNamespace(name=name, sink=None)

    def run_period(self, name, fire, *, once):
        self.ran.append((name, fire))
        return SimpleNamespace(rows_written=0)


@pytest.mark.parametrize("discard", [False, True])
def test_a_window_run_discards_a_firing_whose_next_is_due_before_it_runs(discard):
    from cq_engine.resample.rounds import execute_rounds

    engine, out = FakeEngine(), queue.Queue()
    past = datetime.now(UTC) - timedelta(minutes=5)
    fires = [past, past + 20 * S, past + 40 * S]
    execute_rounds(
        engine,
        {"d": list(fires), "b": list(fires)},
        {},
        out,
        recover=lambda errors: "",
        discard=frozenset({"d"} if discard else ()),
    )
    outcomes = []
    while not out.empty():
        kind, d, fire, _ = out.get_nowait()
        outcomes.append((kind, d.name, fire))
    assert [f for n, f in engine.ran if n == "b"] == fires  # BLOCKED: all, in order
    if discard:
        assert [f for n, f in engine.ran if n == "d"] == fires[-1:]
        assert [(k, f) for k, n, f in outcomes if n == "d"] == [
            ("discarded", fires[0]),
            ("discarded", fires[1]),
            ("ok", fires[2]),
        ]
    else:
        assert [f for n, f in engine.ran if n == "d"] == fires


def test_the_ledgers_last_firing_per_definition(tmp_path):
    from cq_engine.storage.delta import DeltaRsStorage
    from cq_engine.storage.ledger import Ledger, LedgerEntry

    ledger = Ledger(store=DeltaRsStorage(warehouse=str(tmp_path / "wh")))
    assert ledger.last_fired() == {}

    def entry(name, kind, fire, status="succeeded"):
        return LedgerEntry(
            definition=name,
            kind=kind,
            fire_time=fire,
            range_start=fire - 20 * S,
            range_end=fire,
            source_versions={},
            rows_written=1,
            sink_version=1,
            status=status,
            started_at=T0,
            finished_at=T0,
        )

    ledger.record_many(
        [
            entry("a", "firing", T0),
            entry("a", "firing", T0 + 20 * S),
            entry("a", "firing", T0 + 40 * S, status="failed"),  # BLOCKED retries it: not the last
            entry("a", "recalculate", T0 + 600 * S),  # a recalculation is no firing
            entry("p", "period", T0 + 30 * S),
            entry("f", "firing", T0, status="failed"),
        ]
    )
    assert ledger.last_fired() == {"a": T0 + 20 * S, "p": T0 + 30 * S}


def test_window_timetable_runs_each_window_lead_early(airflow_home, monkeypatch):
    import pendulum
    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import DagSerialization
    from airflow.timetables.base import TimeRestriction

    from airflow_dags import timetable as tt_module
    from airflow_dags.timetable import WindowTimetable

    tt = WindowTimetable.of(cadence=60 * S, lead=25 * S, timezone="Europe/Berlin")
    now = T0 + 70 * S

    class Clock(datetime):
        @classmethod
        def now(cls, tz=None):
            return now

    monkeypatch.setattr(tt_module, "datetime", Clock)
    go = TimeRestriction(earliest=None, latest=None, catchup=False)
    first = tt.next_dagrun_info(last_automated_data_interval=None, restriction=go)
    # The window holding now, [T0+60s, T0+120s), its run and data interval 25 s early.
    assert first.run_after == T0 + 35 * S == first.logical_date
    assert tuple(first.data_interval) == (T0 + 35 * S, T0 + 95 * S)
    assert tt.window(first.data_interval) == (T0 + 60 * S, T0 + 120 * S)
    assert first.run_after.timezone_name == "Europe/Berlin"
    second = tt.next_dagrun_info(last_automated_data_interval=first.data_interval, restriction=go)
    assert tt.window(second.data_interval) == (T0 + 120 * S, T0 + 180 * S)
    # No catch-up: after a run that ended past its window, the window holding now.
    now = T0 + 400 * S
    late = tt.next_dagrun_info(last_automated_data_interval=second.data_interval, restriction=go)
    assert tt.window(late.data_interval) == (T0 + 360 * S, T0 + 420 * S)
    manual = tt.infer_manual_data_interval(run_after=pendulum.instance(T0 + 130 * S))
    assert tt.window(manual) == (T0 + 120 * S, T0 + 180 * S)
    assert not tt.periodic  # no backfill of cq_firings: a definition's own DAG has them
    dag = DAG(dag_id="t", schedule=tt, start_date=datetime(2024, 1, 1, tzinfo=UTC))
    again = DagSerialization.from_dict(DagSerialization.to_dict(dag)).timetable
    assert type(again).__name__ == "WindowTimetable" and again == tt


def test_a_definitions_dag_in_the_batched_form_is_unscheduled_but_backfills(airflow_home):
    from airflow.timetables.base import TimeRestriction

    from airflow_dags.dags import timetable_of

    definition = parsed()["blocked"]
    ticks = ticks_of(definition, timezone="UTC")
    tt = timetable_of(definition, timezone="UTC").unscheduled()
    for catchup in (True, False):
        scheduler = TimeRestriction(earliest=T0, latest=None, catchup=catchup)
        assert tt.next_dagrun_info(last_automated_data_interval=None, restriction=scheduler) is None
    lo, hi = T0, T0 + 300 * S
    restriction, infos, info = TimeRestriction(earliest=lo, latest=hi, catchup=True), [], None
    while info := tt.next_dagrun_info_v2(last_dagrun_info=info, restriction=restriction):
        infos.append(info)
    want = [f for f in ticks.between(lo, hi + 60 * S) if lo <= ticks.range_of(f)[0] <= hi]
    assert [i.run_after for i in infos] == want and len(want) > 10
    assert "fires in cq_firings" in tt.summary


def project(tmp_path, monkeypatch, sql: str, form: str | None):
    (tmp_path / "sql").mkdir(exist_ok=True)
    (tmp_path / "sql" / "defs.sql").write_text(sql)
    for var, value in {
        "CQ_SQL_DIR": tmp_path / "sql",
        "CQ_WAREHOUSE": tmp_path / "wh",
        "CQ_HOME": tmp_path / ".cq",
        "CQ_CONFIG": tmp_path / "none.toml",
    }.items():
        monkeypatch.setenv(var, str(value))
    if form is None:
        monkeypatch.delenv("CQ_AIRFLOW_FORM", raising=False)
    else:
        monkeypatch.setenv("CQ_AIRFLOW_FORM", form)


def many(n: int) -> str:
    head = "CREATE TABLE IF NOT EXISTS sensors (ts TIMESTAMP, device STRING, temperature DOUBLE);\n"
    return head + "".join(
        f"CREATE CQ q{i:03d} RESAMPLE EVERY 1m BEGIN\n"
        f"  SELECT count(temperature) AS n INTO q{i:03d}_out FROM sensors GROUP BY (1m)\nEND;\n"
        for i in range(n)
    )


@pytest.mark.parametrize(("n", "form", "batched"), [(30, None, False), (31, None, True), (31, "per_definition", False)])
def test_auto_batches_above_thirty_firings_a_minute(airflow_home, tmp_path, monkeypatch, n, form, batched):
    from airflow_dags.batch import BATCH_DAG_ID
    from airflow_dags.dags import build_dags

    project(tmp_path, monkeypatch, many(n), form)
    dags = build_dags()
    assert (BATCH_DAG_ID in dags) is batched and len(dags) == n + batched


def test_the_batched_form_has_cq_firings_and_each_definitions_dag_unscheduled(airflow_home, tmp_path, monkeypatch):
    from airflow_dags.batch import BATCH_DAG_ID, SINKS_ALIAS
    from airflow_dags.dags import build_dags

    project(tmp_path, monkeypatch, SQL, "batched")
    dags = build_dags()
    assert set(dags) == {BATCH_DAG_ID, "blocked", "dropping", "hourly", "ticking"}
    batch = dags[BATCH_DAG_ID]
    assert batch.timetable.cadence == 10 * S and batch.timetable.lead == 5 * S  # gcd(20s, 1h, 30s), clamped
    assert batch.max_active_runs == 1 and not batch.catchup and "batched" in batch.tags
    (task,) = batch.tasks
    assert [o.name for o in task.outlets] == [SINKS_ALIAS] and task.retries == 0
    for name in ("blocked", "dropping", "hourly", "ticking"):
        assert not dags[name].timetable.scheduled and "batched" in dags[name].tags, name

    monkeypatch.setenv("CQ_AIRFLOW_BATCH_EVERY", "60")
    assert build_dags()[BATCH_DAG_ID].timetable.cadence == 60 * S
    monkeypatch.setenv("CQ_AIRFLOW_FORM", "fused")
    dags = build_dags()
    assert "cq_load_errors" in dags and "CQ_AIRFLOW_FORM='fused'" in dags["cq_load_errors"].description
    assert dags["blocked"].timetable.scheduled  # the per-definition form meanwhile


def test_a_definition_is_stopped_while_its_own_dag_is_paused():
    from airflow_dags.batch_tasks import switches_off

    dags = {"on": SimpleNamespace(is_paused=False), "off": SimpleNamespace(is_paused=True)}

    def get_dag(dag_id):
        if dag_id not in dags:
            raise LookupError(f"The Dag with dag_id: `{dag_id}` was not found")  # not parsed yet: it fires
        return dags[dag_id]

    assert switches_off(["on", "off", "new"], get_dag) == {"off"}
