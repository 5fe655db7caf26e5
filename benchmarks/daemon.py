"""A real Dagster daemon for the orchestration benchmarks (``orchestration``, ``freshness``): a
Spark Connect server, a DAGSTER_HOME written by ``cq dev``'s ``write_dagster_home``, a code server
(``dagster api grpc`` on ``dagster_defs.location``) and ``dagster-daemon run``, each in its own
session, stopped (process groups, then the Spark server) by ``stop``."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from . import clean_env, free_port

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent


@dataclass
class Daemon:
    root: Path
    settings: object  # cq_engine.config.Settings
    run_model: str = "batch"
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def dagster_home(self) -> Path:
        return self.root / "dagster_home"

    def env(self) -> dict[str, str]:
        from cq_engine.cli.dev import dagster_env

        env = dagster_env(self.settings, self.dagster_home)
        env = {**clean_env(), **{k: v for k, v in env.items() if k.startswith(("CQ_", "DAGSTER_"))}}
        env.update(
            CQ_CONFIG=str(self.root / "no-cq.toml"),
            CQ_RUN_MODEL=self.run_model,
            PYTHONUNBUFFERED="1",
            PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        )
        return env

    def start(self, *, timeout: float = 300) -> None:
        from cq_engine import spark as cq_spark
        from cq_engine.cli.dev import write_dagster_home

        status = cq_spark.start_server(self.settings, timeout=240)
        if not status.running:
            raise RuntimeError(status.describe())
        write_dagster_home(self.dagster_home)
        runs = os.environ.get("CQ_BENCH_BATCH_RUNS")  # an experiment: another cq/batch queue limit
        if runs:
            yaml = self.dagster_home / "dagster.yaml"
            text = yaml.read_text()
            old = 'value: "true"\n        limit: 2'
            assert old in text, "the cq/batch limit moved in cq dev's dagster.yaml"
            yaml.write_text(text.replace(old, f'value: "true"\n        limit: {int(runs)}'))
        port = free_port()
        (self.root / "workspace.yaml").write_text(
            f"load_from:\n  - grpc_server:\n      host: 127.0.0.1\n      port: {port}\n      location_name: bench\n"
        )
        env = self.env()
        self._spawn(
            "code_server",
            [
                str(BIN / "dagster"),
                "api",
                "grpc",
                "--module-name",
                "dagster_defs.location",
                "--working-directory",
                str(REPO),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            env,
        )
        deadline = time.monotonic() + timeout
        while not _port_open(port):
            self._check()
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the code server did not start within {timeout:.0f}s\n{self.log_tail('code_server')}"
                )
            time.sleep(1)
        self._spawn("daemon", [str(BIN / "dagster-daemon"), "run", "-w", str(self.root / "workspace.yaml")], env)

    def instance(self):
        """The daemon's DagsterInstance (read its runs and sensor ticks directly)."""
        import dagster as dg

        os.environ["DAGSTER_HOME"] = str(self.dagster_home)
        return dg.DagsterInstance.get()

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        (self.root / "logs").mkdir(exist_ok=True)
        with open(self.root / "logs" / f"{name}.log", "w") as log:
            self.procs[name] = subprocess.Popen(
                cmd,
                cwd=self.root,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def _check(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}\n{self.log_tail(name)}")

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.root / "logs" / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        from cq_engine import spark as cq_spark
        from cq_engine.cli.dev import stop_process_group

        for name in ("daemon", "code_server"):
            if name in self.procs:
                stop_process_group(self.procs[name], first_signal=signal.SIGTERM)
        cq_spark.stop_server(self.settings)


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def queued_runs(instance) -> int:
    """How many runs wait in the instance's queue now."""
    import dagster as dg

    return instance.get_runs_count(dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED]))


def daemon_engine(ctx, name: str, files: dict[str, str]):
    """(settings, engine) of benchmark ``name`` under the daemon: ``files`` (file name -> SQL) in its
    sql dir, its own warehouse, home and Connect port, the declared tables created."""
    from cq_engine.config import Settings
    from cq_engine.engine import Engine

    from . import free_port

    work = ctx.workdir(name)
    (work / "sql").mkdir(exist_ok=True)
    for file, sql in files.items():
        (work / "sql" / file).write_text(sql)
    settings = Settings(
        sql_dir=str(work / "sql"), warehouse=str(work / "wh"), home=str(work / ".cq"), spark_port=free_port()
    )
    engine = Engine(settings=settings)
    assert not engine.catalog.errors, engine.catalog.errors
    engine.ensure_tables()
    return settings, engine


def observe(ctx, daemon, *, seconds: int) -> tuple[datetime, datetime, list[float], list[int]]:
    """After a warm-up, watch ``seconds``, sampling the load average and the runs queued every 10 s:
    the window's (start, end) and the samples."""

    time.sleep(30 if ctx.quick else 60)  # warm-up
    w0 = datetime.now(UTC)
    ctx.log(f"measuring {seconds}s from {w0:%H:%M:%S}")
    end_at = time.monotonic() + seconds
    instance = daemon.instance()
    loads: list[float] = []
    queued: list[int] = []
    while time.monotonic() < end_at:
        loads.append(os.getloadavg()[0])
        queued.append(queued_runs(instance))
        time.sleep(10)
    return w0, datetime.now(UTC), loads, queued


def load_text(loads: list[float]) -> str:
    """The sampled 1-minute load averages, as the benchmarks' lines print them."""
    return f"load avg {statistics.mean(loads):.1f} (1-min, sampled; max {max(loads):.1f})" if loads else ""
