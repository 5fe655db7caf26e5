"""What the `cq dev` tests share: a project with the sample sensors, the real `cq dev` started in the
background with its own ports and homes, and waits that name what they waited for."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
import requests
from deltalake import DeltaTable
from procutil import command_line, live_pids

from cq_engine.config import Settings
from cq_engine.storage.ledger import Ledger

REPO = Path(__file__).resolve().parent.parent
SENSORS = """CREATE TABLE IF NOT EXISTS sensors (ts TIMESTAMP, device STRING, temperature DOUBLE, humidity DOUBLE);
CREATE CONTINUOUS QUERY hum_5s RESAMPLE EVERY 5s BEGIN
  SELECT avg(humidity) AS h INTO hum_5s FROM sensors GROUP BY (5s), device END;
CREATE STREAM hum_s INTERVAL(5s) SLIDING(5s) FROM sensors INTO hum_s AS SELECT _twstart, avg(humidity) AS h FROM %%trows;
"""


def project(tmp_path: Path) -> Settings:
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "sensors.sql").write_text(SENSORS)
    return Settings(sql_dir=str(tmp_path / "sql"), warehouse=str(tmp_path / "wh"), home=str(tmp_path / ".cq"))


def hold(port: int) -> socket.socket | None:
    """Listen on ``port`` if nobody does yet (else someone else already holds it)."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        return None
    sock.listen()
    return sock


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen, out: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            pytest.fail(f"cq dev exited ({proc.returncode}) while waiting for {what}:\n{out.read_text()[-4000:]}")
        time.sleep(1)
    pytest.fail(f"timed out waiting for {what}:\n{out.read_text()[-4000:]}")


def sensor_keys(settings: Settings) -> list[tuple]:
    data = pa.table(DeltaTable(str(Path(settings.warehouse) / "sensors")).scan())
    return sorted(zip(data.column("ts").to_pylist(), data.column("device").to_pylist()))


CQ = [sys.executable, "-m", "cq_engine.cli.main"]


def dev_env(tmp_path: Path, settings: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CQ_", "DAGSTER_", "SPARK_"))}
    env.update(
        CQ_SQL_DIR=settings.sql_dir,
        CQ_WAREHOUSE=settings.warehouse,
        CQ_HOME=settings.home,
        DAGSTER_HOME=str(tmp_path / "dagster"),
        PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]),
        **extra,
    )
    return env


def start_dev(out: Path, env: dict[str, str], *args: str) -> subprocess.Popen:
    """`cq dev ARGS` in the background, its output appended to ``out``."""
    with open(out, "ab") as sink:
        return subprocess.Popen(
            [*CQ, "dev", *args], cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )


def stop_dev(proc: subprocess.Popen) -> None:
    """After a failure: Ctrl-C first (a killed `cq dev` would leave `dagster dev`, in its own session,
    running), then SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(300)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def ui_up(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/server_info", timeout=3).status_code == 200
    except requests.RequestException:
        return False


def ctrl_c_during(dagster_home: Path, runs, what: str, proc: subprocess.Popen, out: Path) -> tuple[str, list]:
    """Once a run matching the filter ``runs`` is in flight, Ctrl-C: what `cq dev` printed from then on
    (it must exit 0) and every run of the instance."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        wait_for(lambda: instance.get_run_records(runs, limit=1), 600, what, proc, out)
        before = len(out.read_text())
        proc.send_signal(signal.SIGINT)
        assert proc.wait(600) == 0
        return out.read_text()[before:], [r.dagster_run for r in instance.get_run_records()]


def succeeded(ledger: Ledger, name: str, kind: str = "firing") -> list:
    return [e for e in ledger.entries(name) if e.kind == kind and e.status == "succeeded"]


def stack_pids(settings: Settings, dagster_home: Path) -> list[str]:
    """The live processes whose environment names this CQ_HOME or DAGSTER_HOME, with their commands."""
    found = []
    for pid in live_pids(f"CQ_HOME={Path(settings.home).resolve()}", f"DAGSTER_HOME={dagster_home.resolve()}"):
        try:
            command = command_line(pid)
        except OSError:  # it exited meanwhile
            continue
        found.append(f"{pid}: {command[:150]}")
    return found


def none_left(settings: Settings, dagster_home: Path, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while (left := stack_pids(settings, dagster_home)) and time.monotonic() < deadline:
        time.sleep(1)
    return left
