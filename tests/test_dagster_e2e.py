"""End to end on a real Dagster: dagster-daemon and dagster-webserver processes, a real Spark Connect
server, Delta tables fed while the test runs. Everything is observed through Dagster's GraphQL API
over HTTP (and the Delta tables on disk); see dagster_e2e_util for the stack."""

from __future__ import annotations

import json
import math
import time
from datetime import datetime, timedelta

import pyarrow as pa
from deltalake import DeltaTable

from cq_engine.run import Engine

from dagster_e2e_util import SLOW_LOCATION, SLOW_SECONDS, UTC, dagster_stack, parse_iso  # noqa: F401

EVERY = timedelta(seconds=5)
RANGE = timedelta(seconds=10)
IN_FLIGHT = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING"}
WAIT = 240  # seconds, per test; the definitions fire concurrently from the stack's start


def fire(run: dict) -> datetime:
    return parse_iso(run["tags"]["cq/fire_time"])


def floor5(ts: float) -> datetime:
    return datetime.fromtimestamp(math.floor(ts / 5) * 5, UTC)


def check_firing_tags(runs: list[dict], name: str, *, policy: str) -> None:
    """cq/* tags of every run agree with the definition (EVERY 5s, RANGE 10s) and with its run key."""
    for run in runs:
        tags = run["tags"]
        f, lo, hi = fire(run), parse_iso(tags["cq/range_start"]), parse_iso(tags["cq/range_end"])
        assert run["jobName"] == f"{name}_job"
        assert tags["cq/name"] == name and tags["cq/timeout_policy"] == policy
        assert tags["dagster/sensor_name"] == f"{name}_ticks"
        assert f.timestamp() % 5 == 0 and f.microsecond == 0, f"{f} is not a multiple of 5 s"
        assert (hi - lo, hi) == (RANGE, f), tags
        assert tags["dagster/run_key"] == f"{name}@{tags['cq/fire_time']}"
        # A firing is requested once it is due, never before.
        assert run["creationTime"] >= f.timestamp() - 0.001, (run["creationTime"], f)
    keys = [r["tags"]["dagster/run_key"] for r in runs]
    assert len(set(keys)) == len(keys), f"duplicate run keys: {sorted(keys)}"


def check_no_overlap(runs: list[dict]) -> None:
    """At most one run of the definition executes at any moment (started runs, by start time)."""
    started = sorted((r for r in runs if r["startTime"]), key=lambda r: r["startTime"])
    for a, b in zip(started, started[1:]):
        assert a["endTime"] is not None, f"{a['runId']} ({a['status']}) has not ended but {b['runId']} started"
        assert b["startTime"] >= a["endTime"], (f"{b['runId']} started at {b['startTime']} before "
                                                f"{a['runId']} ended at {a['endTime']}")


def consecutive(fires: list[datetime]) -> bool:
    return all(b - a == EVERY for a, b in zip(fires, fires[1:]))


# -- item 1: the sub-minute definition fires through the tick sensor ------------------------------
def test_fast_fires_every_5s_with_consistent_tags(dagster_stack):
    runs = dagster_stack.wait_for_runs("fast", successes=3, timeout=WAIT)
    statuses = {r["status"] for r in runs}
    assert statuses <= IN_FLIGHT | {"SUCCESS"}, statuses
    check_firing_tags(runs, "fast", policy="BLOCKED")
    fires = [fire(r) for r in runs]  # in creation order
    assert fires == sorted(fires) and consecutive(fires), f"firings lost or out of order: {fires}"
    check_no_overlap(runs)
    for run in runs:
        if run["status"] == "SUCCESS":
            assert run["creationTime"] <= run["startTime"] < run["endTime"]


