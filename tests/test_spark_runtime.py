"""The engine's local Spark Connect server: real JVM processes, no mocks; one server per module."""

import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cq_engine.config import Settings
from cq_engine.errors import SparkError
from cq_engine.spark import _alive, server_status, start_server, stop_server

from netutil import free_port, port_open  # noqa: E402

REPO = Path(__file__).resolve().parent.parent





def proc_state(pid: int) -> str | None:
    """None once the pid is gone. "Z" is dead too: the orphaned JVM's parent is pid 1, and some
    container inits reap orphans only every few seconds."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    settings = Settings(home=str(tmp_path_factory.mktemp("cq_home")), spark_port=free_port())
    try:
        status = start_server(settings)
        yield settings, status
    finally:
        stop_server(settings)


def test_start_reports_running(server):
    settings, status = server
    assert status.running and status.pid and status.port == settings.spark_port
    assert status.url == f"sc://localhost:{settings.spark_port}"
    now = server_status(settings)
    assert now == status and _alive(now.pid) and port_open(now.port)
    assert now.log_file and Path(now.log_file).is_file()
    assert Path(settings.home, "spark").is_dir()
    assert str(settings.spark_port) in now.describe()


def test_get_session_connects(server):
    settings, _ = server
    # A subprocess: this process may hold the classic session other tests use.
    code = (
        "from cq_engine.config import Settings\n"
        "from cq_engine.spark import get_session, session_kind\n"
        f"s = get_session(Settings(home={settings.home!r}, spark_port={settings.spark_port}))\n"
        "print(session_kind(s), s.range(10).count(), s.conf.get('spark.sql.session.timeZone'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "connect 10 UTC"


def test_start_is_idempotent(server):
    settings, status = server
    assert start_server(settings, timeout=5) == status
    # The same home with another port: one server per home, so refuse rather than start a second.
    with pytest.raises(SparkError, match=f"already runs on port {settings.spark_port}"):
        start_server(replace(settings, spark_port=free_port()), timeout=5)
    assert server_status(settings) == status


def test_port_in_use(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(SparkError, match=f"port {port} is already in use"):
            start_server(Settings(home=str(tmp_path), spark_port=port), timeout=10)
    assert not list(tmp_path.glob("spark/*.pid"))


def test_java_missing(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(SparkError, match="Java 17"):
        start_server(Settings(home=str(tmp_path), spark_port=free_port()), timeout=10)


def test_stop(server):
    settings, status = server
    assert stop_server(settings) is True
    assert not _alive(status.pid)
    assert proc_state(status.pid) in (None, "Z")
    assert not port_open(settings.spark_port)
    assert not server_status(settings).running
    assert not list(Path(settings.home, "spark").glob("*.pid"))
    assert stop_server(settings) is False
