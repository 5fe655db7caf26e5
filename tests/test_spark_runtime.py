"""The engine's local Spark Connect server: real JVM processes, no mocks; one server per module."""

import os
import re
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from netutil import free_port, port_open

from cq_engine.config import Settings
from cq_engine.errors import SparkError
from cq_engine.spark import _alive, in_process_notice, port_taken, server_status, start_server, stop_server

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


def over_connect(script: str, settings, tmp_path):
    """Run ``script`` (argv: the server's CQ_HOME, its port, a scratch directory) in a fresh Python
    beside the module's Connect server; the JSON of its last line of output."""
    import json

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO)])}
    out = subprocess.run(
        [sys.executable, "-c", script, settings.home, str(settings.spark_port), str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0 and out.stdout.strip(), out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


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
        "from cq_engine.spark import get_session\n"
        f"s = get_session(Settings(home={settings.home!r}, spark_port={settings.spark_port}))\n"
        "kind = 'connect' if type(s).__module__.startswith('pyspark.sql.connect') else 'classic'\n"
        "print(kind, s.range(10).count(), s.conf.get('spark.sql.session.timeZone'))\n"
        "p = s.client.get_retry_policies()\n"
        "print(len(p), p[0].max_retries, p[0].initial_backoff, p[0].backoff_multiplier, p[0].max_backoff)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-2] == "connect 10 UTC"
    # A lost server costs a call about 12 s of retries, not pyspark's ten minutes; the rounds then wait
    # for the server themselves (cq_engine.recovery; docs/operations/guarantees.md).
    count, retries, first, factor, cap = lines[-1].split()
    waits = [min(float(first) * float(factor) ** i, float(cap)) for i in range(int(retries))]
    assert count == "1" and 5_000 <= sum(waits) <= 20_000 and float(cap) <= 5_000, lines[-1]


def _listening(pid: int) -> list[str]:
    """The local addresses (hex, as in /proc/net/tcp*) of the sockets ``pid`` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                found.append(cols[1].split(":")[0])
    return found


LOOPBACK = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux procfs")
def test_server_listens_on_loopback_only_and_requires_its_token(server):
    settings, status = server
    listening = _listening(status.pid)
    assert len(listening) >= 2  # Connect's gRPC port, the driver's RPC and block manager ports
    assert set(listening) <= LOOPBACK, listening
    token = Path(settings.home, "spark", "connect.token")
    assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text().strip()) >= 32
    assert token.read_text().strip() not in Path(f"/proc/{status.pid}/cmdline").read_text()
    assert token.read_text().strip() not in status.describe()
    code = (
        "import sys\nfrom pyspark.sql import SparkSession\n"
        "try:\n    SparkSession.builder.remote(sys.argv[1]).getOrCreate().range(3).count()\n"
        "except Exception as exc:\n    print('refused', type(exc).__name__, str(exc)[:300]); sys.exit(3)\n"
        "print('answered')\n"
    )
    for url in (f"sc://localhost:{settings.spark_port}", f"sc://localhost:{settings.spark_port}/;token=wrong"):
        env = {k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_AUTHENTICATE_TOKEN"}
        out = subprocess.run(
            [sys.executable, "-c", code, url], cwd=REPO, capture_output=True, text=True, timeout=180, env=env
        )
        assert out.returncode == 3 and "refused" in out.stdout, (url, out.stdout, out.stderr[-2000:])
        assert "UNAUTHENTICATED" in out.stdout or "auth" in out.stdout.lower(), out.stdout


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


STREAMS_OVER_CONNECT = r'''
import json, sys
from datetime import timedelta
import pyarrow as pa
from pathlib import Path
from cq_engine.config import Settings
from cq_engine.spark import get_session
from streams_util import NOW, T0, Bench

spark = get_session(Settings(home=sys.argv[1], spark_port=int(sys.argv[2])))
assert type(spark).__module__.startswith("pyspark.sql.connect")
b = Bench(Path(sys.argv[3]), spark, """CREATE TABLE prices (ts TIMESTAMP, price DOUBLE);
    CREATE STREAM j INTERVAL(1m) SLIDING(1m) FROM meters OPTIONS(FORCE_OUTPUT) INTO j_out AS
        SELECT _twstart, count(*) AS n, avg(price) AS p FROM prices WHERE ts >= _twstart AND ts < _twend;
    CREATE STREAM pe PERIOD(1m) FROM meters INTO pe_out AS SELECT _tlocaltime, count(*) AS n FROM %%trows;""")
b.engine.storage.append("prices", pa.table({"ts": pa.array([T0 + timedelta(seconds=30)], pa.timestamp("us", tz="UTC")),
                                            "price": pa.array([5.0])}))
b.tick("j")
b.append([(s, "d1", 1.0) for s in range(0, 130, 10)])
b.tick("j")
tick = NOW.replace(second=0)
b.engine.run_period("pe", tick - timedelta(minutes=1))
b.append([(200, "d1", 1.0)])
b.engine.run_period("pe", tick)
print(json.dumps({"j": [[r["_twstart"].isoformat(), r["n"], r["p"]] for r in b.sink("j_out")],
                  "pe": [r["n"] for r in b.sink("pe_out")]}))
'''


def test_streams_run_over_spark_connect(server, tmp_path):
    """Unpartitioned streams, a range join and FORCE_OUTPUT's rows through a Spark Connect session
    (what `cq dev` runs), not only the classic one the other tests share."""

    settings, _ = server
    result = over_connect(STREAMS_OVER_CONNECT, settings, tmp_path)
    assert result == {
        "j": [["2026-11-21T10:00:00+00:00", 1, 5.0], ["2026-11-21T10:01:00+00:00", None, None]],
        "pe": [1],
    }  # the first tick only sets the %%trows baseline (no rows, no group)


UPSERT_OVER_CONNECT = r"""
import json, sys
from pathlib import Path
from cq_engine.config import Settings
from cq_engine.spark import get_session
from test_runner import make_engine
from test_spark_delta import SQL, T0, M, _cells

spark = get_session(Settings(home=sys.argv[1], spark_port=int(sys.argv[2])))
assert type(spark).__module__.startswith("pyspark.sql.connect")
engine = make_engine(Path(sys.argv[3]), spark, SQL, storage="spark", spark_write_bytes=0)
kwargs = dict(time_column="ts", keys=("device",), time_range=(T0, T0 + 10 * M), app_id="test/upsert")
s = engine.storage
s.upsert_cells("per_minute_out", _cells([(0, "a", 1.0, 1), (1, "a", 2.0, 2)]), app_version=1,
               source_versions={"readings": 1}, **kwargs)
frame = spark.createDataFrame(_cells([(1, "a", None, 20), (2, "b", 3.0, 3)]))
s.upsert_cells("per_minute_out", frame, app_version=2, source_versions={"readings": 2}, **kwargs)
rows = spark.sql(f"SELECT ts, device, tmax, n FROM delta.`{s.spark_uri('per_minute_out')}` ORDER BY ts").collect()
print(json.dumps([[int((r.ts.replace(tzinfo=T0.tzinfo) - T0).total_seconds() // 60), r.device, r.tmax, r.n] for r in rows]))
"""


def test_iotdb_upsert_over_spark_connect(server, tmp_path):
    """IoTDB's cell upsert committed by the executors through a Spark Connect session (what
    `cq recalculate` of a large result does on the Deployment): a MERGE the server can parse."""

    settings, _ = server
    result = over_connect(UPSERT_OVER_CONNECT, settings, tmp_path)
    # the NULL cell kept the row's own (2.0), its non-NULL one overwrote (20), a new key was added
    assert result == [[0, "a", 1.0, 1], [1, "a", 2.0, 20], [2, "b", 3.0, 3]]


EMPTY_SOURCE_OVER_CONNECT = r"""
import json, sys
from datetime import UTC, datetime
from pathlib import Path
from cq_engine.config import Settings
from cq_engine.spark import get_session
from test_runner import make_engine

SQL = '''
CREATE TABLE IF NOT EXISTS sensors (ts TIMESTAMP, device STRING, humidity DOUBLE);
CREATE CQ h RESAMPLE EVERY 10s RANGE 30s BEGIN
  SELECT avg(humidity) AS humidity_avg INTO h_out FROM sensors GROUP BY (10s), device FILL(PREVIOUS)
END;
'''
spark = get_session(Settings(home=sys.argv[1], spark_port=int(sys.argv[2])))
assert type(spark).__module__.startswith("pyspark.sql.connect")
engine = make_engine(Path(sys.argv[3]), spark, SQL)
engine.ensure_tables()
r = engine.run_firing("h", datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC))
print(json.dumps({"rows": r.rows_written}))
"""


def test_a_firing_over_an_empty_source_over_spark_connect(server, tmp_path):
    """A grouped firing before the source has any row (no group known yet), through Spark Connect:
    no rows, no error (the groups frame cannot come from an empty Arrow table there)."""
    settings, _ = server
    assert over_connect(EMPTY_SOURCE_OVER_CONNECT, settings, tmp_path) == {"rows": 0}


ROUNDS_WHILE_EXITING = r'''
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from cq_engine.config import Settings
from cq_engine.spark import get_session
from cq_engine.streams import rounds
from cq_engine.streams.sensor import evaluate_stream
from streams_util import NOW, Bench

spark = get_session(Settings(home=sys.argv[1], spark_port=int(sys.argv[2])))
b = Bench(Path(sys.argv[3]), spark, """CREATE STREAM s INTERVAL(1m) SLIDING(1m) FROM meters INTO s_out AS
    SELECT _twstart, count(*) AS n FROM %%trows;""")
b.tick("s")  # the first evaluation sets the stream's baseline
b.append([(s, "d1", 1.0) for s in range(0, 130, 10)])
stream = b.engine.stream("s")
pending = {"s": list(evaluate_stream(b.engine, stream, cursor=b.cursors["s"], now=NOW).works)}
before = len(pending["s"])


def in_a_pool_thread():
    # As a sensor evaluation in the gRPC pool of a code server that exits: the main thread has
    # returned, and Python's exit (which made every pool refuse new work) waits for this one.
    time.sleep(3)
    try:
        got = [(n, str(o)[:200]) for n, _, o in rounds.run_rounds(b.engine.ctx, {"s": stream}, pending)]
        print(json.dumps({"yielded": got, "before": before, "left": len(pending["s"])}), flush=True)
    except Exception as exc:  # a pool thread's exception is otherwise never seen
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:500]}), flush=True)


ThreadPoolExecutor(max_workers=1).submit(in_a_pool_thread)
'''


def test_stream_rounds_stop_without_a_failure_once_the_process_exits(server, tmp_path):
    """A code server the daemon replaces exits while its sensor's evaluation still computes in a
    thread: Spark Connect's pools then refuse work ("cannot schedule new futures after interpreter
    shutdown"). The rounds stop and keep their works pending (the next evaluation computes them),
    rather than failing the stream over to a run."""

    settings, _ = server
    result = over_connect(ROUNDS_WHILE_EXITING, settings, tmp_path)
    assert "error" not in result, result["error"]
    assert result["before"] >= 1 and result == {"yielded": [], "before": result["before"], "left": result["before"]}


def test_cq_through_the_agent_matches_in_process(server, tmp_path):
    """`cq ingest`, `cq run` and `cq query` through the command agent (cq_engine.cli.agent) beside the
    server give what the same commands give in-process: output, exit codes and the sink's rows."""
    from benchmarks import PER_MINUTE_SQL
    from cq_engine.cli import agent

    settings, _ = server
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "q.sql").write_text(PER_MINUTE_SQL)
    rows = [
        f"2026-01-01T00:0{m}:{s:02d}Z,d{s % 2},{20 + m + s / 10},{50 + s}" for m in range(3) for s in range(0, 60, 7)
    ]
    (tmp_path / "data.csv").write_text("ts,device,temperature,humidity\n" + "\n".join(rows) + "\n")
    assert agent.start(settings.home, wait=180), Path(settings.home, "spark", "agent.log").read_text()
    base = {k: v for k, v in os.environ.items() if not k.startswith("CQ_")}
    base.update(CQ_HOME=settings.home, CQ_CONFIG=str(tmp_path / "none.toml"), CQ_DEBUG="1")
    cq = str(Path(sys.executable).with_name("cq"))
    results = {}
    try:
        for how, extra in (("agent", {}), ("in-process", {"CQ_NO_AGENT": "1"})):
            env = {**base, **extra, "CQ_WAREHOUSE": str(tmp_path / f"warehouse-{how}")}
            outs = [
                subprocess.run([cq, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
                for args in (
                    ["ingest", "sensors", "data.csv"],
                    ["run", "per_minute", "--at", "2026-01-01T00:02:00Z"],
                    ["query", "SELECT * FROM out ORDER BY ts, device", "--format", "csv"],
                    ["query", "SELECT * FROM nowhere"],
                )
            ]
            assert [o.returncode for o in outs] == [0, 0, 0, 1], [o.stderr[-2000:] for o in outs]
            assert all(("ran in the command agent" in o.stderr) == (how == "agent") for o in outs)
            assert not any("in-process Spark session" in o.stderr for o in outs)  # both found the server
            results[how] = [re.sub(r"\d+\.\d+s\b", "Xs", o.stdout) for o in outs]  # durations differ
    finally:
        agent.stop(settings.home)
    assert results["agent"] == results["in-process"]
    sink = results["agent"][2].splitlines()
    assert sink[0].startswith("ts,device,tmax") and len(sink) == 3  # the minute [00:01, 00:02), two devices


HOLD_A_SESSION = """
import sys, time
from pyspark.sql import SparkSession
SparkSession.builder.remote(sys.argv[1]).getOrCreate().range(3).count()
print("connected", flush=True)
time.sleep(600)
"""


def test_restart_at_once_on_the_same_port_with_a_client_connected(server):
    """`cq spark stop` then `cq spark start` while a client is connected: the stopped server's
    connections may stay in TIME_WAIT on the port (a plain bind is then refused for about a minute),
    and the new server starts at once anyway (the port check binds as the JVM does)."""
    from cq_engine.spark import client_url

    settings, _ = server
    client = subprocess.Popen(
        [sys.executable, "-c", HOLD_A_SESSION, client_url(settings)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert client.stdout is not None and client.stdout.readline().strip() == "connected"
        assert stop_server(settings) is True
        # Whether the port is left in TIME_WAIT here depends on which side the kernel saw close first
        # (test_port_check_sees_listeners_not_time_wait makes that case for certain); either way the
        # port is free for a listener, and the server starts again at once.
        assert not port_taken(settings.spark_port)
        again = start_server(settings, timeout=300)
        assert again.running and again.port == settings.spark_port and server_status(settings) == again
    finally:
        client.kill()
        client.wait(30)


def test_port_check_sees_listeners_not_time_wait():
    """The kernel's own TIME_WAIT (the server side closed first, as a stopping server does) is not a
    process on the port; a listener is."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the JVM's server socket
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert port_taken(port)
        with socket.create_connection(("127.0.0.1", port)) as client:
            conn, _ = listener.accept()
            conn.close()  # the server's end closes first: it goes to TIME_WAIT
            assert client.recv(1) == b""
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))
    assert not port_taken(port)


def test_in_process_notice_names_the_server_looked_for(tmp_path):
    settings = Settings(home=str(tmp_path / ".cq"), spark_port=free_port())
    text = in_process_notice(settings)
    assert f"CQ_HOME={tmp_path / '.cq'}/spark" in text and f"port {settings.spark_port}" in text
    assert "no pid file" in text and "`cq spark start`" in text and "CQ_SPARK_REMOTE=sc://" in text
    assert "does answer" not in text
    with socket.socket() as other:  # a server another CQ_HOME started answers on the port
        other.bind(("127.0.0.1", settings.spark_port))
        other.listen()
        assert "does answer: a server started with another CQ_HOME?" in in_process_notice(settings)


RELEASE_SCRIPT = """
import json, sys
import dagster as dg
from dagster_pyspark import PySparkResource
from cq_engine.config import Settings
from cq_engine.spark import client_url, connect_session
from dagster_defs.resource import pyspark_resource

settings = Settings(home=sys.argv[1], spark_port=int(sys.argv[2]))
url = client_url(settings)
seen = []

@dg.asset
def probe(pyspark: PySparkResource) -> None:
    seen.append(pyspark.spark_session.session_id)
    assert pyspark.spark_session.range(3).count() == 3

def attach(session_id):
    from pyspark.sql.connect.session import SparkSession
    s = SparkSession.builder.remote(f"{url};session_id={session_id}").create()
    try:
        return "open" if s.range(1).count() == 1 else "?"
    except Exception as exc:
        return "closed" if "SESSION_CLOSED" in str(exc) else str(exc)[:300]

assert dg.materialize([probe], resources={"pyspark": pyspark_resource(settings)}).success
kept = connect_session(url)  # this process's own session before the next run
assert dg.materialize([probe], resources={"pyspark": pyspark_resource(settings)}).success
print(json.dumps({
    "run's own": attach(seen[0]),
    "reused": seen[1] == kept.session_id,
    "kept": attach(kept.session_id),
    "kept works": kept.range(2).count(),
}))
"""


def test_a_run_releases_the_connect_session_it_opened(server, tmp_path):
    """A batch run's session is released when the run ends (else the server keeps it, and the plans
    it cached, for an hour: the Connect driver's live heap grew with every run); a session the
    process had before the run is left open for it."""
    settings, _ = server
    assert server_status(settings).running  # else the resource falls back to a classic session
    found = over_connect(RELEASE_SCRIPT, settings, tmp_path)
    assert found == {"run's own": "closed", "reused": True, "kept": "open", "kept works": 2}, found


def test_stop(server):
    settings, status = server
    assert stop_server(settings) is True
    assert not _alive(status.pid)
    assert proc_state(status.pid) in (None, "Z")
    assert not port_open(settings.spark_port)
    assert not server_status(settings).running
    assert not list(Path(settings.home, "spark").glob("*.pid"))
    assert stop_server(settings) is False


def test_jvm_incubator_warning_stays_off_the_terminal(tmp_path):
    """Spark 4's launcher always starts the JVM with ``--add-modules=jdk.incubator.vector``, and the JVM
    then prints "WARNING: Using incubator modules" on stderr: not on a user's terminal, neither from an
    in-process session (`cq query`) nor from `cq spark start` (the server's output goes to its log).
    The in-process command says once why it starts a JVM (no server under its CQ_HOME), and pyspark's
    mode variables inherited from a parent holding a Connect session do not derail it."""
    (tmp_path / "sql").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CQ_SPARK_REMOTE", "CQ_SPARK_MASTER")}
    env.update(
        CQ_HOME=str(tmp_path / ".cq"),
        CQ_WAREHOUSE=str(tmp_path / "wh"),
        CQ_SQL_DIR=str(tmp_path / "sql"),
        CQ_SPARK_PORT=str(free_port()),
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
        # What a process holding a (local) Connect session passes on to the commands it starts.
        SPARK_CONNECT_MODE_ENABLED="1",
        SPARK_LOCAL_REMOTE="1",
    )
    cq = str(Path(sys.executable).with_name("cq"))

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([cq, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    out = run("query", "SELECT 1 AS x")  # no server: an in-process (py4j) JVM
    assert out.returncode == 0 and "(1 row)" in out.stdout, out.stderr
    assert "Using incubator modules" not in out.stderr + out.stdout, out.stderr
    assert "Traceback" not in out.stderr and "CONNECT_URL_NOT_SET" not in out.stderr, out.stderr
    assert out.stderr.count("using an in-process Spark session") == 1, out.stderr
    assert f"CQ_HOME={tmp_path / '.cq'}/spark" in out.stderr and "`cq spark start`" in out.stderr, out.stderr
    try:
        out = run("spark", "start")
        assert out.returncode == 0 and "running at" in out.stdout, out.stderr
        assert "Using incubator modules" not in out.stderr + out.stdout, out.stderr
    finally:
        assert run("spark", "stop").returncode == 0
