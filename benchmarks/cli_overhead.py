"""cli_overhead: what a ``cq`` command costs of its own when the local Spark Connect server is warm,
and how long ``cq spark stop`` + ``cq spark start`` take with a client connected.

The same firing (``per_minute`` over 12 one-minute commits, as in ``connect_vs_inprocess``) runs
interleaved as

- ``cq via agent``: the ``cq`` executable, ``cq run per_minute --at T``, a fresh process finding the
  server and its warm command agent through ``CQ_HOME`` (what a user types; cq_engine.cli.agent);
- ``cq``: the same with ``CQ_NO_AGENT=1``: the command runs in the ``cq`` process (imports pyspark's
  Connect client, opens its own session);
- ``cq, full teardown``: the same command ending through the interpreter's normal exit (what every
  command did before ``cq_engine.cli.main.console``), to show what the quick exit saves;
- ``api``: ``Engine.run_firing`` in this process, with an engine and a Connect session to the same
  server opened once and warmed up (the same work through the Python API).

A command's own cost is its median wall time minus the API's: interpreter start, imports, settings,
the catalog, the session's set-up and the exit. The ratio is ``cq via agent`` / ``api``; the target is
the ratio at which the own cost would be half a second; ``cq via agent`` / ``cq`` is printed too.
Through the agent, the CPU time is the client's plus the command's in the agent's forked child (the
agent reports it, ``CQ_DEBUG=1``). ``cq validate`` (no Spark) is timed beside them, and the
command's CPU time is given too (on a shared machine wall time waits for a core). Last, with the API's
session still connected, ``cq spark stop`` then ``cq spark start`` on the same port, timed: the start
must succeed at once (the stopped server's connections sit in TIME_WAIT).
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from . import PER_MINUTE_SQL, T0, Context, Outcome, clean_env, free_port, make_engine, measure, spread

NAME = "cli_overhead"
SUBPROCESS = True  # the runner stops its classic session first: this process becomes a Connect client
BUDGET = 0.5  # seconds a warm command may cost of its own
COMMITS = 12


def run(ctx: Context) -> Outcome:
    from cq_engine.cli import agent
    from cq_engine.cli.feed import sensor_rows
    from cq_engine.config import Settings
    from cq_engine.engine import Engine
    from cq_engine.spark import get_session, start_server, stop_server

    repeat = 3 if ctx.quick else 7
    work = ctx.workdir(NAME)
    loader = make_engine(work, PER_MINUTE_SQL, spark=None)  # delta-rs only: no Spark in this process yet
    for m in range(COMMITS):
        loader.storage.append(
            "sensors",
            sensor_rows(start=T0 + timedelta(minutes=m), end=T0 + timedelta(minutes=m + 1), every=timedelta(seconds=1)),
        )
    fire = (T0 + timedelta(minutes=COMMITS // 2 + 1)).isoformat()
    settings = Settings(**{**loader.settings.__dict__, "spark_port": free_port()})
    env = {
        **clean_env(),
        "CQ_SQL_DIR": settings.sql_dir,
        "CQ_WAREHOUSE": settings.warehouse,
        "CQ_HOME": settings.home,
        "CQ_CONFIG": str(work / "no-cq.toml"),
        "CQ_STORAGE": settings.storage,
    }  # no CQ_SPARK_PORT: found where the server recorded it, as a user's command finds it
    cq = str(Path(sys.executable).with_name("cq"))
    teardown = [sys.executable, "-c", "import sys; from cq_engine.cli.main import main; sys.exit(main())"]
    cpu: dict[str, list[float]] = {"cq via agent": [], "cq": [], "cq, full teardown": [], "validate": [], "api": []}
    client_cpu: list[float] = []  # through the agent: the cq process alone

    def command(kind: str, argv: list[str]) -> None:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        via = kind == "cq via agent"
        extra = {"CQ_DEBUG": "1"} if via else {"CQ_NO_AGENT": "1"}
        proc = subprocess.run(argv, env={**env, **extra}, cwd=work, capture_output=True, text=True, timeout=600)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise RuntimeError(f"{argv[-4:]} exited {proc.returncode}: {proc.stderr.strip()[-1500:]}")
        if "in-process Spark session" in proc.stderr:
            raise RuntimeError(f"{kind}: the command did not find the server: {proc.stderr.strip()[-800:]}")
        own = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        if via:
            ran = re.search(r"ran in the command agent \(pid \d+, ([\d.]+)s CPU\)", proc.stderr)
            if ran is None:
                raise RuntimeError(f"the command did not run in the agent: {proc.stderr.strip()[-800:]}")
            client_cpu.append(own)
            own += float(ran.group(1))
        cpu[kind].append(own)

    run_args = ["run", "per_minute", "--at", fire]

    def api() -> None:
        clock = time.process_time()  # this process's CPU: the Python side of the same work
        engine.run_firing("per_minute", T0 + timedelta(minutes=COMMITS // 2 + 1))
        cpu["api"].append(time.process_time() - clock)

    try:
        ctx.log(f"starting the Spark Connect server on port {settings.spark_port}")
        start_server(settings)
        if not agent.start(settings.home, wait=180):
            raise RuntimeError(f"the command agent did not start: see {settings.home}/spark/agent.log")
        engine = Engine(settings=settings, spark_session=get_session(settings))
        cases = {
            "cq via agent": lambda: command("cq via agent", [cq, *run_args]),
            "cq": lambda: command("cq", [cq, *run_args]),
            "cq, full teardown": lambda: command("cq, full teardown", [*teardown, *run_args]),
            "api": lambda: api(),
            "validate": lambda: command("validate", [cq, "validate"]),
        }
        ctx.log("timing (interleaved) after warm-up")
        medians, samples, _ = measure(cases, repeat=repeat, warmup=2)
        ctx.log("cq spark stop + start with this process's session connected")
        # The port explicitly: stop forgets the recorded one, and start would take the default.
        same_port = {**env, "CQ_SPARK_PORT": str(settings.spark_port)}
        clock = time.perf_counter()
        stop = subprocess.run(
            [cq, "spark", "stop"], env=same_port, cwd=work, capture_output=True, text=True, timeout=300
        )
        stopped = time.perf_counter() - clock
        start = subprocess.run(
            [cq, "spark", "start"], env=same_port, cwd=work, capture_output=True, text=True, timeout=300
        )
        restart = time.perf_counter() - clock
    finally:
        agent.stop(settings.home)
        stop_server(settings)

    own = medians["cq via agent"] - medians["api"]
    ratio = medians["cq via agent"] / medians["api"]
    target = (medians["api"] + BUDGET) / medians["api"]
    med_cpu = {k: sorted(v)[len(v) // 2] for k, v in cpu.items() if v}
    restarted = stop.returncode == 0 and start.returncode == 0
    line = (
        f"{NAME}: `cq run` via the agent {medians['cq via agent']:.3f}s vs in-process {medians['cq']:.3f}s "
        f"(ratio {medians['cq via agent'] / medians['cq']:.2f}) vs API {medians['api']:.3f}s: own cost {own:.3f}s "
        f"(budget {BUDGET:.1f}s) {'OK' if own < BUDGET else 'MISSED'}; ratio {ratio:.2f} (target <= {target:.2f}); "
        + (f"restart {restart:.1f}s" if restarted else "restart FAILED")
    )
    load = os.getloadavg()
    notes = [
        f"{repeat} runs each after 2 warm-ups: cq via agent {spread(samples['cq via agent'])}, cq in-process "
        f"{spread(samples['cq'])} (own cost {medians['cq'] - medians['api']:.3f}s), cq with full teardown "
        f"{spread(samples['cq, full teardown'])} (median {medians['cq, full teardown']:.3f}s: the quick exit saves "
        f"{medians['cq, full teardown'] - medians['cq']:.3f}s), api {spread(samples['api'])}",
        f"`cq validate` {medians['validate']:.3f}s ({spread(samples['validate'])}); CPU time (load-independent): "
        f"cq run via the agent {med_cpu['cq via agent']:.2f}s (the cq process alone "
        f"{sorted(client_cpu)[len(client_cpu) // 2]:.3f}s, the rest in the agent's child), in-process "
        f"{med_cpu['cq']:.2f}s, with full teardown {med_cpu['cq, full teardown']:.2f}s, validate "
        f"{med_cpu['validate']:.2f}s, the API's run_firing {med_cpu['api']:.2f}s: own CPU cost "
        f"{med_cpu['cq via agent'] - med_cpu['api']:.2f}s via the agent, {med_cpu['cq'] - med_cpu['api']:.2f}s "
        "in-process",
        f"`cq spark stop` {stopped:.1f}s then `cq spark start` {restart - stopped:.1f}s on the same port, a client "
        f"connected at stop: "
        + (start.stdout.strip()[:70] if restarted else f"FAILED: {(stop.stderr + start.stderr).strip()[-600:]}"),
        f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}",
    ]
    return Outcome(NAME, line, ratio, target, notes=notes)
