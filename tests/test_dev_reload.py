"""`cq dev` and a file that stops loading while the stack runs: its definitions keep running at the
file's last good version, and carry on when it loads again."""

from __future__ import annotations

import itertools
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
import requests
from deltalake import DeltaTable
from dev_util import (
    CQ,
    dev_env,
    project,
    start_dev,
    stop_dev,
    succeeded,
    ui_up,
    wait_for,
)
from netutil import free_port

from cq_engine.storage.delta import DeltaRsStorage
from cq_engine.storage.ledger import Ledger

MINE = """CREATE CQ mine_5s RESAMPLE EVERY 5s BEGIN
  SELECT count(temperature) AS n INTO mine_5s FROM sensors GROUP BY (5s), device END;
CREATE CQ mine_10s RESAMPLE EVERY 10s BEGIN
  SELECT max_value(temperature) AS m INTO mine_10s FROM sensors GROUP BY (10s), device END;
CREATE STREAM mine_s INTERVAL(5s) SLIDING(5s) FROM sensors INTO mine_s AS SELECT _twstart, count(*) AS n FROM %%trows;
"""
TYPO = "CREATE CQ mine_c RESAMPLE EVERY 5s BEGIN\n  SELECT count(temperature) AS n INTO mine_c FROM sensors GROPU BY (5s) END;\n"
LOCATION_QUERY = """
{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus locationOrLoadError {
  __typename ... on PythonError { message }
  ... on RepositoryLocation { repositories { sensors { name } schedules { name } } } } } } } }
"""
RELOAD_MUTATION = """
mutation Reload($name: String!) { reloadRepositoryLocation(repositoryLocationName: $name) {
  __typename ... on WorkspaceLocationEntry { loadStatus } ... on PythonError { message } } }
"""
ERROR_ASSET_QUERY = """
query Node($key: AssetKeyInput!) { assetNodeOrError(assetKey: $key) {
  __typename ... on AssetNode { description } } }
"""
# The daemon refreshes its view of a reloaded location every 60 s (Dagster's RELOAD_WORKSPACE_INTERVAL).
DAEMON_REFRESH = timedelta(seconds=75)


def _graphql(port: int, query: str, variables: dict | None = None) -> dict:
    body = requests.post(
        f"http://127.0.0.1:{port}/graphql", json={"query": query, "variables": variables or {}}, timeout=60
    ).json()
    assert not body.get("errors"), body["errors"]
    return body["data"]


def _location(port: int) -> tuple[str, set[str]]:
    """The code location's name and its sensors and schedules (the definitions' switches)."""
    (entry,) = _graphql(port, LOCATION_QUERY)["workspaceOrError"]["locationEntries"]
    loc = entry["locationOrLoadError"]
    assert entry["loadStatus"] == "LOADED" and loc["__typename"] == "RepositoryLocation", entry
    return entry["name"], {x["name"] for r in loc["repositories"] for x in (*r["sensors"], *r["schedules"])}


def _reload(port: int) -> set[str]:
    """Reload definitions as the UI's button does; the switches the location then has."""
    name, _ = _location(port)
    result = _graphql(port, RELOAD_MUTATION, {"name": name})["reloadRepositoryLocation"]
    assert result["__typename"] == "WorkspaceLocationEntry", result
    return _location(port)[1]


def _error_asset(port: int) -> str | None:
    node = _graphql(port, ERROR_ASSET_QUERY, {"key": {"path": ["cq_errors", "mine_sql_load_error"]}})
    node = node["assetNodeOrError"]
    return node["description"] if node["__typename"] == "AssetNode" else None


def _go_on(ledger: Ledger, runs: tuple, since: datetime, proc: subprocess.Popen, out: Path) -> None:
    """Wait until each (definition, ledger kind) committed once more past the daemon's refresh after ``since``."""
    for name, kind in runs:
        wait_for(
            lambda name=name, kind=kind: any(
                e.finished_at > since + DAEMON_REFRESH for e in succeeded(ledger, name, kind)
            ),
            600,
            f"{name} to go on after {since}",
            proc,
            out,
        )


