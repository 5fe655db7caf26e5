"""dagster_defs.launcher: the run-worker health check that run monitoring calls, and a launch that a
code server shutting down refuses, on a real Dagster instance configured as `cq dev`'s dagster.yaml
configures it, against real processes. The daemon's side (a worker dies unnoticed, run monitoring fails
its run, the batch sensor retries its firings) is tests/test_dagster_e2e.py's."""

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


JOBS = """\
import time

import dagster as dg


@dg.op
def wait():
    time.sleep(60)


@dg.job
def slow():
    wait()


defs = dg.Definitions(jobs=[slow])
"""


def test_a_launch_refused_by_a_code_server_shutting_down_is_left_to_the_queue(instance, tmp_path):
    """A code server told to shut down (SIGTERM, a restart) keeps serving its runs in flight and refuses
    new ones; Dagster would fail such a run. CQRunLauncher raises the error the queue retries instead
    (``max_user_code_failure_retries`` in ``cq dev``'s and the Deployment's dagster.yaml)."""
    from dagster._core.launcher import LaunchRunContext
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import GrpcServerTarget
    from dagster._grpc.server import GrpcServerProcess

    from dagster_defs.internals import DagsterUserCodeUnreachableError

    assert yaml.safe_load(DAGSTER_YAML)["run_coordinator"]["config"]["max_user_code_failure_retries"] > 0
    (tmp_path / "jobs.py").write_text(JOBS)
    origin = LoadableTargetOrigin(executable_path=sys.executable, python_file=str(tmp_path / "jobs.py"))
    with GrpcServerProcess(
        instance_ref=instance.get_ref(), loadable_target_origin=origin, wait_on_exit=False
    ) as server:
        target = GrpcServerTarget(host="localhost", port=server.port, socket=server.socket, location_name="jobs")
        with WorkspaceProcessContext(instance, target) as workspace:
            context = workspace.create_request_context()
            location = context.get_code_location("jobs")
            job = location.get_repository("__repository__").get_full_job("slow")

            def new_run():
                return create_run_for_test(
                    instance,
                    job_name="slow",
                    remote_job_origin=job.get_remote_origin(),
                    job_code_origin=job.get_python_origin(),
                )

            first = new_run()
            instance.run_launcher.launch_run(LaunchRunContext(dagster_run=first, workspace=context))
            server.create_client().shutdown_server()  # it waits for `first` before it exits
            second = new_run()
            with pytest.raises(DagsterUserCodeUnreachableError, match="the code server is shutting down"):
                instance.run_launcher.launch_run(LaunchRunContext(dagster_run=second, workspace=context))
            # The first run ends before the instance goes (its worker writes to the instance's storage).
            assert instance.run_launcher.terminate(first.run_id)
            deadline = time.monotonic() + 120
            while instance.get_run_by_id(first.run_id).status not in (
                dg.DagsterRunStatus.CANCELED,
                dg.DagsterRunStatus.SUCCESS,
                dg.DagsterRunStatus.FAILURE,
            ):
                assert time.monotonic() < deadline, instance.get_run_by_id(first.run_id).status
                time.sleep(0.5)
            # The server exits once it has seen the worker gone; that check opens the instance, so it
            # must still exist (gone, the check dies and the server would live on, never exiting).
            try:
                server.server_process.wait(timeout=120)
            finally:
                if server.server_process.poll() is None:
                    server.server_process.kill()


# A gRPC server of the DagsterApi service whose Ping never answers (the process is killed mid-call).
HANGING_SERVER = """
import sys, time
from concurrent import futures
import grpc
def hang(request, context):
    time.sleep(120)
handler = grpc.method_handlers_generic_handler("api.DagsterApi", {"Ping": grpc.unary_unary_rpc_method_handler(
    hang, request_deserializer=lambda b: b, response_serializer=lambda b: b)})
server = grpc.server(futures.ThreadPoolExecutor(2))
server.add_generic_rpc_handlers((handler,))
server.add_insecure_port(f"127.0.0.1:{sys.argv[1]}")
server.start()
print("serving", flush=True)
time.sleep(120)
"""


def test_only_a_refused_launch_is_left_to_the_queue_not_one_that_timed_out_or_whose_server_died():
    """A server that refused the connection never took the run: the queue may try again. A call that
    timed out may have started it (a server waiting for its database), and so may one whose server was
    killed during it (the code server's process, SIGKILLed by the chaos test as the OOM killer would):
    launched again at once, it could run twice, so CQRunLauncher first waits for a worker to take it
    (real gRPC calls to a closed port, to a silent one and to a server killed mid-call)."""
    import threading

    from dagster._grpc.__generated__ import dagster_api_pb2
    from dagster._grpc.client import DagsterGrpcClient

    from dagster_defs.internals import DagsterUserCodeUnreachableError
    from dagster_defs.launcher import refused, went_away

    def error(port: int, timeout: float = 2) -> DagsterUserCodeUnreachableError:
        client = DagsterGrpcClient(host="127.0.0.1", port=port)
        with pytest.raises(DagsterUserCodeUnreachableError) as caught:
            client._query("Ping", dagster_api_pb2.PingRequest, timeout=timeout, echo="x")
        return caught.value

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    assert refused(error(port)) and not went_away(error(port))
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    try:
        timed_out = error(silent.getsockname()[1])
    finally:
        silent.close()
    assert "timed out" in str(timed_out) and not refused(timed_out) and not went_away(timed_out)
    server = subprocess.Popen([sys.executable, "-c", HANGING_SERVER, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "serving"
        threading.Timer(2.0, server.kill).start()  # during the call
        died = error(port, timeout=60)
    finally:
        server.kill()
        server.wait()
    assert went_away(died) and not refused(died), died.__cause__


def test_a_launch_counts_as_taken_once_the_worker_recorded_its_process(instance):
    """After a launch call that did not end in a refusal, the run is launched if a worker records its
    process (its first engine event, as soon as it has read the run) or moves the run on; an event of
    an earlier attempt does not count."""
    launcher = instance.run_launcher
    run = create_run_for_test(instance, job_name="cq_firings_job", status=dg.DagsterRunStatus.STARTING)
    instance.report_engine_event("Started process for run (pid: 4242).", run, EngineEventData.in_process(4242))
    later = time.time() + 1
    assert not launcher._launch_taken(run.run_id, since=later, seconds=1.5)
    time.sleep(max(0.0, later - time.time()) + 0.1)
    instance.report_engine_event("Started process for run (pid: 4343).", run, EngineEventData.in_process(4343))
    assert launcher._launch_taken(run.run_id, since=later, seconds=1.5)
    moved = create_run_for_test(instance, job_name="cq_firings_job", status=dg.DagsterRunStatus.STARTED)
    assert launcher._launch_taken(moved.run_id, since=time.time(), seconds=0)
