"""The engine on a real cluster on one machine (``make cluster-test``; marker ``cluster``, run by ``.ci/run``
after ``make test``).

This is the docs' Deployment page, read from docs/operations/deployment.md and run as written, with only
its ports and directories replaced by free ones of the test's own: the environment of step 1, the Spark standalone
block (a master and two workers from pip pyspark's ``sbin/spark-daemon.sh``), ``cq spark start`` attaching
the engine's Spark Connect server to that master (its command line checked conf by conf against the
page's), the dagster.yaml (PostgreSQL, the run queue and the tag limits). The warehouse is on an
S3-compatible object store (moto's server) through ``s3a://`` for Spark and delta-rs for the sensors, the
ledger and the feed. The sample continuous queries (sql/sensors.sql, sql/resample.sql) fire through the
daemon and their sinks must equal an independent computation over the source at the version each firing
read. Every server listens on 127.0.0.1 only; everything is torn down.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shlex
import shutil
import string
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import requests
import yaml
from deltalake import DeltaTable
from netutil import free_port, port_open
from procutil import spawn_logged

import cq_engine
from cq_engine import jars
from cq_engine.cli.dev import DAGSTER_YAML as DEV_DAGSTER_YAML
from dagster_defs.internals import GRPC_INFO_TAG

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
BUCKET = "cq-warehouse"
VERSITYGW = REPO / ".tools" / "bin" / "versitygw"  # `make versitygw`
PG_BIN = max(
    Path("/usr/lib/postgresql").glob("*/bin"),
    default=Path("/usr/lib/postgresql/15/bin"),
    key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
)
MASTER, WORKER = "org.apache.spark.deploy.master.Master", "org.apache.spark.deploy.worker.Worker"
CHECKED = ("temperature_1m", "temperature_fahrenheit")  # disjoint firing ranges: one firing per sink row
FENCE = re.compile(r"^( *)```(\w+)\n(.*?)^\1```", re.MULTILINE | re.DOTALL)


DEPLOYMENT = REPO / "docs" / "operations" / "deployment.md"


def deployment_blocks(page: Path = DEPLOYMENT) -> list[tuple[str, str]]:
    """(language, dedented body) of each fenced block of the docs' Deployment page, in order, up to its
    first subsection (if it ever gets one): the environment, Spark standalone, ``cq spark start``, the
    command it runs, dagster.yaml, the code server and the daemon, workspace.yaml."""
    text = page.read_text()
    section = text[text.index("# Deployment\n") :]
    section = section.split("\n## ", 1)[0]
    blocks = [(m.group(2), textwrap.dedent(m.group(3))) for m in FENCE.finditer(section)]
    assert [lang for lang, _ in blocks] == ["sh", "sh", "sh", "sh", "yaml", "sh", "yaml"], blocks
    return blocks


def readme_exports(block: str) -> dict[str, str]:
    """The ``export K=V ...`` assignments of a shell block (comments dropped)."""
    out = {}
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        assert words and words[0] == "export", line
        out.update(w.split("=", 1) for w in words[1:])
    return out


def submit_args(words: list[str]) -> tuple[str, dict[str, str]]:
    """The master and the Spark confs of spark-submit-style arguments (``--driver-memory`` is a conf)."""
    master, conf = None, {}
    for flag, value in itertools.pairwise(words):
        if flag == "--master":
            master = value
        elif flag == "--conf":
            key, val = value.split("=", 1)
            conf[key] = val
        elif flag == "--driver-memory":
            conf["spark.driver.memory"] = value
    assert master, words
    return master, conf


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


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            kids.setdefault(ppid, []).append(int(stat.parent.name))
    return kids


def listening(roots: list[int]) -> dict[str, list[int]]:
    """Local address -> pids, for every TCP socket listened on by ``roots`` and their descendants."""
    kids, pids, todo = _children(), set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in pids:
            pids.add(pid)
            todo += kids.get(pid, [])
    inodes: dict[str, int] = {}
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            with contextlib.suppress(OSError):
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    inodes[link[8:-1]] = pid
    found: dict[str, list[int]] = {}
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                addr, port = cols[1].split(":")
                found.setdefault(f"{_ip(addr)}:{int(port, 16)}", []).append(inodes[cols[9]])
    return found


def _ip(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # little-endian 32-bit words
    if len(words) == 4:
        return ".".join(str(b) for b in words)
    if words[:12] == b"\0" * 10 + b"\xff\xff":
        return ".".join(str(b) for b in words[12:])  # IPv4-mapped
    return "[" + ":".join(words[i : i + 2].hex() for i in range(0, 16, 2)) + "]"


class Cluster:
    """Starts and stops every server of the deployment; ``stop`` is safe to call at any point."""

    def __init__(self, root: Path):
        self.root, self.logs = root, root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.blocks = deployment_blocks()
        self.stops: list = []
        self.roots: list[int] = []  # the pids of the servers (listening addresses are checked)
        self.pg_port, self.s3_port, self.connect_port = free_port(), free_port(), free_port()
        self.master_port, self.master_ui, self.code_port = free_port(), free_port(), free_port()
        self.master = f"spark://127.0.0.1:{self.master_port}"
        # The Deployment page's addresses and directories -> this test's own.
        self.subst = {
            "127.0.0.1:9000": f"127.0.0.1:{self.s3_port}",
            "127.0.0.1:7077": f"127.0.0.1:{self.master_port}",
            "--port 7077": f"--port {self.master_port}",
            "--webui-port 8080": f"--webui-port {self.master_ui}",
            "CQ_SPARK_PORT=15002": f"CQ_SPARK_PORT={self.connect_port}",
            "binding.port=15002": f"binding.port={self.connect_port}",
            "127.0.0.1:5432": f"127.0.0.1:{self.pg_port}",
            "-p 4266": f"-p {self.code_port}",
            "port: 4266": f"port: {self.code_port}",
            "/var/tmp/cq-cluster": str(self.logs),
        }
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "CQ_SPARK_REMOTE", "CQ_FAILPOINT")
            and not k.startswith(("AWS_", "CQ_SPARK_MASTER"))
        }
        exports = readme_exports(self.local(self.blocks[0][1]))
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert exports[key] == "...", exports  # a placeholder: moto takes any key
            exports[key] = "testing"
        assert exports["CQ_WAREHOUSE"] == f"s3://{BUCKET}/warehouse", exports
        self.env.update(exports)
        self.env.update(
            {
                "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                "CQ_HOME": str(root / ".cq"),
                "CQ_SQL_DIR": str(root / "sql"),
                "CQ_SPARK_PORT": str(self.connect_port),
                "CQ_CONFIG": str(root / "no-cq.toml"),
                "DAGSTER_HOME": str(root / "dagster_home"),
                "PYTHONUNBUFFERED": "1",
            }
        )

    def local(self, text: str) -> str:
        for old, new in self.subst.items():
            text = text.replace(old, new)
        return text

    def _spawn(self, name: str, cmd: list[str], **env: str) -> subprocess.Popen:
        proc = spawn_logged(cmd, log=self.logs / f"{name}.log", cwd=self.root, env={**self.env, **env})
        from cq_engine.cli.dev import stop_process_group

        self.stops.append(lambda: stop_process_group(proc, first_signal=15))
        self.roots.append(proc.pid)
        return proc

    def _run(self, cmd: list[str], **env: str) -> str:
        out = subprocess.run(cmd, cwd=self.root, env={**self.env, **env}, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}"
        return out.stdout

    # -- PostgreSQL ----------------------------------------------------------------------------
    def start_postgres(self) -> None:
        data = Path(tempfile.mkdtemp(prefix="cq-pg-", dir="/tmp"))  # traversable by the postgres user
        as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if as_pg:
            shutil.chown(data, "postgres", "postgres")
        self.stops.append(lambda: shutil.rmtree(data, ignore_errors=True))
        self._run([*as_pg, str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"])
        pg_ctl = [*as_pg, str(PG_BIN / "pg_ctl"), "-D", str(data), "-w", "-t", "300"]
        # Kept for a restart (tests/test_chaos.py stops and starts the server again).
        self.pg_start = [
            *pg_ctl,
            "-l",
            str(data / "server.log"),
            "-o",
            f"-h 127.0.0.1 -p {self.pg_port} -k {data}",
            "start",
        ]
        self.pg_stop = [*pg_ctl, "-m", "fast", "stop"]
        self._run(self.pg_start)
        self.stops.append(lambda: subprocess.run(self.pg_stop, capture_output=True))
        self.roots.append(int((data / "postmaster.pid").read_text().split()[0]))
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.pg_port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute("CREATE DATABASE dagster")

    # -- object store --------------------------------------------------------------------------
    def start_s3(self, server: str = "moto") -> None:
        """The object store: moto's server (the tests), or versitygw, a gateway serving S3 over a
        directory (the soak: moto answers a LIST by scanning the whole bucket, which at a soak's
        tens of thousands of objects took over half a core; ``make versitygw`` builds it)."""
        if server == "versitygw":
            if not VERSITYGW.is_file():
                raise RuntimeError(f"{VERSITYGW} is missing: run `make versitygw` first")
            data = self.root / "s3"
            data.mkdir(exist_ok=True)
            access = ["-a", "testing", "-s", "testing"]
            cmd = [str(VERSITYGW), "-q", "-p", f"127.0.0.1:{self.s3_port}", *access, "posix", str(data)]
            self._spawn("s3", cmd)
        elif server == "moto":
            self._spawn("moto", [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(self.s3_port)])
        else:
            raise ValueError(f"unknown S3 server {server!r}: moto or versitygw")
        _wait("the S3 server", lambda: port_open(self.s3_port), 120, self.logs)
        import boto3

        boto3.client(
            "s3",
            endpoint_url=self.env["AWS_ENDPOINT_URL"],
            region_name=self.env["AWS_REGION"],
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        ).create_bucket(Bucket=BUCKET)

    # -- Spark standalone (the page's block, as written) -----------------------------------------
    def start_spark(self) -> None:
        script = self.local(self.blocks[1][1])
        assert self.master in script and f"--port {self.master_port}" in script and str(self.logs) in script, script
        # Stopping needs the block's environment (its pid directory): its export lines, then stop.
        setup = "\n".join(line for line in script.splitlines() if line.startswith(("SPARK_HOME=", "export ")))
        for cls, i in ((MASTER, 1), (WORKER, 1), (WORKER, 2)):
            stop = f'{setup}\n"$SPARK_HOME/sbin/spark-daemon.sh" stop {cls} {i}'
            self.stops.append(lambda s=stop, c=cls, n=i: self._stop_daemon(s, c, n))
        self._run(["bash", "-e", "-o", "pipefail", "-c", script])
        _wait("two Spark workers", lambda: self.master_state()["aliveworkers"] == 2, 300, self.logs)
        self.roots += [int(p.read_text()) for p in self.logs.glob("spark-*.pid")]

    def _stop_daemon(self, stop: str, cls: str, i: int) -> None:
        """``spark-daemon.sh stop`` sends SIGTERM and removes the pid file at once; a JVM still alive 15 s
        later (seen after the chaos test: a master and workers outliving the test) is killed."""
        pid_file = next(self.logs.glob(f"spark-*-{cls}-{i}.pid"), None)
        pid = int(pid_file.read_text()) if pid_file else None
        subprocess.run(["bash", "-c", stop], env=self.env, capture_output=True)
        deadline = time.monotonic() + 15
        while pid is not None and Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        if pid is not None and Path(f"/proc/{pid}").exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)

    def master_state(self) -> dict:
        return requests.get(f"http://127.0.0.1:{self.master_ui}/json/", timeout=5).json()

    # -- the engine's Spark Connect server: `cq spark start`, checked against the page's command -----
    def start_connect(self) -> None:
        self.stops.append(lambda: subprocess.run([str(BIN / "cq"), "spark", "stop"], env=self.env, capture_output=True))
        self._run(["bash", "-e", "-c", self.local(self.blocks[2][1])])
        pid_file = next((self.root / ".cq" / "spark").glob("*SparkConnectServer-1.pid"))
        pid = int(pid_file.read_text())
        self.roots.append(pid)
        words = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        running = submit_args(words[words.index("org.apache.spark.deploy.SparkSubmit") + 1 :])
        command = string.Template(self.local(self.blocks[3][1].replace("\\\n", " "))).substitute(
            M2=str(Path.home() / ".m2" / "repository"),
            AWS_ENDPOINT_URL=self.env["AWS_ENDPOINT_URL"],
            AWS_REGION=self.env["AWS_REGION"],
            CQ_ENGINE=str(Path(cq_engine.__file__).resolve().parent),
            CQ_LOGSTORE_JAR=str(jars.logstore_jar()),
        )
        assert running == submit_args(shlex.split(command)), (running, command)

    # -- Dagster ---------------------------------------------------------------------------------
    def start_dagster(self) -> None:
        text = self.local(self.blocks[4][1])
        conf = yaml.safe_load(text)
        assert conf.pop("storage") == {
            "custom": {
                "module": "dagster_defs.pgstorage",
                "class": "PatientPostgresStorage",
                "config": {"postgres_url": f"postgresql+psycopg2://postgres:postgres@127.0.0.1:{self.pg_port}/dagster"},
            }
        }
        assert conf == yaml.safe_load(DEV_DAGSTER_YAML)  # the page's dagster.yaml is `cq dev`'s plus storage
        home = Path(self.env["DAGSTER_HOME"])
        home.mkdir(parents=True)
        (home / "dagster.yaml").write_text(text)
        workspace = yaml.safe_load(self.local(self.blocks[6][1]))
        assert workspace == {
            "load_from": [{"grpc_server": {"host": "127.0.0.1", "port": self.code_port, "location_name": "cq"}}]
        }, workspace
        (self.root / "workspace.yaml").write_text(yaml.safe_dump(workspace))
        self.start_code_server()
        self.start_daemon()

    def _dagster_commands(self) -> tuple[list[str], list[str]]:
        """The page's two commands: the code location's server and the daemon."""
        serve, daemon = (shlex.split(line) for line in self.local(self.blocks[5][1]).strip().splitlines())
        assert serve[:3] == ["dagster", "code-server", "start"], serve
        assert daemon == ["dagster-daemon", "run", "-w", "workspace.yaml"], daemon
        return [str(BIN / "dagster"), *serve[1:]], [str(BIN / daemon[0]), *daemon[1:]]

    def start_code_server(self) -> None:
        # No CQ_SPARK_REMOTE: with the server's CQ_HOME and port, runs find it and its token there.
        self.code_server = self._spawn("code-server", self._dagster_commands()[0])
        _wait("the code server", lambda: port_open(self.code_port), 300, self.logs)

    def start_daemon(self) -> None:
        self.daemon = self._spawn("daemon", self._dagster_commands()[1])

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


def _committer(commit: dict) -> str:
    """Who wrote a commit: ``Apache-Spark`` (delta-spark's engineInfo) or ``delta-rs`` (its clientVersion)."""
    info = f"{commit.get('engineInfo', '')} {commit.get('clientVersion', '')}"
    return "Apache-Spark" if "Apache-Spark" in info else "delta-rs" if "delta-rs" in info else info


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

    assert not jars.missing(jars.delta_artifacts() + jars.s3a_artifacts()), "run `make jars`"
    (tmp_path / "sql").mkdir()
    for name in ("sensors.sql", "resample.sql"):
        shutil.copy(REPO / "sql" / name, tmp_path / "sql" / name)
    cluster = Cluster(tmp_path)
    stop_feed, old = threading.Event(), dict(os.environ)
    try:
        cluster.start_postgres()
        cluster.start_s3(os.environ.get("CQ_CLUSTER_S3", "moto"))  # versitygw: the soak's store
        cluster.start_spark()
        cluster.start_connect()
        apps = cluster.master_state()["activeapps"]
        assert len(apps) == 1 and apps[0]["cores"] == 2, apps  # the Connect server runs on both workers
        assert list((cluster.logs / "work").glob("app-*")), "the executors' scratch is not SPARK_WORKER_DIR"

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
        import psycopg

        def query(sql: str) -> list[tuple]:
            with psycopg.connect(host="127.0.0.1", port=cluster.pg_port, user="postgres", dbname="dagster") as conn:
                return conn.execute(sql).fetchall()

        # A batch run commits several definitions' firings, each as it is done: the first two batches
        # (which hold the first firings) have finished a little later. The runs live in PostgreSQL.
        _wait(
            "two successful Dagster runs",
            lambda: query("SELECT count(*) FROM runs WHERE status = 'SUCCESS'")[0][0] >= 2,
            600,
        )
        stop_feed.set()
        materialized = {
            key
            for (key,) in query(
                "SELECT DISTINCT asset_key FROM event_logs WHERE dagster_event_type = 'ASSET_MATERIALIZATION'"
            )
        }
        sinks = {feeder.continuous_query(cq).sink for cq in CHECKED}
        assert all(any(f'"{sink}"' in str(key) for key in materialized) for sink in sinks), (sinks, materialized)
        bound = listening(cluster.roots)
        assert f"127.0.0.1:{cluster.master_port}" in bound and f"127.0.0.1:{cluster.connect_port}" in bound, bound
        assert all(addr.startswith("127.0.0.1:") for addr in bound), bound  # nothing on another interface
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
        # A firing's few rows were committed by delta-rs from the run's process: no Spark job for them.
        sink_uri = feeder.settings.table_uri("sensors_1m")
        firings = [h for h in DeltaTable(sink_uri).history() if h.get("operation") in ("WRITE", "MERGE")]
        assert firings and all(_committer(h) == "delta-rs" for h in firings), firings

        # A large result is written and committed by the executors, through the engine's log store (one
        # conditional PUT), while the daemon's runs go on committing to the same sink with delta-rs:
        # CQ_SPARK_WRITE_BYTES=1 makes every result "large" for this one command (a row-wise query, whose
        # Spark frame is its whole result; an aggregate with known groups completes its result in Arrow).
        raw, raw_sink = "temperature_fahrenheit", feeder.settings.table_uri("sensors_fahrenheit")
        done = sorted((e for e in feeder.ledger.entries(raw) if e.status == "succeeded"), key=lambda e: e.range_end)
        lo, hi = done[0].range_start, done[-1].range_end
        recalc = subprocess.run(
            [str(BIN / "cq"), "recalculate", raw, "--from", lo.isoformat(), "--to", hi.isoformat()],
            cwd=tmp_path,
            env={**cluster.env, "CQ_SPARK_WRITE_BYTES": "1"},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert recalc.returncode == 0, recalc.stdout + recalc.stderr
        entry = next(e for e in reversed(feeder.ledger.entries(raw)) if e.kind == "recalculate")
        assert entry.status == "succeeded" and entry.sink_version is not None, entry
        written = DeltaTable(raw_sink, version=entry.sink_version).history(1)[0]
        assert _committer(written) == "Apache-Spark", written
        sink = pa.table(DeltaTable(raw_sink, version=entry.sink_version).to_pyarrow_table())
        source = DeltaTable(feeder.settings.table_uri("sensors"), version=entry.source_versions["sensors"])
        assert _actual(raw, sink, lo, hi) == _expected(raw, source.to_pyarrow_table(), lo, hi)
        # One code server served the whole test: a daemon starting its own replaces it every 60 s, and
        # the replaced one exits with what its sensors compute ("cannot schedule new futures after
        # shutdown"), and everything it held open starts over in the next.
        assert cluster.code_server.poll() is None, "the code server exited"
        logs = "".join(p.read_text(errors="replace") for p in cluster.logs.glob("*.log"))
        for said in ("No heartbeat received", "cannot schedule new futures"):
            assert said not in logs, said
        grpc = {json.loads(r[0])["port"] for r in query(f"SELECT value FROM run_tags WHERE key = '{GRPC_INFO_TAG}'")}
        assert grpc == {cluster.code_port}, grpc  # every run launched by it
        # Nowhere in the deployment does delta-rs fall back to its unsafe rename.
        assert "AWS_S3_ALLOW_UNSAFE_RENAME" not in cluster.env
    finally:
        stop_feed.set()
        cluster.stop()
        os.environ.clear()
        os.environ.update(old)
    # Torn down: Spark's stop scripts signal the JVMs and return, so their ports close a moment later.
    ports = (cluster.connect_port, cluster.master_port, cluster.pg_port, cluster.s3_port, cluster.code_port)
    deadline = time.monotonic() + 120
    while any(port_open(p) for p in ports) and time.monotonic() < deadline:
        time.sleep(1)
    assert not [p for p in ports if port_open(p)], "a server of the cluster still listens after teardown"
