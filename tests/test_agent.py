"""The command agent (cq_engine.cli.agent) and the ``cq`` executable's client side, with a real agent
process and real ``cq`` processes (no JVM: ``cq validate --check-triggers`` runs a probe trigger's
``validate()``, which reports what the command saw). The same commands through a real Spark Connect
server: tests/test_spark_runtime.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cq_engine.cli import agent
from cq_engine.cli.agent import socket_path

CQ = str(Path(sys.executable).with_name("cq"))

PROBE = """
import os, sys, time
from cq_engine.triggers import Trigger


class Probe(Trigger):
    def validate(self, attributes):
        mode = attributes.string("mode")
        if mode == "echo":
            print("stdin", sys.stdin.readline().strip())
            print("cwd", os.getcwd())
            print("env", os.environ.get("PROBE_VALUE"))
            print("tty", sys.stdout.isatty())
            mask = os.umask(0)
            print("umask", oct(mask))
            print("to stderr", file=sys.stderr)
        elif mode == "wait":
            print("pid", os.getpid(), flush=True)
            time.sleep(120)
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A project with probe triggers and a running agent (the server's recorded port faked: the
    agent lives while it is there)."""
    root = tmp_path_factory.mktemp("agent")
    (root / "sql").mkdir()
    (root / "probe.py").write_text(PROBE)
    for mode in ("echo", "wait"):
        (root / "sql" / f"{mode}.sql").write_text(
            f'CREATE STATELESS TRIGGER {mode} BEFORE INSERT ON t AS \'probe:Probe\' WITH ("mode" = "{mode}");\n'
        )
    home = root / "home"
    (home / "spark").mkdir(parents=True)
    (home / "spark" / "port").write_text("1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CQ_")}
    env.update(CQ_HOME=str(home), CQ_CONFIG=str(root / "none.toml"), CQ_STORAGE="deltars", CQ_DEBUG="1")
    assert agent.start(str(home), wait=120), (home / "spark" / "agent.log").read_text()
    yield root, env
    assert agent.stop(str(home))
    assert not Path(socket_path(str(home))).exists()


def cq(project, *args: str, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    root, base = project
    return subprocess.run(
        [CQ, *args], cwd=root, env={**base, **(env or {})}, capture_output=True, text=True, timeout=120, **kwargs
    )


def via_agent(out: subprocess.CompletedProcess) -> bool:
    return "cq: debug: ran in the command agent" in out.stderr


def test_output_exit_code_stdin_env_and_cwd_as_in_process(project):
    root, _ = project
    args = ("validate", "--check-triggers", "sql/echo.sql")
    runs = [
        cq(project, *args, input="hello\n", env={"PROBE_VALUE": "v1", **extra}, umask=0o027)
        for extra in ({}, {"CQ_NO_AGENT": "1"})
    ]
    assert [via_agent(r) for r in runs] == [True, False]
    for out in runs:
        assert out.returncode == 0, out.stderr
        probe = [
            line for line in out.stdout.splitlines() if line.split(" ")[0] in ("stdin", "cwd", "env", "tty", "umask")
        ]
        assert probe == ["stdin hello", f"cwd {root}", "env v1", "tty False", "umask 0o27"]
        assert "to stderr" in out.stderr
    assert runs[0].stdout == runs[1].stdout
    # Exit codes: a usage error (argparse, 2) and a CQError (1), with the same messages.
    for args, code in ((["plan"], 2), (["validate", "nowhere"], 1)):
        ours, theirs = cq(project, *args), cq(project, *args, env={"CQ_NO_AGENT": "1"})
        assert via_agent(ours) and (ours.returncode, theirs.returncode) == (code, code)
        assert ours.stderr.replace(ours.stderr.splitlines()[-1], "").strip() == theirs.stderr.strip()
    # A command that never goes through the agent.
    assert not via_agent(cq(project, "spark", "status"))


def test_ctrl_c_reaches_the_command(project):
    root, base = project
    client = subprocess.Popen(
        [CQ, "validate", "--check-triggers", "sql/wait.sql"],
        cwd=root,
        env=base,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert client.stdout is not None
        line = client.stdout.readline().split()
        while line and line[0] != "pid":  # the listing comes first
            line = client.stdout.readline().split()
        assert line[0] == "pid" and int(line[1]) != client.pid  # the command runs in the agent's child
        client.send_signal(signal.SIGINT)
        assert client.wait(60) == 130  # KeyboardInterrupt in the command, as in-process
    finally:
        client.kill()
        client.wait()


def test_stale_socket_and_refused_clients_run_in_process(project, tmp_path):
    root, base = project
    # A socket file nobody listens on (a killed agent's).
    home = tmp_path / "home"
    (home / "spark").mkdir(parents=True)
    import socket

    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(socket_path(str(home)))
    out = cq(project, "validate", "sql/echo.sql", env={"CQ_HOME": str(home)})
    assert out.returncode == 0 and "echo" in out.stdout and not via_agent(out)
    assert "not through the command agent" in out.stderr
    # A client of another version: refused, and the command runs in this process.
    other = "import sys; import cq_engine.cli.agent as a, cq_engine.cli.client as c; a.PROTOCOL = 99; sys.argv[0] = 'cq'; c.console()"
    out = subprocess.run(
        [sys.executable, "-c", other, "validate", "sql/echo.sql"],
        cwd=root,
        env=base,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "echo" in out.stdout, out.stderr
    assert "refused the command: a client of another installation (protocol 99" in out.stderr


def test_agent_ends_with_the_server(tmp_path):
    """Once the server's recorded port is gone (any stop), the agent stops by itself."""
    home = tmp_path / "home"
    (home / "spark").mkdir(parents=True)
    (home / "spark" / "port").write_text("1\n")
    assert agent.start(str(home), wait=120)
    (home / "spark" / "port").unlink()
    deadline = time.monotonic() + 30
    while Path(socket_path(str(home))).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(socket_path(str(home))).exists()
    assert not agent.stop(str(home))  # already gone
