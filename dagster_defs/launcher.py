"""The run launcher of ``cq dev``'s and the Deployment's dagster.yaml: Dagster's DefaultRunLauncher
(each run in a process of its code location's server) plus a run-worker health check, so run
monitoring fails the run of a worker that died.

Without it nothing may ever end such a run: DefaultRunLauncher offers run monitoring no check, and the
code server marks a run failed when its process dies only if that server can reach the run storage
then. A PostgreSQL outage of a minute does both at once: the run worker dies because it cannot write
its events, and the server's thread that would record the death dies on the same unreachable database.
The run stayed STARTED, and the batch sensor held its definitions' firings behind it, until the run's
``dagster/max_runtime`` (docs/operations/guarantees.md).
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import time
from pathlib import Path

from dagster import DagsterEventType, DagsterRun, DagsterRunStatus, DefaultRunLauncher

from .internals import (
    GRPC_INFO_TAG,
    CheckRunHealthResult,
    DagsterLaunchFailedError,
    DagsterUserCodeUnreachableError,
    WorkerStatus,
)

# How long a launch whose call timed out waits for its worker to start before the run is failed.
LAUNCH_CONFIRM_SECONDS = 30.0
# What a code server answers a run's launch with between SIGTERM and its exit (dagster._grpc.server).
SHUTTING_DOWN = "after telling it to shut down"
WORKER_STARTED = "Started process for run (pid: "  # the engine event the worker writes first (dagster._grpc.impl)
START_SLACK = 5.0  # seconds: /proc's boot time is whole seconds, and the worker writes its event after it started


class CQRunLauncher(DefaultRunLauncher):
    """DefaultRunLauncher whose workers run monitoring checks: the pid of the run's "Started process for
    run" engine event must still be a live process that started before that event (a pid reused by a
    later process is not the worker)."""

    def launch_run(self, context) -> None:
        """Launch through the code server; one that is shutting down (restarted, as the docs tell a user
        to after changing ``CQ_SQL_DIR``) refuses the launch, and Dagster would fail the run. Reported
        as unreachable instead, the queue puts the run back and tries again (``dagster.yaml``'s
        ``max_user_code_failure_retries``), so it runs on the new server.

        A call that did not end in a refusal (it timed out, or the server died during it) may have
        started the run: put back in the queue, it would run twice. So a worker taking the run within
        ``LAUNCH_CONFIRM_SECONDS`` makes it launched. Otherwise a server that died during the call
        (``went_away``) goes back to the queue too: a worker it started late finds the run queued and
        ignores it (Dagster does, with run monitoring on). One that timed out is failed instead (a
        server waiting for its database may start it much later); the batch sensor requests its
        firings again, and a worker starting later ignores a failed run."""
        since = time.time()
        try:
            super().launch_run(context)
        except DagsterLaunchFailedError as exc:
            if SHUTTING_DOWN not in str(exc):
                raise
            raise DagsterUserCodeUnreachableError(f"the code server is shutting down: {exc}") from exc
        except DagsterUserCodeUnreachableError as exc:
            if refused(exc):
                raise  # the server never took the run: the queue tries again
            if self._launch_taken(context.dagster_run.run_id, since=since - START_SLACK):
                return
            if went_away(exc):
                raise DagsterUserCodeUnreachableError(
                    f"the code server went away during the run's launch and no worker took the run within "
                    f"{LAUNCH_CONFIRM_SECONDS:.0f}s; back to the queue ({exc})"
                ) from exc
            raise DagsterLaunchFailedError(
                f"the code server did not confirm the run's launch ({exc}); not launched again, as it may "
                "have started it"
            ) from exc

    def _launch_taken(self, run_id: str, *, since: float, seconds: float | None = None) -> bool:
        """Whether a worker took the run within ``seconds`` (default ``LAUNCH_CONFIRM_SECONDS``): its
        "Started process for run" event at or after ``since`` (epoch seconds; written as soon as the
        worker has read the run), or the run left STARTING."""
        deadline = time.monotonic() + (LAUNCH_CONFIRM_SECONDS if seconds is None else seconds)
        while True:
            run = self._instance.get_run_by_id(run_id)
            if run is None or run.status not in (DagsterRunStatus.STARTING, DagsterRunStatus.QUEUED):
                return run is not None
            started = self._worker_started(run_id)
            if started is not None and started[1] >= since:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(1.0)

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        host = remote_host(run.tags.get(GRPC_INFO_TAG))
        if host is not None:  # a code server elsewhere: its pids mean nothing here (max runtime still applies)
            return CheckRunHealthResult(WorkerStatus.RUNNING, f"run worker on {host}: not checked from here")
        started = self._worker_started(run.run_id)
        if started is None:
            return CheckRunHealthResult(WorkerStatus.RUNNING, "no run worker recorded yet")
        pid, at = started
        return worker_status(pid, reported_at=at)

    def _worker_started(self, run_id: str) -> tuple[int, float] | None:
        """The pid and time of the run's newest "Started process for run" event."""
        records = self._instance.get_records_for_run(
            run_id, of_type=DagsterEventType.ENGINE_EVENT, ascending=False
        ).records
        for record in records:
            entry = record.event_log_entry
            if entry.message.startswith(WORKER_STARTED):
                pid = entry.message[len(WORKER_STARTED) :].split(")", 1)[0]
                if pid.isdigit():
                    return int(pid), entry.timestamp
        return None


