"""soak: the deployed topology (docs/operations/deployment.md, started as ``tests/test_cluster.py`` starts it:
PostgreSQL, an S3 object store, Spark standalone with two workers, the engine's Spark Connect server on
them, the Dagster daemon) running 100 continuous queries (every 30 s) and the sample streams
(``sql/streams.sql`` but the NOTIFY one, ``sql/ekuiper.sql``) fed every 5 s, for
``CQ_BENCH_SOAK_SECONDS`` (default 1,800; ``--quick`` 300). Not part of CI.

Reported: the memory (RSS) of every long-lived process of the stack at the start of the window and at
its end, and each JVM's heap in use right after a full GC (``jcmd``: a JVM's RSS also grows as it
expands its heap towards the maximum, which is not a leak); the Delta log of the sinks and the engine state tables on the object store at both ends (JSON
commits, checkpoints, bytes, live data files); PostgreSQL's database size at both ends; the worst lag
of the continuous queries over the window (now minus the newest committed range end, each second) and
the streams' runs; then what ``cq maintain`` does to the tables afterwards. Informational (no target):
growth beyond noise in the RSS columns or the live heaps, or a log without checkpoints, is what to look for.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from . import Context, Outcome
from .orchestration import EVERY, definitions_sql, worst_lag

NAME = "soak"
SUBPROCESS = True
N = 100
REPO = Path(__file__).resolve().parent.parent
FEEDS = ("sensors", "meters", "demo")


def _sql(target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    (target / "cqs.sql").write_text(definitions_sql(N))
    streams = (REPO / "sql" / "streams.sql").read_text()
    # The NOTIFY sample needs a WebSocket receiver the soak does not run: left out.
    statements = [s for s in streams.split(";\n") if "NOTIFY(" not in s]
    (target / "streams.sql").write_text(";\n".join(statements))
    shutil.copy(REPO / "sql" / "ekuiper.sql", target / "ekuiper.sql")


def _feed(engine, stop: threading.Event, start: datetime) -> None:
    from cq_engine.cli.feed import FEEDS as ROWS
    from cq_engine.cli.feed import floor_time

    every = timedelta(seconds=5)
    while not stop.wait(5):
        end = floor_time(datetime.now(UTC), every)
        if end > start:
            for table in FEEDS:
                with contextlib.suppress(Exception):  # the soak watches the stack, not the feeder
                    engine.storage.append(table, ROWS[table](start=start, end=end, every=every))
            start = end


def _descendants(roots: list[int]) -> set[int]:
    kids: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            kids.setdefault(ppid, []).append(int(stat.parent.name))
    seen, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo += kids.get(pid, [])
    return seen


def _label(pid: int) -> str | None:
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    text = " ".join(words)
    for pattern, label in (
        (r"SparkConnectServer", "Spark Connect server (driver)"),
        (r"deploy\.master\.Master", "Spark master"),
        (r"deploy\.worker\.Worker \d? ?.*--webui-port", "Spark worker"),
        (r"CoarseGrainedExecutorBackend", "Spark executor"),
        (r"dagster-daemon", "dagster-daemon"),
        (r"dagster api grpc|dagster code-server", "Dagster code server"),
        (r"dagster api execute_run|execute_run", "Dagster run"),
        (r"moto_server", "S3 server (moto)"),
        (r"postgres", "PostgreSQL"),
    ):
        if re.search(pattern, text):
            return label
    return Path(words[0]).name if words and words[0] else None


def _rss(pid: int) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    return 0


def _memory(roots: list[int]) -> dict[int, tuple[str, int]]:
    out = {}
    for pid in _descendants(roots):
        label = _label(pid)
        if label:
            out[pid] = (label, _rss(pid))
    return out


JVMS = ("Spark Connect server (driver)", "Spark master", "Spark worker", "Spark executor")


def _live_heaps(memory: dict[int, tuple[str, int]]) -> dict[int, int]:
    """MiB of Java heap in use right after a full GC (``jcmd``), per JVM of ``memory``: what a leak
    grows, unlike the RSS, which also grows as the JVM expands its heap towards its maximum."""
    out = {}
    for pid, (label, _rss_mib) in memory.items():
        if label not in JVMS:
            continue
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["jcmd", str(pid), "GC.run"], capture_output=True, timeout=60, check=True)
            info = subprocess.run(["jcmd", str(pid), "GC.heap_info"], capture_output=True, text=True, timeout=60)
            used = re.search(r"heap\s+total \d+K, used (\d+)K", info.stdout)
            if used:
                out[pid] = int(used.group(1)) // 1024
    return out


def _logs(cluster, names: list[str]) -> dict[str, tuple[int, int, int, int]]:
    """Per table (``_cq/...`` for state): JSON commits, checkpoint files, log bytes, data files."""
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=cluster.env["AWS_ENDPOINT_URL"],
        region_name=cluster.env["AWS_REGION"],
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    bucket, base = cluster.env["CQ_WAREHOUSE"][5:].split("/", 1)
    out = {}
    for name in names:
        commits = checkpoints = size = data = 0
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{base}/{name}/"):
            for obj in page.get("Contents", []):
                key = obj["Key"][len(base) + len(name) + 2 :]
                if key.startswith("_delta_log/"):
                    size += obj["Size"]
                    commits += key.endswith(".json")
                    checkpoints += ".checkpoint." in key
                elif key.endswith(".parquet") and "/_delta_log/" not in key:
                    data += 1
        out[name] = (commits, checkpoints, size, data)
    return out


def _pg_size(cluster) -> int:
    import psycopg

    with psycopg.connect(host="127.0.0.1", port=cluster.pg_port, user="postgres", dbname="dagster") as conn:
        return int(conn.execute("SELECT pg_database_size('dagster')").fetchone()[0])


def run(ctx: Context) -> Outcome:
    sys.path.insert(0, str(REPO / "tests"))
    from test_cluster import PG_BIN, Cluster  # the deployment exactly as `make cluster-test` starts it

    from cq_engine.config import load_settings
    from cq_engine.engine import Engine

    seconds = 300 if ctx.quick else int(os.environ.get("CQ_BENCH_SOAK_SECONDS", "1800"))
    if not (PG_BIN / "initdb").is_file():
        raise RuntimeError("PostgreSQL is not installed: run `make cluster-setup` first")
    root = ctx.workdir(NAME)
    _sql(root / "sql")
    cluster = Cluster(root)
    stop, old_env = threading.Event(), dict(os.environ)
    load0 = os.getloadavg()
    try:
        ctx.log("starting PostgreSQL, S3, Spark standalone, the Connect server")
        cluster.start_postgres()
        cluster.start_s3()
        cluster.start_spark()
        cluster.start_connect()
        os.environ.update({k: v for k, v in cluster.env.items() if k.startswith("AWS_")})
        feeder = Engine(settings=load_settings(environ={**cluster.env, "CQ_STORAGE": "deltars"}))
        feeder.ensure_tables()
        start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=2)
        threading.Thread(target=_feed, args=(feeder, stop, start), daemon=True).start()
        cluster.start_dagster()
        ctx.log("waiting for the first committed firing")
        deadline = time.monotonic() + 1200
        while not [e for e in feeder.ledger.entries() if e.status == "succeeded" and e.kind == "firing"]:
            if time.monotonic() > deadline:
                raise RuntimeError("no firing committed within 20 minutes (logs under the --keep dir)")
            time.sleep(10)
        time.sleep(EVERY)  # let the first backlog clear
        names = sorted({d.sink for d in feeder.catalog.definitions if d.sink})
        state = [f"_cq/{n}" for n in feeder.storage.state_names()]
        w0 = datetime.now(UTC)
        mem0, logs0, pg0 = _memory(cluster.roots), _logs(cluster, state + names), _pg_size(cluster)
        heap0 = _live_heaps(mem0)
        ctx.log(f"soaking {seconds}s from {w0:%H:%M:%S}")
        loads = [os.getloadavg()[0]]
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(min(30, max(0, end - time.monotonic())))
            loads.append(os.getloadavg()[0])
        w1 = datetime.now(UTC)
        state = [f"_cq/{n}" for n in feeder.storage.state_names()]
        mem1, logs1, pg1 = _memory(cluster.roots), _logs(cluster, state + names), _pg_size(cluster)
        heap1 = _live_heaps(mem1)
        time.sleep(EVERY + 5)
        entries = feeder.ledger.entries()
        stop.set()
        # Printed before the final `cq maintain`, which may outlast its bound: the soak's own figures stay.
        measured = _window_figures(entries, feeder, w0=w0, w1=w1, load0=load0, loads=loads, pg=(pg0, pg1))
        for note in measured[0]:
            ctx.log(note)
        limit = int(os.environ.get("CQ_BENCH_SOAK_MAINTAIN_SECONDS", "900"))
        ctx.log(f"cq maintain on the stack's tables (at most {limit}s)")
        try:
            maintained = subprocess.run(
                [str(Path(sys.executable).parent / "cq"), "maintain", "--sources"],
                cwd=root,
                env=cluster.env,
                capture_output=True,
                text=True,
                timeout=limit,
            )
            outcome = f"exit {maintained.returncode}; " + "; ".join(
                line for line in (maintained.stdout + maintained.stderr).splitlines() if "FAILED" in line
            )
        except subprocess.TimeoutExpired:
            outcome = f"did not finish within {limit}s (the stack still running beside it)"
        logs2 = _logs(cluster, state + names)
    finally:
        stop.set()
        cluster.stop()
        os.environ.clear()
        os.environ.update(old_env)
    notes, line, growth = _report(measured, (mem0, heap0), (mem1, heap1), logs0, logs1, logs2, state + names, outcome)
    return Outcome(NAME, line, ratio=growth, target=None, notes=notes)


def _window_figures(entries, feeder, *, w0, w1, load0, loads, pg) -> tuple[list[str], tuple]:
    """The window's lag, firings, stream runs, load and PostgreSQL size: notes, and the line's figures."""
    pg0, pg1 = pg
    ok = [e for e in entries if e.status == "succeeded"]
    cq_names = [f"q{i:03d}" for i in range(N)]
    lag = worst_lag([e for e in ok if e.kind == "firing"], names=cq_names, start=w0, end=w1)
    due = N * (int(w1.timestamp()) // EVERY - int(w0.timestamp()) // EVERY)
    done = sum(1 for e in ok if e.kind == "firing" and w0 < e.fire_time <= w1)
    streams = {d.name for d in feeder.catalog.definitions if d.name not in cq_names}
    stream_runs = sum(1 for e in ok if e.definition in streams and w0 <= e.finished_at <= w1)
    failed = sum(1 for e in entries if e.status == "failed" and w0 <= e.finished_at <= w1)
    notes = [
        f"window {w0:%H:%M:%S}-{w1:%H:%M:%S} UTC ({(w1 - w0).total_seconds() / 60:.1f} min); load average "
        f"{load0[0]:.1f} before the stack, {min(loads):.1f}-{max(loads):.1f} during (1-min, sampled every 30 s)",
        f"continuous queries: {done} of {due} firings due in the window committed; worst lag {lag:.0f}s; "
        f"window-triggered/PERIOD stream runs succeeded in the window: {stream_runs}; failed runs: {failed}",
        f"PostgreSQL (dagster database): {pg0 / 2**20:.1f} MiB -> {pg1 / 2**20:.1f} MiB",
    ]
    return notes, (w0, w1, lag, done, due, len(streams), pg0, pg1)


def _report(measured, start, end, logs0, logs1, logs2, tables, maintained: str):
    notes, (w0, w1, lag, done, due, streams, pg0, pg1) = list(measured[0]), measured[1]
    (mem0, heap0), (mem1, heap1) = start, end
    notes.append("RSS MiB at start -> end of the window (processes alive at both):")
    by_label: dict[str, list[tuple[int, int]]] = {}
    for pid, (label, rss) in sorted(mem0.items()):
        if pid in mem1:
            by_label.setdefault(label, []).append((rss, mem1[pid][1]))
    for label, pairs in sorted(by_label.items()):
        notes.append(f"  {label}: " + ", ".join(f"{a} -> {b}" for a, b in pairs))
    transient = sorted({mem1[p][0] for p in mem1 if p not in mem0})
    if transient:
        notes.append(f"  started during the window and alive at its end: {', '.join(transient)}")
    heaps = [(mem1[p][0], heap0[p], heap1[p]) for p in sorted(heap0) if p in heap1]
    if heaps:
        notes.append(
            "JVM heap in use after a full GC, MiB, start -> end: "
            + ", ".join(f"{label} {a} -> {b}" for label, a, b in heaps)
        )
    notes.append("Delta log (JSON commits / checkpoints / log KiB / data files) at start -> end -> after cq maintain:")
    for name in tables:
        a, b, c = logs0.get(name, (0, 0, 0, 0)), logs1.get(name), logs2.get(name)
        fmt = lambda t: "-" if t is None else f"{t[0]}/{t[1]}/{t[2] // 1024}/{t[3]}"
        notes.append(f"  {name}: {fmt(a)} -> {fmt(b)} -> {fmt(c)}")
    notes.append(f"cq maintain --sources: {maintained[:2000]}")
    growth = max((b / a for pairs in by_label.values() for a, b in pairs if a >= 50), default=1.0)
    heap_growth = max((b / a for _label, a, b in heaps if a >= 10), default=1.0)
    line = (
        f"{NAME}: {N} CQs + {streams} streams on the cluster topology for {(w1 - w0).total_seconds() / 60:.1f} "
        f"min: worst CQ lag {lag:.0f}s, {done}/{due} firings done, largest RSS growth x{growth:.2f} (JVM live heap x{heap_growth:.2f}), "
        f"PostgreSQL {pg0 / 2**20:.0f} -> {pg1 / 2**20:.0f} MiB (informational)"
    )
    return notes, line, growth
