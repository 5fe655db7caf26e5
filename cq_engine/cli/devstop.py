"""How ``cq dev`` stops Dagster without failing a run: freeze the daemon (no sensor tick, no run leaves
the queue), cancel the batched runs (their sensors request their work again), let the other runs in
flight finish while the code server that runs them stays up, cancel and re-queue those that cannot
finish in time, then stop the rest. The feed stops only after that (``cli.dev``): no firing commits
after it.

The daemon is frozen (SIGSTOP) rather than stopped: ``dagster dev`` takes a daemon that exits for a
crash and shuts everything down, run workers included. It is frozen outside a SQLite transaction (no
POSIX lock of its own in ``/proc/locks``), so it cannot block the runs' writes to the instance, and
while no run is STARTING (it could be the one it is launching)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

_FLIGHT = ("STARTING", "STARTED", "CANCELING")
CANCEL_WAIT = 15.0  # seconds a canceled run's worker has to end before the run is marked canceled
_TERMINATE = """mutation($id: String!) { terminateRun(runId: $id, terminatePolicy: SAFE_TERMINATE) { __typename
  ... on TerminateRunFailure { message } ... on PythonError { message } } }"""
_REQUEUE = """mutation($id: String!) { launchRunReexecution(reexecutionParams: {parentRunId: $id,
  strategy: ALL_STEPS}) { __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""


def descendant(root: int, needle: str) -> int | None:
    """A live descendant of process ``root`` whose command line holds ``needle`` (Linux ``/proc``)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    for pid in parents:
        p = pid
        while p in parents and p not in (0, 1, root):
            p = parents[p]
        if p == root and pid != root:
            with contextlib.suppress(OSError):
                if needle in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    return pid
    return None


def _holds_lock(pid: int) -> bool:
    """Whether process ``pid`` holds a write lock (a SQLite write transaction). Its read locks do not
    count: every open connection to a WAL database holds some for its whole life (the daemon always
    does), and counted they made every Ctrl-C wait out ``freeze_daemon``'s whole budget."""
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return False
    return any(len(f) > 4 and f[3] == "WRITE" and f[4] == str(pid) for f in (line.split() for line in lines))


def freeze_daemon(proc: subprocess.Popen, dagster_home: Path, *, budget: float = 60) -> int | None:
    """SIGSTOP ``dagster dev``'s daemon at a quiet moment: outside a SQLite transaction, and not while
    it launches a run (frozen then, the run would stay STARTING without a worker). Tried again for up to
    ``budget`` seconds, then frozen anyway (a run left STARTING is canceled and queued again by
    ``drain_runs``). Its pid (None: not found)."""
    pid = descendant(proc.pid, "dagster._daemon")
    if pid is None:
        return None
    try:
        import dagster as dg

        with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
            starting = dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTING])
            deadline = time.monotonic() + budget
            while True:
                os.kill(pid, signal.SIGSTOP)
                if time.monotonic() > deadline or not (_holds_lock(pid) or instance.get_run_records(starting, limit=1)):
                    return pid
                os.kill(pid, signal.SIGCONT)  # let it commit, or finish launching, then try again
                time.sleep(0.2)
    except ProcessLookupError:
        return None
    except Exception as exc:  # shutting down: report, never stop the shutdown
        print(f"cq dev: could not pause the Dagster daemon cleanly ({type(exc).__name__}: {exc})", file=sys.stderr)
        return pid


def kill_frozen(pid: int | None) -> None:
    """End a frozen daemon for good: continued, it could still launch a queued run."""
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _in_flight(instance) -> dict[str, dict[str, str]]:
    import dagster as dg

    statuses = [dg.DagsterRunStatus(s) for s in _FLIGHT]
    return {
        r.dagster_run.run_id: dict(r.dagster_run.tags)
        for r in instance.get_run_records(dg.RunsFilter(statuses=statuses), limit=200)
    }


