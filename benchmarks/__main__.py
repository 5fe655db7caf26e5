"""``python -m benchmarks [--quick] [--only NAME]``: run the benchmarks and print a summary.

Exits 0 whenever the benchmarks ran, targets met or not (they are measurements, not tests); a
benchmark that crashes is reported as ERROR and makes the exit code 1.
"""

from __future__ import annotations

import argparse
import importlib
import resource
import sys
import tempfile
import time
import traceback
from pathlib import Path

from . import STORAGE, Context, Outcome, remove_tree

# In-process benchmarks first (they share one Spark session), then the subprocess one.
BENCHMARKS = (
    "firing_scale",
    "firing_overhead",
    "recalculate_vs_groupby",
    "stream_sensor",
    "stream_catchup",
    "sliding_vs_groupby",
    "stream_series",
    "stream_time_joins",
    "stream_range_join",
    "connect_vs_inprocess",
    "write_heavy",
    "batch_firings",
    "housekeeping",
    "location_load",
    "cli_overhead",
    "stream_batch",
    "orchestration",
    "freshness",
    "stream_scale",
    "mixed",
    "soak",
    "airflow",
)
# Run only when named with --only (long; not part of `make bench`).
ON_REQUEST = ("soak", "airflow")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller sizes and fewer repetitions (smoke test)")
    p.add_argument(
        "--only",
        metavar="NAME",
        action="append",
        choices=BENCHMARKS,
        help="run only this benchmark (repeatable): " + ", ".join(BENCHMARKS),
    )
    p.add_argument(
        "--storage",
        choices=("spark", "deltars"),
        default="spark",
        help="the engine's storage (CQ_STORAGE) for the in-process benchmarks (default: spark, the engine's)",
    )
    p.add_argument(
        "--spark-write-bytes",
        type=int,
        metavar="N",
        help="CQ_SPARK_WRITE_BYTES for the in-process benchmarks on the spark storage (0: the executors write every commit)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="print progress steps")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (its path is printed)")
    args = p.parse_args(argv)

    names = [n for n in BENCHMARKS if (n in args.only if args.only else n not in ON_REQUEST)]
    STORAGE["kind"], STORAGE["write_bytes"] = args.storage, args.spark_write_bytes
    storage = args.storage + (
        "" if args.spark_write_bytes is None else f", CQ_SPARK_WRITE_BYTES={args.spark_write_bytes}"
    )
    root = Path(tempfile.mkdtemp(prefix="cq-bench-"))
    ctx = Context(quick=args.quick, root=root, verbose=args.verbose)
    print(
        f"cq-engine benchmarks ({'quick' if args.quick else 'full'} size, {storage} storage; data in {root})",
        flush=True,
    )
    outcomes: list[Outcome] = []
    started = time.perf_counter()
    try:
        for name in names:
            module = importlib.import_module(f"benchmarks.{name}")
            if getattr(module, "SUBPROCESS", False):
                ctx.stop_spark()  # an idle in-process JVM would only add noise
            clock = time.perf_counter()
            try:
                outcome = module.run(ctx)
            except Exception as exc:  # report and go on with the next benchmark
                traceback.print_exc()
                outcome = Outcome(name, f"{name}: ERROR {type(exc).__name__}: {exc}")
            print(outcome.line, flush=True)
            for note in outcome.notes:
                print(f"  {note}", flush=True)
            if not getattr(module, "SUBPROCESS", False):
                # ru_maxrss only grows: per benchmark with one --only per process.
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
                print(f"  peak RSS of this Python process so far: {peak} MiB ({storage} storage)", flush=True)
            ctx.log(f"{name} took {time.perf_counter() - clock:.1f}s")
            outcomes.append(outcome)
    finally:
        ctx.stop_spark()
        if args.keep:
            print(f"kept {root}")
        else:
            remove_tree(root)

    print(f"\nsummary ({time.perf_counter() - started:.0f}s):")
    for o in outcomes:
        ratio = "-" if o.ratio is None else f"{o.ratio:.2f}"
        target = "" if o.target is None else f" (target <= {o.target:.2f})"
        print(f"  {o.name:<24} {o.status:<7} ratio {ratio}{target}")
    return 1 if any(o.status == "ERROR" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
