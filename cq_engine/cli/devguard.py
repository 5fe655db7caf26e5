"""No process of ``cq dev``'s stack outlives it, however it ends, and no second stack starts beside one.

Every process ``cq dev`` starts (``dagster dev`` with its webserver, daemon, code servers and run
workers, the Spark Connect JVM, the command agent) inherits the environment variable ``CQ_DEV_STACK``
naming the stack (its CQ_HOME); several of them run in sessions of their own, so neither a process
group nor the terminal reaches them all. A guard process, in its own session, reads a pipe only
``cq dev`` holds open: when it reads end of file (``cq dev`` exited, was killed with SIGKILL, or its
terminal closed), it kills every process still carrying the mark, then exits. A new ``cq dev`` refuses
to start while a process marked with its CQ_HOME, or one using its DAGSTER_HOME, still runs.
Linux (``/proc``); elsewhere the guard and the check do nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cq_engine.errors import CQError

MARK = "CQ_DEV_STACK"
GUARD_SECONDS = 20.0  # how long the guard keeps looking for marked processes (a child may spawn one)
_guards: list[int] = []  # the guard this process started (never one of the stack's leftovers)


def stack_mark(home: str | Path) -> str:
    return str(Path(home).resolve())


def _environ_pids(needles: list[bytes], *, skip: set[int], command: str | None = None) -> list[int]:
    """Live processes (not zombies) whose environment holds one of ``needles`` (``VAR=value``) and,
    with ``command``, whose command line holds it (a shell that exported DAGSTER_HOME is no stack)."""
    found = []
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            env = set((entry / "environ").read_bytes().split(b"\0"))
            if not env.intersection(needles):
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                continue
            if command is not None and command.encode() not in (entry / "cmdline").read_bytes():
                continue
        except (OSError, IndexError):
            continue
        found.append(int(entry.name))
    return sorted(found)


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"


def _finishing_guards(pids: list[int]) -> list[int]:
    """The guards among ``pids`` whose ``cq dev`` has exited: they are reaping its stack and end within
    ``GUARD_SECONDS`` (they carry the stack's mark, and would kill a new stack's processes meanwhile)."""
    finishing = []
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # main(): ``-m cq_engine.cli.devguard OWNER MARK``
        at = argv.index(b"cq_engine.cli.devguard") + 1 if b"cq_engine.cli.devguard" in argv else len(argv)
        if at < len(argv) and argv[at].isdigit() and not Path(f"/proc/{int(argv[at])}").exists():
            finishing.append(pid)
    return finishing


def refuse_beside_running(home: str | Path, dagster_home: str | Path) -> None:
    """A ``CQError`` naming the processes of a stack still running on this CQ_HOME or DAGSTER_HOME. The
    guard of a ``cq dev`` that just stopped is waited for first (a restart right after a Ctrl-C)."""
    skip = {os.getpid(), os.getppid()}
    needle = [f"{MARK}={stack_mark(home)}".encode()]
    deadline = time.monotonic() + GUARD_SECONDS + 5
    while time.monotonic() < deadline and _finishing_guards(_environ_pids(needle, skip=skip)):
        time.sleep(0.2)
    pids = _environ_pids(needle, skip=skip)
    pids += _environ_pids([f"DAGSTER_HOME={Path(dagster_home).resolve()}".encode()], skip=skip, command="dagster")
    pids = sorted(set(pids))
    if pids:
        listing = "; ".join(f"pid {p}: {_command(p)}" for p in pids[:5])
        raise CQError(
            f"a cq dev stack still runs on CQ_HOME={stack_mark(home)} / DAGSTER_HOME={Path(dagster_home).resolve()} "
            f"({len(pids)} process(es): {listing}); stop it (Ctrl-C in its terminal) or wait for it to end"
        )


def kill_dagster_leftovers(dagster_home: str | Path) -> list[int]:
    """SIGKILL what still runs on ``dagster_home`` after Dagster's process group was stopped (a run
    worker in a session of its own); the pids."""
    needle = [f"DAGSTER_HOME={Path(dagster_home).resolve()}".encode()]
    pids = _environ_pids(needle, skip={os.getpid(), *_guards}, command="dagster")
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return pids


def start_guard(home: str | Path) -> int | None:
    """Mark this process's environment (every child inherits it) and start the guard; the write end of
    its pipe stays open in this process only (the fd it returns; closed by the process's end)."""
    os.environ[MARK] = stack_mark(home)
    if not Path("/proc").is_dir():
        return None
    read, write = os.pipe()
    os.set_inheritable(write, False)
    guard = subprocess.Popen(
        [sys.executable, "-m", "cq_engine.cli.devguard", str(os.getpid()), stack_mark(home)],
        stdin=read,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # beyond a signal to cq dev's group or session
        close_fds=True,
    )
    os.close(read)
    _guards.append(guard.pid)
    return write


def reap(owner: int, mark: str, *, seconds: float = GUARD_SECONDS) -> list[int]:
    """SIGKILL every process marked ``mark`` but ``owner`` and this one, until none is left for a
    second (or ``seconds`` passed); the pids killed."""
    needle = [f"{MARK}={mark}".encode()]
    killed: list[int] = []
    deadline = time.monotonic() + seconds
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        pids = _environ_pids(needle, skip={owner, os.getpid()})
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        if pids:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= 1.0:
            break
        time.sleep(0.1)
    return killed


def main(argv: list[str]) -> int:
    owner, mark = int(argv[0]), argv[1]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaching it must not end the guard early
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        while sys.stdin.buffer.read(4096):
            pass
    reap(owner, mark)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