def _batched(tags: dict[str, str]) -> bool:
    """A run a sensor requested for many definitions: its sensor requests its work again at the next
    start, so the shutdown does not wait for it."""
    return "true" in (tags.get("cq/batch"), tags.get("cq/stream_batch"))


def drain_runs(dagster_home: Path, *, timeout: float, ui: str, cancel_wait: float = CANCEL_WAIT) -> None:
    """End the runs in flight (none can start: the daemon is frozen). Batched runs are canceled at once:
    a pipelined one holds firings up to its horizon ahead, which it would otherwise wait for, and its
    sensor requests them again at the next start. Every other run (a definition's own, a recalculation)
    may finish for up to ``timeout`` seconds, then it is canceled and queued again (``ui``: the
    webserver's host:port). A run still in flight ``cancel_wait`` seconds after its cancellation is
    marked canceled; its worker dies with Dagster's process group."""
    try:
        import dagster as dg

        with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
            flight = _in_flight(instance)
            batched = {r: t for r, t in flight.items() if _batched(t)}
            if batched:
                print(
                    f"cq dev: canceling {len(batched)} batch run(s) (their sensors request them again at the next start)"
                )
                _cancel(instance, batched, ui=ui, timeout=cancel_wait)
            flight = {r: t for r, t in _in_flight(instance).items() if r not in batched}
            if flight:
                print(f"cq dev: waiting up to {timeout:.0f}s for {len(flight)} run(s) in flight to finish")
            deadline = time.monotonic() + timeout
            while flight and time.monotonic() < deadline:
                time.sleep(1)
                flight = {r: t for r, t in _in_flight(instance).items() if r not in batched}
            if flight:
                _requeue(instance, flight, ui=ui, timeout=cancel_wait)
    except Exception as exc:  # shutting down: report, never stop the shutdown
        print(f"cq dev: could not check for runs in flight ({type(exc).__name__}: {exc})", file=sys.stderr)


def _cancel(instance, flight: dict[str, dict[str, str]], *, ui: str, timeout: float) -> None:
    """Terminate the runs; those no worker ended within ``timeout`` seconds are marked canceled."""
    from dagster_defs.client import GraphQL

    graphql = GraphQL(ui)
    for run_id in flight:
        graphql(_TERMINATE, id=run_id)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and set(flight) & set(_in_flight(instance)):
        time.sleep(0.5)
    for run_id in set(flight) & set(_in_flight(instance)):  # no worker answered (e.g. never started)
        graphql(_TERMINATE.replace("SAFE_TERMINATE", "MARK_AS_CANCELED_IMMEDIATELY"), id=run_id)


def _requeue(instance, flight: dict[str, dict[str, str]], *, ui: str, timeout: float) -> None:
    import dagster as dg

    from dagster_defs.client import GraphQL

    _cancel(instance, flight, ui=ui, timeout=timeout)
    # A run may still have finished (termination interrupts it between Spark calls): only the
    # canceled ones are run again.
    records = instance.get_run_records(dg.RunsFilter(run_ids=list(flight)))
    canceled = [r.dagster_run.run_id for r in records if r.dagster_run.status == dg.DagsterRunStatus.CANCELED]
    if not canceled:
        return
    graphql = GraphQL(ui)
    again = []
    for run_id in canceled:
        if not _batched(flight[run_id]):
            result = graphql(_REQUEUE, id=run_id)["launchRunReexecution"]
            if result.get("__typename") == "LaunchRunSuccess":
                again.append(result["run"]["runId"])
    print(
        f"cq dev: {len(canceled)} run(s) did not finish in time: canceled, and "
        + (f"queued again for the next start ({', '.join(again)})" if again else "their sensor retries them")
    )


def stop_process_group(proc: subprocess.Popen, *, first_signal: int = signal.SIGINT, timeout: float = 20) -> None:
    """Signal the whole process group (``dagster dev`` forwards SIGINT to webserver, daemon and runs),
    then SIGKILL whatever is left in it, run workers included."""
    for sig, wait in ((first_signal, timeout), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
