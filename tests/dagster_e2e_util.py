"""A real Dagster stack for the end-to-end tests (test_dagster_e2e.py, test_dagster_ui.py).

One temp project, one Spark Connect server, one DAGSTER_HOME written by ``write_dagster_home``, and:

- ``dagster-daemon run`` and ``dagster-webserver`` on a workspace with two code locations:
  ``cq_main`` (module ``dagster_defs``, managed by Dagster, as in the repo's workspace.yaml) holding
  the sub-minute ``fast`` definition and the ``meter_5s`` stream (its table ``meters`` is fed by
  the stream test only), and ``cq_slow``: a code server we start ourselves
  (``dagster api grpc``) on a second sql dir holding a BLOCKED and a DISCARD definition. Only that
  server's environment carries ``CQ_FAILPOINT=sleep-before-commit:12``; runs are launched by the code
  server of their location and inherit its environment, so only the slow definitions are slow.
- a background thread appending fresh sensor readings every two seconds.

Every process runs in its own session; ``Stack.stop`` kills the process groups, then any process
left whose environment names our DAGSTER_HOME, then the Spark server, and reports leftovers.
The stack is shared by the test modules that use the ``dagster_stack`` fixture and stopped after
the last of them (see ``release``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import requests
from netutil import free_port, port_open
from procutil import command_line, live_pids, spawn_logged
from streams_util import METERS

from cq_engine import spark as cq_spark
from cq_engine.cli.dev import dagster_env, feed_forever, stop_process_group, write_dagster_home
from cq_engine.cli.feed import floor_time, sensor_rows
from cq_engine.config import Settings
from cq_engine.engine import Engine

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SLOW_SECONDS = 12  # the failpoint's sleep in the slow location; its definitions fire every 5 s
FEED_EVERY = 2.0  # seconds between appended batches
READING_EVERY = timedelta(seconds=1)  # one reading per device per second
BACKFILL = timedelta(minutes=15)
MAIN_LOCATION, SLOW_LOCATION = "cq_main", "cq_slow"

SENSORS_TABLE = """
CREATE TABLE IF NOT EXISTS sensors (ts TIMESTAMP, device STRING, temperature DOUBLE, humidity DOUBLE);
"""
MAIN_SQL = """
-- cq: freshness_grace 5m
CREATE CQ fast RESAMPLE EVERY 5s RANGE 10s BEGIN
  SELECT max_value(temperature) AS m, count(temperature) AS n INTO fast_out FROM sensors GROUP BY (5s), device
END;
CREATE CQ solo RESAMPLE EVERY 5s RANGE 10s BEGIN
  SELECT count(temperature) AS n INTO solo_out FROM sensors GROUP BY (5s), device
END;
CREATE TABLE IF NOT EXISTS flaky_src (ts TIMESTAMP, device STRING, v DOUBLE);
CREATE CQ flaky RESAMPLE EVERY 5s BEGIN
  SELECT max_value(v) AS m INTO flaky_out FROM flaky_src GROUP BY (5s), device
END;
"""
# fast's grace (5 minutes: a busy machine delays batches) keeps it fresh; slow_discard's default grace
# (30 s: it fails one minute after its last materialization) lets the UI test see it turn stale.
# `flaky_src` starts on disk without its column v, so flaky's firings fail (and share their batches
# with fast's) until the test calls Stack.fix_flaky_source. `solo` is also run on its own (a firing,
# a recalculation), so its ledger is not checked for exactly-once firings.
TRANSLATOR = "renamed_translator:Renamed"  # the slow location's CQ_TRANSLATOR
# A window-triggered stream in the main location, over `meters` (which only the stream test appends to).
STREAM = "meter_5s"
# FILL_HISTORY over `hist_src`, a table its test writes (with history) after the stack started; the
# main location splits history into chunks of HISTORY_CHUNK_ROWS rows, so its run takes a while.
HIST_STREAM = "meter_hist"
HISTORY_CHUNK_ROWS = 100
BAD_STREAM = "meter_bad"  # over its own table; its test gives it a sink it cannot write, then removes it
LL_STREAM = "meter_ll"  # the same over its own table, with LOW_LATENCY_CALC (computed in its sensor)
UI_STREAM = "ui_stream"  # over the fed `sensors` table: always has windows for the UI test's stream page
STREAM_SQL = (
    METERS
    + f"""
