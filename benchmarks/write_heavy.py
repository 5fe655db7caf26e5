"""write_heavy: a recalculation writing millions of rows, Spark-native Delta writes vs collect-and-write.

A row-wise continuous query (``temperature * 9 / 5 + 32 ... ALIGN BY DEVICE``, no GROUP BY) recalculated
over the whole source writes one sink row per source row (full: 5,184,000 rows; quick: 518,400). Each
storage runs it as its own ``cq recalculate`` process on an in-process ``local[*]`` session:

- ``spark`` (CQ_STORAGE=spark): the executors write the Delta files (``replaceWhere``), nothing is
  collected to Python;
- ``deltars`` (CQ_STORAGE=deltars): the result is collected as Arrow batches into the Python process
  and committed with delta-rs.

Target: spark / deltars wall time <= 1.0 (Spark-native must win). Reported for each: the process's
wall time and the peak resident memory of its Python process (``wait4``'s ``ru_maxrss``; the JVM is a
separate process and not counted).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from . import T0, Context, Outcome, clean_env, make_engine, remove_tree, spread, verdict

NAME = "write_heavy"
SUBPROCESS = True
TARGET = 1.0
SQL = """
CREATE TABLE IF NOT EXISTS sensors (ts TIMESTAMP, device STRING, temperature DOUBLE, humidity DOUBLE);
CREATE CQ fahrenheit RESAMPLE EVERY 1h BEGIN
  SELECT temperature * 9 / 5 + 32 AS temperature_f, humidity INTO fahrenheit_out FROM sensors ALIGN BY DEVICE
END;
"""
DEVICES = 60


def _source(hours: int):
    """``DEVICES`` devices every second for ``hours`` hours, one Arrow table per hour (numpy, no loops)."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(7)
    base = int(T0.timestamp()) * 1_000_000
    for h in range(hours):
        seconds = np.arange(h * 3600, (h + 1) * 3600, dtype=np.int64)
        ts = np.repeat(base + seconds * 1_000_000, DEVICES)
        device = np.tile(np.array([f"dev-{i:02d}" for i in range(DEVICES)], dtype=object), len(seconds))
        yield pa.table(
            {
                "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
                "device": pa.array(device, pa.string()),
                "temperature": pa.array(20 + 5 * rng.standard_normal(len(ts))),
                "humidity": pa.array(55 + 10 * rng.standard_normal(len(ts))),
            }
        )


def _run_once(work: Path, storage: str, hours: int) -> tuple[float, int, str]:
    """One ``cq recalculate`` process: (wall seconds, peak RSS of its Python process in MiB, output)."""
    remove_tree(work / "wh" / "fahrenheit_out")  # a fresh sink: nothing for Delta to skip
    env = {
        **clean_env(),
        "CQ_STORAGE": storage,
        "CQ_SQL_DIR": str(work / "sql"),
        "CQ_WAREHOUSE": str(work / "wh"),
        "CQ_HOME": str(work / ".cq"),
        "CQ_CONFIG": str(work / "no-cq.toml"),
    }
    end = T0 + timedelta(hours=hours)
    cmd = [
        sys.executable,
        "-m",
        "cq_engine.cli.main",
        "recalculate",
        "fahrenheit",
        "--from",
        T0.isoformat(),
        "--to",
        end.isoformat(),
    ]
    clock = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - clock
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"cq recalculate ({storage}) failed:\n{out[-3000:]}")
    return seconds, usage.ru_maxrss // 1024, out


def run(ctx: Context) -> Outcome:
    from deltalake import DeltaTable

    hours = 2 if ctx.quick else 24
    repeat = 1 if ctx.quick else 2
    work = ctx.workdir(NAME)
    engine = make_engine(work, SQL, spark=None, storage="deltars")
    ctx.log(f"writing {hours} hours x {DEVICES} devices of 1-second readings")
    rows = 0
    for part in _source(hours):
        engine.storage.append("sensors", part)
        rows += part.num_rows
    results: dict[str, list[tuple[float, int]]] = {"spark": [], "deltars": []}
    for _ in range(repeat):
        for storage in results:  # interleaved, so a slow spell hits both
            ctx.log(f"cq recalculate on the {storage} storage")
            seconds, peak, _ = _run_once(work, storage, hours)
            written = DeltaTable(str(work / "wh" / "fahrenheit_out")).to_pyarrow_dataset().count_rows()
            if written != rows:
                raise RuntimeError(f"{storage}: the sink holds {written} rows, expected {rows}")
            results[storage].append((seconds, peak))
    best = {k: min(s for s, _ in v) for k, v in results.items()}
    peak = {k: max(p for _, p in v) for k, v in results.items()}
    ratio = best["spark"] / best["deltars"]
    line = (
        f"{NAME}: spark-native {best['spark']:.1f}s (peak Python RSS {peak['spark']} MiB)  collect-and-write "
        f"{best['deltars']:.1f}s (peak Python RSS {peak['deltars']} MiB)  {verdict(ratio, TARGET)}"
    )
    notes = [
        f"{rows:,} rows recalculated and written by one `cq recalculate` process per storage (JVM start "
        f"included on both sides); best of {repeat}: spark {spread([s for s, _ in results['spark']])}, "
        f"deltars {spread([s for s, _ in results['deltars']])}"
    ]
    return Outcome(NAME, line, ratio, TARGET, notes=notes)