def test_fast_sink_holds_the_windows_computed_from_the_source(dagster_stack):
    settings = dagster_stack.settings
    done = [r for r in dagster_stack.wait_for_runs("fast", successes=3, timeout=WAIT) if r["status"] == "SUCCESS"]
    ledger = pa.table(DeltaTable(settings.state_uri("firings")).scan()).to_pylist()
    entries = [e for e in ledger if e["definition"] == "fast"]
    assert all(e["status"] == "succeeded" for e in entries), [e["error"] for e in entries if e["error"]]
    by_fire = {e["fire_time"]: e for e in entries}
    for run in done:  # every SUCCESS run is one committed firing of its tagged range
        entry = by_fire[fire(run)]
        assert (entry["kind"], entry["range_start"], entry["range_end"]) == (
            "firing", parse_iso(run["tags"]["cq/range_start"]), parse_iso(run["tags"]["cq/range_end"]))
        assert entry["rows_written"] > 0 and entry["sink_version"] is not None

    # The sink as of the newest of those commits; each window holds what the last firing covering it
    # computed, from the source version that firing read (the feeder keeps appending meanwhile).
    version = max(by_fire[fire(r)]["sink_version"] for r in done)
    sink = pa.table(DeltaTable(settings.table_uri("fast_out"), version=version).scan()).to_pylist()
    committed = sorted((e for e in entries if e["sink_version"] <= version), key=lambda e: e["sink_version"])
    windows = sorted({parse_iso(r["tags"]["cq/range_start"]) + k * EVERY for r in done for k in range(2)})
    sources: dict[int, list[dict]] = {}
    expected: dict[tuple, tuple] = {}
    for start in windows:
        last = [e for e in committed if e["range_start"] <= start < e["range_end"]][-1]
        source_version = json.loads(last["source_versions"])["sensors"]
        if source_version not in sources:
            sources[source_version] = pa.table(DeltaTable(settings.table_uri("sensors"), version=source_version)
                                               .scan(columns=["ts", "device", "temperature"])).to_pylist()
        rows = sources[source_version]
        # Groups: the devices present in that firing's range (IoTDB: empty windows are rows too).
        devices = {r["device"] for r in rows if last["range_start"] <= r["ts"] < last["range_end"]}
        for device in devices:
            values = [r["temperature"] for r in rows if r["device"] == device and start <= r["ts"] < start + EVERY
                      and r["temperature"] is not None]
            expected[(start, device)] = (max(values) if values else None, len(values))
    actual = {(r["ts"], r["device"]): (r["m"], r["n"]) for r in sink if r["ts"] in set(windows)}
    assert len(expected) >= 3 * len(windows) and any(m is not None for m, _ in expected.values())
    assert actual == expected
    # Readings are one per device per second: a complete window holds 5 of them.
    assert max(n for _, n in expected.values()) == 5


# -- item 2: timeout policies, with firings slower (12 s) than EVERY (5 s) -------------------------
def test_blocked_firings_queue_and_run_one_at_a_time_in_order(dagster_stack):
    runs = dagster_stack.wait_for_runs("slow_blocked", successes=3, timeout=WAIT)
    check_firing_tags(runs, "slow_blocked", policy="BLOCKED")
    check_no_overlap(runs)
    by_fire = sorted(runs, key=fire)
    fires = [fire(r) for r in by_fire]
    assert consecutive(fires), f"BLOCKED lost firings: {fires}"  # every due firing has a run
    assert fires[-1] >= datetime.now(UTC) - 6 * EVERY, "the sensor stopped requesting firings"
    # In order: the runs that started are exactly the earliest firings, and started in firing order.
    started = [r for r in by_fire if r["startTime"]]
    assert started == by_fire[:len(started)], [(fire(r).time(), r["status"]) for r in by_fire]
    assert [r["startTime"] for r in started] == sorted(r["startTime"] for r in started)
    done = [r for r in started if r["status"] == "SUCCESS"]
    assert len(done) >= 3
    for run in done:
        assert run["endTime"] - run["startTime"] >= SLOW_SECONDS, "the failpoint did not slow the firing"
    # Queued: each later run existed while its predecessor ran, and started only after it ended.
    for a, b in zip(done, done[1:]):
        assert b["creationTime"] < a["endTime"] <= b["startTime"], (a, b)
    assert "QUEUED" in dagster_stack.observed["slow_blocked"]
    ticks = dagster_stack.ticks(SLOW_LOCATION, "slow_blocked_ticks")
    assert not [t for t in ticks if "DISCARD" in (t["skipReason"] or "")]
    assert not [t for t in ticks if t["status"] == "FAILURE"], [t["error"] for t in ticks if t["error"]]


