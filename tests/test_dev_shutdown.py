"""`cq dev` stopped: Ctrl-C cancels the batched runs in flight (requested again at the next start) and
commits no firing past the feed; a second `cq dev` on the same CQ_HOME is refused; a SIGKILLed
`cq dev` takes its whole stack with it."""

from __future__ import annotations

import os
import signal
import subprocess
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from dev_util import (
    CQ,
    REPO,
    SENSORS,
    ctrl_c_during,
    dev_env,
    none_left,
    project,
    stack_pids,
    start_dev,
    stop_dev,
    succeeded,
    ui_up,
    wait_for,
)
from netutil import free_port

from cq_engine.config import Settings
from cq_engine.spark import server_status
from cq_engine.storage.delta import DeltaRsStorage
from cq_engine.storage.ledger import Ledger


@pytest.mark.spark
@pytest.mark.dagster_e2e
def test_cq_dev_ctrl_c_cancels_and_requeues_the_runs_that_cannot_finish(tmp_path):
    """Ctrl-C cancels the batched runs in flight at once (here the stream's works: without a Spark Connect
    server the cq_streams sensor hands them to runs): canceled, not failed, nothing left in flight, not
    queued again: the sensor requests the works again at the next start. (A definition's own run may
    finish for `--stop-wait` seconds, then is canceled and queued again with the same tags.)"""
    import dagster as dg

    settings = project(tmp_path)  # the stream alone: every run is one to queue again
    (tmp_path / "sql" / "sensors.sql").write_text(
        "\n".join(line for line in SENSORS.splitlines() if "hum_5s" not in line)
    )
    ui = free_port()
    env = dev_env(tmp_path, settings, CQ_SPARK_PORT=str(free_port()))
    out = tmp_path / "dev.out"
    # In-process Spark: a run spends its first seconds starting a JVM, where a termination lands.
    proc = start_dev(out, env, "--port", str(ui), "--feed-every", "2", "--stop-wait", "0", "--no-spark-server")
    try:
        wait_for(lambda: "Dagster UI on" in out.read_text(), 400, "cq dev to start", proc, out)
        stream = dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED], tags={"cq/name": "hum_s"})
        after, runs = ctrl_c_during(tmp_path / "dagster", stream, "a stream run in flight", proc, out)
        assert "Traceback" not in after, after
        status = {r.run_id: r.status for r in runs}
        assert dg.DagsterRunStatus.FAILURE not in status.values(), after
        # A run in flight either finished (a termination interrupts it between Spark calls) or was
        # canceled.
        canceled = [r for r in runs if r.status == dg.DagsterRunStatus.CANCELED]
        assert all(r.tags.get("cq/name") == "hum_s" and r.tags.get("cq/stream_batch") == "true" for r in canceled), (
            status
        )
        assert ("batch run(s) (their sensors request them again" in after) == bool(canceled), after
        requeued = {r.tags.get("dagster/parent_run_id") for r in runs} - {None}
        assert requeued == set(), status  # the sensor requests the works again instead
        left = [s for s in status.values() if s in (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED)]
        assert left == [], status
        if canceled:  # the next start: the sensor requests the canceled works again, and they succeed
            proc = start_dev(out, env, "--port", str(ui), "--feed-every", "60", "--no-spark-server")

            def hum_works(run) -> set[str]:
                return set(run.run_config["ops"]["cq_streams"]["config"]["works"].get("hum_s", []))

            works = set().union(*(hum_works(r) for r in canceled))
            with dg.DagsterInstance.from_config(str(tmp_path / "dagster")) as instance:
                done = dg.RunsFilter(statuses=[dg.DagsterRunStatus.SUCCESS], tags={"cq/name": "hum_s"})

                def retried() -> bool:
                    return any(
                        r.dagster_run.tags.get("cq/attempt", "0") != "0" and works & hum_works(r.dagster_run)
                        for r in instance.get_run_records(done)
                    )

                wait_for(retried, 600, "the canceled works, requested again", proc, out)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(600) == 0
    finally:
        stop_dev(proc)
        subprocess.run([*CQ, "spark", "stop"], cwd=tmp_path, env=env, capture_output=True, timeout=120)


