"""End to end on a real Dagster: dagster-daemon and dagster-webserver processes, a real Spark Connect
server, Delta tables fed while the test runs. Everything is observed through Dagster's GraphQL API
over HTTP (and the Delta tables on disk); see dagster_e2e_util for the stack."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import time
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pyarrow as pa
from dagster_e2e_util import (
    BAD_STREAM,
    HIST_STREAM,
    HISTORY_CHUNK_ROWS,
    LL_STREAM,
    MAIN_LOCATION,
    SLOW_LOCATION,
    SLOW_SECONDS,
    STREAM,
    UTC,
    parse_iso,
)
from deltalake import DeltaTable
from streams_util import TYPES

from cq_engine.engine import Engine
from cq_engine.scheduling import batch_horizon, batch_lead
from cq_engine.scheduling.batch import window_of

EVERY = timedelta(seconds=5)
RANGE = timedelta(seconds=10)
IN_FLIGHT = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING"}
WAIT = 240  # seconds, per test; the definitions fire concurrently from the stack's start


def floor5(ts: float) -> datetime:
    return datetime.fromtimestamp(math.floor(ts / 5) * 5, UTC)


def done_at(stack, name: str, run: dict) -> float | None:
    """When ``run`` was done with ``name``: its last firing of ``name`` committed (ledger), or the run
    ended. A batch run goes on with other definitions after one of them is done, and that definition's
    next firings may then start in the next batch: it is no longer in flight."""
    last = run["firings"][name][-1]
    committed = [
        e.finished_at.timestamp()
        for e in stack.ledger(name)
        if e.kind == "firing" and e.status == "succeeded" and e.fire_time == last
    ]
    ends = [t for t in (*committed, run["endTime"]) if t is not None]
    return min(ends) if ends else None


def check_no_overlap(stack, name: str, runs: list[dict]) -> None:
    """BLOCKED across runs: a run computes its first firing of ``name`` (the ledger entry it wrote)
    only once the previous run is done with it; a pipelined run may start before that and wait for
    the commit. And at most two runs hold ``name`` at any moment (started runs, by start time)."""
    started = sorted((r for r in runs if r["startTime"]), key=lambda r: r["startTime"])
    entries = [e for e in stack.ledger(name) if e.kind == "firing" and e.status == "succeeded"]
    for a, b in pairwise(started):
        first = b["firings"][name][0]
        computed = [e.started_at.timestamp() for e in entries if e.fire_time == first]
        computed = [t for t in computed if t >= b["startTime"] - 0.5]  # by b itself, not an earlier attempt
        if not computed:
            continue
        end = done_at(stack, name, a)
        assert end is not None, f"{a['runId']} ({a['status']}) is not done with {name} but {b['runId']} computed it"
        assert min(computed) >= end - 0.5, (
            f"{b['runId']} computed {name} at {min(computed)} before {a['runId']} was done with it at {end}"
        )
    for a, _, c in zip(started, started[1:], started[2:], strict=False):
        end = done_at(stack, name, a)
        assert end is not None and c["startTime"] >= end - 0.5, f"{name} in three runs at once: {a['runId']}"


def consecutive(fires: list[datetime]) -> bool:
    return all(b - a == EVERY for a, b in pairwise(fires))


def check_batches(stack, name: str) -> list[dict]:
    """The batch runs holding ``name``'s firings: unique run keys, never two at once, each run's
    firings in order and on the 5 s grid, and first requests in firing order with no gap."""
    runs = stack.firing_runs(name)
    keys = [r["tags"]["dagster/run_key"] for r in runs]
    assert len(set(keys)) == len(keys), f"duplicate run keys: {sorted(keys)}"
    check_no_overlap(stack, name, runs)
    requested: list[datetime] = []
    for run in runs:
        fires = run["firings"][name]
        assert fires == sorted(fires) and all(f.timestamp() % 5 == 0 for f in fires), fires
        assert run["tags"]["dagster/sensor_name"] == "cq_firings" and run["tags"]["cq/batch"] == "true"
        # A run's first firing is requested at most its lead before it is due (CQ_BATCH_LEAD, for
        # EVERY 5s half of it; under the horizon, half the window), and its last lies in the horizon
        # window that lead reaches, never later; check_exactly_once checks that each executes only
        # once due.
        span = batch_horizon(EVERY)
        lead = batch_lead(EVERY, horizon=span).total_seconds()
        assert run["creationTime"] >= fires[0].timestamp() - lead - 0.001, (run["creationTime"], fires[0])
        reach = datetime.fromtimestamp(run["creationTime"] + lead, UTC)
        last = window_of(reach, span)[1] if span else reach + timedelta(microseconds=1)
        assert fires[-1] < last, (run["creationTime"], fires[-1], last)
        requested += [f for f in fires if f not in requested]
    assert requested == sorted(requested), f"{name}: firings requested out of order: {requested}"
    return runs


def main_location_env(stack, monkeypatch) -> None:
    """This process's `cq` commands use the main location's settings."""
    settings = stack.settings
    for var, value in {
        "CQ_SQL_DIR": settings.sql_dir,
        "CQ_WAREHOUSE": settings.warehouse,
        "CQ_HOME": settings.home,
    }.items():
        monkeypatch.setenv(var, value)


def main_location_cq(stack, monkeypatch, capsys):
    """`cq ARGS --dagster <the stack's webserver>` in this process with the main location's settings:
    returns its output; a non-zero exit fails the test with its error."""
    from cq_engine.cli.main import main

    main_location_env(stack, monkeypatch)

    def cq(*argv: str) -> str:
        code = main([*argv, "--dagster", f"127.0.0.1:{stack.web_port}"])
        out, err = capsys.readouterr()
        assert code == 0, err
        return out

    return cq


def check_exactly_once(stack, name: str, sink: str | None = None) -> list[datetime]:
    """Every firing of ``name`` from its first to its last succeeded firing succeeded exactly once
    (ledger), and its sink's asset shows one firing materialization for each (GraphQL)."""
    deadline = time.monotonic() + 60
    while True:  # a run reports a firing's materialization a moment after its ledger entry
        done = sorted(e.fire_time for e in stack.ledger(name) if e.status == "succeeded" and e.kind == "firing")
        mats = [m for m in stack.materializations(sink or f"{name}_out") if m["metadata"].get("cq/kind") == "firing"]
        ends = sorted(parse_iso(m["metadata"]["cq/range_end"]) for m in mats)
        if ends[: len(done)] == done or time.monotonic() > deadline:
            break
        time.sleep(2)
    if len(set(done)) != len(done):
        firings = [e for e in stack.ledger(name) if e.status == "succeeded" and e.kind == "firing"]
        raise AssertionError(f"{name}: firings committed twice\n{stack.ledger_twice(firings, lambda e: e.fire_time)}")
    # Requested up to CQ_BATCH_LEAD early, a firing still executes at or after its time.
    early = [e for e in stack.ledger(name) if e.kind == "firing" and e.started_at < e.fire_time]
    assert not early, f"{name}: firings executed before they were due: {early}"
    assert consecutive(done), f"{name}: firings missing between {done[0]} and {done[-1]}: {done}"
    assert ends[: len(done)] == done and len(set(ends)) == len(ends), (ends, done)
    return done


