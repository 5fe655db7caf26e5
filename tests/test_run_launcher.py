"""dagster_defs.launcher: the run-worker health check that run monitoring calls, on a real Dagster
instance configured as `cq dev`'s dagster.yaml configures it, against real processes. The daemon's side
(a worker dies unnoticed, run monitoring fails its run, the batch sensor retries its firings) is
tests/test_dagster_e2e.py's."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import dagster as dg
import pytest
import yaml
from dagster._core.events import EngineEventData
from dagster._core.launcher import WorkerStatus
from dagster._core.storage.tags import GRPC_INFO_TAG
from dagster._core.test_utils import create_run_for_test

from cq_engine.cli.dev import DAGSTER_YAML
from dagster_defs.launcher import CQRunLauncher, remote_host, worker_status


@pytest.fixture(scope="module")
def instance():
    launcher = yaml.safe_load(DAGSTER_YAML)["run_launcher"]
    with dg.instance_for_test(overrides={"run_launcher": launcher}) as inst:
        assert isinstance(inst.run_launcher, CQRunLauncher)
        assert inst.run_launcher.supports_check_run_worker_health
        yield inst


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _started_run(instance, pid: int, **tags: str):
    """A STARTED run whose worker recorded ``pid`` as Dagster's run worker does."""
    run = create_run_for_test(instance, job_name="cq_firings_job", status=dg.DagsterRunStatus.STARTED, tags=tags)
    instance.report_engine_event(f"Started process for run (pid: {pid}).", run, EngineEventData.in_process(pid))
    return run


def test_a_live_worker_is_running_and_a_dead_or_unreaped_one_is_not_found(instance):
    launcher = instance.run_launcher
    worker = _sleeper()
    try:
        run = _started_run(instance, worker.pid)
        health = launcher.check_run_worker_health(run)
        assert health.status == WorkerStatus.RUNNING and health.run_worker_id == str(worker.pid), health
        worker.kill()
        time.sleep(0.5)  # exited, not reaped yet: a zombie, as under a code server whose checks died
        health = launcher.check_run_worker_health(run)
        assert health.status == WorkerStatus.NOT_FOUND, health
        assert f"run worker (pid {worker.pid}) exited without recording the end of the run" in (health.msg or "")
    finally:
        worker.kill()
        worker.wait()
    assert launcher.check_run_worker_health(run).status == WorkerStatus.NOT_FOUND


def test_a_pid_taken_by_a_later_process_is_not_the_worker():
    later = _sleeper()
    try:
        assert worker_status(later.pid, reported_at=time.time()).status == WorkerStatus.RUNNING
        # The run's worker recorded this pid a minute before `later` started: the worker is gone.
        health = worker_status(later.pid, reported_at=time.time() - 60)
        assert health.status == WorkerStatus.NOT_FOUND and "now another process's" in (health.msg or ""), health
    finally:
        later.kill()
        later.wait()


def test_no_recorded_worker_or_a_worker_on_another_host_is_left_to_max_runtime(instance):
    launcher = instance.run_launcher
    run = create_run_for_test(instance, job_name="cq_firings_job", status=dg.DagsterRunStatus.STARTED)
    assert launcher.check_run_worker_health(run).status == WorkerStatus.RUNNING  # nothing to check yet
    elsewhere = json.dumps({"host": "10.1.2.3", "port": 4000})
    remote = _started_run(instance, 999_999_999, **{GRPC_INFO_TAG: elsewhere})  # no such pid here
    health = launcher.check_run_worker_health(remote)
    assert health.status == WorkerStatus.RUNNING and "10.1.2.3" in (health.msg or ""), health
    local = _started_run(instance, 999_999_999, **{GRPC_INFO_TAG: json.dumps({"host": "localhost", "port": 1})})
    assert launcher.check_run_worker_health(local).status == WorkerStatus.NOT_FOUND


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        (None, None),
        ({"host": "localhost", "port": 4000}, None),
        ({"host": "127.0.0.1", "port": 4000}, None),
        ({"host": "::1", "port": 4000}, None),
        ({"host": "localhost", "socket": "/tmp/s"}, None),
        ({"host": "10.1.2.3", "port": 4000}, "10.1.2.3"),
        ({"host": "code.example", "port": 4000}, "code.example"),
    ],
)
def test_remote_host(info, expected):
    assert remote_host(json.dumps(info) if info else None) == expected


def test_this_hosts_own_name_is_local():
    assert remote_host(json.dumps({"host": socket.gethostname(), "port": 4000})) is None