def remote_host(grpc_info: str | None) -> str | None:
    """The host of the code server that launched a run (its ``dagster/grpc_info`` tag) when it is not this
    machine; None when it is (a socket, a loopback address, this host's name) or the tag is missing."""
    if not grpc_info:
        return None
    info = json.loads(grpc_info)
    host = info.get("host")
    if info.get("socket") or not host or host == "localhost":
        return None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # a name: this host's own (getfqdn may ask DNS: only for names)
        return None if host in (socket.gethostname(), socket.getfqdn()) else host
    return None if address.is_loopback or address.is_unspecified else host


def worker_status(pid: int, *, reported_at: float) -> CheckRunHealthResult:
    """RUNNING while ``pid`` is a live process that started by ``reported_at`` (when the worker recorded
    its pid, epoch seconds); NOT_FOUND once it exited (a zombie counts as exited) or the pid is another's."""
    alive, started = process_start(pid)
    gone = f"the run worker (pid {pid}) exited without recording the end of the run"
    if not alive:
        # It dies so when it cannot write its events, e.g. while the run storage is unreachable.
        return CheckRunHealthResult(WorkerStatus.NOT_FOUND, gone)
    if started is not None and started > reported_at + START_SLACK:
        return CheckRunHealthResult(WorkerStatus.NOT_FOUND, f"{gone}; its pid is now another process's")
    return CheckRunHealthResult(WorkerStatus.RUNNING, run_worker_id=str(pid))


def process_start(pid: int) -> tuple[bool, float | None]:
    """Whether process ``pid`` is alive (a zombie is not), and when it started (epoch seconds; None where
    there is no /proc to tell)."""
    if not Path("/proc/stat").exists():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False, None
        except PermissionError:
            pass  # alive, another user's
        return True, None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False, None
    if fields[0] in ("Z", "X"):  # exited; its parent (the code server) has not reaped it
        return False, None
    boot = next(
        float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime ")
    )
    return True, boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # stat's field 22: start, in clock ticks


def _grpc_error(exc: BaseException) -> tuple[str | None, str]:
    """The gRPC status code's name and the details of the call error behind ``exc`` (None, "" if none)."""
    cause = exc.__cause__
    code, details = getattr(cause, "code", None), getattr(cause, "details", None)
    name = getattr(code(), "name", None) if callable(code) else None
    return name, str(details() or "") if callable(details) else ""


def refused(exc: BaseException) -> bool:
    """Whether an unreachable code server refused the call before taking it: the connection could not
    be made (gRPC ``UNAVAILABLE``, "failed to connect") or the server is shutting down; not a call
    that timed out, nor one whose server died during it (``went_away``)."""
    if SHUTTING_DOWN in str(exc):
        return True
    return _grpc_error(exc)[0] == "UNAVAILABLE" and not went_away(exc)


def went_away(exc: BaseException) -> bool:
    """Whether the code server's connection broke during the call (gRPC ``UNAVAILABLE`` after it was
    connected: "Socket closed", "Connection reset"), i.e. the server died (killed, out of memory) and
    may or may not have started the run."""
    code, details = _grpc_error(exc)
    text = details.lower()
    return code == "UNAVAILABLE" and (
        "socket closed" in text or "stream removed" in text or "connection reset" in text or "broken pipe" in text
    )
