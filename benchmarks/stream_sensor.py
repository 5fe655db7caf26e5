"""stream_sensor: a stream sensor's tick on a trigger table of 10 commits and one of 1,000 (with Delta
checkpoints) (target: 1,000 / 10 <= 1.5).

A tick is one call of ``stream_sensor.evaluate_stream`` — the whole sensor evaluation Dagster's
sensor and ``cq tick`` run: parse the cursor, find the latest version from the last seen one
(``storage.log.latest_version``), read the new commit files (``read_commits``), plan with the pure
``stream_timing.plan_tick``. Each timed tick starts from the cursor of the version just before the
table's last commit, so it finds exactly one new commit (an append of one minute of readings) and
plans exactly one run (the window that commit closes). No Spark: the Engine has no session and the
benchmark checks that the ticks did not start one. delta-rs writes a checkpoint every 100 commits,
so the large table has checkpoints. The cost should not depend on the table's history: ratio near 1.
"""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa

from . import STREAM_SQL, T0, Context, Outcome, make_engine, measure, timed, verdict

NAME = "stream_sensor"
TARGET = 1.5
SMALL = 10
METERS = 20
SQL = STREAM_SQL


def _minute(schema: pa.Schema, m: int) -> pa.Table:
    """Minute ``m`` after T0 of readings every 10 s of METERS meters (one commit)."""
    times = [T0 + timedelta(minutes=m, seconds=s) for s in range(0, 60, 10)]
    n = len(times) * METERS
    names = [f"d{i:03d}" for i in range(METERS) for _ in times]
    return (
        pa.table(
            {
                "ts": pa.array(times * METERS, pa.timestamp("us", tz="UTC")),
                "current": pa.array([float(m % 13)] * n),
                "voltage": pa.array([220] * n, pa.int32()),
                "status": pa.array([m % 2] * n, pa.int32()),
                "tbname": names,
                "location": ["loc-" + x for x in names],
            }
        )
        .select(schema.names)
        .cast(schema)
    )


def _build(ctx: Context, label: str, commits: int):
    """An engine (no Spark session) whose trigger table has ``commits`` commits (version 0 is the empty
    table), and the sensor cursor of version ``commits - 2``: the next tick finds the last commit."""
    from deltalake import write_deltalake

    from cq_engine.streams.sensor import evaluate_stream

    engine = make_engine(ctx.workdir(f"{NAME}/{label}"), SQL, None)
    stream = engine.stream("s")
    uri = engine.storage.uri("meters")
    schema = engine.storage.schema("meters")
    cursor = evaluate_stream(engine, stream, cursor=None, now=T0).cursor.to_json()  # created on the empty table
    for m in range(commits - 2):  # versions 1 .. commits - 2
        write_deltalake(uri, _minute(schema, m), mode="append")
    plan = evaluate_stream(engine, stream, cursor=cursor, now=T0)  # catch up once (untimed)
    write_deltalake(uri, _minute(schema, commits - 2), mode="append")  # the commit each timed tick finds
    return engine, stream, plan.cursor.to_json()


def _tick(engine, stream, cursor: str, version: int):
    from cq_engine.streams.sensor import evaluate_stream

    plan = evaluate_stream(engine, stream, cursor=cursor, now=T0)
    if plan.cursor.version != version or len(plan.works) != 1 or len(plan.works[0].windows) != 1:
        raise RuntimeError(
            f"the tick planned {plan.works} up to version {plan.cursor.version}, expected one run"
            f" up to version {version}"
        )
    return plan


def _per_call(cases, *, calls: int, warmup: int):
    """Per-call wall times of the cases (``measure`` alternates them call by call, so a slow spell
    of the shared machine hits both alike; one call is far shorter than such a spell). Returns the
    median, 10th and 90th percentile per case and each case's last result."""
    medians, samples, last = measure(cases, repeat=calls, warmup=warmup)
    pick = lambda q: {k: sorted(v)[int(q * (len(v) - 1))] for k, v in samples.items()}
    return medians, pick(0.1), pick(0.9), last


