"""An AFTER INSERT trigger under a real ``dagster-daemon`` (its own code server process, the sensor
``<name>_trigger``), stopped and started again while the table keeps growing: every committed batch
reaches ``fire`` exactly once, in version order, and the new process's STATEFUL instance is
``restore()``d. The trigger is the repository's ``examples.triggers.journal:Journal`` (one JSON line
per batch); batches are written with the public ``ingest()`` API."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest
from dagster._core.scheduler.instigation import InstigatorType
from procutil import spawn_logged

from cq_engine.cli.dev import dagster_env, stop_process_group, write_dagster_home
from cq_engine.config import Settings
from cq_engine.engine import Engine
from cq_engine.ingest import ingest
from cq_engine.triggers.runtime import state_dir

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
T0 = datetime(2024, 1, 1, tzinfo=UTC)
SENSOR = "journal_trigger"


class Daemon:
    """One ``dagster-daemon run`` in its own session (its code server and run workers in its group)."""

    def __init__(self, root: Path, settings: Settings):
        self.root, self.home = root, write_dagster_home(root / "dagster_home")
        self.workspace = root / "workspace.yaml"
        self.workspace.write_text(
            "load_from:\n  - python_module:\n      module_name: dagster_defs.location\n"
            f"      working_directory: {REPO}\n      location_name: cq_triggers\n"
        )
        self.env = dagster_env(settings, self.home)
        for var in ("CQ_SPARK_REMOTE", "CQ_SPARK_MASTER", "CQ_FAILPOINT"):
            self.env.pop(var, None)
        # The trigger class lives in the repository's examples/: the documented trigger path points there.
        self.env.update(CQ_CONFIG=str(root / "no-cq.toml"), PYTHONUNBUFFERED="1", CQ_TRIGGER_PATH=str(REPO))
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        self.proc = spawn_logged(
            [str(BIN / "dagster-daemon"), "run", "-w", str(self.workspace)],
            log=self.root / f"daemon{self.starts}.log",
            cwd=self.root,
            env=self.env,
            append=False,
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop_process_group(self.proc, first_signal=signal.SIGTERM)
        self.proc = None
        # The code server the daemon spawned can sit in a session of its own, waiting for a heartbeat
        # timeout: end it (by pid; it is ours, its environment names our DAGSTER_HOME).
        for pid in _pids_with(f"DAGSTER_HOME={self.home}"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _pids_with(f"DAGSTER_HOME={self.home}") and time.monotonic() < deadline:
            time.sleep(0.2)

    def log_tail(self) -> str:
        path = self.root / f"daemon{self.starts}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-30:]) if path.exists() else ""

    def cursor(self) -> dict | None:
        """The sensor's cursor as Dagster stored it."""
        with dg.DagsterInstance.from_config(str(self.home)) as instance:
            for state in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR):
                if state.name == SENSOR and state.instigator_data and state.instigator_data.cursor:
                    return json.loads(state.instigator_data.cursor)
        return None

    def wait(self, what: str, ready, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, f"the daemon exited\n{self.log_tail()}"
            if ready():
                return
            time.sleep(0.5)
        raise AssertionError(f"{what} not within {timeout:.0f}s\n{self.log_tail()}")


@pytest.fixture
def stack(tmp_path):
    (tmp_path / "sql").mkdir()
    journal = tmp_path / "journal.jsonl"
    (tmp_path / "sql" / "triggers.sql").write_text(
        "CREATE TABLE readings (ts TIMESTAMP, device STRING, value DOUBLE);\n"
        "CREATE STATEFUL TRIGGER journal AFTER INSERT ON read* AS 'examples.triggers.journal:Journal'\n"
        f'  WITH ("path" = "{journal}");\n'
    )
    settings = Settings(sql_dir=str(tmp_path / "sql"), warehouse=str(tmp_path / "wh"), home=str(tmp_path / ".cq"))
    engine = Engine(settings=settings)
    engine.ensure_tables()
    daemon = Daemon(tmp_path, settings)
    try:
        yield engine, daemon, journal
    finally:
        daemon.stop()


def records(journal: Path) -> list[dict]:
    return [json.loads(line) for line in journal.read_text().splitlines()] if journal.exists() else []


def fired(journal: Path) -> list[dict]:
    return [r for r in records(journal) if r["event"] == "after"]


def test_after_trigger_sees_every_committed_batch_once_across_a_daemon_restart(stack):
    engine, daemon, journal = stack
    written: list[tuple[int, int]] = []  # (version, rows) in commit order

    def write(n: int) -> None:
        start = 10 * len(written)
        data = pa.table(
            {
                "ts": pa.array([T0 + timedelta(seconds=start + i) for i in range(n)], pa.timestamp("us", tz="UTC")),
                "device": ["d1"] * n,
                "value": [float(start + i) for i in range(n)],
            }
        )
        written.append((ingest(table="readings", data=data, engine=engine).version, n))

    daemon.start()
    # The trigger exists once its sensor's first evaluation registered it (a trigger sees later writes).
    daemon.wait(
        "the trigger's registration",
        lambda: (state_dir(engine.settings, "journal") / "delivered.json").exists(),
        timeout=120,
    )
    for n in (2, 3, 1):
        write(n)
    daemon.wait("the first three batches", lambda: len(fired(journal)) >= 3)
    daemon.wait(
        "Dagster storing the cursor",
        lambda: (daemon.cursor() or {}).get("tables", {}).get("readings") == written[-1][0],
    )
    first_pid = fired(journal)[0]["pid"]
    daemon.stop()

    for n in (4, 2):  # committed while no daemon runs
        write(n)
    daemon.start()
    daemon.wait("the batches written while stopped", lambda: len(fired(journal)) >= 5)
    write(3)
    daemon.wait("a batch written after the restart", lambda: len(fired(journal)) >= 6)
    daemon.wait("the final cursor", lambda: (daemon.cursor() or {}).get("tables", {}).get("readings") == written[-1][0])
    daemon.stop()

    log = fired(journal)
    assert [(r["table"], r["version"], len(r["rows"])) for r in log] == [("readings", v, n) for v, n in written]
    assert [r["rows"][0]["value"] for r in log] == [float(10 * i) for i in range(len(written))]
    # Three batches in the first daemon's code server, three in the second's; the second instance was
    # restore()d (STATEFUL, registered by the first) before it fired.
    events = records(journal)
    assert [r["event"] for r in events] == ["after"] * 3 + ["restore"] + ["after"] * 3
    assert len({r["pid"] for r in events[:3]}) == 1 and events[0]["pid"] == first_pid
    assert events[3]["pid"] == events[4]["pid"] != first_pid
    assert [r["restored"] for r in log] == [False] * 3 + [True] * 3


def _pids_with(needle: str) -> list[int]:
    """Live processes whose environment holds ``needle`` (``VAR=value``)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle.encode() in (entry / "environ").read_bytes().split(b"\0") and (entry / "stat").read_text().rsplit(
                ")", 1
            )[1].split()[0] not in ("Z", "X"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids
