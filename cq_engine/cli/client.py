"""The ``cq`` executable: a command goes to the warm command agent (``cq_engine.cli.agent``) when one
runs beside the local Spark Connect server under ``CQ_HOME``, else it runs in this process
(``cq_engine.cli.main.console``) exactly as without an agent.

Only the standard library is imported before the agent answers: the point of the agent is that this
process never imports pyspark, pandas, pyarrow or gRPC. The client hands over its argv, working
directory, environment and its stdin/stdout/stderr file descriptors (SCM_RIGHTS), so terminals, pipes
and redirections behave as in-process; it forwards SIGINT/SIGTERM/SIGHUP to the command's process and
ends as the command did (its exit code, or the signal that killed it). No agent, a stale socket, a
refused or broken connection: the command runs in-process (``CQ_DEBUG=1`` says why, one line)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping, Sequence

# Short-lived commands only: `dev`, `demo`, `spark start|stop|status`, `listen` and the Dagster controls
# start or manage servers, or are long-lived, and always run in the process the user started.
VIA_AGENT = frozenset({"validate", "plan", "run", "recalculate", "show", "ingest", "query", "triggers", "tick", "drop"})
FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")


def debug(env: Mapping[str, str], message: str) -> None:
    if env.get("CQ_DEBUG"):
        print(f"cq: debug: {message}", file=sys.stderr, flush=True)


# What a command runs, in the agent as in this process: the CLI's dispatcher.
ENTRY = "cq_engine.cli.main:console"


def run_via_agent(
    argv: Sequence[str], *, env: Mapping[str, str] | None = None, stdio: Sequence[int] = (0, 1, 2)
) -> dict[str, int] | None:
    """Run ``argv`` in the agent: ``{"exit": code}`` or ``{"signal": number}`` as the command ended,
    or None when it was not started there (the caller runs it in-process)."""
    env = os.environ if env is None else env
    if env.get("CQ_NO_AGENT") or not argv or argv[0] not in VIA_AGENT:
        return None
    try:
        from cq_engine.cli.agent import identity, socket_path
        from cq_engine.configfile import home_dir

        path = socket_path(home_dir(env))
    except Exception as exc:  # a broken cq.toml: the in-process command reports it properly
        debug(env, f"no command agent: {exc}")
        return None
    import json
    import signal
    import socket
    import struct

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            sock.settimeout(10)  # a wedged agent must not hang the command
            sock.connect(path)
            umask = os.umask(0o022)
            os.umask(umask)
            world = {
                "argv": list(argv),
                "cwd": os.getcwd(),
                "env": dict(env),
                "umask": umask,
                "path0": sys.path[0],
                "entry": ENTRY,
            }
            payload = json.dumps({**identity(), **world}).encode()
            socket.send_fds(sock, [struct.pack("!I", len(payload))], list(stdio))
            sock.sendall(payload)
            reader = sock.makefile("rb")
            first = json.loads(reader.readline() or b"null")
        except (OSError, ValueError) as exc:
            debug(env, f"not through the command agent at {path}: {exc}")
            return None
        if not isinstance(first, dict) or not isinstance(first.get("pid"), int):
            reason = first.get("refused") if isinstance(first, dict) else first
            debug(env, f"the command agent refused the command: {reason}")
            return None
        # From here the command runs in the agent's child: never run it a second time here.
        pid = first["pid"]

        def forward(signum: int, _frame: object) -> None:
            try:  # the child leads its own process group (a JVM it started is in it too)
                os.killpg(pid, signum)
            except OSError:
                with contextlib.suppress(OSError):
                    os.kill(pid, signum)

        for name in FORWARDED:
            signal.signal(getattr(signal, name), forward)
        sock.settimeout(None)
        try:
            last = json.loads(reader.readline() or b"null")
        except (OSError, ValueError):
            last = None
        if not isinstance(last, dict) or not ({"exit", "signal"} & last.keys()):
            print(f"cq: error: the command agent ({path}) went away while running the command", file=sys.stderr)
            return {"exit": 1}
        debug(env, f"ran in the command agent (pid {pid}, {last.get('cpu', 0.0):.3f}s CPU)")
        return {k: int(v) for k, v in last.items() if k in ("exit", "signal")}
    finally:
        sock.close()


def console() -> None:
    """The ``cq`` executable (``[project.scripts]``)."""
    ended = run_via_agent(sys.argv[1:])
    if ended is None:
        from cq_engine.cli.main import console as in_process

        in_process()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    if "signal" in ended:  # end as the command did: a shell sees the same signal
        import signal

        signal.signal(ended["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), ended["signal"])
        os._exit(128 + ended["signal"])
    os._exit(ended["exit"])