CREATE STREAM {STREAM} INTERVAL(5s) SLIDING(5s) FROM meters PARTITION BY tbname OPTIONS(WATERMARK(1s))
  INTO {STREAM}_out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;
CREATE TABLE meters_ll (ts TIMESTAMP, current DOUBLE, voltage INT, status INT) TAGS (location STRING);
CREATE STREAM {HIST_STREAM} INTERVAL(5s) SLIDING(5s) FROM hist_src PARTITION BY tbname
  OPTIONS(WATERMARK(1s) | FILL_HISTORY)
  INTO {HIST_STREAM}_out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;
CREATE TABLE meters_bad (ts TIMESTAMP, current DOUBLE, voltage INT, status INT) TAGS (location STRING);
CREATE STREAM {BAD_STREAM} INTERVAL(5s) SLIDING(5s) FROM meters_bad PARTITION BY tbname OPTIONS(WATERMARK(1s))
  INTO {BAD_STREAM}_out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;
CREATE STREAM {LL_STREAM} INTERVAL(5s) SLIDING(5s) FROM meters_ll PARTITION BY tbname
  OPTIONS(WATERMARK(1s) | LOW_LATENCY_CALC)
  INTO {LL_STREAM}_out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;
CREATE STREAM {UI_STREAM} INTERVAL(10s) SLIDING(10s) FROM sensors OPTIONS(WATERMARK(1s))
  INTO {UI_STREAM}_out AS SELECT _twstart, count(*) AS n, max(temperature) AS t FROM %%trows;
"""
)
SLOW_SQL = """
CREATE CQ slow_blocked RESAMPLE EVERY 5s RANGE 10s TIMEOUT POLICY BLOCKED BEGIN
  SELECT max_value(temperature) AS m INTO blocked_out FROM sensors GROUP BY (5s), device
END;
CREATE CQ slow_discard RESAMPLE EVERY 5s RANGE 10s TIMEOUT POLICY DISCARD BEGIN
  SELECT max_value(temperature) AS m INTO discard_out FROM sensors GROUP BY (5s), device
END;
"""

RUNS_QUERY = """
query Runs($filter: RunsFilter!) {
  runsOrError(filter: $filter, limit: 1000) {
    __typename
    ... on Runs { results { runId jobName status creationTime startTime endTime tags { key value }
                            assetSelection { path } } }
    ... on PythonError { message }
  }
}
"""
SENSOR_STATE_QUERY = """
query State($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    __typename
    ... on Sensor { sensorState { status typeSpecificData { ... on SensorData { lastCursor } } } }
    ... on PythonError { message }
  }
}
"""
TICKS_QUERY = """
query Ticks($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    __typename
    ... on Sensor { name sensorState { status ticks(limit: 500) { status skipReason timestamp runIds error { message } } } }
    ... on PythonError { message }
  }
}
"""
WORKSPACE_QUERY = """
{
  workspaceOrError {
    __typename
    ... on Workspace { locationEntries { name loadStatus locationOrLoadError {
      __typename
      ... on PythonError { message }
      ... on RepositoryLocation { repositories { name sensors { name } schedules { name } } }
    } } }
  }
}
"""
BATCH_RUNS_QUERY = """
query Runs($filter: RunsFilter!) {
  runsOrError(filter: $filter, limit: 1000) {
    __typename
    ... on Runs { results { runId jobName status creationTime startTime endTime runConfigYaml
                            tags { key value } assetSelection { path } } }
    ... on PythonError { message }
  }
}
"""
MATERIALIZATIONS_QUERY = """
query Mats($key: AssetKeyInput!) {
  assetOrError(assetKey: $key) {
    __typename
    ... on Asset { assetMaterializations(limit: 1000) { runId timestamp
      metadataEntries { label ... on TextMetadataEntry { text } ... on JsonMetadataEntry { jsonString } } } }
  }
}
"""
RUN_LOG_QUERY = """
query Log($runId: ID!) {
  logsForRun(runId: $runId, limit: 5000) {
    __typename
    ... on EventConnection { events { __typename ... on MessageEvent { message } } }
    ... on PythonError { message }
  }
}
"""
DAEMONS_QUERY = "{ instance { daemonHealth { allDaemonStatuses { daemonType healthy required } } } }"
# Dagster OSS answers `assetHealth` with null (a Dagster+ feature): freshness and checks one by one.
HEALTH_QUERY = """
query Health($key: AssetKeyInput!) {
  assetNodeOrError(assetKey: $key) { __typename ... on AssetNode { freshnessStatusInfo { freshnessStatus } } }
  assetCheckExecutions(assetKey: $key, checkName: "cq_completeness", limit: 10) {
    status evaluation { severity description }
  }
}
"""
FRESHNESS_INTERVAL = 5  # seconds between the freshness daemon's evaluations here (Dagster's default: 30)
LAUNCH_MUTATION = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on Error { message }
  }
}
"""
RUN_QUERY = """
query Run($id: ID!) {
  runOrError(runId: $id) {
    __typename
    ... on Run { runId jobName status tags { key value } assetSelection { path }
      eventConnection { events { __typename ... on ExecutionStepFailureEvent { error { message } } } } }
  }
}
"""


