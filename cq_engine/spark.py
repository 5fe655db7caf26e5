"""One Spark session factory, plus the engine's own local Spark Connect server (ARCHITECTURE.md §4).

Limitation: classic (py4j) and Spark Connect sessions cannot coexist in one Python process. Once a
classic ``SparkContext`` is active, pyspark refuses to build a Connect session (SESSION_ALREADY_EXIST),
and once a Connect session exists pyspark sets ``SPARK_CONNECT_MODE_ENABLED`` for the whole process,
so later ``pyspark.sql.functions`` calls dispatch to Connect. ``get_session`` therefore only falls back
to our own server when no classic session is active; use a subprocess to mix both (as the tests do).
A process *started* by one holding a Connect session inherits those variables, though no session of
its own made them: ``get_session`` drops them first (``drop_inherited_mode``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from cq_engine import jars
from cq_engine.config import Settings, load_settings, recorded_port_file
from cq_engine.configfile import state_dir
from cq_engine.errors import SparkError
from cq_engine.statefile import read_state, write_atomic

if TYPE_CHECKING:  # pyspark costs a third of a second to import: only when a session is made
    from pyspark.sql import SparkSession

LOG = logging.getLogger("cq_engine.spark")
_told: set[str] = set()  # the in-process fallback is said once per process and server location

# PySpark logs every analysis error as a JSON blob on stderr; the engine reports it as a one-line CQError.
logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)

DEBUGGING = "spark.python.sql.dataFrameDebugging.enabled"
BASE_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # The driver's status store keeps the latest 1,000 jobs, stages and SQL executions (their plans'
    # text and metrics) and 100,000 tasks by default, even with the UI off: a Connect server running
    # fused batches every 30 s took over an hour to fill them, its live heap 152 -> 293 MiB in 30 min.
    # Nothing reads the finished ones (the UI is off; a Connect client's progress is of running jobs),
    # so they are kept few: bounds that take half an hour of batches to reach read as a leak in the
    # soak (the driver's live heap x1.16 over 30 minutes at 100, 100, 10,000 and 100).
    "spark.ui.retainedJobs": "20",
    "spark.ui.retainedStages": "20",
    "spark.ui.retainedTasks": "1000",
    "spark.sql.ui.retainedExecutions": "20",
    # The Connect server's own listener keeps each finished statement with its plan's text (a fused
    # batch's plan runs to hundreds of KiB) and each closed session: 200 of each by default.
    "spark.sql.connect.ui.retainedStatements": "20",
    "spark.sql.connect.ui.retainedSessions": "20",
    # What the executors hold for a finished query (broadcasts, shuffle files) is removed once the
    # driver's GC collects the query; a driver with a roomy heap collects rarely, and Spark's periodic
    # GC for it runs every 30 minutes: an executor's live heap grew 116 -> 343 MiB in a 30-minute soak.
    "spark.cleaner.periodicGC.interval": "5min",
    # Reading a commit's data files by path caches each file's status in a cache shared by the
    # driver's sessions, 250 MiB by default: a firing reads new files, so it filled by some 1,500
    # statuses a minute (18 MiB of the driver's live heap in 8 minutes of the soak). 8 MiB holds
    # the last several minutes of them, the ones a later firing may read again.
    "spark.sql.hive.filesourcePartitionFileCacheSize": str(8 * 2**20),
    "spark.sql.adaptive.enabled": "true",
    # pyspark records the Python call site of every DataFrame and Column call for its error messages
    # (a stack walk and a failed `import IPython` each: a quarter of the client's time in a batch of
    # 400 fused firings); the engine's errors name the definition and its file:line:col instead.
    DEBUGGING: "false",
}

# Everything the local server's JVM listens on stays on loopback: Connect's gRPC port, the driver's
# RPC port and the block manager (which binds where the driver does).
LOOPBACK_CONF = {
    "spark.connect.grpc.binding.address": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
}

DRIVER_MEMORY = "2g"
# The class name also names the pid and log files spark-daemon.sh writes.
_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
_IDENT = "cq"  # SPARK_IDENT_STRING: fixed, so the pid file name does not depend on $USER


LOG_CONFIG = Path(__file__).with_name("log4j2.properties")
# Read when the driver JVM starts: Spark's WARN lines stay off the terminal, errors still show.
QUIET_CONF = {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG_CONFIG}"}


def engine_conf(settings: Settings | None = None) -> dict[str, str]:
    """``BASE_CONF`` plus delta-spark's jars and extension when they are in the local Maven repository
    (whatever ``CQ_STORAGE`` says: sessions can read any Delta table), and for an ``s3://`` warehouse
    the s3a connector and its endpoint."""
    settings = settings or Settings()
    s3 = settings.warehouse.startswith(("s3://", "s3a://"))
    conf = {**BASE_CONF, **jars.spark_conf(delta=True, s3a=s3)}
    if s3:
        conf.update(s3a_conf())
    return conf


# A store that stops answering fails a request in bounded time: hadoop-aws' defaults (a 200 s socket
# timeout, 5 SDK attempts, 7 S3A retries) hold a Spark task for most of an hour. With these a request
# gives up after 30 s of silence and is tried 3 times by the SDK, each failure retried 3 times by S3A
# (with its back-off): a store away for a minute is ridden out, one away for good fails the job in
# minutes (docs/operations/guarantees.md). Milliseconds, as every Hadoop line reads them.
S3A_TIMEOUTS = {
    "spark.hadoop.fs.s3a.connection.establish.timeout": "10000",
    "spark.hadoop.fs.s3a.connection.timeout": "30000",
    "spark.hadoop.fs.s3a.attempts.maximum": "3",
    "spark.hadoop.fs.s3a.retry.limit": "3",
}


# hadoop-aws 3.5 reads through the S3 analytics accelerator by default (``analytics``); its library
# (1.3.1) keeps an entry for every distinct object a file system has read until the file system is
# closed (HADOOP-20058), and a long-lived JVM's cached file system reads a new commit file or data file
# every few seconds: the soak's executors grew their live heap by 15-80% in 30 minutes. The classic
# stream keeps nothing per object once a stream is closed.
S3A_INPUT_STREAM = {"spark.hadoop.fs.s3a.input.stream.type": "classic"}


def s3a_conf() -> dict[str, str]:
    """Hadoop s3a settings from the AWS variables delta-rs reads too (``AWS_ENDPOINT_URL`` for an
    S3-compatible store, path-style addressing then, plain http allowed by the URL's scheme)."""
    conf = {"spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem", **S3A_TIMEOUTS, **S3A_INPUT_STREAM}
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        conf.update(
            {
                "spark.hadoop.fs.s3a.endpoint": endpoint,
                "spark.hadoop.fs.s3a.path.style.access": "true",
                "spark.hadoop.fs.s3a.connection.ssl.enabled": str(endpoint.startswith("https")).lower(),
            }
        )
    if os.environ.get("AWS_REGION"):
        conf["spark.hadoop.fs.s3a.endpoint.region"] = os.environ["AWS_REGION"]
    return conf


def local_session(
    *, app_name: str = "cq-engine", master: str = "local[*]", settings: Settings | None = None
) -> SparkSession:
    """An in-process (classic, py4j) session, ``local[*]`` by default, tuned for small batch firings,
    with Delta's connector when its jars are available (``engine_conf``); a local master's driver
    listens on loopback only."""
    from pyspark.sql import SparkSession

    drop_inherited_mode()
    builder = SparkSession.builder.master(master).appName(app_name)
    conf = {**engine_conf(settings), **QUIET_CONF}
    if master.startswith("local"):
        conf.update({k: v for k, v in LOOPBACK_CONF.items() if k.startswith("spark.driver.")})
    for key, value in conf.items():
        builder = builder.config(key, value)
    _start_gateway({"spark.master": master, "spark.app.name": app_name, **conf})
    return builder.getOrCreate()


# Spark 4's launcher always adds ``--add-modules=jdk.incubator.vector`` (JavaModuleOptions), and the
# JVM then prints this on stderr at startup; no JVM flag turns it off.
_JVM_NOISE = (b"WARNING: Using incubator modules:",)


def _start_gateway(conf: dict[str, str]) -> None:
    """Launch the in-process py4j JVM the way ``SparkContext`` would (same ``--conf``s), but with its
    stderr read by a thread that passes every line on to our stderr except ``_JVM_NOISE``. A no-op when
    a gateway already runs (or pyspark was given one, ``PYSPARK_GATEWAY_PORT``)."""
    from pyspark import SparkConf
    from pyspark.core.context import SparkContext
    from pyspark.java_gateway import launch_gateway

    with SparkContext._lock:
        if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
            return
        spark_conf = SparkConf(loadDefaults=False)
        for key, value in conf.items():
            spark_conf.set(key, value)
        # Our own pipe, read from before the launch: a JVM failing to start still says why.
        read_end, write_end = os.pipe()
        reader = os.fdopen(read_end, "rb")
        threading.Thread(target=_pass_stderr, args=(reader,), name="jvm-stderr", daemon=True).start()
        try:
            gateway = launch_gateway(spark_conf, popen_kwargs={"stderr": write_end})
        finally:
            os.close(write_end)  # the JVM has its own copy: the thread ends when the JVM does
        SparkContext._gateway = gateway
        SparkContext._jvm = gateway.jvm


def _pass_stderr(stream) -> None:
    # To file descriptor 2, as the JVM wrote when it inherited it (whatever sys.stderr is now).
    for line in iter(stream.readline, b""):
        if not line.startswith(_JVM_NOISE):
            os.write(2, line)


@dataclass(frozen=True)
class ServerStatus:
    """What we know about the engine's local Spark Connect server."""

    running: bool
    pid: int | None
    port: int
    url: str
    log_file: str | None

    def describe(self) -> str:
        if self.running:
            return f"Spark Connect server running at {self.url} (pid {self.pid}, log {self.log_file})"
        return f"Spark Connect server not running (port {self.port})"


def spark_home() -> Path:
    """The installed pyspark package directory, which is a usable SPARK_HOME (bin/, sbin/, jars/)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _state_dir(settings: Settings) -> Path:
    return Path(state_dir(settings.home))


def _token_file(settings: Settings) -> Path:
    return _state_dir(settings) / "connect.token"


def server_token(settings: Settings) -> str | None:
    """The pre-shared token our server requires (``spark.connect.authenticate.token``); None if
    no server was started under ``settings.home``. Kept 0600 in the state directory, never on a
    command line or in a printed URL."""
    text = read_state(_token_file(settings), what="Spark Connect token")
    return text.strip() if text else None


def client_url(settings: Settings) -> str:
    """The URL a client of our local server connects with: the token as the bearer credential.
    ``localhost`` (not 127.0.0.1): pyspark only sends a token without TLS to that exact host name,
    over gRPC's local (loopback-only) channel credentials."""
    token = server_token(settings)
    url = f"sc://localhost:{settings.spark_port}"
    return f"{url}/;token={token}" if token else url


def _redact(url: str) -> str:
    return re.sub(r"(;token=)[^;]*", r"\1***", url)


def _pid_file(settings: Settings) -> Path:
    return _state_dir(settings) / f"spark-{_IDENT}-{_CLASS}-1.pid"


def _log_file(settings: Settings) -> Path | None:
    # spark-daemon.sh appends $HOSTNAME to the name; take the newest current (unrotated) one.
    logs = sorted(_state_dir(settings).glob(f"spark-{_IDENT}-{_CLASS}-1-*.out"), key=os.path.getmtime)
    return logs[-1] if logs else None


def _read_pid(settings: Settings) -> int | None:
    try:
        return int(_pid_file(settings).read_text().strip())
    except (OSError, ValueError):
        return None


def _cmdline(pid: int) -> str | None:
    """The command line of live process ``pid`` ("" without procfs); None if dead or a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    proc = Path(f"/proc/{pid}")
    if not proc.exists():  # no procfs (macOS): signal 0 is all we can check
        return ""
    try:
        # Our JVM is an orphan of pid 1; some container inits reap it only seconds after it died.
        if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return None
        return (proc / "cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    """Is ``pid`` a live process of our server? The pid file names the nice -> bash -> java exec
    chain, all of which carry the class name; checking it guards against recycled pids."""
    cmd = _cmdline(pid)
    return cmd is not None and (cmd == "" or _CLASS in cmd)


def _port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def port_taken(port: int) -> bool:
    """Does a process listen on ``port`` (on loopback or all interfaces)? Bound with SO_REUSEADDR, as
    the JVM's and uvicorn's servers bind: connections a stopped server left in TIME_WAIT (a client was
    connected at stop) do not count, only a listener does (Linux refuses the bind then)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            return False
        except OSError:
            return True


def _log_tail(path: Path | None, lines: int = 20) -> str:
    if path is None or not path.exists():
        return "(no log file)"
    tail = path.read_text(errors="replace").splitlines()[-lines:]
    return f"last lines of {path}:\n" + "\n".join("  " + line for line in tail)


def _check_java() -> None:
    """Fail early and clearly where spark-class would fail late and cryptically."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else None  # spark-class's own order
    java = java or shutil.which("java")
    if java is None or not os.access(java, os.X_OK):
        where = f"JAVA_HOME={java_home} has no bin/java" if java_home else "no java on PATH and JAVA_HOME unset"
        raise SparkError(f"Java 17+ is required to run the Spark Connect server ({where})")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    found = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    # "1.8.0_392" style before Java 9, "17.0.15" since.
    major = int(found.group(2) if found.group(1) == "1" and found.group(2) else found.group(1)) if found else 0
    if major < 17:
        raise SparkError(f"Java 17+ is required; {java} reports version {major or 'unknown'}")


def server_status(settings: Settings) -> ServerStatus:
    """Running means: the pid file's process is alive and the gRPC port accepts connections."""
    pid = _read_pid(settings)
    running = pid is not None and _alive(pid) and _port_open(settings.spark_port)
    log = _log_file(settings)
    return ServerStatus(
        running,
        pid if running else None,
        settings.spark_port,
        f"sc://localhost:{settings.spark_port}",
        str(log) if log else None,
    )


def server_expected(settings: Settings) -> bool:
    """Was our server started under ``settings.home`` and not stopped, though it does not run now? Its
    pid file names a dead process: it crashed or was killed, and whoever started it (``cq dev``'s
    supervisor, the Deployment's service manager) is expected to start it again, with the same token."""
    pid = _read_pid(settings)
    return pid is not None and not server_status(settings).running


def await_server(settings: Settings, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for our server to run (pid alive, port open); True once it does."""
    deadline = time.monotonic() + timeout
    while not server_status(settings).running:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
    return True


def start_server(settings: Settings, *, timeout: float = 180) -> ServerStatus:
    """Start (or find) the local Spark Connect server and wait until it accepts connections."""
    status = server_status(settings)
    if status.running:
        return status
    pid = _read_pid(settings)
    if pid is not None and not _alive(pid):
        _pid_file(settings).unlink(missing_ok=True)
        pid = None
    m = re.search(r"grpc\.binding\.port=(\d+)", _cmdline(pid) or "") if pid is not None else None
    if m and int(m.group(1)) != settings.spark_port:
        raise SparkError(
            f"the Spark Connect server under {settings.home} already runs on port "
            f"{m.group(1)} (pid {pid}); stop it first to use port {settings.spark_port}"
        )
    if pid is None:  # else: one is still starting (another caller); just wait for it below
        _launch(settings)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = _read_pid(settings)
        if pid is None or not _alive(pid):
            raise SparkError(f"Spark Connect server exited during start\n{_log_tail(_log_file(settings))}")
        if _port_open(settings.spark_port):
            return server_status(settings)
        time.sleep(0.25)
    stop_server(settings)  # leave no half-started JVM behind
    raise SparkError(
        f"Spark Connect server did not open port {settings.spark_port} within {timeout:.0f}s\n"
        f"{_log_tail(_log_file(settings))}"
    )


def _launch(settings: Settings) -> None:
    home = spark_home()
    script = home / "sbin" / "start-connect-server.sh"
    daemon = home / "sbin" / "spark-daemon.sh"
    if not any((home / "jars").glob("spark-connect_*.jar")):
        raise SparkError(f"no Spark Connect server jar (jars/spark-connect_*.jar) in {home}; reinstall pyspark")
    # The pip wheel ships spark-daemon.sh but not start-connect-server.sh; that script only runs
    # `spark-daemon.sh submit <class> 1 --name ...`, so do the same when it is missing.
    if script.is_file():
        cmd = ["bash", str(script)]
    elif daemon.is_file() and (home / "bin" / "spark-submit").is_file():
        cmd = ["bash", str(daemon), "submit", _CLASS, "1", "--name", "Spark Connect server"]
    else:
        raise SparkError(f"neither sbin/start-connect-server.sh nor sbin/spark-daemon.sh found in {home}")
    _check_java()
    if port_taken(settings.spark_port):
        raise SparkError(f"port {settings.spark_port} is already in use by another process; set CQ_SPARK_PORT")
    state = _state_dir(settings)
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o700)  # pid, logs and the token: this user's only
    # A server started again after a crash (its pid file names a dead process, the token is still
    # there) keeps its predecessor's token, so the clients that read it (a run, the stream sensor) are
    # accepted by the new server and carry on; `cq spark stop` removes it, so a start after a clean stop
    # makes a new one. Either way it never leaves the 0600 file and the server's environment.
    token = server_token(settings) or secrets.token_urlsafe(32)
    write_atomic(_token_file(settings), token + "\n", mode=0o600)
    # Later commands without CQ_SPARK_PORT find the server here (load_settings); removed on stop.
    write_atomic(recorded_port_file(settings.home), f"{settings.spark_port}\n")
    conf = {
        **engine_conf(settings),
        **LOOPBACK_CONF,
        **QUIET_CONF,
        "spark.connect.grpc.binding.port": str(settings.spark_port),
    }
    # CQ_SPARK_MASTER attaches the server to a cluster (a standalone master, see docs/operations/deployment.md).
    args = ["--master", settings.spark_master or "local[*]", "--driver-memory", DRIVER_MEMORY]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    env = {
        k: v
        for k, v in os.environ.items()
        # A client-side Connect marker would make spark-submit/pyspark act as a client.
        if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "SPARK_API_MODE")
    }
    env.update(
        SPARK_HOME=str(home),
        SPARK_PID_DIR=str(state),
        SPARK_LOG_DIR=str(state),
        SPARK_IDENT_STRING=_IDENT,
        SPARK_CONNECT_MODE="0",
        SPARK_LOCAL_IP="127.0.0.1",
        # The server reads its token from here: a --conf would show it in `ps` to every user.
        SPARK_CONNECT_AUTHENTICATE_TOKEN=token,
    )
    # New session: the daemon must survive Ctrl-C of the command that started it.
    out = subprocess.run(
        cmd + args,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    if out.returncode != 0:
        raise SparkError(
            f"{Path(cmd[1]).name} failed ({out.returncode}): {(out.stdout + out.stderr).strip()}\n"
            f"{_log_tail(_log_file(settings))}"
        )


def stop_server(settings: Settings, *, timeout: float = 30) -> bool:
    """Stop our server if it runs (SIGTERM, then SIGKILL after ``timeout``); True if one was stopped."""
    pid = _read_pid(settings)
    stopped = False
    if pid is not None and _alive(pid):
        os.kill(pid, signal.SIGTERM)  # JVM shutdown hooks stop the SparkContext and its workers
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            while _alive(pid):
                time.sleep(0.1)
        stopped = True
    _pid_file(settings).unlink(missing_ok=True)
    recorded_port_file(settings.home).unlink(missing_ok=True)
    _token_file(settings).unlink(missing_ok=True)  # retired: the next start makes a new one
    deadline = time.monotonic() + 5  # the kernel may take a moment to release the port
    while stopped and _port_open(settings.spark_port) and time.monotonic() < deadline:
        time.sleep(0.1)
    return stopped


def _classic_active() -> bool:
    from pyspark.core.context import SparkContext

    return SparkContext._active_spark_context is not None


def _remote_session(url: str, *, own_server: bool = False) -> SparkSession:
    # pyspark's Connect client warns at every unpartitioned window function; the engine's plans use
    # them on purpose (row numbers over a small read coalesced to one partition, ARCHITECTURE.md §6.3).
    warnings.filterwarnings("ignore", message="WARN WindowExpression: No Partition Defined", category=UserWarning)

    if _classic_active():
        raise SparkError(
            f"cannot connect to {url}: a classic Spark session is already active in this "
            "process, and pyspark cannot mix classic and Spark Connect sessions"
        )
    # Probe first: the Connect client retries an unreachable server for minutes.
    parsed = urlparse(url.replace("sc://", "http://", 1).split(";", 1)[0])
    if not _port_open(parsed.port or 15002, parsed.hostname or "localhost", timeout=3):
        raise SparkError(f"cannot connect to Spark Connect server at {_redact(url)}")
    try:
        spark = connect_session(url)
        bound_retries(spark)
        if not own_server:  # ours was started with BASE_CONF: spare the round trips
            spark.conf.set("spark.sql.session.timeZone", "UTC")
            with contextlib.suppress(Exception):  # a server may refuse it: then only slower
                spark.conf.set(DEBUGGING, BASE_CONF[DEBUGGING])
    except Exception as exc:  # pyspark raises many unrelated types here
        raise SparkError(f"cannot open a Spark Connect session at {_redact(url)}: {_redact(str(exc))}") from None
    return spark


_FORGOTTEN: weakref.WeakSet = weakref.WeakSet()  # Connect sessions that failed: never handed out again


def forget_session(session) -> None:
    """Make this process's next Connect session a new one: pyspark's ``getOrCreate`` hands back its
    default session (or the thread's active one), so a session that failed (its server restarted,
    with a new token) would come back to a long-lived process (the code server's stream sensor) for
    ever. Not stopped: stopping closes its client, which shuts pyspark's release pool that every
    session's queries share, under any other thread's query (``cannot schedule new futures after
    shutdown``). A no-op for a classic session."""
    if not type(session).__module__.startswith("pyspark.sql.connect"):
        return
    from pyspark.sql.connect.session import SparkSession

    _FORGOTTEN.add(session)
    with SparkSession._lock:
        if SparkSession._default_session is session:
            SparkSession._default_session = None


def default_connect_session():
    """pyspark's default Connect session in this process (``getOrCreate`` hands it out), or None."""
    from pyspark.sql.connect.session import SparkSession

    with SparkSession._lock:
        return SparkSession._default_session


def release_session(session, *, wait: float = 5.0) -> None:
    """Release ``session`` on its Connect server (``stop``), waiting at most ``wait`` seconds: a server
    keeps an idle session, and the plans it cached, for an hour after its client's last request, so
    every batch run process that ended without releasing its own left one behind. Bounded: a server
    that is gone must not hold the end of a run for the client's minute of retries. For a process
    done with the session (it is no longer pyspark's default after). A no-op for a classic session."""
    if not type(session).__module__.startswith("pyspark.sql.connect"):
        return

    def stop() -> None:
        with contextlib.suppress(Exception):  # best effort: an unreleased session times out
            session.stop()

    thread = threading.Thread(target=stop, name="cq-release-session", daemon=True)
    thread.start()
    thread.join(wait)


def connect_session(url: str):
    """pyspark's Connect session for ``url`` (``getOrCreate``), unless that is one this process
    forgot (``forget_session``): then a new one, the default and this thread's active one from now."""
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    spark = SparkSession.builder.remote(url).getOrCreate()
    if spark in _FORGOTTEN:
        spark = SparkSession.builder.remote(url).create()
        ConnectSession._active_session.session = spark
    return spark


# pyspark's Connect client retries a lost server for at least 10 minutes (15 retries, back-off x4 up to
# 60 s), which holds a run (or the cq_streams sensor, past Dagster's 60 s time-out) that long on a dead
# server. A client of ours retries for about 12 s (0.5, 1, 2, 4, then 5 s), which covers a blip; past it
# the call fails and the rounds ask ``recovery.SparkRecovery``, which waits for the server itself,
# polling twice a second: a restarted server is used within a second of answering, not at the end of
# a back-off of up to a minute (docs/operations/guarantees.md).
CONNECT_RETRIES, CONNECT_BACKOFF_MS, CONNECT_MAX_BACKOFF_MS = 5, 500, 5_000


def bound_retries(session) -> None:
    """Bound the Connect client's retries of ``session`` to about 12 s (``CONNECT_RETRIES`` with a
    doubling back-off); a no-op for a classic session."""
    if not type(session).__module__.startswith("pyspark.sql.connect"):
        return  # a classic session's ``client`` property raises
    from pyspark.sql.connect.client.retries import DefaultPolicy

    client = session.client

    policy = DefaultPolicy(
        max_retries=CONNECT_RETRIES,
        initial_backoff=CONNECT_BACKOFF_MS,
        backoff_multiplier=2.0,
        max_backoff=CONNECT_MAX_BACKOFF_MS,
    )
    client.set_retry_policies([policy])


# What pyspark sets in a process once it holds a Connect session (or reads to make one).
_MODE_VARS = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE", "SPARK_API_MODE")


def drop_inherited_mode() -> None:
    """Forget pyspark's mode variables unless a Connect session of this process set them: inherited
    from a parent holding one, they make a classic builder demand a Connect URL (CONNECT_URL_NOT_SET)
    and would send ``pyspark.sql.functions`` to a session this process does not have. The engine says
    which Spark to use through ``CQ_SPARK_REMOTE`` / ``CQ_SPARK_MASTER`` only."""
    if not any(var in os.environ for var in _MODE_VARS):
        return
    connect = sys.modules.get("pyspark.sql.connect.session")
    if connect is not None and (
        connect.SparkSession.getActiveSession() is not None
        or getattr(connect.SparkSession, "_default_session", None) is not None  # made in another thread
    ):
        return  # ours: this process already talks Connect
    for var in _MODE_VARS:
        os.environ.pop(var, None)


def in_process_notice(settings: Settings) -> str:
    """Why a session is in-process although no master was asked for, and how to get the server: the
    server looked for, where, and the three ways to reach one."""
    home = Path(settings.home).expanduser().resolve()
    pid = _read_pid(settings)
    found = f"its pid file names process {pid}, which is gone" if pid is not None else "no pid file there"
    hint = ""
    if _port_open(settings.spark_port):
        hint = (
            f"; port {settings.spark_port} does answer: a server started with another CQ_HOME? "
            "set CQ_HOME to the directory `cq spark start` used"
        )
    return (
        f"no Spark Connect server of this project runs (looked under CQ_HOME={home}/spark for port "
        f"{settings.spark_port}: {found}){hint}; using an in-process Spark session instead (a JVM start: "
        "about 10-20 s). Start one with `cq spark start` (same CQ_HOME), or point at one with "
        "CQ_SPARK_REMOTE=sc://HOST:PORT (CQ_SPARK_MASTER=local[*] makes in-process the explicit choice)"
    )


def get_session(settings: Settings | None = None) -> SparkSession:
    """CQ_SPARK_REMOTE, else CQ_SPARK_MASTER, else our running local server, else in-process local
    (said once per process on the ``cq_engine.spark`` logger: ``in_process_notice``)."""
    settings = settings or load_settings()
    drop_inherited_mode()
    if settings.spark_remote:
        return _remote_session(settings.spark_remote)
    if settings.spark_master:
        return local_session(master=settings.spark_master, settings=settings)
    status = server_status(settings)
    classic = _classic_active()
    if status.running and not classic:  # see the module docstring
        return _remote_session(client_url(settings), own_server=True)
    if not classic:  # a JVM is about to start: say why, once
        key = f"{Path(settings.home).expanduser().resolve()}:{settings.spark_port}"
        if key not in _told:
            _told.add(key)
            LOG.warning("%s", in_process_notice(settings))
    return local_session(settings=settings)
