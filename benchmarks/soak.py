"""soak: the deployed topology (docs/operations/deployment.md, started as ``tests/test_cluster.py`` starts it:
PostgreSQL, an S3 object store, Spark standalone with two workers, the engine's Spark Connect server on
them, the Dagster daemon) running ``CQ_BENCH_SOAK_N`` continuous queries every 30 s (default 100,
``orchestration``'s definitions) and ``CQ_BENCH_SOAK_STREAMS`` window-triggered streams (default 10,
``stream_scale``'s: INTERVAL, SESSION, STATE, EVENT and COUNT windows and an eKuiper rule) fed every
5 s, for ``CQ_BENCH_SOAK_SECONDS`` (default 1,800; ``--quick`` 300). Not part of CI.

Targets (the ratio is the worst of them, <= 1 when all hold): >= 99% of the window's due firings
committed within a cadence, worst CQ lag <= 60 s; every stream window that closed 30 s before the
window's end in its sink, freshness p95 <= 20 s; no failed run; no "cannot schedule new futures" in
the stack's logs; no firing or stream work recorded twice in the ledger; each JVM's retained heap
grown by at most 10%.

Reported: the memory (RSS) of every long-lived process of the stack at the start of the window and at
its end, and the heap each JVM retains (the least of five readings of its heap in use right after a full GC,
``jcmd``: a JVM's RSS also grows as it expands its heap towards the maximum, which is not a leak); the Delta log of the sinks and the engine state tables on the object store at both ends (JSON
commits, checkpoints, bytes, live data files); PostgreSQL's database size at both ends; the worst lag
of the continuous queries over the window (now minus the newest committed range end, each second) and
the streams' runs; then what ``cq maintain`` does to the tables afterwards. Informational (no target):
growth beyond noise in the RSS columns or the live heaps, or a log without checkpoints, is what to look for.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from . import Context, Outcome, orchestration, stream_scale, verdict
from .orchestration import EVERY

NAME = "soak"
SUBPROCESS = True
REPO = Path(__file__).resolve().parent.parent
CQ_SHARE, CQ_LAG, STREAM_SHARE, STREAM_P95, HEAP_GROWTH = 0.99, 60.0, 1.0, 20.0, 1.10
# Minutes between the live-heap readings inside the window (CQ_BENCH_SOAK_HEAP_EVERY): a 2-hour soak
# reads them at minutes 0, 30, 60, 90 and 120.
HEAP_EVERY = 30
# What a sensor's computation said when the code server it ran in was replaced under it.
SHUTDOWN_ERROR = "cannot schedule new futures"


def _sql(target: Path, n: int, streams: int) -> None:
    target.mkdir(parents=True, exist_ok=True)
    (target / "cqs.sql").write_text(orchestration.definitions_sql(n))
    (target / "streams.sql").write_text(stream_scale.definitions_sql(streams))


def _feed(engine, stop: threading.Event, start: datetime, commits: list) -> None:
    """``stream_scale.feed`` (sensors, meters and demo every 5 s), riding out a store that does not answer:
    the soak watches the stack, not the feeder."""
    while not stop.is_set():
        with contextlib.suppress(Exception):
            stream_scale.feed(engine, stop, start, commits, sensors=True)
        start = commits[-1][1] if commits else start


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
        (r"versitygw", "S3 server (versitygw)"),
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


def _live_heaps(memory: dict[int, tuple[str, int]], *, samples: int = 5, apart: float = 6.0) -> dict[int, int]:
    """MiB of Java heap a JVM of ``memory`` retains: the least of ``samples`` readings ``apart`` seconds
    apart of its heap in use right after a full GC (``jcmd``). That is what a leak grows, unlike the RSS,
    which also grows as the JVM expands its heap towards its maximum; one reading is not, since an
    executor's heap after a GC also holds the memory pages of the tasks it is running at that moment
    (0-80 MiB of ``long[]`` in its class histogram, from one reading to the next)."""
    out: dict[int, int] = {}
    for sample in range(samples):
        if sample:
            time.sleep(apart)
        for pid, (label, _rss_mib) in memory.items():
            if label not in JVMS:
                continue
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(["jcmd", str(pid), "GC.run"], capture_output=True, timeout=60, check=True)
                info = subprocess.run(["jcmd", str(pid), "GC.heap_info"], capture_output=True, text=True, timeout=60)
                used = re.search(r"heap\s+total \d+K, used (\d+)K", info.stdout)
                if used:
                    out[pid] = min(out.get(pid, 2**31), int(used.group(1)) // 1024)
    return out


def _heaps_line(heaps: dict[int, int], memory: dict[int, tuple[str, int]]) -> str:
    return ", ".join(f"{memory[p][0]} {mib}" for p, mib in sorted(heaps.items()) if p in memory) or "-"


def _heap_readings(readings: list[tuple[int, dict[int, int]]], memory: dict[int, tuple[str, int]]) -> list[str]:
    """The JVMs' live heaps at each reading (minute 0, every ``HEAP_EVERY`` minutes, the end) and the
    growth after the first reading past minute 30: what goes on growing once the caches are warm."""
    pids = [p for p in sorted(readings[0][1]) if all(p in heaps for _m, heaps in readings) and p in memory]
    notes = [
        "JVM heap in use after a full GC, MiB, at minute "
        + "/".join(str(m) for m, _h in readings)
        + ": "
        + ", ".join(f"{memory[p][0]} " + "/".join(str(h[p]) for _m, h in readings) for p in pids)
    ]
    warm = next((h for m, h in readings if m >= 30), None)
    if warm is not None and readings[-1][0] > 30 and warm is not readings[-1][1]:
        end = readings[-1][1]
        growth = max((end[p] / warm[p] for p in pids if warm.get(p, 0) >= 10), default=1.0)
        notes.append(f"JVM live heap growth after minute 30: x{growth:.2f} (the largest of the JVMs)")
    return notes


def _driver_classes(memory: dict[int, tuple[str, int]]) -> dict[str, int]:
    """Bytes per class on the Connect driver's heap (``jcmd GC.class_histogram``, after a full GC):
    what its growth is made of."""
    out: dict[str, int] = {}
    for pid, (label, _rss_mib) in memory.items():
        if label == JVMS[0]:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                text = subprocess.run(
                    ["jcmd", str(pid), "GC.class_histogram"], capture_output=True, text=True, timeout=120
                ).stdout
                for match in re.finditer(r"^\s*\d+:\s+\d+\s+(\d+)\s+(\S+)", text, re.MULTILINE):
                    out[match.group(2)] = out.get(match.group(2), 0) + int(match.group(1))
    return out


def _grown(before: dict[str, int], after: dict[str, int], top: int = 8) -> str:
    """The ``top`` classes that grew most, KiB before -> after."""
    grown = sorted(after, key=lambda c: before.get(c, 0) - after[c])[:top]
    return ", ".join(
        f"{c} {before.get(c, 0) // 1024} -> {after[c] // 1024}" for c in grown if after[c] > before.get(c, 0)
    )


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
    n = 10 if ctx.quick else int(os.environ.get("CQ_BENCH_SOAK_N", "100"))
    m = int(os.environ.get("CQ_BENCH_SOAK_STREAMS", "10"))
    store = os.environ.get("CQ_BENCH_SOAK_S3", "versitygw")  # or moto (the tests' store)
    if not (PG_BIN / "initdb").is_file():
        raise RuntimeError("PostgreSQL is not installed: run `make cluster-setup` first")
    root = ctx.workdir(NAME)
    _sql(root / "sql", n, m)
    streams = [f"s{i:03d}" for i in range(m)]
    commits: list[tuple[float, datetime]] = []
    cluster = Cluster(root)
    stop, old_env = threading.Event(), dict(os.environ)
    load0 = os.getloadavg()
    try:
        ctx.log("starting PostgreSQL, S3, Spark standalone, the Connect server")
        cluster.start_postgres()
        cluster.start_s3(store)
        cluster.start_spark()
        cluster.start_connect()
        os.environ.update({k: v for k, v in cluster.env.items() if k.startswith("AWS_")})
        feeder = Engine(settings=load_settings(environ={**cluster.env, "CQ_STORAGE": "deltars"}))
        feeder.ensure_tables()
        from cq_engine.cli.feed import demo_rows, floor_time, meter_rows, sensor_rows

        start = floor_time(datetime.now(UTC), stream_scale.FEED)
        feeder.storage.append("sensors", sensor_rows(start=start - timedelta(minutes=2), end=start))
        step = stream_scale.FEED
        feeder.storage.append("meters", meter_rows(start=start - timedelta(minutes=2), end=start + step, every=step))
        feeder.storage.append("demo", demo_rows(start=start - timedelta(minutes=2), end=start + step, every=step))
        threading.Thread(target=_feed, args=(feeder, stop, start, commits), daemon=True).start()
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
        heap0, classes0 = _live_heaps(mem0), _driver_classes(mem0)
        ctx.log(f"soaking {seconds}s from {w0:%H:%M:%S}")
        loads = [os.getloadavg()[0]]
        began = time.monotonic()
        end = began + seconds
        every = int(os.environ.get("CQ_BENCH_SOAK_HEAP_EVERY", str(HEAP_EVERY)))
        heaps_at, reading = [(0, heap0)], every
        while time.monotonic() < end:
            time.sleep(min(30, max(0, end - time.monotonic())))
            loads.append(os.getloadavg()[0])
            if time.monotonic() - began >= reading * 60 and time.monotonic() < end - 60:
                heaps_at.append((reading, _live_heaps(_memory(cluster.roots))))
                ctx.log(f"minute {reading}: JVM heap after a full GC {_heaps_line(heaps_at[-1][1], mem0)}")
                reading += every
        w1 = datetime.now(UTC)
        state = [f"_cq/{n}" for n in feeder.storage.state_names()]
        mem1, logs1, pg1 = _memory(cluster.roots), _logs(cluster, state + names), _pg_size(cluster)
        heap1, classes1 = _live_heaps(mem1), _driver_classes(mem1)
        heaps_at.append((round((w1 - w0).total_seconds() / 60), heap1))
        sinks = stream_scale.read_sinks(feeder.settings, streams)
        time.sleep(EVERY + 5)  # firings due in the window may finish up to a cadence after it
        entries = feeder.ledger.entries()
        failed_runs = _failed_runs(cluster, w0, w1 + timedelta(seconds=EVERY + 5))
        shutdown_errors = _lines_saying(cluster.logs, SHUTDOWN_ERROR)
        stop.set()
        # Printed before the final `cq maintain`, which may outlast its bound: the soak's own figures stay.
        measured = _window_figures(
            entries,
            n=n,
            streams=streams,
            sinks=sinks,
            commits=commits,
            failed_runs=failed_runs,
            shutdown_errors=shutdown_errors,
            w0=w0,
            w1=w1,
            load0=load0,
            loads=loads,
            pg=(pg0, pg1),
        )
        measured[0].extend(_heap_readings(heaps_at, mem0))
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
    notes, line, ratio = _report(
        measured,
        (mem0, heap0, classes0),
        (mem1, heap1, classes1),
        logs0,
        logs1,
        logs2,
        state + names,
        outcome,
        store=store,
    )
    return Outcome(NAME, line, ratio=ratio, target=1.0, notes=notes)


def _failed_runs(cluster, w0: datetime, w1: datetime) -> int:
    """Dagster runs created in ``[w0, w1]`` that failed (PostgreSQL's run storage)."""
    import psycopg

    with psycopg.connect(host="127.0.0.1", port=cluster.pg_port, user="postgres", dbname="dagster") as conn:
        row = conn.execute(
            "SELECT count(*) FROM runs WHERE status = 'FAILURE' AND create_timestamp BETWEEN %s AND %s",
            (w0.replace(tzinfo=None), w1.replace(tzinfo=None)),
        ).fetchone()
    return int(row[0]) if row else 0


def _lines_saying(logs: Path, text: str) -> int:
    """Lines of the stack's logs under ``logs`` holding ``text``: the daemon's, the code server's, the S3
    server's, Spark's daemons' and its executors' (not the jars the workers copied beside them)."""
    found = 0
    for log in logs.rglob("*"):
        if log.is_file() and (log.suffix in (".log", ".out") or log.name in ("stderr", "stdout")):
            with contextlib.suppress(OSError), open(log, errors="replace") as lines:
                found += sum(text in line for line in lines)
    return found


def _window_figures(
    entries, *, n, streams, sinks, commits, failed_runs, shutdown_errors, w0, w1, load0, loads, pg
) -> tuple[list[str], dict]:
    """The window's CQ and stream figures, load and PostgreSQL size: notes, and the figures."""
    pg0, pg1 = pg
    cq_share, done, due, lag, failed = orchestration.score(entries, n=n, w0=w0, w1=w1)
    doubled = orchestration.doubled(entries)
    in_time = [e for e in entries if e.status == "succeeded" and e.finished_at <= w1]
    st_share, st_due, latencies, st_lag = stream_scale.score(
        names=streams, sinks=sinks, entries=in_time, commits=commits, w0=w0, w1=w1
    )
    p50, p95 = stream_scale.percentiles(latencies)
    notes = [
        f"window {w0:%H:%M:%S}-{w1:%H:%M:%S} UTC ({(w1 - w0).total_seconds() / 60:.1f} min); load average "
        f"{load0[0]:.1f} before the stack, {min(loads):.1f}-{max(loads):.1f} during (1-min, sampled every 30 s)",
        f"continuous queries: {cq_share:.1%} of {due} due firings committed within {EVERY}s (target >= "
        f"{CQ_SHARE:.0%}), {done} firings in the window, worst lag {lag:.0f}s (target <= {CQ_LAG:.0f}s), "
        f"{failed} failed firings",
        f"streams: {st_share:.1%} of {st_due} windows in their sinks (target {STREAM_SHARE:.0%}), freshness "
        f"p50 {p50:.1f}s p95 {p95:.1f}s (target <= {STREAM_P95:.0f}s), worst lag {st_lag:.0f}s; "
        f"failed Dagster runs: {failed_runs} (target 0)",
        f"'{SHUTDOWN_ERROR}' in the stack's logs: {shutdown_errors} line(s) (target 0)",
        f"ledger: {doubled} firing(s) or stream work(s) recorded as succeeded more than once (target 0)",
        f"PostgreSQL (dagster database): {pg0 / 2**20:.1f} MiB -> {pg1 / 2**20:.1f} MiB",
    ]
    figures = dict(
        w0=w0,
        w1=w1,
        n=n,
        streams=len(streams),
        cq_share=cq_share,
        lag=lag,
        st_share=st_share,
        p95=p95,
        failed_runs=failed_runs,
        shutdown_errors=shutdown_errors,
        doubled=doubled,
        pg0=pg0,
        pg1=pg1,
        load=f"load {min(loads):.1f}-{max(loads):.1f}",
    )
    return notes, figures


def _report(measured, start, end, logs0, logs1, logs2, tables, maintained: str, *, store: str):
    notes, f = list(measured[0]), measured[1]
    w0, w1, pg0, pg1 = f["w0"], f["w1"], f["pg0"], f["pg1"]
    (mem0, heap0, classes0), (mem1, heap1, classes1) = start, end
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
    if classes0 and classes1:
        notes.append(f"Connect driver, classes grown most (KiB): {_grown(classes0, classes1)}")
    notes.append("Delta log (JSON commits / checkpoints / log KiB / data files) at start -> end -> after cq maintain:")
    for name in tables:
        a, b, c = logs0.get(name, (0, 0, 0, 0)), logs1.get(name), logs2.get(name)
        fmt = lambda t: "-" if t is None else f"{t[0]}/{t[1]}/{t[2] // 1024}/{t[3]}"
        notes.append(f"  {name}: {fmt(a)} -> {fmt(b)} -> {fmt(c)}")
    notes.append(f"cq maintain --sources: {maintained[:2000]}")
    growth = max((b / a for pairs in by_label.values() for a, b in pairs if a >= 50), default=1.0)
    heap_growth = max((b / a for _label, a, b in heaps if a >= 10), default=1.0)
    # Each target as a ratio, <= 1 when met: the worst is the benchmark's.
    ratio = max(
        (1 - f["cq_share"]) / (1 - CQ_SHARE),
        f["lag"] / CQ_LAG,
        1.0 + (STREAM_SHARE - f["st_share"]) * 100,
        f["p95"] / STREAM_P95,
        1.0 + f["failed_runs"],
        1.0 + f["shutdown_errors"],
        1.0 + f["doubled"],
        (heap_growth - 1) / (HEAP_GROWTH - 1),
    )
    line = (
        f"{NAME}: {f['n']} CQs every {EVERY}s + {f['streams']} streams on the cluster topology (S3: {store}), "
        f"{(w1 - w0).total_seconds() / 60:.1f} min: CQs {f['cq_share']:.1%} committed, worst lag {f['lag']:.0f}s; "
        f"streams {f['st_share']:.1%} of windows, p95 {f['p95']:.1f}s; {f['failed_runs']} failed runs, "
        f"{f['shutdown_errors']} '{SHUTDOWN_ERROR}' lines, {f['doubled']} recorded twice; "
        f"JVM live heap x{heap_growth:.2f}, largest RSS growth x{growth:.2f}; PostgreSQL {pg0 / 2**20:.0f} -> "
        f"{pg1 / 2**20:.0f} MiB; {f['load']}; {verdict(ratio, 1.0)}"
    )
    return notes, line, ratio
