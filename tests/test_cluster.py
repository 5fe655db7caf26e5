"""The engine on a real cluster on one machine (``make cluster-test``; marker ``cluster``, not in ``make test``).

A Spark standalone master and two workers (pip pyspark's ``sbin/spark-daemon.sh``), the engine's Spark
Connect server attached to that master with delta-spark and hadoop-aws; Dagster's instance on
PostgreSQL with the run queue and the BLOCKED tag limits; the warehouse on an S3-compatible object
store (moto's server) through ``s3a://`` for Spark and delta-rs for the sensors, the ledger and the
feed. The sample continuous queries (sql/sensors.sql, sql/resample.sql) fire through the daemon and
their sinks must equal an independent computation over the source at the version each firing read.
Every server binds to 127.0.0.1; everything is torn down. This is the README's "Deployment" section.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import requests
from deltalake import DeltaTable
from netutil import free_port, port_open

from cq_engine.cli.dev import DAGSTER_YAML as DEV_DAGSTER_YAML

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
BUCKET = "cq-warehouse"
PG_BIN = max(
    Path("/usr/lib/postgresql").glob("*/bin"),
    default=Path("/usr/lib/postgresql/15/bin"),
    key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
)
MASTER, WORKER = "org.apache.spark.deploy.master.Master", "org.apache.spark.deploy.worker.Worker"
CHECKED = ("temperature_1m", "temperature_fahrenheit")  # disjoint firing ranges: one firing per sink row

# The README's dagster.yaml (Deployment): PostgreSQL storage, then `cq dev`'s run queue and tag limits.
# postgres_url names the psycopg2 driver: SQLAlchemy 2.1 defaults to psycopg 3, with which
# dagster-postgres 0.29.27's `NOTIFY run_events, %s` fails (server-side parameters).
POSTGRES_STORAGE = """\
storage:
  postgres:
    postgres_url: postgresql+psycopg2://postgres:postgres@127.0.0.1:{port}/dagster