# -- the batched run model: continuous queries fire through the cq_firings sensor --------------------
def test_fast_fires_every_5s_in_batches_with_one_materialization_per_firing(dagster_stack):
    dagster_stack.wait_for_firings("fast", count=3, timeout=WAIT)
    runs = check_batches(dagster_stack, "fast")
    check_exactly_once(dagster_stack, "fast")
    ticks = dagster_stack.ticks(MAIN_LOCATION, "cq_firings")
    assert ticks and max(t["timestamp"] for t in ticks) >= time.time() - 120, "the cq_firings sensor stopped"
    for run in runs:
        assert run["jobName"] == "cq_firings_job" and {"fast_out"} <= {
            "/".join(a["path"]) for a in run["assetSelection"]
        }


def test_fast_sink_holds_the_windows_computed_from_the_source(dagster_stack):
    settings = dagster_stack.settings
    dagster_stack.wait_for_firings("fast", count=3, timeout=WAIT)
    entries = [e for e in dagster_stack.ledger("fast") if e.kind == "firing"]
    done = [e for e in entries if e.status == "succeeded"]
    for entry in done:  # every committed firing covers its 10 s range
        assert entry.range_end == entry.fire_time and entry.range_end - entry.range_start == RANGE
        assert entry.rows_written > 0 and entry.sink_version is not None

    # The sink as of the newest of those commits; each window holds what the last firing covering it
    # computed, from the source version that firing read (the feeder keeps appending meanwhile).
    version = max(e.sink_version for e in done)
    sink = pa.table(DeltaTable(settings.table_uri("fast_out"), version=version).scan()).to_pylist()
    committed = sorted((e for e in done if e.sink_version <= version), key=lambda e: e.sink_version)
    windows = sorted({e.range_start + k * EVERY for e in done for k in range(2)})
    sources: dict[int, list[dict]] = {}
    expected: dict[tuple, tuple] = {}
    for start in windows:
        last = [e for e in committed if e.range_start <= start < e.range_end][-1]
        source_version = last.source_versions["sensors"]
        if source_version not in sources:
            sources[source_version] = pa.table(
                DeltaTable(settings.table_uri("sensors"), version=source_version).scan(
                    columns=["ts", "device", "temperature"]
                )
            ).to_pylist()
        rows = sources[source_version]
        # Groups: the devices present in that firing's range (IoTDB: empty windows are rows too).
        devices = {r["device"] for r in rows if last.range_start <= r["ts"] < last.range_end}
        for device in devices:
            values = [
                r["temperature"]
                for r in rows
                if r["device"] == device and start <= r["ts"] < start + EVERY and r["temperature"] is not None
            ]
            expected[(start, device)] = (max(values) if values else None, len(values))
    actual = {(r["ts"], r["device"]): (r["m"], r["n"]) for r in sink if r["ts"] in set(windows)}
    assert len(expected) >= 3 * len(windows) and any(m is not None for m, _ in expected.values())
    assert actual == expected
    # Readings are one per device per second: a complete window holds 5 of them.
    assert max(n for _, n in expected.values()) == 5


def test_a_blocked_query_stopped_inside_its_batch_and_started_again_runs_every_firing_once(
    dagster_stack, monkeypatch, capsys
):
    """`cq stop` while a batch run holds a BLOCKED query's next firings (under the horizon, minutes
    of them) and `cq start` before that run ends: every firing it missed runs, in order, once, and
    it goes on (the sensor once followed that run with the next window, which waited for firings the
    run had left out, and the query fired nothing again)."""
    stack = dagster_stack
    cq = main_location_cq(stack, monkeypatch, capsys)
    every = EVERY.total_seconds()
    stack.wait_for_firings("fast", count=2, timeout=WAIT)
    stack.wait_until(
        "a started batch holding fast's firings for a while yet",
        lambda: [
            r
            for r in stack.firing_runs("fast")
            if r["status"] == "STARTED" and r["firings"]["fast"][-1].timestamp() > time.time() + 4 * every
        ],
        WAIT,
    )
    cq("stop", "fast")
    stopped = time.time()
    time.sleep(3 * every)
    cq("start", "fast")
    started = time.time()
    stack.wait_until(
        "fast to fire again past its start",
        lambda: [
            e
            for e in stack.ledger("fast")
            if e.kind == "firing" and e.status == "succeeded" and e.fire_time.timestamp() > started + 2 * every
        ],
        WAIT,
    )
    done = check_exactly_once(stack, "fast")  # from its first firing to its last: none missing, none twice
    assert done[0].timestamp() < stopped


