"""`cq dev`'s guard: the processes a killed `cq dev` started (each in a session of its own) die with it,
and a new `cq dev` refuses to start while any of them runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procutil import alive, command_line, live_pids

from cq_engine.cli.devguard import MARK, refuse_beside_running, stack_mark
from cq_engine.errors import CQError

REPO = Path(__file__).resolve().parent.parent
# A stand-in for cq dev: starts its guard, then a child in a session of its own (as the Spark server,
# the agent and `dagster dev` are), prints the child's pid and waits to be killed.
OWNER = """
import subprocess, sys, time
from cq_engine.cli.devguard import start_guard
start_guard(sys.argv[1])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="Linux /proc")
def test_a_sigkilled_owner_takes_its_children_in_other_sessions_with_it(tmp_path):
    home = tmp_path / ".cq"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(home)], stdout=subprocess.PIPE, text=True, env=env)
    child = 0
    try:
        assert owner.stdout is not None
        child = int(owner.stdout.readline())
        assert alive(child)
        mark = f"{MARK}={stack_mark(home)}".encode()
        # Inherited. Popen returns once the child's exec closed its close-on-exec pipe, a moment before
        # the kernel sets up the new program's environment: until then /proc/<pid>/environ reads empty.
        deadline = time.monotonic() + 30
        while not (environ := Path(f"/proc/{child}/environ").read_bytes()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mark in environ.split(b"\0")
        # While it runs, a second stack on the same CQ_HOME is refused, naming what runs.
        with pytest.raises(CQError, match=r"a cq dev stack still runs on CQ_HOME=.*\(\d+ process\(es\): pid \d+"):
            refuse_beside_running(home, tmp_path / "dagster")
        refuse_beside_running(tmp_path / "elsewhere", tmp_path / "dagster")  # another CQ_HOME is fine
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        # A new stack started at once (a restart right after the owner ended) waits for the guard,
        # which is still reaping (it would kill the new stack's processes, marked alike), then starts.
        guards = [p for p in live_pids(mark.decode()) if "cq_engine.cli.devguard" in command_line(p)]
        assert guards, "the guard ended before the check could see it finishing"
        refuse_beside_running(home, tmp_path / "dagster")
        assert not alive(child), "the owner's child outlived it"
        assert live_pids(mark.decode()) == [], "the guard was not waited for"
    finally:
        for pid in (owner.pid, child):
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)
