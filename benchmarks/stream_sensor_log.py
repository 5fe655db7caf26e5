"""stream_sensor_log: a sensor tick's Delta-log cost on a table with 10 commits and one with 1,000
(target: large / small <= 1.5).

A tick is what a sensor does each time it runs (DESIGN §7, "read only the new part of the Delta log"):
``latest_version(uri, known=<last seen>)`` then ``read_commits(after=<last seen>, until=<latest>)``, here
finding exactly one new commit (an append). No Spark. delta-rs checkpoints every 100 commits, so the
large table also has checkpoints. The cost should not depend on the table's history: ratio near 1.
"""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa

from . import T0, Context, Outcome, measure, spread, verdict

NAME = "stream_sensor_log"
TARGET = 1.5
SMALL = 10
TICKS = 200  # ticks per timed sample (one tick is well under a millisecond on a local disk)


def _build(uri: str, commits: int) -> None:
    from deltalake import write_deltalake

    for m in range(commits):
        data = pa.table({"ts": pa.array([T0 + timedelta(minutes=m, seconds=s) for s in range(0, 60, 10)],
                                        pa.timestamp("us", tz="UTC")),
                         "device": ["d1"] * 6, "v": [float(m)] * 6})
        write_deltalake(uri, data, mode="append")


def _tick(uri: str, known: int, *, added: int = 1, removed: int = 0) -> int:
    from cq_engine.storage.log import latest_version, read_commits

    latest = latest_version(uri, known=known)
    commits = read_commits(uri, after=known, until=latest, time_column="ts")
    if len(commits) != 1 or (len(commits[0].added), len(commits[0].removed)) != (added, removed):
        raise RuntimeError(f"the tick found {commits}, expected one commit adding {added}, removing {removed}")
    if removed and commits[0].removed[0].min_time is None:
        raise RuntimeError("the removed file's statistics were not resolved")
    return latest


def _ticks(uri: str, known: int, count: int = TICKS, **expect):
    return lambda: [_tick(uri, known, **expect) for _ in range(count)]


def run(ctx: Context) -> Outcome:
    from deltalake import DeltaTable

    large_commits = 200 if ctx.quick else 1000
    warmup, repeat = (2, 5) if ctx.quick else (3, 11)
    root = ctx.workdir(NAME)
    small, large = str(root / "small"), str(root / "large")
    ctx.log(f"writing {SMALL} + {large_commits} one-row-per-10s commits")
    _build(small, SMALL)
    _build(large, large_commits)
    checkpoints = sorted(int(p.name.split(".")[0]) for p in (root / "large" / "_delta_log").iterdir()
                         if ".checkpoint." in p.name)
    last_small, last_large = SMALL - 1, large_commits - 1

    ctx.log("timing ticks")
    medians, samples, _ = measure({"small": _ticks(small, last_small - 1), "large": _ticks(large, last_large - 1)},
                                  repeat=repeat, warmup=warmup)
    ratio = medians["large"] / medians["small"]
    per = {k: v / TICKS * 1000 for k, v in medians.items()}
    line = (f"{NAME}: tick (1 new commit) {SMALL} commits {per['small']:.3f}ms  {large_commits} commits "
            f"{per['large']:.3f}ms  {verdict(ratio, TARGET)}")
    notes = [f"{repeat} samples of {TICKS} ticks after {warmup} warm-ups: {SMALL} commits {spread(samples['small'])},"
             f" {large_commits} commits {spread(samples['large'])}; checkpoints at versions {', '.join(map(str, checkpoints))}"]
    # For contrast, what a sensor pays if it loads the snapshot instead (grows with the history).
    snap, snap_samples, _ = measure({"small": lambda: DeltaTable(small).version(),
                                     "large": lambda: DeltaTable(large).version()}, repeat=repeat, warmup=1)
    notes.append(f"for contrast, DeltaTable(uri).version() (snapshot load): {SMALL} commits "
                 f"{snap['small'] * 1000:.2f}ms, {large_commits} commits {snap['large'] * 1000:.2f}ms "
                 f"(ratio {snap['large'] / snap['small']:.2f})")
    # A tick whose new commit removes a file also loads the snapshot at the last seen version, for the
    # removed file's statistics (the log does not repeat them): that part grows with the table.
    DeltaTable(small).delete("v = 0")
    DeltaTable(large).delete("v = 0")
    rem, _, _ = measure({"small": _ticks(small, last_small, 10, added=0, removed=1),
                         "large": _ticks(large, last_large, 10, added=0, removed=1)}, repeat=repeat, warmup=1)
    notes.append(f"a tick finding a DELETE (loads the snapshot for the removed file's statistics): {SMALL} commits "
                 f"{rem['small'] * 100:.2f}ms, {large_commits} commits {rem['large'] * 100:.2f}ms "
                 f"(ratio {rem['large'] / rem['small']:.2f})")
    return Outcome(NAME, line, ratio, TARGET, notes=notes)
