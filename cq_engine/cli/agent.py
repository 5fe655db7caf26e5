"""The command agent: a warm process beside the local Spark Connect server that runs ``cq`` commands
for the ``cq`` executable (``cq_engine.cli.client``), so a command does not pay for importing pyspark's
Connect client (pandas, pyarrow, gRPC) and the interpreter's start each time (docs/cli.md).

``cq spark start`` and ``cq dev`` start it with the server (``start``); ``cq spark stop`` stops it
(``stop``), and it ends by itself once the server's recorded port file is gone (any other stop). It
listens on ``<CQ_HOME>/spark/agent.sock`` (0600, in the server's 0700 state directory), pre-imports the
heavy third-party modules (``PRELOAD``) but none of cq_engine's own, and opens no gRPC channel: each
command runs in a child forked from the single-threaded main loop, which applies the client's
environment, working directory and stdin/stdout/stderr, imports cq_engine afresh (an edited editable
install is picked up) and runs the entry point the client names (``client.ENTRY``). The loop reaps children (SIGCHLD through
a wake-up pipe) and sends each client its command's end; a client that goes away takes its command
with it (SIGTERM to the command's process group)."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from typing import Any, NoReturn

from cq_engine.configfile import state_dir

PROTOCOL = 1
SOCKET_NAME = "agent.sock"
PRELOAD = (
    "pandas",
    "pyarrow",
    "grpc",
    "pyspark.sql.connect.session",
    "pyspark.sql.connect.dataframe",
    "pyspark.sql.connect.functions",
    "deltalake",
    "sqlglot",
)
# What pyspark sets in a process holding a Connect session: never in the agent (see cq_engine.spark).
_MODE_VARS = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE", "SPARK_API_MODE")
_MODULE = "cq_engine.cli.agent"


def socket_path(home: str) -> str:
    """The agent's Unix socket under ``home`` (the server's state directory, mode 0700)."""
    return os.path.join(state_dir(home), SOCKET_NAME)


def identity() -> dict[str, object]:
    """What a client and its agent must share: the protocol, the environment (``sys.prefix``: the
    virtualenv), the interpreter's version and the package's place (an agent of another virtualenv,
    Python or checkout refuses the command)."""
    package = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # cq_engine/
    return {"protocol": PROTOCOL, "prefix": sys.prefix, "python": sys.version, "package": package}


def _pid_file(home: str) -> str:
    return os.path.join(state_dir(home), "agent.pid")


def _answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
            return True
        except OSError:
            return False


def _is_agent(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return _MODULE.encode() in f.read()
    except OSError:
        return False


def _agent_pid(home: str) -> int | None:
    """The pid of ``home``'s live agent, checked against its command line (pids are recycled)."""
    try:
        with open(_pid_file(home)) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return pid if _is_agent(pid) else None


def start(home: str, *, wait: float = 0.0) -> bool:
    """Start ``home``'s command agent unless one answers; with ``wait``, up to that many seconds
    until it accepts commands (its imports take a second or two). True if it answers."""
    path = socket_path(home)
    if _answers(path):
        return True
    os.makedirs(state_dir(home), mode=0o700, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in _MODE_VARS}
    with open(os.path.join(state_dir(home), "agent.log"), "ab") as log:
        subprocess.Popen(
            [sys.executable, "-m", _MODULE, os.path.realpath(os.path.expanduser(home))],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives the command that started it, like the server
            cwd=state_dir(home),  # `-m` puts its working directory first on sys.path: a private one
        )
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if _answers(path):
            return True
        time.sleep(0.05)
    return False


def stop(home: str, *, timeout: float = 30.0) -> bool:
    """Stop ``home``'s agent (commands in flight finish first); True if one was running."""
    pid = _agent_pid(home)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _is_agent(pid) and time.monotonic() < deadline:  # its pid file goes first
        time.sleep(0.05)
    return True