@pytest.mark.spark
@pytest.mark.dagster_e2e
def test_a_file_that_stops_loading_while_cq_dev_runs_keeps_its_definitions_running(tmp_path):
    """Three definitions of a new file run; the file gets a typo and the location is reloaded: `cq dev`
    says so, the UI holds their switches and a named error asset, and they go on (no firing missed, the
    stream neither re-created nor its history ignored again); fixed and reloaded, they carry on."""
    settings = project(tmp_path)
    mine = Path(settings.sql_dir) / "mine.sql"
    mine.write_text(MINE)
    ui = free_port()
    env = dev_env(tmp_path, settings, CQ_SPARK_PORT=str(free_port()))
    out = tmp_path / "dev.out"
    proc = start_dev(out, env, "--port", str(ui), "--feed-every", "2", "--stop-wait", "600")
    ledger = Ledger(store=DeltaRsStorage(warehouse=settings.warehouse))
    try:
        wait_for(lambda: ui_up(ui), 600, "the Dagster UI", proc, out)
        wait_for(lambda: len(succeeded(ledger, "mine_5s")) >= 2, 600, "mine_5s's firings", proc, out)
        wait_for(lambda: succeeded(ledger, "mine_s", "realtime"), 600, "mine_s's windows", proc, out)
        ignored = [e for e in ledger.entries("mine_s") if e.status == "ignored"]
        switches = {"mine_5s_ticks", "mine_10s_ticks", "mine_s_ticks"}
        assert switches <= _location(ui)[1]

        mine.write_text(MINE + TYPO)
        said = "keep running at the file's last good version"
        wait_for(lambda: said in out.read_text(), 60, "cq dev to say the file fails", proc, out)
        line = next(x for x in out.read_text().splitlines() if said in x)
        assert "mine.sql:7:" in line and "GROPU" in line and "mine_5s, mine_10s, mine_s keep running" in line
        assert said in (Path(env["DAGSTER_HOME"]) / "dev.log").read_text()  # and in its log
        assert switches <= _reload(ui)
        broken_at = datetime.now(UTC)
        description = _error_asset(ui)
        assert description and "mine.sql:7:" in description and "mine_5s, mine_10s, mine_s keep running" in description
        # Past the daemon's refresh, the kept definitions still fire, every one of their firings.
        _go_on(ledger, (("mine_5s", "firing"), ("mine_10s", "firing"), ("mine_s", "realtime")), broken_at, proc, out)

        mine.write_text(MINE + TYPO.replace("GROPU", "GROUP"))
        wait_for(lambda: "mine.sql loads again" in out.read_text(), 60, "cq dev to say the file loads", proc, out)
        assert switches | {"mine_c_ticks"} <= _reload(ui)
        fixed_at = datetime.now(UTC)
        assert _error_asset(ui) is None
        _go_on(ledger, (("mine_5s", "firing"), ("mine_c", "firing"), ("mine_s", "realtime")), fixed_at, proc, out)
        for name, every in (("mine_5s", 5), ("mine_10s", 10)):
            times = sorted(e.fire_time for e in succeeded(ledger, name))
            assert len(times) == len(set(times)), f"{name}: a firing committed twice"
            gaps = [(a, b) for a, b in itertools.pairwise(times) if b - a != timedelta(seconds=every)]
            assert not gaps, f"{name}: firings missing: {gaps}"
        # The stream was never created again: no more history ignored, its windows without a gap.
        assert [e for e in ledger.entries("mine_s") if e.status == "ignored"] == ignored
        sink = pa.table(DeltaTable(str(Path(settings.warehouse) / "mine_s")).scan())
        starts = sorted(set(sink.column("_twstart").to_pylist()))
        assert all(b - a == timedelta(seconds=5) for a, b in itertools.pairwise(starts)), starts
    finally:
        stop_dev(proc)
        subprocess.run([*CQ, "spark", "stop"], cwd=tmp_path, env=env, capture_output=True, timeout=120)