def test_a_failing_firing_leaves_its_batch_neighbours_committed_and_is_retried(dagster_stack):
    stack = dagster_stack
    stack.wait_until(
        "a batch run failing on flaky",
        lambda: any(
            r["status"] == "FAILURE" and r["tags"].get("cq/failed") == "flaky" for r in stack.firing_runs("flaky")
        ),
        WAIT,
    )
    failed = [r for r in stack.firing_runs("flaky") if r["status"] == "FAILURE"]
    # fast's firings in those failed runs were committed by them, and never requested again.
    ledger = {e.fire_time: e for e in stack.ledger("fast") if e.status == "succeeded"}
    shared = [(r, f) for r in failed for f in r["firings"].get("fast", [])]
    assert shared, "flaky and fast never shared a batch"
    for run, fire_time in shared:
        assert fire_time in ledger, f"fast's firing {fire_time} in failed run {run['runId']} was not committed"
        again = [
            r for r in stack.firing_runs("fast") if r["runId"] != run["runId"] and fire_time in r["firings"]["fast"]
        ]
        assert not again, f"fast's firing {fire_time} was requested again by {[r['runId'] for r in again]}"
    first_failed = min(f for r in failed for f in r["firings"]["flaky"])
    # The operator fixes the table: flaky's firings from the first failed one on are retried, in order.
    stack.fix_flaky_source()
    fixed_at = datetime.now(UTC)
    deadline = time.monotonic() + 2 * WAIT  # a back-off, the batch queue, then the retried run itself
    while time.monotonic() < deadline:
        done = sorted(e.fire_time for e in stack.ledger("flaky") if e.status == "succeeded")
        if done and done[-1] >= fixed_at:
            break
        time.sleep(3)
    else:
        raise AssertionError(
            f"flaky never recovered: {[(r['status'], r['tags'].get('cq/attempt')) for r in stack.firing_runs('flaky')]}"
            f"\n{stack.diagnostics()}"
        )
    assert done[0] == first_failed and consecutive(done), done
    assert len(set(done)) == len(done)
    retried = [r for r in stack.firing_runs("flaky") if r["tags"]["cq/attempt"] != "0"]
    assert retried, "no batch retried flaky"
    check_batches(stack, "flaky")


# -- timeout policies, with firings slower (12 s) than EVERY (5 s) -----------------------------------
def test_blocked_firings_wait_for_their_run_and_all_run_in_order(dagster_stack):
    stack = dagster_stack
    stack.wait_for_firings("slow_blocked", count=3, timeout=WAIT)
    runs = check_batches(stack, "slow_blocked")
    done = check_exactly_once(stack, "slow_blocked", "blocked_out")
    # Held while its run ran, then requested together: some batch holds several of its firings.
    assert any(len(r["firings"]["slow_blocked"]) > 1 for r in runs), [r["firings"] for r in runs]
    requested = [f for r in runs for f in r["firings"]["slow_blocked"]]
    assert consecutive(sorted(set(requested))), "BLOCKED lost firings"
    for run in runs:
        if run["status"] == "SUCCESS":
            assert run["endTime"] - run["startTime"] >= SLOW_SECONDS * len(run["firings"]["slow_blocked"])
    ticks = stack.ticks(SLOW_LOCATION, "cq_firings")
    assert [t for t in ticks if "slow_blocked: BLOCKED holds" in (t["skipReason"] or "")] or any(
        len(r["firings"]["slow_blocked"]) > 1 for r in runs
    )
    assert not [t for t in ticks if t["status"] == "FAILURE"], [t["error"] for t in ticks if t["error"]]
    assert done[0] == runs[0]["firings"]["slow_blocked"][0]


def test_discard_skips_while_its_run_is_in_flight_and_catches_up(dagster_stack):
    stack = dagster_stack
    stack.wait_for_firings("slow_discard", count=2, timeout=WAIT)
    runs = check_batches(stack, "slow_discard")
    assert all(len(r["firings"]["slow_discard"]) == 1 for r in runs), [r["firings"] for r in runs]
    # At most one run is still busy with a slow_discard firing (a batch may go on with other definitions).
    busy = [r for r in runs if r["status"] in IN_FLIGHT and done_at(stack, "slow_discard", r) is None]
    assert len(busy) <= 1, [r["status"] for r in runs]
    committed = {e.fire_time for e in stack.ledger("slow_discard") if e.kind == "firing" and e.status == "succeeded"}
    done = [r for r in runs if r["firings"]["slow_discard"][0] in committed]
    for a, b in pairwise(done):
        fa, fb = a["firings"]["slow_discard"][0], b["firings"]["slow_discard"][0]
        end = done_at(stack, "slow_discard", a)
        assert end is not None and b["creationTime"] >= end - 0.5, (
            "a DISCARD firing was requested while one was in flight"
        )
        # The firings due while `a` ran were dropped, not queued...
        assert fb - fa >= 2 * EVERY
        # ...and `b` is the latest firing due once `a` finished (one step of slack for the evaluation).
        assert fb >= floor5(end) - EVERY, (fb, end)
    ticks = stack.ticks(SLOW_LOCATION, "cq_firings")
    skips = [t for t in ticks if "slow_discard: DISCARD skipped" in (t["skipReason"] or "")]
    logged = len(done) > 1  # skips in a tick that also requested a run are in its log, not its skip reason
    assert skips or logged, [(t["status"], t["skipReason"]) for t in ticks][:20]


