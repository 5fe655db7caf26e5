"""firing_scale: one firing's cost on a source table 1x and 20x as large (target: ratio <= 1.3).

Both source tables hold one-minute commits of 1-second readings of 3 devices (180 rows per commit);
the large one has 20 times the commits. The firing covers one minute that both tables contain, so with
file skipping both firings should read the same one or two files and cost about the same.
"""

from __future__ import annotations

from datetime import timedelta

from . import PER_MINUTE_SQL, T0, Context, Outcome, make_engine, measure, spread, verdict

NAME = "firing_scale"
TARGET = 1.3
FACTOR = 20


def _load(engine, commits: int) -> None:
    from cq_engine.cli.feed import sensor_rows

    for m in range(commits):
        engine.storage.append(
            "sensors",
            sensor_rows(start=T0 + timedelta(minutes=m), end=T0 + timedelta(minutes=m + 1), every=timedelta(seconds=1)),
        )


def run(ctx: Context) -> Outcome:
    small_commits = 3 if ctx.quick else 12
    large_commits = small_commits * FACTOR
    # The first firings of a fresh JVM are several times slower (JIT): warm up on both tables.
    warmup, repeat = (3, 3) if ctx.quick else (4, 7)
    fire = T0 + timedelta(minutes=small_commits // 2 + 1)  # range [fire - 1m, fire): in both tables

    small = make_engine(ctx.workdir(f"{NAME}/small"), PER_MINUTE_SQL, ctx.spark)
    large = make_engine(ctx.workdir(f"{NAME}/large"), PER_MINUTE_SQL, ctx.spark)
    ctx.log(f"loading {small_commits} + {large_commits} one-minute commits")
    _load(small, small_commits)
    _load(large, large_commits)

    ctx.log("timing firings")
    medians, samples, last = measure(
        {
            "1x": lambda: small.run_firing("per_minute", fire),
            f"{FACTOR}x": lambda: large.run_firing("per_minute", fire),
        },
        repeat=repeat,
        warmup=warmup,
    )
    r1, r20 = last["1x"], last[f"{FACTOR}x"]
    if r1.rows_written != r20.rows_written:
        raise RuntimeError(f"the two firings wrote different row counts: {r1.rows_written} vs {r20.rows_written}")
    ratio = medians[f"{FACTOR}x"] / medians["1x"]
    line = f"{NAME}: 1x {medians['1x']:.3f}s  {FACTOR}x {medians[f'{FACTOR}x']:.3f}s  {verdict(ratio, TARGET)}"
    details = (
        f"files read: 1x {r1.files_read}/{r1.files_total}, {FACTOR}x {r20.files_read}/{r20.files_total};"
        f" {repeat} runs each after {warmup} warm-ups: 1x {spread(samples['1x'])},"
        f" {FACTOR}x {spread(samples[f'{FACTOR}x'])}"
    )
    outcome = Outcome(NAME, line, ratio, TARGET, notes=[details])
    if outcome.status == "MISSED":
        outcome.notes += _profile(ctx, small, large, fire)
    return outcome


def _profile(ctx: Context, small, large, fire) -> list[str]:
    """Where does the extra time go? Time the firing's steps separately on both tables."""
    from . import timed

    notes = []
    for label, engine in (("1x", small), (f"{FACTOR}x", large)):
        st, tc = engine.storage, "ts"
        steps = {
            "version": lambda st=st: st.version("sensors"),
            "read_range(plan)": lambda st=st, tc=tc: st.read_range(
                ctx.spark, "sensors", time_column=tc, time_range=(fire - timedelta(minutes=1), fire)
            ),
            "sink version": lambda st=st: st.version("out"),
            "ledger entries": lambda engine=engine: engine.ledger.entries("per_minute"),
        }
        parts = []
        for step, fn in steps.items():
            timed(fn)
            parts.append(f"{step} {min(timed(fn)[0] for _ in range(3)):.3f}s")
        notes.append(f"profile {label}: " + ", ".join(parts))
    return notes