def run(ctx: Context) -> Outcome:
    from deltalake import DeltaTable

    from cq_engine.streams.sensor import evaluate_stream

    large_commits = 200 if ctx.quick else 1000
    calls, warmup = (2000, 200) if ctx.quick else (5000, 500)
    repeat = 7  # for the snapshot-load contrast
    ctx.log(f"writing {SMALL} + {large_commits} commits of one minute of {METERS} meters")
    small, s_stream, s_cursor = _build(ctx, "small", SMALL)
    large, l_stream, l_cursor = _build(ctx, "large", large_commits)
    log_dir = ctx.root / NAME / "large" / "wh" / "meters" / "_delta_log"
    checkpoints = sorted(int(p.name.split(".")[0]) for p in log_dir.iterdir() if ".checkpoint." in p.name)
    if not checkpoints:
        raise RuntimeError(f"no Delta checkpoint in {log_dir}: the large table should have some")
    last_small, last_large = SMALL - 1, large_commits - 1

    ctx.log("timing ticks")
    ticks = {
        "small": lambda: _tick(small, s_stream, s_cursor, last_small),
        "large": lambda: _tick(large, l_stream, l_cursor, last_large),
    }
    per, p10, p90, last = _per_call(ticks, calls=calls, warmup=warmup)
    if small.spark_session is not None or large.spark_session is not None:
        raise RuntimeError("a sensor evaluation started a Spark session")
    ratio = per["large"] / per["small"]
    line = (
        f"{NAME}: tick (1 new commit, 1 run planned) {SMALL} commits {per['small'] * 1000:.3f}ms  {large_commits}"
        f" commits {per['large'] * 1000:.3f}ms  {verdict(ratio, TARGET)}"
    )
    work = last["large"].works[0]
    notes = [
        f"medians of {calls} evaluate_stream calls each (interleaved, after {warmup} warm-ups); p10-p90:"
        f" {SMALL} commits {p10['small'] * 1000:.3f}-{p90['small'] * 1000:.3f}ms, {large_commits} commits"
        f" {p10['large'] * 1000:.3f}-{p90['large'] * 1000:.3f}ms; checkpoints of the large table at versions"
        f" {_ranges(checkpoints)}; each tick planned windows {work.windows[0][0]:%H:%M}-{work.windows[0][1]:%H:%M}"
        f" at version {work.version}; no Spark session started"
    ]

    # For contrast, what a sensor pays if it loads the snapshot instead. The large table's latest version
    # is a checkpoint; the version before it replays the previous checkpoint plus 99 JSON commits.
    s_uri, l_uri = small.storage.uri("meters"), large.storage.uri("meters")
    snap, _, _ = measure(
        {
            "small": lambda: DeltaTable(s_uri).version(),
            "large": lambda: DeltaTable(l_uri).version(),
            "before": lambda: DeltaTable(l_uri, version=last_large - 1).version(),
        },
        repeat=repeat,
        warmup=1,
    )
    notes.append(
        f"for contrast, loading the snapshot (DeltaTable(uri)): {SMALL} commits {snap['small'] * 1000:.2f}ms,"
        f" {large_commits} commits {snap['large'] * 1000:.2f}ms (ratio {snap['large'] / snap['small']:.2f};"
        f" the latest version is a checkpoint), at version {last_large - 1}"
        f" {snap['before'] * 1000:.2f}ms (ratio {snap['before'] / snap['small']:.2f})"
    )

    # A tick finding a DELETE also loads the snapshot at the last seen version for the removed file's
    # statistics (the log does not repeat them): that part grows with the table.
    from cq_engine.storage.log import read_commits

    s_after, l_after = last["small"].cursor.to_json(), last["large"].cursor.to_json()
    first_minute = f"ts < '{T0 + timedelta(minutes=1):%Y-%m-%dT%H:%M:%SZ}'"  # the whole first file
    rem = {}
    for label, engine, cursor, version in (
        ("small", small, s_after, last_small),
        ("large", large, l_after, last_large),
    ):
        uri, stream = engine.storage.uri("meters"), engine.stream("s")
        DeltaTable(uri).delete(first_minute)
        (commit,) = read_commits(uri, after=version, until=version + 1, time_column="ts")
        if (len(commit.added), len(commit.removed)) != (0, 1) or commit.removed[0].min_time is None:
            raise RuntimeError(f"the DELETE commit is not one removed file with statistics: {commit}")
        evaluate_stream(engine, stream, cursor=cursor, now=T0)
        rem[label] = min(
            timed(lambda e=engine, s=stream, c=cursor: evaluate_stream(e, s, cursor=c, now=T0))[0]
            for _ in range(repeat)
        )
    notes.append(
        f"a tick finding a DELETE (loads the snapshot for the removed file's statistics): {SMALL} commits "
        f"{rem['small'] * 1000:.2f}ms, {large_commits} commits {rem['large'] * 1000:.2f}ms "
        f"(ratio {rem['large'] / rem['small']:.2f}; best of {repeat})"
    )
    return Outcome(NAME, line, ratio, TARGET, notes=notes)


def _ranges(versions: list[int]) -> str:
    if len(versions) > 4:
        return f"{versions[0]}, {versions[1]}, ..., {versions[-1]} ({len(versions)})"
    return ", ".join(map(str, versions))