def test_cq_stop_start_and_recalculate_find_a_renamed_translators_objects(dagster_stack, monkeypatch, capsys):
    """The slow location runs with CQ_TRANSLATOR=renamed_translator:Renamed: `cq stop/start` and
    `cq recalculate --via-dagster` with the same setting find <name>_switch and recalc_<name>."""
    from cq_engine.cli.main import main

    stack = dagster_stack
    settings = stack.slow_settings
    for var, value in {
        "CQ_SQL_DIR": settings.sql_dir,
        "CQ_WAREHOUSE": settings.warehouse,
        "CQ_HOME": settings.home,
        "CQ_TRANSLATOR": "renamed_translator:Renamed",
    }.items():
        monkeypatch.setenv(var, value)
    address = f"127.0.0.1:{stack.web_port}"
    assert main(["stop", "slow_discard", "--dagster", address]) == 0
    out = capsys.readouterr().out
    assert f"slow_discard: schedule slow_discard_switch in {SLOW_LOCATION} stopped" in out, out
    # A run requested before the sensor saw the stop may still hold its last firing: the run commits
    # it or, if it sees the stop first, leaves it out (tag cq/left_out); which one is a race, so only
    # what the sensor requests once it has seen the stop (a tick or two) is checked.
    stopped_at = time.time()
    time.sleep(4 * EVERY.total_seconds())
    assert not [
        r for r in stack.firing_runs("slow_discard") if r["creationTime"] > stopped_at + 2 * EVERY.total_seconds()
    ], "a stopped definition got a batch"
    assert main(["start", "slow_discard", "--dagster", address]) == 0
    assert "slow_discard_switch" in capsys.readouterr().out
    stack.wait_until(
        "a batch after the start",
        lambda: [
            r for r in stack.firing_runs("slow_discard") if r["creationTime"] > stopped_at + 4 * EVERY.total_seconds()
        ],
        WAIT,
    )

    end = floor5(time.time() - 60)
    code = main(
        [
            "recalculate",
            "slow_discard",
            "--from",
            (end - timedelta(seconds=10)).isoformat(),
            "--to",
            end.isoformat(),
            "--via-dagster",
            address,
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0 and "recalculate backfill" in out, (out, err)
    backfill = out.split("recalculate backfill ")[1].split()[0]
    stack.wait_until(
        "the recalculation",
        lambda: [r for r in stack.backfill_runs("slow_discard", backfill) if r["status"] == "SUCCESS"],
        WAIT,
    )
    # No recalculate job of its own: a backfill of its sink alone.
    (run,) = stack.backfill_runs("slow_discard", backfill)
    assert run["assetSelection"] == [{"path": ["discard_out"]}] and run["tags"]["cq/recalculate"] == "true"


BACKFILL_QUERY = (
    "query($id: String!) { partitionBackfillOrError(backfillId: $id) { ... on PartitionBackfill { title } } }"
)


def test_cq_recalculate_via_dagster_launches_a_backfill_of_its_sink_alone(dagster_stack, monkeypatch, capsys):
    """`cq recalculate --via-dagster` launches an asset backfill of the definition's sink alone (titled
    as a recalculation, the range in its tags) through the webserver's GraphQL API; its run recalculates."""
    from cq_engine.cli.main import main

    main_location_env(dagster_stack, monkeypatch)
    monkeypatch.delenv("CQ_TRANSLATOR", raising=False)
    end = floor5(time.time() - 60)
    start = end - timedelta(seconds=30)
    code = main(
        [
            "recalculate",
            "fast",
            "--from",
            start.isoformat(),
            "--to",
            end.isoformat(),
            "--via-dagster",
            f"127.0.0.1:{dagster_stack.web_port}",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0 and "recalculate backfill" in out, (out, err)
    backfill = out.split("recalculate backfill ")[1].split()[0]
    title = dagster_stack.graphql(BACKFILL_QUERY, {"id": backfill})["partitionBackfillOrError"]["title"]
    assert title == f"Recalculate fast [{start.isoformat()}, {end.isoformat()})", title
    dagster_stack.wait_until("the backfill's run", lambda: dagster_stack.backfill_runs("fast", backfill), WAIT)
    (run_id,) = [r["runId"] for r in dagster_stack.backfill_runs("fast", backfill)]
    run = dagster_stack.wait_run(run_id, WAIT)
    assert run["status"] == "SUCCESS" and run["tags"].get("cq/recalculate") == "true", (run["errors"], run)
    assert run["assetSelection"] == [{"path": ["fast_out"]}]
    assert "cq/batch" not in run["tags"] and run["tags"]["cq/recalculate_from"] == start.isoformat()
    (mat,) = [m for m in dagster_stack.materializations("fast_out") if m["runId"] == run_id]
    assert mat["metadata"]["cq/kind"] == "recalculate"
    ledger = [e for e in Engine(settings=dagster_stack.settings).ledger.entries("fast") if e.kind == "recalculate"]
    assert ledger and (ledger[-1].range_start, ledger[-1].range_end) == (start, end)


def test_one_definition_fires_and_recalculates_on_its_own_through_the_shared_job(dagster_stack):
    """What the UI's launchpad does for one of many definitions (GraphQL launchRun): cq_firings_job
    with the sink of `solo` alone selected runs a firing (tag cq/fire_time), its latest firing (no tag
    or config: "Materialize") and a recalculation (run config), each a materialization of solo_out."""
    stack = dagster_stack
    stack.wait_for_firings("solo", count=1, timeout=WAIT)
    fire = floor5(time.time() - 30)
    ids = {
        "firing": stack.launch(
            MAIN_LOCATION,
            "cq_firings_job",
            assets=["solo_out"],
            tags={"cq/name": "solo", "cq/fire_time": fire.isoformat()},
        ),
        "latest": stack.launch(MAIN_LOCATION, "cq_firings_job", assets=["solo_out"]),
        "recalculate": stack.launch(
            MAIN_LOCATION,
            "cq_firings_job",
            assets=["solo_out"],
            config={
                "ops": {
                    "cq_firings": {
                        "config": {
                            "recalculate_from": (fire - timedelta(seconds=20)).isoformat(),
                            "recalculate_to": fire.isoformat(),
                        }
                    }
                }
            },
        ),
    }
    for what, run_id in ids.items():
        run = stack.wait_run(run_id, WAIT)
        assert run["status"] == "SUCCESS", (what, run["errors"], run, stack.diagnostics())
        assert run["jobName"] == "cq_firings_job" and run["assetSelection"] == [{"path": ["solo_out"]}], run
        assert "cq/batch" not in run["tags"], run["tags"]
    mats = {m["runId"]: m["metadata"] for m in stack.materializations("solo_out")}
    assert all(len([m for m in stack.materializations("solo_out") if m["runId"] == i]) == 1 for i in ids.values())
    firing, latest, recalc = (mats[ids[k]] for k in ("firing", "latest", "recalculate"))
    assert firing["cq/kind"] == "firing" and parse_iso(firing["cq/range_end"]) == fire
    assert firing["cq/range_start"] and parse_iso(firing["cq/range_start"]) == fire - RANGE
    assert latest["cq/kind"] == "firing" and parse_iso(latest["cq/range_end"]) >= fire + timedelta(seconds=25)
    assert recalc["cq/kind"] == "recalculate"
    assert (parse_iso(recalc["cq/range_start"]), parse_iso(recalc["cq/range_end"])) == (
        fire - timedelta(seconds=20),
        fire,
    )
    # The engine's ledger: the firing at `fire` and the recalculation, with the rows they wrote.
    ledger = stack.ledger("solo")
    assert [e for e in ledger if e.kind == "firing" and e.fire_time == fire and e.status == "succeeded"]
    assert [
        e
        for e in ledger
        if e.kind == "recalculate" and (e.range_start, e.range_end) == (fire - timedelta(seconds=20), fire)
    ]


# -- item 3: a window-triggered stream: sensor runs, cq stop/start --ignore-untreated, pause/resume --
STREAM_T0 = datetime(2026, 1, 1, tzinfo=UTC)  # event time 0 of the rows the test appends (5 s aligned)
WIDTH = 5  # INTERVAL(5s) SLIDING(5s), WATERMARK(1s): see dagster_e2e_util.STREAM_SQL
METER_IDS = ("m1", "m2")
STREAM_WAIT = 180


def at(seconds: int) -> datetime:
    return STREAM_T0 + timedelta(seconds=seconds)


def append_meters(engine: Engine, seconds: range, *, table: str = "meters") -> int:
    """One reading per meter per second in ``seconds`` (event time), in one commit; its version."""
    rows = [(at(s), m, round(s % 7 + 0.5 * i, 2)) for s in seconds for i, m in enumerate(METER_IDS)]
    n = len(rows)
    data = {
        "ts": [r[0] for r in rows],
        "tbname": [r[1] for r in rows],
        "current": [r[2] for r in rows],
        "voltage": [220] * n,
        "status": [0] * n,
        "location": ["e2e"] * n,
    }
    return engine.storage.append(table, pa.table({k: pa.array(v, TYPES[k]) for k, v in data.items()}))


def closed_windows(settings, until: int, *, table: str = "meters") -> dict[tuple, tuple]:
    """Independent computation over the table: (tbname, window start) -> (count, avg current) of every
    5 s window ending at or before event time ``until``."""
    rows = pa.table(DeltaTable(settings.table_uri(table)).scan(columns=["ts", "tbname", "current"])).to_pylist()
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        k = (r["ts"] - STREAM_T0) // timedelta(seconds=WIDTH)
        if (k + 1) * WIDTH <= until:
            groups.setdefault((r["tbname"], at(k * WIDTH)), []).append(r["current"])
    return {key: (len(v), round(sum(v) / len(v), 6)) for key, v in groups.items()}


def stream_sink(settings, stream: str = STREAM) -> dict[tuple, tuple]:
    uri = settings.table_uri(f"{stream}_out")
    if not DeltaTable.is_deltatable(uri):
        return {}
    return {
        (r["tbname"], r["_twstart"]): (r["n"], round(r["c"], 6)) for r in pa.table(DeltaTable(uri).scan()).to_pylist()
    }


def wait_stream(stack, required: set, *, version: int, timeout: float = STREAM_WAIT) -> tuple[list[dict], dict]:
    """Poll until the sink holds the ``required`` windows, the stream's cursor in ``cq_streams`` has
    reached ``version`` (the evaluation that computed them is recorded: its materializations too), and
    no run holding its works failed. Returns its sink's materializations and the sink."""
    deadline = time.monotonic() + timeout
    sink: dict = {}
    while time.monotonic() < deadline:
        stack.check_alive()
        failed = [r["runId"] for r in stack.stream_runs(STREAM) if r["status"] == "FAILURE"]
        assert not failed, f"{STREAM}: failed runs {failed}\n{stack.diagnostics()}"
        sink = stream_sink(stack.settings)
        seen = stack.stream_cursor(MAIN_LOCATION, STREAM)[1]
        if required <= sink.keys() and seen is not None and seen >= version:
            return stack.materializations(f"{STREAM}_out"), sink
        time.sleep(2)
    raise AssertionError(
        f"{STREAM}: missing windows {sorted(required - sink.keys())} after {timeout:.0f}s; cursor "
        f"{stack.stream_cursor(MAIN_LOCATION, STREAM)}\n{stack.diagnostics()}"
    )


def test_stream_sensor_runs_and_cq_stop_start_pause_resume(dagster_stack, monkeypatch, capsys):
    stack, settings = dagster_stack, dagster_stack.settings
    engine, sensor = Engine(settings=settings), f"{STREAM}_ticks"
    assert stack.sensor_state(MAIN_LOCATION, sensor)[0] == "RUNNING"  # its switch
    cq = main_location_cq(stack, monkeypatch, capsys)

    def state() -> tuple[str, int | None]:  # the switch, and the stream's cursor in cq_streams
        return stack.stream_cursor(MAIN_LOCATION, STREAM)

    # The sensor's first evaluation creates its cursor on the empty table: later rows are real time.
    stack.wait_until(f"{sensor}'s first evaluation", lambda: state()[1] is not None, 60)

    # Running: the sensor computes the commit's work, closing the windows its watermark (21 - 1 s) closes.
    v_a = append_meters(engine, range(0, 22))
    runs, sink = wait_stream(stack, set(closed_windows(settings, 20)), version=v_a)
    assert sink == closed_windows(settings, 20) and len(sink) == 4 * len(METER_IDS)

    # cq stop: the sensor stops in Dagster and evaluates no more (its cursor stays at A's version).
    assert f"{STREAM}: sensor {sensor} in {MAIN_LOCATION} stopped" in cq("stop", STREAM)
    assert state() == ("STOPPED", v_a)
    v_b = append_meters(engine, range(30, 52))  # written while stopped: closes [30 s, 50 s)
    for _ in range(7):  # longer than the sensor's 2 s interval
        time.sleep(1)
        assert state() == ("STOPPED", v_a)
    assert len(stack.materializations(f"{STREAM}_out")) == len(runs)

    # cq start --ignore-untreated: the cursor moves past B, so B is never treated (the switch hands the
    # new cursor to cq_streams, which takes it at its next evaluation).
    assert "running (data written while stopped skipped)" in cq("start", STREAM, "--ignore-untreated")
    stack.wait_until("cq_streams to take the new cursor", lambda: state() == ("RUNNING", v_b), 60)
    v_c = append_meters(engine, range(70, 92))
    required = set(closed_windows(settings, 20)) | {k for k in closed_windows(settings, 90) if k[1] >= at(70)}
    runs, sink = wait_stream(stack, required, version=v_c)
    untreated = {k for k in closed_windows(settings, 50) if k[1] >= at(30)}
    leaked = sorted(untreated & sink.keys())
    assert leaked == [], f"windows closed by data written while stopped were computed: {leaked}"

    # cq pause / cq resume (no flag): what was written while paused is processed after the resume.
    assert "stopped" in cq("pause", STREAM)
    assert state() == ("STOPPED", v_c)
    v_d = append_meters(engine, range(110, 132))
    assert state() == ("STOPPED", v_c)
    out = cq("resume", STREAM)
    assert "running" in out and "skipped" not in out
    required |= {k for k in closed_windows(settings, 130) if k[1] >= at(90)}
    runs, sink = wait_stream(stack, required, version=v_d)

    # One computation per commit the sensor treated (none for B), each a materialization of the sink
    # (computed in the sensor: no run) carrying what it computed.
    assert [json.loads(m["metadata"]["cq/source_versions"]) for m in runs] == [{"meters": v} for v in (v_a, v_c, v_d)]
    for mat in runs:
        meta = mat["metadata"]
        assert not mat["runId"] and (meta["cq/kind"], meta["cq/computed_in"]) == ("realtime", "sensor")
        assert parse_iso(meta["cq/range_start"]) < parse_iso(meta["cq/range_end"])
    assert stack.stream_runs(STREAM) == []
    ledger = Engine(settings=settings).ledger.entries(STREAM)
    assert [(e.kind, e.status) for e in ledger] == [("realtime", "succeeded")] * 3
    # The sink: every window it holds is what the table holds there; every closed window is in it except
    # those B closed (untreated) and the two B and A's last rows straddle (written or not, either is right).
    everything = closed_windows(settings, 130)
    assert sink.keys() <= everything.keys() and sink == {k: everything[k] for k in sink}
    straddling = {(m, at(s)) for m in METER_IDS for s in (20, 50)}
    assert everything.keys() - sink.keys() - untreated - straddling == set()


def test_low_latency_calc_stream_is_computed_in_its_sensor_without_a_run(dagster_stack):
    # LOW_LATENCY_CALC: "computation starts immediately after a trigger". The sensor computes the
    # windows a commit closes itself (no run to launch); each shows as a materialization of the sink.
    stack, settings = dagster_stack, dagster_stack.settings
    engine = Engine(settings=settings)
    stack.wait_until(
        f"{LL_STREAM}'s first evaluation", lambda: stack.stream_cursor(MAIN_LOCATION, LL_STREAM)[1] is not None, 60
    )
    append_meters(engine, range(0, 22), table="meters_ll")
    append_meters(engine, range(22, 42), table="meters_ll")
    expected = closed_windows(settings, 40, table="meters_ll")
    assert len(expected) == 8 * len(METER_IDS)
    stack.wait_until(
        f"{LL_STREAM}'s sink holds the closed windows",
        lambda: expected.keys() <= stream_sink(settings, LL_STREAM).keys(),
        STREAM_WAIT,
    )
    sink = stream_sink(settings, LL_STREAM)
    assert {k: sink[k] for k in expected} == expected
    assert stack.runs(LL_STREAM) == []  # no Dagster run: the sensor did the work
    # The sensor writes the sink during its evaluation; the daemon records the materializations the
    # evaluation returns only after it ends.
    stack.wait_until(f"{LL_STREAM}'s materializations", lambda: stack.materializations(f"{LL_STREAM}_out"), STREAM_WAIT)
    mats = stack.materializations(f"{LL_STREAM}_out")
    assert mats and all(m["metadata"].get("cq/computed_in") == "sensor" and not m["runId"] for m in mats), mats
    ledger = Engine(settings=settings).ledger.entries(LL_STREAM)
    assert ledger and {(e.kind, e.status) for e in ledger} == {("realtime", "succeeded")}


def attempt_of(run: dict) -> int:
    return int(run["tags"]["cq/attempt"])


def test_a_failing_stream_holds_back_no_other_and_is_retried_alone_until_it_succeeds(dagster_stack):
    import shutil

    from deltalake import write_deltalake

    stack, settings = dagster_stack, dagster_stack.settings
    engine = Engine(settings=settings)
    stack.wait_until(
        f"{BAD_STREAM}'s first evaluation", lambda: stack.stream_cursor(MAIN_LOCATION, BAD_STREAM)[1] is not None, 60
    )
    # Its sink exists with columns its query cannot fill: every work of it fails.
    sink_uri = settings.table_uri(f"{BAD_STREAM}_out")
    write_deltalake(
        sink_uri,
        pa.table({"_twstart": pa.array([STREAM_T0], pa.timestamp("us", tz="UTC")), "n": [0], "tbname": ["x"]}),
    )
    version = append_meters(engine, range(0, 22), table="meters_bad")

    def failed_runs() -> list[dict]:
        return [r for r in stack.stream_runs(BAD_STREAM) if r["status"] == "FAILURE"]

    # The sensor's failure goes to a run of cq_streams_job; it fails naming the stream (its error in the
    # run), and is requested again, alone, after a back-off, one attempt more.
    stack.wait_until(f"a failed run of {BAD_STREAM}", failed_runs, STREAM_WAIT * 2)
    first = failed_runs()[0]
    assert first["tags"].get("cq/failed") == BAD_STREAM and first["tags"].get("cq/name") == BAD_STREAM, first
    assert f"table '{BAD_STREAM}_out' has" in stack.run_log(first["runId"])  # its error, in the run

    def retries() -> list[dict]:
        attempt = int(first["tags"]["cq/attempt"])
        return [r for r in stack.stream_runs(BAD_STREAM) if int(r["tags"]["cq/attempt"]) > attempt]

    stack.wait_until(f"{BAD_STREAM} requested again", retries, STREAM_WAIT)
    assert retries()[0]["works"] == first["works"] and attempt_of(first) >= 1
    # Meanwhile the others go on in the sensor.
    append_meters(engine, range(200, 222), table="meters_ll")
    live = {k for k in closed_windows(settings, 220, table="meters_ll") if k[1] >= at(200)}
    stack.wait_until(
        f"{LL_STREAM}'s windows while {BAD_STREAM} fails",
        lambda: live <= stream_sink(settings, LL_STREAM).keys(),
        STREAM_WAIT,
    )
    assert not [r for r in stack.stream_runs(LL_STREAM) if r["status"] == "FAILURE"]
    # Repaired (the table goes), the next retry commits its windows, once.
    shutil.rmtree(sink_uri)
    expected = closed_windows(settings, 20, table="meters_bad")
    stack.wait_until(
        f"{BAD_STREAM}'s retried windows", lambda: stream_sink(settings, BAD_STREAM) == expected, STREAM_WAIT * 2
    )

    def done() -> list:  # the ledger records a work just after its sink commit
        return [(e.kind, e.source_versions) for e in stack.ledger(BAD_STREAM) if e.status == "succeeded"]

    stack.wait_until(f"{BAD_STREAM}'s ledger entry", done, 60)
    assert done() == [("realtime", {"meters_bad": version})]
    stack.wait_until(
        f"{BAD_STREAM}'s successful run",
        lambda: stack.stream_runs(BAD_STREAM)[-1]["status"] == "SUCCESS",
        STREAM_WAIT * 2,
    )


# -- history in a batched run: live windows go on beside it; a daemon killed mid-round loses nothing --
HIST_T0 = STREAM_T0 - timedelta(hours=1)  # hist_src's event times: 40 minutes of history


def test_history_runs_beside_live_windows_and_a_daemon_killed_mid_round_computes_each_window_once(dagster_stack):
    from deltalake import write_deltalake

    stack, settings = dagster_stack, dagster_stack.settings
    engine = Engine(settings=settings)
    seconds = range(0, 40 * 60)
    rows = [
        (HIST_T0 + timedelta(seconds=s), m, round(s % 7 + 0.5 * i, 2)) for s in seconds for i, m in enumerate(METER_IDS)
    ]
    write_deltalake(
        settings.table_uri("hist_src"),
        pa.table(
            {
                "ts": pa.array([r[0] for r in rows], pa.timestamp("us", tz="UTC")),
                "tbname": [r[1] for r in rows],
                "current": [r[2] for r in rows],
            }
        ),
    )
    chunks = len(rows) // HISTORY_CHUNK_ROWS  # about this many history works, in one run

    def history_done() -> list:
        return [e for e in stack.ledger(HIST_STREAM) if e.kind == "history" and e.status == "succeeded"]

    # The sensor finds the table, plans its history in chunks and hands them to one run of cq_streams_job.
    stack.wait_until(
        f"{HIST_STREAM}'s history run to commit its first chunks", lambda: len(history_done()) >= 2, STREAM_WAIT * 3
    )
    (run,) = stack.stream_runs(HIST_STREAM)
    assert run["jobName"] == "cq_streams_job" and run["tags"]["cq/work_kind"] == "history"
    assert len(run["works"]) >= chunks // 2, len(run["works"])
    # Live windows of another stream are computed in the sensor meanwhile, not after the history.
    append_meters(engine, range(300, 322), table="meters_ll")
    live = {k for k in closed_windows(settings, 320, table="meters_ll") if k[1] >= at(300)}
    stack.wait_until(
        f"{LL_STREAM}'s live windows", lambda: live <= stream_sink(settings, LL_STREAM).keys(), STREAM_WAIT * 2
    )
    assert len(history_done()) < len(run["works"]), "the history run ended before the live windows were computed"

    # The daemon dies in the middle of the round (the run goes on in its own process); windows closed
    # while it is down are computed after its restart, each exactly once.
    stack.kill_daemon()
    assert len(history_done()) < len(run["works"]), "the history round ended before the daemon was killed"
    v_down = append_meters(engine, range(400, 422))
    time.sleep(5)
    stack.start_daemon()
    stack.wait_until(f"{HIST_STREAM}'s history", lambda: len(history_done()) >= len(run["works"]), STREAM_WAIT * 4)
    stack.wait_until(
        f"{STREAM} after the restart",
        lambda: (stack.stream_cursor(MAIN_LOCATION, STREAM)[1] or 0) >= v_down,
        STREAM_WAIT,
    )
    done = history_done()
    ranges = [(e.range_start, e.range_end) for e in done]
    assert len(ranges) == len(set(ranges)) == len(run["works"]), "a history chunk was computed twice"
    assert [r["runId"] for r in stack.stream_runs(HIST_STREAM)] == [run["runId"]]  # not requested again
    # Closed at creation: every window ending by the history's watermark (its newest row - 1 s).
    watermark = int((HIST_T0 - STREAM_T0).total_seconds()) + len(seconds) - 2
    assert stream_sink(settings, HIST_STREAM) == closed_windows(settings, watermark, table="hist_src")
    ledger = [e for e in stack.ledger(STREAM) if e.status == "succeeded"]

    def work(e) -> tuple:
        return (e.kind, e.range_start, e.range_end, tuple(e.source_versions.items()))

    keys = [work(e) for e in ledger]
    assert len(keys) == len(set(keys)), "a stream work was recorded twice across the daemon restart\n" + (
        stack.ledger_twice(ledger, work)
    )


# -- a run worker that died unnoticed: run monitoring fails its run, its firings are retried once ------
def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_run_worker_that_died_unnoticed_is_failed_by_run_monitoring_and_its_firings_land_once(dagster_stack):
    """A PostgreSQL outage kills a run worker and the code server's own check of it (docs/operations/guarantees.md,
    after a crash or restart). Here: the slow location's code server is frozen (SIGSTOP) while its
    run worker is SIGKILLed, so only the daemon's run monitoring, through CQRunLauncher's health check,
    can fail the run; then the batch sensor retries the firings it had not committed."""
    stack = dagster_stack
    server = stack.procs["slow_code_server"].pid
    found: dict = {}

    def a_started_run() -> bool:
        """A run of slow_blocked's firings that has started and not committed all of them."""
        committed = {e.fire_time for e in stack.ledger("slow_blocked") if e.status == "succeeded"}
        for run in stack.firing_runs("slow_blocked"):
            if run["status"] == "STARTED" and set(run["firings"]["slow_blocked"]) - committed:
                pids = re.findall(r"Started process for run \(pid: (\d+)\)", stack.run_log(run["runId"]))
                if pids and _ppid(int(pids[0])) == server:  # the worker, a child of the code server
                    found.update(run=run, pid=int(pids[0]), committed=sorted(committed))
                    return True
        return False

    stack.wait_until("a batch run of slow_blocked in flight", a_started_run, WAIT)
    run, pid = found["run"], found["pid"]
    os.kill(server, signal.SIGSTOP)
    try:
        os.kill(pid, signal.SIGKILL)  # a firing sleeps 12 s before its commit: `lost` has not committed
        killed_at = time.time()
        ended = stack.wait_run(run["runId"], 180)  # run monitoring polls every 30 s (cq dev's dagster.yaml)
    finally:
        os.kill(server, signal.SIGCONT)
    assert ended["status"] == "FAILURE", ended
    log = stack.run_log(run["runId"])
    assert "Detected run worker status NOT_FOUND" in log and f"run worker (pid {pid}) exited without" in log, log
    # The sensor requests its firings again from the first one that had not committed, in a later run.
    committed = {e.fire_time for e in stack.ledger("slow_blocked") if e.status == "succeeded"}
    lost = [f for f in run["firings"]["slow_blocked"] if f not in committed]
    assert lost, (run["firings"]["slow_blocked"], found["committed"])
    again = stack.wait_for_firings("slow_blocked", count=1, timeout=WAIT, after=lost[0] - timedelta(microseconds=1))
    assert lost[0] in {e.fire_time for e in again}, again
    retry = [r for r in stack.firing_runs("slow_blocked") if lost[0] in r["firings"]["slow_blocked"]]
    assert len(retry) >= 2 and retry[0]["runId"] == run["runId"], retry
    assert retry[1]["creationTime"] >= killed_at and int(retry[1]["tags"]["cq/attempt"]) >= 1, retry[1]
    check_exactly_once(stack, "slow_blocked", "blocked_out")
    sink = pa.table(DeltaTable(stack.settings.table_uri("blocked_out")).scan(columns=["ts", "device"])).to_pylist()
    keys = [(r["ts"], r["device"]) for r in sink]
    assert len(keys) == len(set(keys)), "blocked_out holds a window twice"


# -- last, as it restarts the daemon: no firing lost or repeated across a daemon restart --------------
def test_every_firing_due_while_the_daemon_was_down_runs_exactly_once_after_its_restart(dagster_stack):
    stack = dagster_stack
    stack.wait_for_firings("fast", count=2, timeout=WAIT)
    stack.kill_daemon()
    killed_at = datetime.now(UTC)
    time.sleep(4 * EVERY.total_seconds())  # at least three firings fall due with no daemon
    stack.start_daemon()
    restarted = datetime.now(UTC)
    # A restarted daemon starts, evaluates its sensors and launches a batch (a process and a Spark
    # session) behind the runs already queued: at a load average near 20 that took over WAIT.
    stack.wait_for_firings("fast", count=1, timeout=2 * WAIT, after=restarted)
    done = check_exactly_once(stack, "fast")  # consecutive from the first firing on, each once
    missed = [f for f in done if killed_at < f <= restarted]
    assert len(missed) >= 3, (killed_at, restarted, done)
    check_batches(stack, "fast")
    # DISCARD after the restart: only the latest due firing, never the backlog.
    stack.wait_until(
        "slow_discard after the restart",
        lambda: [r for r in stack.firing_runs("slow_discard") if r["creationTime"] > restarted.timestamp()],
        WAIT,
    )
    assert all(len(r["firings"]["slow_discard"]) == 1 for r in stack.firing_runs("slow_discard"))