def serve(home: str) -> int:
    """The agent's main loop (``python -m cq_engine.cli.agent HOME``); returns when stopped."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    path = socket_path(home)
    if _answers(path):
        return 0  # another agent serves this home
    port_file = os.path.join(state_dir(home), "port")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a dead agent's socket
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(umask)
    listener.listen(16)
    with open(_pid_file(home), "w") as f:
        f.write(f"{os.getpid()}\n")
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    stopping = []
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wake-up fd hears it
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, None)
    sel.register(wake_r, selectors.EVENT_READ, None)
    clients: dict[int, socket.socket] = {}  # command pid -> its client's connection
    listening = True
    while listening or clients:
        if listening and (stopping or not os.path.exists(port_file)):
            listening = False  # no new commands; those in flight finish
            sel.unregister(listener)
            listener.close()
            for stale in (path, _pid_file(home)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(stale)
        for key, _ in sel.select(timeout=1.0):
            if key.fileobj is listener:
                _accept(listener, sel, clients, close=[listener, wake_r, wake_w])
            elif key.fileobj == wake_r:
                while _drain(wake_r):
                    pass
            else:  # a client's connection is readable only when the client went away
                pid = key.data
                sel.unregister(key.fileobj)
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGTERM)
        _reap(sel, clients)
    return 0


def _drain(fd: int) -> bool:
    try:
        return bool(os.read(fd, 512))
    except BlockingIOError:
        return False


def _reap(sel: selectors.BaseSelector, clients: dict[int, socket.socket]) -> None:
    while clients:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = clients.pop(pid, None)
        if conn is None:
            continue
        ended: dict[str, float] = (
            {"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status) else {"exit": os.waitstatus_to_exitcode(status)}
        )
        ended["cpu"] = round(usage.ru_utime + usage.ru_stime, 4)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn)
        try:
            conn.settimeout(5)
            conn.sendall(json.dumps(ended).encode() + b"\n")
        except OSError:
            pass
        conn.close()


def _accept(
    listener: socket.socket, sel: selectors.BaseSelector, clients: dict[int, socket.socket], *, close: list
) -> None:
    conn, _ = listener.accept()
    fds: list[int] = []
    try:
        conn.settimeout(5)  # a client that says nothing must not stall the agent
        peer = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", peer)
        head, fds, _flags, _addr = socket.recv_fds(conn, 4, 3)
        (length,) = struct.unpack("!I", head)
        payload = b""
        while len(payload) < length:
            chunk = conn.recv(length - len(payload))
            if not chunk:
                raise OSError("the client closed its connection")
            payload += chunk
        request = json.loads(payload)
        refused = _refusal(request, uid=uid, fds=fds)
        if refused:
            conn.sendall(json.dumps({"refused": refused}).encode() + b"\n")
            raise OSError(refused)
    except (OSError, ValueError, struct.error):
        for fd in fds:
            os.close(fd)
        conn.close()
        return
    pid = os.fork()
    if pid == 0:
        _child(request, fds, close=[*close, conn, *(k.fileobj for k in sel.get_map().values())])
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # also in the child: whichever runs first
    for fd in fds:
        os.close(fd)
    clients[pid] = conn
    try:
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        sel.register(conn, selectors.EVENT_READ, pid)
    except OSError:  # the client is already gone: so is its command
        os.killpg(pid, signal.SIGTERM)


def _refusal(request: Any, *, uid: int, fds: list[int]) -> str | None:
    if uid != os.getuid():
        return f"a client of user {uid}, not {os.getuid()}"
    if not isinstance(request, dict) or len(fds) != 3:
        return "a malformed request"
    ours = identity()
    for key, value in ours.items():
        if request.get(key) != value:
            return f"a client of another installation ({key} {request.get(key)!r}, the agent's {value!r})"
    return None


def _child(request: dict[str, Any], fds: list[int], *, close: list) -> NoReturn:
    """The forked command: the client's world, fresh cq_engine modules, ``console()``; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setpgid(0, 0)
        for obj in close:  # the agent's sockets and pipe, other clients' connections
            with contextlib.suppress(OSError):
                os.close(obj) if isinstance(obj, int) else obj.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            if fd > 2:
                os.close(fd)
        encoding = sys.stdout.encoding
        sys.stdin = open(0, encoding=encoding, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", encoding=encoding, closefd=False)  # noqa: SIM115
        sys.stderr = open(  # noqa: SIM115
            2, "w", buffering=1, encoding=encoding, errors="backslashreplace", closefd=False
        )
        os.environ.clear()
        os.environ.update(request["env"])
        time.tzset()
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        sys.path[0] = request["path0"]  # the script's directory, as in the `cq` process (the agent's: its state dir)
        sys.argv = ["cq", *request["argv"]]
        for name in [m for m in sys.modules if m == "cq_engine" or m.startswith("cq_engine.")]:
            del sys.modules[name]  # the command runs the installation's current code
        import importlib

        # The entry point the client names (``module:function``), loaded after the purge above: the
        # command's code is loaded now, not when the agent started. The agent knows no command module,
        # so the CLI that starts agents is not an import of this one.
        module, _, function = request["entry"].partition(":")
        if not module.startswith("cq_engine.cli."):
            raise SystemExit(f"cq: the command agent runs cq_engine.cli entry points only, not {module!r}")
        getattr(importlib.import_module(module), function)()  # ends the process (os._exit) unless a JVM must stop
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        import atexit

        atexit._run_exitfuncs()  # pyspark's orderly stop of an in-process JVM
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1]))