"""
DAGSTER_YAML = POSTGRES_STORAGE + DEV_DAGSTER_YAML


def _wait(what: str, ready, timeout: float, logs: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except Exception:
            pass
        time.sleep(1)
    tails = ""
    if logs is not None:
        for log in sorted(logs.glob("*")):
            if log.is_file():
                tails += f"\n--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:])
    raise AssertionError(f"{what} not ready within {timeout:.0f}s{tails}")


class Cluster:
    """Starts and stops every server of the deployment; ``stop`` is safe to call at any point."""

    def __init__(self, root: Path):
        self.root, self.logs = root, root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.stops: list = []
        self.pg_port, self.s3_port, self.connect_port = free_port(), free_port(), free_port()
        self.master_port, self.master_ui = free_port(), free_port()
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "CQ_SPARK_REMOTE", "CQ_FAILPOINT")
        }
        self.env.update(
            {
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_REGION": "us-east-1",
                "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.s3_port}",
                "AWS_ALLOW_HTTP": "true",
                # delta-rs needs a lock or conditional puts for concurrent S3 writers; one feed per table here.
                "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
                "SPARK_LOCAL_IP": "127.0.0.1",
                "CQ_WAREHOUSE": f"s3://{BUCKET}/warehouse",
                "CQ_HOME": str(root / ".cq"),
                "CQ_SQL_DIR": str(root / "sql"),
                "CQ_STORAGE": "spark",
                "CQ_SPARK_PORT": str(self.connect_port),
                "CQ_CONFIG": str(root / "no-cq.toml"),
                "DAGSTER_HOME": str(root / "dagster_home"),
                "PYTHONUNBUFFERED": "1",
            }
        )

    def _spawn(self, name: str, cmd: list[str], **env: str) -> subprocess.Popen:
        with open(self.logs / f"{name}.log", "w") as log:
            proc = subprocess.Popen(
                cmd,
                cwd=self.root,
                env={**self.env, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        from cq_engine.cli.dev import stop_process_group

        self.stops.append(lambda: stop_process_group(proc, first_signal=15))
        return proc

    def _run(self, cmd: list[str], **env: str) -> None:
        out = subprocess.run(cmd, env={**self.env, **env}, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}"

    # -- PostgreSQL ----------------------------------------------------------------------------
    def start_postgres(self) -> None:
        data = Path(tempfile.mkdtemp(prefix="cq-pg-", dir="/tmp"))  # traversable by the postgres user
        as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if as_pg:
            shutil.chown(data, "postgres", "postgres")
        self.stops.append(lambda: shutil.rmtree(data, ignore_errors=True))
        self._run([*as_pg, str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"])
        pg_ctl = [*as_pg, str(PG_BIN / "pg_ctl"), "-D", str(data), "-w"]
        self._run([*pg_ctl, "-l", str(data / "server.log"), "-o", f"-h 127.0.0.1 -p {self.pg_port} -k {data}", "start"])
        self.stops.append(lambda: subprocess.run([*pg_ctl, "-m", "fast", "stop"], capture_output=True))
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.pg_port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute("CREATE DATABASE dagster")

    # -- object store --------------------------------------------------------------------------
    def start_s3(self) -> None:
        self._spawn("moto", [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(self.s3_port)])
        _wait("the S3 server", lambda: port_open(self.s3_port), 60, self.logs)
        import boto3

        boto3.client(
            "s3",
            endpoint_url=self.env["AWS_ENDPOINT_URL"],
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        ).create_bucket(Bucket=BUCKET)

    # -- Spark standalone ----------------------------------------------------------------------
    def start_spark(self) -> None:
        from cq_engine.spark import spark_home

        home = spark_home()
        daemon = ["bash", str(home / "sbin" / "spark-daemon.sh")]
        env = dict(
            SPARK_HOME=str(home),
            SPARK_PID_DIR=str(self.logs),
            SPARK_LOG_DIR=str(self.logs),
            SPARK_IDENT_STRING="cqcluster",
            SPARK_CONNECT_MODE="0",
        )
        self.stops.append(
            lambda: subprocess.run([*daemon, "stop", MASTER, "1"], env={**self.env, **env}, capture_output=True)
        )
        self._run(
            [
                *daemon,
                "start",
                MASTER,
                "1",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.master_port),
                "--webui-port",
                str(self.master_ui),
            ],
            **env,
        )
        self.master = f"spark://127.0.0.1:{self.master_port}"
        for i in (1, 2):
            self.stops.append(
                lambda i=i: subprocess.run(
                    [*daemon, "stop", WORKER, str(i)], env={**self.env, **env}, capture_output=True
                )
            )
            self._run(
                [
                    *daemon,
                    "start",
                    WORKER,
                    str(i),
                    "--host",
                    "127.0.0.1",
                    "--webui-port",
                    str(free_port()),
                    "--cores",
                    "1",
                    "--memory",
                    "1536m",
                    "--work-dir",
                    str(self.root / f"work{i}"),
                    self.master,
                ],
                **env,
            )
        _wait("two Spark workers", lambda: self.master_state()["aliveworkers"] == 2, 180, self.logs)

    def master_state(self) -> dict:
        return requests.get(f"http://127.0.0.1:{self.master_ui}/json/", timeout=5).json()

    def start_connect(self) -> None:
        from cq_engine import spark as cq_spark
        from cq_engine.config import load_settings

        settings = load_settings(environ={**self.env, "CQ_SPARK_MASTER": self.master})
        old = dict(os.environ)
        os.environ.update({k: v for k, v in self.env.items() if k.startswith(("AWS_", "SPARK_LOCAL_IP"))})
        try:
            self.stops.append(lambda: cq_spark.stop_server(settings))
            cq_spark.start_server(settings, timeout=300)
        finally:
            os.environ.clear()
            os.environ.update(old)

    # -- Dagster ---------------------------------------------------------------------------------
    def start_dagster(self) -> None:
        home = Path(self.env["DAGSTER_HOME"])
        home.mkdir(parents=True)
        (home / "dagster.yaml").write_text(DAGSTER_YAML.format(port=self.pg_port))
        workspace = self.root / "workspace.yaml"
        workspace.write_text(
            f"load_from:\n  - python_module:\n      module_name: dagster_defs.location\n      working_directory: {REPO}\n"
        )
        # No CQ_SPARK_REMOTE: with the server's CQ_HOME and port, runs find it and its token there.
        self._spawn("daemon", [str(BIN / "dagster-daemon"), "run", "-w", str(workspace)])

    def stop(self) -> None:
        while self.stops:
            with contextlib.suppress(Exception):
                self.stops.pop()()


def _feed(engine, stop: threading.Event, start: datetime) -> None:
    from cq_engine.cli.feed import floor_time, sensor_rows

    while not stop.wait(2.0):
        end = floor_time(datetime.now(UTC), timedelta(seconds=1))
        if end > start:
            engine.storage.append(
                "sensors",
                sensor_rows(start=start, end=end, every=timedelta(seconds=1)),
                metadata={"cq.ingest": "cluster test feed"},
            )
            start = end


def _expected(cq: str, source: pa.Table, lo: datetime, hi: datetime) -> list[tuple]:
    """The sink rows of one firing computed with pyarrow alone (no Spark, no engine code)."""
    rows = source.filter(
        pc.and_(
            pc.greater_equal(source["ts"], pa.scalar(lo, pa.timestamp("us", "UTC"))),
            pc.less(source["ts"], pa.scalar(hi, pa.timestamp("us", "UTC"))),
        )
    ).to_pylist()
    if cq == "temperature_fahrenheit":
        return sorted(
            (r["ts"], r["device"], round(r["temperature"] * 9 / 5 + 32, 9))
            for r in rows
            if r["temperature"] is not None
        )
    out = []
    for device in sorted({r["device"] for r in rows}):
        temps = [r["temperature"] for r in rows if r["device"] == device and r["temperature"] is not None]
        if temps:
            out.append((lo, device, max(temps), round(sum(temps) / len(temps), 9), len(temps)))
    return out


def _actual(cq: str, sink: pa.Table, lo: datetime, hi: datetime) -> list[tuple]:
    rows = [r for r in sink.to_pylist() if lo <= r["ts"] < hi]
    if cq == "temperature_fahrenheit":
        return sorted((r["ts"], r["device"], round(r["temperature_f"], 9)) for r in rows)
    return sorted(
        (r["ts"], r["device"], r["temperature_max"], round(r["temperature_avg"], 9), r["samples"]) for r in rows
    )


def test_sample_definitions_on_a_one_machine_cluster(tmp_path):
    if not (PG_BIN / "initdb").is_file():
        pytest.fail(f"PostgreSQL is not installed ({PG_BIN}/initdb): run `make cluster-test`, which installs it")
    from cq_engine import jars

    assert not jars.missing(jars.DELTA_ARTIFACTS + jars.S3A_ARTIFACTS), "run `make jars`"
    (tmp_path / "sql").mkdir()
    for name in ("sensors.sql", "resample.sql"):
        shutil.copy(REPO / "sql" / name, tmp_path / "sql" / name)
    cluster = Cluster(tmp_path)
    stop_feed, old = threading.Event(), dict(os.environ)
    try:
        cluster.start_postgres()
        cluster.start_s3()
        cluster.start_spark()
        cluster.start_connect()
        apps = cluster.master_state()["activeapps"]
        assert len(apps) == 1 and apps[0]["cores"] == 2, apps  # the Connect server runs on both workers

        os.environ.update({k: v for k, v in cluster.env.items() if k.startswith("AWS_")})
        from cq_engine.config import load_settings
        from cq_engine.engine import Engine

        feeder = Engine(settings=load_settings(environ={**cluster.env, "CQ_STORAGE": "deltars"}))
        feeder.ensure_tables()
        start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=2)
        threading.Thread(target=_feed, args=(feeder, stop_feed, start), daemon=True).start()
        cluster.start_dagster()

        def fired() -> bool:
            done = {cq: [e for e in feeder.ledger.entries(cq) if e.status == "succeeded"] for cq in CHECKED}
            return all(len(v) >= 2 for v in done.values())

        _wait("two successful firings of each checked sample CQ", fired, 900, cluster.logs)
        stop_feed.set()
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=cluster.pg_port, user="postgres", dbname="dagster") as conn:
            statuses = dict(conn.execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall())
        assert statuses.get("SUCCESS", 0) >= 4, statuses  # the runs live in PostgreSQL
        for cq in CHECKED:
            sink_name = feeder.continuous_query(cq).sink
            sink = pa.table(DeltaTable(feeder.settings.table_uri(sink_name)).to_pyarrow_table())
            latest = {}
            for e in feeder.ledger.entries(cq):
                if e.status == "succeeded":
                    latest[e.fire_time] = e
            assert latest
            for entry in latest.values():
                source = DeltaTable(
                    feeder.settings.table_uri("sensors"), version=entry.source_versions["sensors"]
                ).to_pyarrow_table()
                lo, hi = entry.range_start, entry.range_end
                assert _actual(cq, sink, lo, hi) == _expected(cq, source, lo, hi), (cq, entry)
        # Spark wrote the sinks (delta-spark commits), straight to the object store.
        history = DeltaTable(feeder.settings.table_uri("sensors_1m")).history(5)
        assert any("Apache-Spark" in str(h.get("engineInfo", "")) for h in history), history
    finally:
        stop_feed.set()
        cluster.stop()
        os.environ.clear()
        os.environ.update(old)
    assert not port_open(cluster.connect_port) and not port_open(cluster.master_port)
    assert not port_open(cluster.pg_port) and not port_open(cluster.s3_port)
