"""``location_load``: how long Dagster takes to load a code location of N definitions.

Each size is loaded in a fresh Python process, the way Dagster's code server (``dagster api grpc``)
loads a location and serves it: build the ``Definitions`` (the catalog parsed, every Dagster object
made), resolve every job (``RepositoryDefinition.load_all_definitions``, which the server calls
before it serves), then compute and serialize what the webserver and the daemon fetch from it: the
``RepositorySnap`` (``ExternalRepository`` with deferred job snapshots) and one ``JobDataSnap`` per
job (``ExternalJob``). Python and Dagster imports are not counted (the same at any size).

The curve: 100, 300 and 1,000 continuous queries every 30 s, and 1,000 plus 100 window-triggered
streams. The ratio checked is the CPU time per definition at 1,000 against at 100 (1.0: linear; a
quadratic load gives about 10; CPU time, because the machine's load moves wall time far more); the
1,000 + 100 load's wall time is reported beside its 15 s target.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from . import Context, Outcome, clean_env, verdict

NAME = "location_load"
SUBPROCESS = True
SIZES = ((100, 0), (300, 0), (1000, 0), (1000, 100))
QUICK_SIZES = ((50, 0), (150, 0), (100, 20))
TARGET_SECONDS = 15.0  # 1,000 continuous queries + 100 streams
REPO = Path(__file__).resolve().parent.parent


def location_sql(cqs: int, streams: int = 0) -> str:
    """``cqs`` continuous queries every 30 s over ``sensors`` and ``streams`` INTERVAL/SLIDING streams
    over ``meters``, each into its own sink."""
    return (
        "CREATE TABLE IF NOT EXISTS sensors (ts TIMESTAMP, device STRING, temperature DOUBLE, humidity DOUBLE);\n"
        "CREATE TABLE IF NOT EXISTS meters (ts TIMESTAMP, current DOUBLE, voltage INT) TAGS (location STRING);\n"
        + "".join(
            f"CREATE CQ q{i:04d} RESAMPLE EVERY 30s BEGIN SELECT max_value(temperature) AS m, "
            f"count(temperature) AS n INTO q{i:04d}_out FROM sensors GROUP BY (10s), device END;\n"
            for i in range(cqs)
        )
        + "".join(
            f"CREATE STREAM s{i:03d} INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname INTO s{i:03d}_out "
            "AS SELECT _twstart, avg(current) AS c, count(*) AS n FROM %%trows;\n"
            for i in range(streams)
        )
    )


@dataclass
class LoadCost:
    """One load: seconds per phase, and what the code server serves (jobs, sensors, bytes)."""

    build: float  # build_definitions: the catalog parsed, the Dagster objects made
    resolve: float  # every job resolved (the code server does it before it serves)
    snapshots: float  # the repository snapshot and every job snapshot, serialized
    cpu: float  # CPU seconds of the three phases (less sensitive than wall time to a busy machine)
    jobs: int
    sensors: int
    schedules: int
    assets: int
    snapshot_bytes: int

    @property
    def seconds(self) -> float:
        return self.build + self.resolve + self.snapshots


def load_location(settings) -> LoadCost:
    """Load the code location of ``settings`` as Dagster's code server does (see the module docstring)."""
    from dagster._core.remote_representation.external_data import JobDataSnap, RepositorySnap
    from dagster._serdes import serialize_value

    from dagster_defs import build_definitions

    clock, cpu = time.perf_counter(), time.process_time()
    defs = build_definitions(settings=settings)
    built = time.perf_counter()
    repo = defs.get_repository_def()
    repo.load_all_definitions()
    resolved = time.perf_counter()
    size = len(serialize_value(RepositorySnap.from_def(repo, defer_snapshots=True)))
    jobs = repo.get_all_jobs()
    size += sum(len(serialize_value(JobDataSnap.from_job_def(j, include_parent_snapshot=True))) for j in jobs)
    done = time.perf_counter()
    return LoadCost(
        build=built - clock,
        resolve=resolved - built,
        snapshots=done - resolved,
        cpu=time.process_time() - cpu,
        jobs=len(jobs),
        sensors=len(repo.sensor_defs),
        schedules=len(repo.schedule_defs),
        assets=len(repo.asset_graph.get_all_asset_keys()),
        snapshot_bytes=size,
    )