def test_discard_skips_while_a_run_is_in_flight_and_catches_up(dagster_stack):
    runs = dagster_stack.wait_for_runs("slow_discard", successes=2, timeout=WAIT)
    ticks = dagster_stack.ticks(SLOW_LOCATION, "slow_discard_ticks")
    check_firing_tags(runs, "slow_discard", policy="DISCARD")
    check_no_overlap(runs)
    assert sum(r["status"] in IN_FLIGHT for r in runs) <= 1, [r["status"] for r in runs]
    assert not [t for t in ticks if t["status"] == "FAILURE"], [t["error"] for t in ticks if t["error"]]
    skipped = [t for t in ticks if t["status"] == "SKIPPED" and "DISCARD" in (t["skipReason"] or "")]
    assert skipped, [(t["status"], t["skipReason"]) for t in ticks]
    for tick in skipped:  # each DISCARD skip happened while a run was queued or running
        assert any(r["creationTime"] - 2 <= tick["timestamp"] <= (r["endTime"] or math.inf) for r in runs), tick
    done = sorted((r for r in runs if r["status"] == "SUCCESS"), key=fire)
    fires = sorted(fire(r) for r in runs)
    for a, b in zip(done, done[1:]):
        assert b["creationTime"] >= a["endTime"] - 0.5, "a DISCARD run was created while another was in flight"
        # The firings due while `a` ran were dropped, not queued: no run between the two...
        assert fire(b) - fire(a) >= 2 * EVERY and not [f for f in fires if fire(a) < f < fire(b)]
        # ...and `b` is the latest firing due once `a` finished (one step of slack for the evaluation).
        assert fire(b) >= floor5(a["endTime"]) - EVERY, (fire(b), a["endTime"])
        assert b["creationTime"] - fire(b).timestamp() < 3 * EVERY.total_seconds()


def test_cq_recalculate_via_dagster_launches_the_recalculate_job(dagster_stack, monkeypatch, capsys):
    """`cq recalculate --via-dagster` submits <name>_recalculate through the webserver's GraphQL API."""
    from cq_engine.cli import main

    settings = dagster_stack.settings
    for var, value in {"CQ_SQL_DIR": settings.sql_dir, "CQ_WAREHOUSE": settings.warehouse, "CQ_HOME": settings.home}.items():
        monkeypatch.setenv(var, value)
    end = floor5(time.time() - 60)
    start = end - timedelta(seconds=30)
    code = main(["recalculate", "fast", "--from", start.isoformat(), "--to", end.isoformat(),
                 "--via-dagster", f"127.0.0.1:{dagster_stack.web_port}"])
    out = capsys.readouterr().out
    assert code == 0 and "recalculate run" in out, out
    run_id = out.split("recalculate run ")[1].split()[0]
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        (run,) = [r for r in dagster_stack.runs("fast") if r["runId"] == run_id]
        if run["status"] in ("SUCCESS", "FAILURE", "CANCELED"):
            break
        time.sleep(2)
    assert run["status"] == "SUCCESS" and run["tags"].get("cq/recalculate") == "true"
    ledger = [e for e in Engine(settings=settings).ledger.entries("fast") if e.kind == "recalculate"]
    assert ledger and (ledger[-1].range_start, ledger[-1].range_end) == (start, end)