def parse_iso(text: str | datetime) -> datetime:
    """An ISO-8601 time (YAML run config already holds it as a datetime) in UTC."""
    return (text if isinstance(text, datetime) else datetime.fromisoformat(text)).astimezone(UTC)


def log_tail(path: Path, lines: int = 40) -> str:
    if not path.exists():
        return f"(no {path.name})"
    return f"--- last lines of {path} ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


class Feeder(threading.Thread):
    """Appends the readings of ``[last end, now)`` (one per device per second) every FEED_EVERY s."""

    def __init__(self, engine: Engine, start: datetime):
        super().__init__(name="sensor-feeder", daemon=True)
        self.engine, self.start_at, self.stop_event = engine, start, threading.Event()
        self.batches, self.error = 0, None

    def run(self) -> None:
        try:
            feed_forever(
                self.engine,
                every=FEED_EVERY,
                stop=self.stop_event,
                start=self.start_at,
                reading_every=READING_EVERY,
                label="e2e feeder",
                on_batch=self._count,
            )
        except BaseException as exc:  # reported by the tests through Stack.check_feeder
            self.error = exc

    def _count(self) -> None:
        self.batches += 1

    def stop(self) -> None:
        self.stop_event.set()
        self.join(30)


@dataclass
class Stack:
    root: Path
    settings: Settings  # the main location's settings (shared warehouse, CQ_HOME and Spark port)
    slow_settings: Settings
    dagster_home: Path
    web_port: int
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    # Process groups whose leader a test killed alone (kill_daemon): their code servers live on.
    orphan_groups: list[int] = field(default_factory=list)
    feeder: Feeder | None = None
    spark_started: bool = False
    stopped: bool = False
    observed: dict[str, set[str]] = field(default_factory=dict)  # statuses seen per cq/name while polling

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    # -- GraphQL -----------------------------------------------------------------------------
    def graphql(self, query: str, variables: dict | None = None, *, timeout: float = 60) -> dict:
        response = requests.post(
            f"{self.url}/graphql", json={"query": query, "variables": variables or {}}, timeout=timeout
        )
        response.raise_for_status()
        body = response.json()
        assert not body.get("errors"), body["errors"]
        return body["data"]

    def runs(self, cq_name: str) -> list[dict]:
        """Every run of ``cq_name`` (tag cq/name), oldest first, tags as a dict, times as floats."""
        data = self.graphql(RUNS_QUERY, {"filter": {"tags": [{"key": "cq/name", "value": cq_name}]}})
        result = data["runsOrError"]
        assert result["__typename"] == "Runs", result
        runs = []
        for run in result["results"]:
            run = {**run, "tags": {t["key"]: t["value"] for t in run["tags"]}}
            runs.append(run)
            self.observed.setdefault(cq_name, set()).add(run["status"])
        return sorted(runs, key=lambda r: r["creationTime"])

    def backfill_runs(self, cq_name: str, backfill: str) -> list[dict]:
        """The runs of ``cq_name`` that backfill ``backfill`` launched (tag dagster/backfill)."""
        return [r for r in self.runs(cq_name) if r["tags"].get("dagster/backfill") == backfill]

    def batch_runs(self) -> list[dict]:
        """Every run of the cq_firings jobs (both locations), oldest first, with ``firings``:
        definition -> its firing times in that run (from the run config)."""
        import yaml

        data = self.graphql(BATCH_RUNS_QUERY, {"filter": {"pipelineName": "cq_firings_job"}})["runsOrError"]
        assert data["__typename"] == "Runs", data
        runs = []
        for run in data["results"]:
            config = yaml.safe_load(run["runConfigYaml"] or "{}") or {}
            firings = ((config.get("ops") or {}).get("cq_firings") or {}).get("config", {}).get("firings") or {}
            runs.append(
                {
                    **run,
                    "tags": {t["key"]: t["value"] for t in run["tags"]},
                    "firings": {n: [parse_iso(f) for f in fs] for n, fs in firings.items()},
                }
            )
        return sorted(runs, key=lambda r: r["creationTime"])

    def launch(
        self, location: str, job: str, *, assets: list[str], tags: dict | None = None, config: dict | None = None
    ) -> str:
        """Launch ``job`` with ``assets`` selected, as the UI's launchpad does (GraphQL); the run id."""
        selector = {
            "repositoryLocationName": location,
            "repositoryName": "__repository__",
            "jobName": job,
            "assetSelection": [{"path": [a]} for a in assets],
        }
        params = {
            "selector": selector,
            "runConfigData": config or {},
            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]},
        }
        result = self.graphql(LAUNCH_MUTATION, {"params": params})["launchRun"]
        assert result["__typename"] == "LaunchRunSuccess", result
        return result["run"]["runId"]

    def wait_run(self, run_id: str, timeout: float) -> dict:
        """The run once it ended (SUCCESS, FAILURE, CANCELED), tags as a dict."""
        ended: dict = {}

        def done() -> bool:
            run = self.graphql(RUN_QUERY, {"id": run_id})["runOrError"]
            if run.get("status") in ("SUCCESS", "FAILURE", "CANCELED"):
                events = run.pop("eventConnection")["events"]
                errors = [e["error"]["message"][:2000] for e in events if e.get("error")]
                ended.update(run, tags={t["key"]: t["value"] for t in run["tags"]}, errors=errors)
            return bool(ended)

        self.wait_until(f"run {run_id}", done, timeout)
        return ended

    def firing_runs(self, name: str) -> list[dict]:
        """The batch runs holding firings of ``name``, oldest first."""
        return [r for r in self.batch_runs() if name in r["firings"]]

    def materializations(self, asset: str) -> list[dict]:
        """The asset's materializations (GraphQL), oldest first, metadata as a dict of text values."""
        data = self.graphql(MATERIALIZATIONS_QUERY, {"key": {"path": [asset]}})["assetOrError"]
        if data["__typename"] != "Asset":
            return []
        mats = [
            {
                "runId": m["runId"],
                "timestamp": float(m["timestamp"]) / 1000,
                "metadata": {e["label"]: e.get("text", e.get("jsonString")) for e in m["metadataEntries"]},
            }
            for m in data["assetMaterializations"]
        ]
        return sorted(mats, key=lambda m: m["timestamp"])

    def health(self, asset: str) -> dict[str, str | None]:
        """The sink's freshness (HEALTHY / WARNING / DEGRADED / UNKNOWN) and its newest evaluated
        completeness check: status (SUCCEEDED / FAILED), severity and description."""
        data = self.graphql(HEALTH_QUERY, {"key": {"path": [asset]}})
        node = data["assetNodeOrError"]
        assert node["__typename"] == "AssetNode", node
        # The newest evaluated one: a batch run in progress holds a planned (IN_PROGRESS) execution.
        done = [c for c in data["assetCheckExecutions"] if c["status"] in ("SUCCEEDED", "FAILED")]
        check = done[0] if done else {"status": None, "evaluation": None}
        evaluation = check["evaluation"] or {}
        return {
            "freshness": (node["freshnessStatusInfo"] or {}).get("freshnessStatus"),
            "check": check["status"],
            "severity": evaluation.get("severity"),
            "description": evaluation.get("description"),
        }

    def ledger(self, name: str) -> list:
        return Engine(settings=self.settings).ledger.entries(name)

    def ledger_twice(self, entries: list, key) -> str:
        """What a test names when ``entries`` hold a ``key`` twice: each such entry's times and
        versions (exact copies come from the ledger's table, different times from two computations)
        and the ledger table's compactions (each with the version it read)."""
        from deltalake import DeltaTable

        seen: dict = {}
        for e in entries:
            seen.setdefault(key(e), []).append(e)
        lines = []
        for k, group in seen.items():
            if len(group) > 1:
                copies = len({(e.started_at, e.finished_at) for e in group}) == 1
                lines.append(f"{k}: {len(group)} entries, {'exact copies' if copies else 'different runs'}:")
                lines += [
                    f"  started {e.started_at} finished {e.finished_at} sink v{e.sink_version} {e.source_versions}"
                    for e in group
                ]
        uri = self.settings.state_uri("firings")
        history = [
            f"v{h.get('version')} {h.get('operation')} read v{h.get('readVersion')}"
            for h in DeltaTable(uri).history(1000)
            if h.get("operation") != "WRITE"
        ]
        return "\n".join([*lines, "ledger table, its commits other than appends: " + ", ".join(history)])

    def wait_for_firings(self, name: str, *, count: int, timeout: float, after: datetime | None = None) -> list:
        """Poll until the ledger holds ``count`` succeeded firings of ``name`` (after ``after``)."""
        deadline = time.monotonic() + timeout
        done: list = []
        while time.monotonic() < deadline:
            self.check_alive()
            done = [
                e
                for e in self.ledger(name)
                if e.status == "succeeded" and e.kind == "firing" and (after is None or e.fire_time > after)
            ]
            if len(done) >= count:
                return done
            time.sleep(3)
        runs = self.firing_runs(name)
        raise AssertionError(
            f"{name}: {len(done)} succeeded firings within {timeout:.0f}s (wanted {count}); its "
            f"batch runs {[(r['status'], r['tags'].get('cq/attempt')) for r in runs]}\n"
            f"{self.diagnostics()}"
        )

    def fix_flaky_source(self) -> None:
        """Give flaky_src its column v (one reading per device per second of the last two minutes)."""
        import pyarrow as pa
        from deltalake import write_deltalake

        now = floor_time(datetime.now(UTC), READING_EVERY)
        times = [now - timedelta(seconds=k) for k in range(120, 0, -1)]
        write_deltalake(
            self.settings.table_uri("flaky_src"),
            pa.table(
                {
                    "ts": pa.array(times * 2, pa.timestamp("us", tz="UTC")),
                    "device": ["a"] * 120 + ["b"] * 120,
                    "v": pa.array([float(k % 7) for k in range(240)]),
                }
            ),
            mode="overwrite",
            schema_mode="overwrite",
        )

    def break_flaky_source(self) -> None:
        """Take flaky_src's column v away again: flaky's next firings fail."""
        import pyarrow as pa
        from deltalake import write_deltalake

        write_deltalake(
            self.settings.table_uri("flaky_src"),
            pa.table({"ts": pa.array([datetime.now(UTC)], pa.timestamp("us", tz="UTC")), "device": ["a"]}),
            mode="overwrite",
            schema_mode="overwrite",
        )

    def kill_daemon(self) -> None:
        """SIGKILL dagster-daemon alone (its code server finishes the runs it started)."""
        proc = self.procs.pop("daemon")
        proc.kill()
        proc.wait(30)
        self.orphan_groups.append(proc.pid)  # its own session: the group id is its pid

    def start_daemon(self) -> None:
        self._spawn(
            "daemon",
            [str(BIN / "dagster-daemon"), "run", "-w", str(self.root / "workspace.yaml")],
            self._env(self.settings),
        )
        self.wait_until("the daemons", self._daemons_healthy, 180)

    def ticks(self, location: str, sensor: str) -> list[dict]:
        selector = {"repositoryLocationName": location, "repositoryName": "__repository__", "sensorName": sensor}
        result = self.graphql(TICKS_QUERY, {"selector": selector})["sensorOrError"]
        assert result["__typename"] == "Sensor", result
        return result["sensorState"]["ticks"]

    def sensor_state(self, location: str, sensor: str) -> tuple[str, str | None]:
        """The sensor's status (RUNNING / STOPPED) and its stored cursor."""
        selector = {"repositoryLocationName": location, "repositoryName": "__repository__", "sensorName": sensor}
        result = self.graphql(SENSOR_STATE_QUERY, {"selector": selector})["sensorOrError"]
        assert result["__typename"] == "Sensor", result
        state = result["sensorState"]
        return state["status"], (state["typeSpecificData"] or {}).get("lastCursor")

    def stream_cursor(self, location: str, stream: str) -> tuple[str, int | None]:
        """The stream's switch (RUNNING / STOPPED) and the trigger-table version of its cursor in the
        shared ``cq_streams`` sensor (None before its first evaluation)."""
        from cq_engine.streams.timing import StreamCursor

        status, _ = self.sensor_state(location, f"{stream}_ticks")
        _, shared = self.sensor_state(location, "cq_streams")
        state = ((json.loads(shared) if shared else {}).get("streams") or {}).get(stream) or {}
        cursor = state.get("cursor")  # nested in the sensor's cursor as an object
        return status, StreamCursor.from_json(json.dumps(cursor)).version if cursor else None

    def run_log(self, run_id: str) -> str:
        """The messages of a run's event log (GraphQL), one a line."""
        data = self.graphql(RUN_LOG_QUERY, {"runId": run_id})["logsForRun"]
        assert data["__typename"] == "EventConnection", data
        return "\n".join(e.get("message") or "" for e in data["events"])

    def stream_runs(self, stream: str) -> list[dict]:
        """The runs of cq_streams_job holding works of ``stream`` (run config), oldest first."""
        import yaml

        data = self.graphql(BATCH_RUNS_QUERY, {"filter": {"pipelineName": "cq_streams_job"}})["runsOrError"]
        assert data["__typename"] == "Runs", data
        runs = []
        for run in data["results"]:
            config = yaml.safe_load(run["runConfigYaml"] or "{}") or {}
            works = ((config.get("ops") or {}).get("cq_streams") or {}).get("config", {}).get("works") or {}
            if stream in works:
                runs.append({**run, "tags": {t["key"]: t["value"] for t in run["tags"]}, "works": works[stream]})
        return sorted(runs, key=lambda r: r["creationTime"])

    def wait_for_runs(self, cq_name: str, *, successes: int, timeout: float) -> list[dict]:
        """Poll (bounded) until ``cq_name`` has ``successes`` SUCCESS runs; no run may fail."""
        deadline = time.monotonic() + timeout
        runs: list[dict] = []
        while time.monotonic() < deadline:
            self.check_alive()
            runs = self.runs(cq_name)
            failed = [r for r in runs if r["status"] == "FAILURE"]
            assert not failed, f"{cq_name}: failed runs {[r['runId'] for r in failed]}\n{self.diagnostics()}"
            done = [r for r in runs if r["status"] == "SUCCESS"]
            if len(done) >= successes:
                return runs
            time.sleep(3)
        raise AssertionError(
            f"{cq_name}: {sum(r['status'] == 'SUCCESS' for r in runs)} SUCCESS runs of "
            f"{len(runs)} within {timeout:.0f}s (wanted {successes}); statuses "
            f"{[r['status'] for r in runs]}\n{self.diagnostics()}"
        )

    # -- health --------------------------------------------------------------------------------
    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            assert proc.poll() is None, f"{name} exited with {proc.returncode}\n{log_tail(self.logs / f'{name}.log')}"
        self.check_feeder()

    def check_feeder(self) -> None:
        assert self.feeder is not None and self.feeder.error is None, f"feeder failed: {self.feeder.error!r}"
        assert self.feeder.is_alive(), "the feeder thread stopped"

    def diagnostics(self) -> str:
        lines = [log_tail(self.logs / f"{name}.log", 25) for name in self.procs]
        try:  # the batches and the sinks' health, when the webserver still answers
            runs = [
                (r["runId"][:8], r["status"], r["tags"].get("cq/firings"), r["tags"].get("cq/failed"))
                for r in self.batch_runs()
            ]
            lines.append(f"batch runs: {runs[-15:]}")
            lines.append(f"health: {[(a, self.health(a)) for a in ('fast_out', 'flaky_out', 'discard_out')]}")
        except Exception as exc:
            lines.append(f"(no GraphQL: {exc})")
        return "\n".join(lines)

    # -- lifecycle -----------------------------------------------------------------------------
    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        # Own session: teardown signals the whole group (code servers and run workers included).
        proc = spawn_logged(cmd, log=self.logs / f"{name}.log", cwd=self.root, env=env, append=False)
        self.procs[name] = proc
        return proc

    def _env(self, settings: Settings, **extra: str) -> dict[str, str]:
        env = dagster_env(settings, self.dagster_home)
        for var in ("CQ_FAILPOINT", "CQ_SPARK_REMOTE", "CQ_SPARK_MASTER", "SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED"):
            env.pop(var, None)
        env.update(
            CQ_CONFIG=str(self.root / "no-cq.toml"),
            CQ_HISTORY_CHUNK_ROWS=str(HISTORY_CHUNK_ROWS),
            PYTHONUNBUFFERED="1",
            FRESHNESS_DAEMON_INTERVAL_SECONDS=str(FRESHNESS_INTERVAL),
            **extra,
        )
        return env

    def start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        # Data: the last 15 minutes, then a batch every FEED_EVERY seconds.
        import pyarrow as pa
        from deltalake import write_deltalake

        write_deltalake(
            self.settings.table_uri("flaky_src"),
            pa.table(
                {  # without v: flaky fails
                    "ts": pa.array([datetime.now(UTC)], pa.timestamp("us", tz="UTC")),
                    "device": ["a"],
                }
            ),
        )
        engine = Engine(settings=self.settings)
        engine.ensure_tables(*(t.name for t in engine.catalog.tables if t.name != "flaky_src"))
        now = floor_time(datetime.now(UTC), READING_EVERY)
        engine.storage.append(
            "sensors",
            sensor_rows(start=now - BACKFILL, end=now, every=READING_EVERY),
            metadata={"cq.ingest": "e2e backfill"},
        )
        self.feeder = Feeder(engine, now)
        self.feeder.start()
        # Spark Connect first: the code locations pick Connect at load time only if it is running.
        self.spark_started = True
        status = cq_spark.start_server(self.settings, timeout=240)
        assert status.running, status.describe()
        write_dagster_home(self.dagster_home)
        slow_port = free_port()
        workspace = self.root / "workspace.yaml"
        workspace.write_text(
            "load_from:\n"
            "  - python_module:\n"
            "      module_name: dagster_defs.location\n"
            f"      working_directory: {REPO}\n"
            f"      location_name: {MAIN_LOCATION}\n"
            "  - grpc_server:\n"
            "      host: 127.0.0.1\n"
            f"      port: {slow_port}\n"
            f"      location_name: {SLOW_LOCATION}\n"
        )
        self._spawn(
            "slow_code_server",
            [
                str(BIN / "dagster"),
                "api",
                "grpc",
                "--module-name",
                "dagster_defs.location",
                "--working-directory",
                str(REPO),
                "--host",
                "127.0.0.1",
                "--port",
                str(slow_port),
                "--location-name",
                SLOW_LOCATION,
            ],
            self._env(
                self.slow_settings,
                CQ_FAILPOINT=f"sleep-before-commit:{SLOW_SECONDS}",
                CQ_TRANSLATOR=TRANSLATOR,
                PYTHONPATH=os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
            ),
        )
        self.wait_until("the slow code server's port", lambda: port_open(slow_port), 180)
        env = self._env(self.settings)
        self._spawn("daemon", [str(BIN / "dagster-daemon"), "run", "-w", str(workspace)], env)
        self._spawn(
            "webserver",
            [str(BIN / "dagster-webserver"), "-w", str(workspace), "-p", str(self.web_port), "-h", "127.0.0.1"],
            env,
        )
        self.wait_until("the webserver", self._webserver_up, 240)
        self.wait_until("both code locations", self._locations_loaded, 240)
        self.wait_until("the daemons", self._daemons_healthy, 180)

    def wait_until(self, what: str, ready, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                if ready():
                    return
            except (requests.RequestException, AssertionError, KeyError, TypeError):
                pass
            time.sleep(1)
        raise AssertionError(f"{what} not ready within {timeout:.0f}s\n{self.diagnostics()}")

    def _webserver_up(self) -> bool:
        return requests.get(f"{self.url}/server_info", timeout=5).status_code == 200

    def _locations_loaded(self) -> bool:
        entries = self.graphql(WORKSPACE_QUERY)["workspaceOrError"]["locationEntries"]
        sensors = set()
        for entry in entries:
            loc = entry["locationOrLoadError"]
            if loc and loc["__typename"] == "PythonError":
                raise RuntimeError(f"code location {entry['name']} failed to load: {loc['message']}")
            if entry["loadStatus"] != "LOADED" or loc is None:
                return False
            # Sensors, and the batched definitions' switches (schedules).
            sensors |= {s["name"] for r in loc["repositories"] for s in (*r["sensors"], *r["schedules"])}
        return {
            "cq_firings",
            "cq_streams",
            "fast_ticks",
            "flaky_ticks",
            f"{STREAM}_ticks",
            "slow_blocked_switch",
            "slow_discard_switch",
        } <= sensors

    def _daemons_healthy(self) -> bool:
        statuses = self.graphql(DAEMONS_QUERY)["instance"]["daemonHealth"]["allDaemonStatuses"]
        wanted = {"SENSOR", "QUEUED_RUN_COORDINATOR", "FRESHNESS_DAEMON"}  # freshness: cq dev's dagster.yaml
        return wanted <= {s["daemonType"] for s in statuses if s["healthy"]}

    def stop(self) -> list[str]:
        """Stop everything we started; returns what had to be killed after the groups were gone."""
        if self.stopped:
            return []
        self.stopped = True
        if self.feeder is not None:
            self.feeder.stop()
        for name in ("webserver", "daemon", "slow_code_server"):
            if name in self.procs:
                stop_process_group(self.procs[name], first_signal=signal.SIGTERM)
        # A killed daemon's code server finishes its runs, then exits on its heartbeat timeout; on a
        # loaded machine it may not have yet. Its group is ours to stop (by pid: a group id is reused).
        for pid in live_pids(f"DAGSTER_HOME={self.dagster_home}"):
            with contextlib.suppress(OSError):
                if os.getpgid(pid) in self.orphan_groups:
                    os.kill(pid, signal.SIGKILL)
        leftovers = _kill_by_environ("DAGSTER_HOME", str(self.dagster_home))
        if self.spark_started:
            cq_spark.stop_server(self.settings)
        return leftovers


def _kill_by_environ(var: str, value: str) -> list[str]:
    """Processes still alive after their groups were killed (none expected; SIGKILLed processes take
    a moment to exit): kill them by pid and report their command lines."""
    if not Path("/proc/self/environ").exists():
        return []
    entry = f"{var}={value}"
    deadline = time.monotonic() + 10
    while live_pids(entry) and time.monotonic() < deadline:
        time.sleep(0.2)
    killed = []
    for pid in live_pids(entry):
        try:
            cmd = command_line(pid)
            pgid = os.getpgid(pid)
            os.kill(pid, signal.SIGKILL)
            killed.append(f"pid {pid} (group {pgid}): {cmd[:200]}")
        except OSError:
            continue
    deadline = time.monotonic() + 10
    while live_pids(entry) and time.monotonic() < deadline:
        time.sleep(0.2)
    return killed


# -- the shared fixture ------------------------------------------------------------------------
_STACK: Stack | None = None


def acquire(tmp_path_factory) -> Stack:
    global _STACK
    if _STACK is None or _STACK.stopped:
        root = tmp_path_factory.mktemp("dagster_e2e")
        settings = Settings(
            sql_dir=str(root / "sql" / "main"),
            warehouse=str(root / "warehouse"),
            home=str(root / "cq_home"),
            spark_port=free_port(),
        )
        for sub, sql in (("main", MAIN_SQL), ("slow", SLOW_SQL)):
            (root / "sql" / sub).mkdir(parents=True)
            (root / "sql" / sub / "sensors.sql").write_text(SENSORS_TABLE)
            (root / "sql" / sub / "cq.sql").write_text(sql)
        (root / "sql" / "main" / "streams.sql").write_text(STREAM_SQL)
        _STACK = Stack(
            root=root,
            settings=settings,
            slow_settings=replace(settings, sql_dir=str(root / "sql" / "slow")),
            dagster_home=root / "dagster_home",
            web_port=free_port(),
        )
        try:
            _STACK.start()
        except BaseException:
            _STACK.stop()
            raise
    return _STACK


def release(request) -> None:
    """Stop the stack after the last selected test module that uses it (or when the session stops)."""
    global _STACK
    if _STACK is None:
        return
    items = request.session.items
    mine = [i for i, item in enumerate(items) if item.module is request.module]
    later = [item for item in items[max(mine, default=-1) + 1 :] if "dagster_stack" in item.fixturenames]
    if later and not (request.session.shouldstop or request.session.shouldfail):
        return
    stack, _STACK = _STACK, None
    leftovers = stack.stop()
    assert not leftovers, f"processes outlived their process groups (killed): {leftovers}"