@pytest.mark.spark
@pytest.mark.dagster_e2e
def test_cq_dev_ctrl_c_commits_no_firing_past_the_feed_and_sigkill_leaves_no_process(tmp_path):
    """Ctrl-C while batch runs hold firings ahead: every firing committed read readings of its range
    (the feed stops last), no run failed, only batch runs were canceled, nothing is left running. A
    second `cq dev` on the same CQ_HOME is refused while one runs. A SIGKILLed `cq dev` takes every
    process of its stack with it (Dagster's, the Spark Connect JVM, the agent: sessions of their own)."""
    import dagster as dg

    settings = project(tmp_path)
    ui = free_port()
    env = dev_env(tmp_path, settings, CQ_SPARK_PORT=str(free_port()))
    dagster_home = tmp_path / "dagster"
    out = tmp_path / "dev.out"
    proc = start_dev(out, env, "--port", str(ui), "--feed-every", "2", "--stop-wait", "30")
    ledger = Ledger(store=DeltaRsStorage(warehouse=settings.warehouse))
    try:
        wait_for(lambda: ui_up(ui), 600, "the Dagster UI", proc, out)
        second = subprocess.run(
            [*CQ, "dev", "--port", str(free_port())], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
        )
        assert second.returncode == 1 and "a cq dev stack still runs on CQ_HOME=" in second.stderr, second
        wait_for(lambda: len(succeeded(ledger, "hum_5s")) >= 3, 600, "hum_5s's firings", proc, out)
        batch = dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED], tags={"cq/batch": "true"})
        after, runs = ctrl_c_during(dagster_home, batch, "a batch run in flight", proc, out)
        assert "Traceback" not in after, after
        assert after.index("Dagster webserver and daemon stopped") < after.index("feed stopped"), after
        assert not [r.run_id for r in runs if r.status == dg.DagsterRunStatus.FAILURE], after
        canceled = [r for r in runs if r.status == dg.DagsterRunStatus.CANCELED]
        assert all(r.tags.get("cq/batch") == "true" or r.tags.get("cq/stream_batch") == "true" for r in canceled)
        assert not [r.run_id for r in runs if r.status in (dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING)]
        assert none_left(settings, dagster_home, 30) == []
        # No firing was committed for a range the feed never reached (its readings are 5 s apart).
        newest = max(pa.table(DeltaTable(str(Path(settings.warehouse) / "sensors")).scan()).column("ts").to_pylist())
        past = [
            (e.fire_time, e.range_end)
            for e in succeeded(ledger, "hum_5s")
            if e.range_end > newest + timedelta(seconds=5)
        ]
        assert past == [], f"firings past the feed's newest reading {newest}: {past}"

        # Restarted, then SIGKILLed: nothing of the stack is left after a few seconds.
        proc = start_dev(out, env, "--port", str(ui), "--feed-every", "2")
        wait_for(lambda: ui_up(ui), 600, "the Dagster UI again", proc, out)
        live = Settings(**{**settings.__dict__, "spark_port": int(env["CQ_SPARK_PORT"])})
        wait_for(lambda: server_status(live).running, 600, "the Spark Connect server", proc, out)
        assert len(stack_pids(settings, dagster_home)) >= 5  # dagster dev, webserver, daemon, code server, JVM
        proc.kill()
        proc.wait(30)
        assert none_left(settings, dagster_home, 60) == []
    finally:
        stop_dev(proc)
        subprocess.run([*CQ, "spark", "stop"], cwd=tmp_path, env=env, capture_output=True, timeout=120)
        for line in stack_pids(settings, dagster_home):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
