"""The Airflow adapter's batched form under a real Airflow 3 (``make cluster-test``; marker ``cluster``):
``CQ_AIRFLOW_FORM=batched``, the stack of ``tests/test_airflow_stack.py`` (scheduler with the
LocalExecutor, DAG processor, triggerer, API server, PostgreSQL, a warm Spark Connect server, a fed
warehouse of Delta tables).

Two continuous queries (BLOCKED, DISCARD) and a PERIOD stream fire through the one DAG ``cq_firings``
for a few minutes; both queries are stopped for a while by pausing their own DAGs
(``cq pause --via-airflow``). Checked through Airflow's REST API and the sinks: every ``cq_firings``
run succeeded and its data interval is one aligned window; the definitions' own DAGs ran nothing on a
schedule; every firing is in the ledger once, BLOCKED and the PERIOD stream without a gap, BLOCKED ran
what came due while it was stopped, late and in order, DISCARD at most the latest of those; each
committed firing is an asset event of its sink (through the alias ``cq_firings_sinks``) carrying the
ledger's range and source versions; the sinks equal pyarrow's computation at the source version each
firing read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from test_airflow_stack import (
    DAGS,
    EVERY,
    SINKS,
    SQL,
    cq_sinks_match_their_sources,
    dag,
    fired,
    firings_once,
    ledger,
    pause_a_while,
    running,
    runs,
    t,
    wait_for,
)

from cq_engine.catalog import load_catalog
from cq_engine.schedule.ticks import ticks_of
from cq_engine.scheduling import batch_lead
from cq_engine.times import iso

pytestmark = pytest.mark.cluster

BATCH = "cq_firings"
NAMES = DAGS  # here scheduled by cq_firings alone
# The continuous queries and the PERIOD stream of the per-definition test, without its window streams.
BATCHED_SQL = SQL.split("-- Window-triggered")[0]


def window_runs(s, cutoff: datetime) -> list[dict]:
    return [r for r in runs(s, BATCH) if t(r["run_after"]) <= cutoff]


def settled(s, cutoff: datetime) -> bool:
    return not any(r["state"] in ("queued", "running") for r in window_runs(s, cutoff))


def test_the_batched_form_fires_every_definition_through_one_dag(tmp_path):
    with running(tmp_path, BATCHED_SQL, (BATCH, *NAMES), env={"CQ_AIRFLOW_FORM": "batched"}) as s:
        defs = {d.name: d for d in load_catalog(s.settings.sql_dir).definitions}
        ticks = {name: ticks_of(defs[name], timezone="UTC") for name in NAMES}
        assert dag(s, BATCH)["is_paused"] is False
        for name in NAMES:
            wait_for(f"{name}'s first firing", lambda n=name: fired(s, n), timeout=400, stack=s)

        # Both queries stopped by pausing their DAGs: cq_firings leaves them out until they are on again.
        due, resumed_at = pause_a_while(s, ticks, wait=NAMES)
        s.stop_feed.set()
        cutoff = datetime.now(UTC)
        wait_for("cq_firings' runs due so far to end", lambda: settled(s, cutoff), timeout=400, stack=s)

        # Airflow: cq_firings' runs, one per aligned window, every one succeeded; the definitions' own
        # DAGs (a backfill's, a manual run's, the switch) ran nothing on a schedule.
        window = runs(s, BATCH)
        done = window_runs(s, cutoff)
        assert len(done) >= 6 and all(r["state"] == "success" for r in done), [
            (r["dag_run_id"], r["state"]) for r in done
        ]
        lead = batch_lead(EVERY, "DISCARD")  # runs are created one lead before their window (the data interval)
        for r in done:
            lo, hi = t(r["data_interval_start"]), t(r["data_interval_end"])
            assert hi - lo == EVERY and (lo + lead).timestamp() % EVERY.total_seconds() == 0, (r, lead)
            assert r["run_type"] == "scheduled", r
        for name in NAMES:
            assert not runs(s, name), f"{name}'s own DAG ran: {runs(s, name)}"

        # The ledger: every firing once; BLOCKED and PERIOD without a gap; BLOCKED ran what came due
        # while it was stopped, after it was on again and in order; DISCARD at most the latest of them.
        entries = {name: ledger(s).entries(name) for name in NAMES}
        succeeded = [e for name in NAMES for e in firings_once(name, entries[name], due)]
        blocked = fired(s, "blocked_cq")
        assert [f for f in blocked if f in due] == due, (due, blocked)
        # The first of them may run on time: a window run planned before the pause (created one lead
        # early) keeps its firings (docs/airflow.md, Known limits); the later ones waited.
        started = {e.fire_time: e.started_at for e in entries["blocked_cq"]}
        assert all(started[f] >= resumed_at - timedelta(seconds=5) for f in due[1:]), (due, started)
        assert len([f for f in fired(s, "discard_cq") if f in due[1:]]) <= 1, due

        # Each committed firing is an asset event of its sink, from cq_firings, with the ledger's record.
        events = s.client.get(f"/api/v2/assets/events?source_dag_id={BATCH}&limit=1000")["asset_events"]
        reported = sorted(
            (e["extra"]["name"], e["extra"]["fire_time"], e["extra"]["range_start"], e["extra"]["range_end"])
            for e in events
        )
        assert all(e["name"] == SINKS[e["extra"]["name"]] for e in events), events
        ran = {r["dag_run_id"] for r in window}
        assert {e["source_run_id"] for e in events} <= ran, events
        assert reported == sorted(
            (e.definition, iso(e.fire_time), iso(e.range_start), iso(e.range_end)) for e in succeeded
        ), (reported, succeeded)

        # The sinks: each firing's rows as pyarrow computes them at the source version it read.
        cq_sinks_match_their_sources(s)