def _child(root: str) -> None:
    """``python -m benchmarks.location_load ROOT``: one load of ROOT's location, as JSON on stdout."""
    from cq_engine.config import Settings

    base = Path(root)
    settings = Settings(sql_dir=str(base / "sql"), warehouse=str(base / "wh"), home=str(base / ".cq"))
    print(json.dumps(asdict(load_location(settings))))


def measure(work: Path, cqs: int, streams: int, *, repeat: int) -> list[LoadCost]:
    """``repeat`` loads of a location of that size, each in a new process."""
    root = work / f"{cqs}_{streams}"
    (root / "sql").mkdir(parents=True, exist_ok=True)
    (root / "sql" / "defs.sql").write_text(location_sql(cqs, streams))
    env = {**clean_env(), "CQ_CONFIG": str(root / "no-cq.toml"), "CQ_RUN_MODEL": "batch"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    costs = []
    for _ in range(repeat):
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.location_load", str(root)],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if out.returncode != 0:
            raise RuntimeError(f"loading {cqs} + {streams} definitions failed:\n{out.stderr[-3000:]}")
        costs.append(LoadCost(**json.loads(out.stdout.strip().splitlines()[-1])))
    return costs


def run(ctx: Context) -> Outcome:
    sizes = QUICK_SIZES if ctx.quick else SIZES
    repeat = 1 if ctx.quick else 3
    work = ctx.workdir(NAME)
    load = os.getloadavg()
    medians: dict[tuple[int, int], LoadCost] = {}
    notes = []
    for cqs, streams in sizes:
        costs = measure(work, cqs, streams, repeat=repeat)
        best = sorted(costs, key=lambda c: c.seconds)[len(costs) // 2]  # the median load, all its phases
        medians[(cqs, streams)] = best
        ctx.log(f"{cqs} + {streams}: {[round(c.seconds, 2) for c in costs]}")
        notes.append(
            f"{cqs} CQs + {streams} streams: {best.seconds:.2f}s, {best.cpu:.2f} CPU s (build {best.build:.2f}, resolve "
            f"{best.resolve:.2f}, snapshots {best.snapshots:.2f}; median of {repeat}: "
            f"{statistics.median(c.seconds for c in costs):.2f}s) - {best.jobs} jobs, {best.sensors} sensors, "
            f"{best.schedules} schedules, "
            f"{best.assets} assets, {best.snapshot_bytes / 1e6:.1f} MB served"
        )
    (small, _), (large, _) = sizes[0], sizes[-2]
    ratio = (medians[sizes[-2]].cpu / large) / (medians[sizes[0]].cpu / small)
    biggest = medians[sizes[-1]]
    verdict_15s = "" if ctx.quick else " " + ("OK" if biggest.seconds <= TARGET_SECONDS else "MISSED")
    line = (
        f"{NAME}: {large} CQs load in {medians[sizes[-2]].seconds:.2f}s ({medians[sizes[-2]].cpu:.2f} CPU s) vs "
        f"{small} in {medians[sizes[0]].seconds:.2f}s ({medians[sizes[0]].cpu:.2f}); per definition {ratio:.2f}x; "
        f"{sizes[-1][0]} + {sizes[-1][1]} streams: {biggest.seconds:.2f}s (target <= {TARGET_SECONDS:.0f}s{verdict_15s}); "
        f"load average {load[0]:.1f}; {verdict(ratio, 1.5)}"
    )
    return Outcome(NAME, line, ratio=ratio, target=1.5, notes=notes)


if __name__ == "__main__":
    _child(sys.argv[1])
