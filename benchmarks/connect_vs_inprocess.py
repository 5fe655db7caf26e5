"""connect_vs_inprocess: the wall time of one ``cq run`` command through the engine's local Spark
Connect server versus with an in-process ``local[*]`` session started by the command (no target; the
ratio in-process / Connect is reported).

Both sides are fresh ``python -m cq_engine.cli.main run NAME --at T`` subprocesses over the same warehouse:
the Connect side with the server's ``CQ_HOME`` (found there with its token, as a user's command finds
it), the in-process side with a different ``CQ_HOME`` (no server pid file there, so the engine falls
back to ``local[*]`` and says so on stderr). The server is started
once with ``cq_engine.spark.start_server`` on a free port, warmed up, and always stopped at the end.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from datetime import timedelta

from . import PER_MINUTE_SQL, T0, Context, Outcome, clean_env, free_port, make_engine, measure, spread, verdict

NAME = "connect_vs_inprocess"
SUBPROCESS = True  # the runner stops its in-process Spark session first: it would only add noise
COMMITS = 12
# A command falling back to a classic session says so on stderr (and Spark may log its start); a
# Connect client does neither.
_CLASSIC_MARKERS = ("in-process Spark session", "Setting default log level", "log4j2-defaults.properties")
_ENGINE_SECONDS = re.compile(r"files, ([0-9.]+)s\)")


def run(ctx: Context) -> Outcome:
    from cq_engine.cli.feed import sensor_rows
    from cq_engine.config import Settings
    from cq_engine.spark import start_server, stop_server

    repeat = 1 if ctx.quick else 3
    work = ctx.workdir(NAME)
    # Only the storage is used here (no Spark in this process): load the data with delta-rs.
    engine = make_engine(work, PER_MINUTE_SQL, spark=None)
    for m in range(COMMITS):
        engine.storage.append(
            "sensors",
            sensor_rows(start=T0 + timedelta(minutes=m), end=T0 + timedelta(minutes=m + 1), every=timedelta(seconds=1)),
        )
    fire = T0 + timedelta(minutes=COMMITS // 2 + 1)

    port = free_port()
    server = Settings(
        sql_dir=engine.settings.sql_dir,
        warehouse=engine.settings.warehouse,
        home=str(work / "home-server"),
        spark_port=port,
    )
    base = {
        **clean_env(),
        "CQ_SQL_DIR": server.sql_dir,
        "CQ_WAREHOUSE": server.warehouse,
        "CQ_CONFIG": str(work / "no-cq.toml"),
        "CQ_SPARK_PORT": str(port),
    }
    envs = {
        "connect": {**base, "CQ_HOME": server.home},  # the server requires its token: found in CQ_HOME
        "in-process": {**base, "CQ_HOME": str(work / "home-local")},  # no server to discover there
    }
    engine_seconds: dict[str, list[float]] = {k: [] for k in envs}
    wrong_kind: list[str] = []

    def cq_run(kind: str):
        proc = subprocess.run(
            [sys.executable, "-m", "cq_engine.cli.main", "run", "per_minute", "--at", fire.isoformat()],
            env=envs[kind],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"`cq run` ({kind}) exited {proc.returncode}: {proc.stderr.strip()[-1500:]}")
        if m := _ENGINE_SECONDS.search(proc.stdout):
            engine_seconds[kind].append(float(m.group(1)))
        classic = any(marker in proc.stderr for marker in _CLASSIC_MARKERS)
        if classic != (kind == "in-process"):
            wrong_kind.append(kind)
        return proc.stdout.strip()

    try:
        ctx.log(f"starting the Spark Connect server on port {port}")
        clock = time.perf_counter()
        start_server(server)
        server_start = time.perf_counter() - clock
        ctx.log("warming the server up")
        for _ in range(1 if ctx.quick else 2):
            cq_run("connect")
        engine_seconds["connect"].clear()
        ctx.log("timing `cq run` subprocesses")
        medians, samples, _ = measure({k: (lambda k=k: cq_run(k)) for k in envs}, repeat=repeat, warmup=0)
    finally:
        stop_server(server)

    ratio = medians["in-process"] / medians["connect"]
    inner = {k: sorted(v)[len(v) // 2] for k, v in engine_seconds.items() if v}
    line = f"{NAME}: connect {medians['connect']:.3f}s  in-process {medians['in-process']:.3f}s  {verdict(ratio, None)}"
    details = (
        f"wall time of `cq run` subprocesses, {repeat} run(s) each: connect {spread(samples['connect'])},"
        f" in-process {spread(samples['in-process'])}; the engine's own RunResult.seconds (session"
        f" start included): connect {inner.get('connect', float('nan')):.2f}s,"
        f" in-process {inner.get('in-process', float('nan')):.2f}s; server start {server_start:.1f}s (once)"
    )
    outcome = Outcome(NAME, line, ratio, None, notes=[details])
    if wrong_kind:
        outcome.notes.append(
            f"could not confirm the session kind of {len(wrong_kind)} run(s) from their stderr "
            f"({', '.join(sorted(set(wrong_kind)))})"
        )
    return outcome
