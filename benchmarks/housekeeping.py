"""housekeeping: a sensor tick's reads and a firing on tables of ~100 commits vs many commits, before and
after ``Engine.maintain`` (``cq maintain``): the ratio many/small should be near 1 after housekeeping.

Two warehouses, identical but for their history: the source ``sensors`` (one append per minute of
readings), the continuous query's sink ``out`` (one commit per firing, as the engine writes it) and the
ledger ``_cq/firings`` (one entry per commit) each have SMALL (100) or N commits (``CQ_BENCH_HK_COMMITS``,
default 20,000; ``--quick`` 2,000). The many-commit tables are written directly as Delta log JSON commits
each adding a real Parquet file (a writer's commit, without a writer's per-commit snapshot load), spread
over 60 days of commit times; as their writers would have, they hold a checkpoint at every 100th
version's position that matters: the newest one (a reader's starting point) and the newest one older
than the table's log retention (``CQ_BENCH_HK_LOG_RETENTION``, default the engine's 7 days, for the source and the
sink; a state table keeps at most a day; what log cleanup may delete up to). The first commits, which
the engine writes when it creates the tables, get the oldest times (delta-rs's log cleanup goes by file
times).

Measured on each, interleaved, medians: the sensor tick's reads (``evaluate_stream`` of a 1-minute
interval stream over ``sensors`` finding one new commit, plus the ledger's last hour, which each
Dagster run's completeness check and a retried run read) and one firing (``Engine.run_firing``: the
source read, the sink's range replace, the ledger append), each repetition a different minute. Then
``Engine.maintain(sources=True)`` on both (its time reported), the rows checked unchanged, one tick
that reads the maintenance commits (as a sensor's next tick would), and the same again. The many-commit
ledger is one file per commit, as before state tables compacted themselves. Reported with it: each large
table's log files and checkpoint actions after housekeeping (a checkpoint keeps the compaction's
tombstones for the file retention, and every open reads them).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cq_engine.durations import parse_duration

from . import Context, Outcome, make_engine, measure, verdict

NAME = "housekeeping"
TARGET = 1.5  # many / small after housekeeping
SMALL = 100
SPAN = timedelta(days=60)  # the commits' times: a long-running deployment's history
T0 = datetime(2024, 1, 1, tzinfo=UTC)
SQL = """
CREATE TABLE sensors (ts TIMESTAMP, device STRING, v DOUBLE);
CREATE CQ q RESAMPLE EVERY 1m BEGIN
  SELECT max_value(v) AS m, count(v) AS n INTO out FROM sensors GROUP BY (1m), device
END;
CREATE STREAM s INTERVAL(1m) SLIDING(1m) FROM sensors OPTIONS(WATERMARK(0s))
  INTO s_out AS SELECT _twstart, count(*) AS n FROM %%trows;
"""
DEVICES = ("d1", "d2")


def _minute(i: int) -> pa.Table:
    ts = T0 + timedelta(minutes=i)
    return pa.table(
        {
            "ts": pa.array([ts + timedelta(seconds=s) for s in (0, 30) for _ in DEVICES], pa.timestamp("us", "UTC")),
            "device": [d for _ in (0, 30) for d in DEVICES],
            "v": [float(i % 17 + k) for k in range(2 * len(DEVICES))],
        }
    )


def _sink_rows(schema: pa.Schema, i: int) -> pa.Table:
    """The sink rows of the firing over minute ``i`` (what the engine writes: a row per device)."""
    data = _minute(i)
    out = {}
    for f in schema:
        if f.name == "ts" or pa.types.is_timestamp(f.type):
            out[f.name] = pa.array([T0 + timedelta(minutes=i)] * len(DEVICES), f.type)
        elif f.name == "device":
            out[f.name] = pa.array(list(DEVICES), f.type)
        elif f.name == "m":
            out[f.name] = pa.array([max(data["v"].to_pylist()[k::2]) for k in range(len(DEVICES))], f.type)
        else:
            out[f.name] = pa.array([2] * len(DEVICES), f.type)
    return pa.table(out, schema=schema)


def _ledger_rows(schema: pa.Schema, i: int, when: datetime) -> pa.Table:
    fire = T0 + timedelta(minutes=i + 1)
    row = {
        "definition": "q",
        "kind": "firing",
        "fire_time": fire,
        "range_start": fire - timedelta(minutes=1),
        "range_end": fire,
        "source_versions": json.dumps({"sensors": i}),
        "rows_written": len(DEVICES),
        "sink_version": i,
        "status": "succeeded",
        "started_at": when,
        "finished_at": when,
        "error": None,
    }
    return pa.Table.from_pylist([row], schema=schema)


def _value(v):
    if isinstance(v, datetime):
        return v.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{v.microsecond // 1000:03d}Z"
    return v


def _stats(data: pa.Table) -> str:
    mins, maxs, nulls = {}, {}, {}
    for f in data.schema:
        nulls[f.name] = data.column(f.name).null_count
        kinds = (pa.types.is_timestamp, pa.types.is_floating, pa.types.is_integer, pa.types.is_string)
        if not any(k(f.type) for k in kinds):
            continue
        bounds = pc.min_max(data.column(f.name)).as_py()
        if bounds["min"] is not None:
            mins[f.name], maxs[f.name] = _value(bounds["min"]), _value(bounds["max"])
    return json.dumps({"numRecords": data.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls})


def append_commits(uri: str, first: int, count: int, rows, *, when, checkpoint_at=()) -> None:
    """Commits ``first .. first + count - 1`` of the table at ``uri`` (which has version ``first - 1``),
    each adding the Parquet file of ``rows(i)``, written straight to ``_delta_log`` with commit time
    (and file time) ``when(i)``; a delta-rs checkpoint after each version in ``checkpoint_at``."""
    from deltalake import DeltaTable

    log = Path(uri) / "_delta_log"
    for v in range(first, first + count):
        data = rows(v)
        name = f"part-{v:06d}-{uuid.uuid4()}-c000.snappy.parquet"
        pq.write_table(data, Path(uri) / name)
        stamp = when(v).timestamp()
        millis = int(stamp * 1000)
        size = (Path(uri) / name).stat().st_size
        info = {"timestamp": millis, "operation": "WRITE", "operationParameters": {"mode": "Append"}}
        add = {
            "path": name,
            "partitionValues": {},
            "size": size,
            "modificationTime": millis,
            "dataChange": True,
            "stats": _stats(data),
        }
        path = log / f"{v:020d}.json"
        path.write_text(json.dumps({"commitInfo": info}) + "\n" + json.dumps({"add": add}) + "\n")
        os.utime(path, (stamp, stamp))
        os.utime(Path(uri) / name, (stamp, stamp))
        if v in checkpoint_at:
            DeltaTable(uri).create_checkpoint()
            for p in log.glob(f"{v:020d}.checkpoint*"):
                os.utime(p, (stamp, stamp))


def _age(uri: str, upto: int, when) -> None:
    """Give the log files of versions ``0 .. upto - 1`` (written by the engine now) the times of the first
    commits, as a long-lived table's oldest files have: delta-rs's log cleanup (``cleanup_metadata``)
    goes by the files' modification times and deleted none of a log whose first commit was the newest."""
    for v in range(upto):
        stamp = when(v).timestamp()
        for path in (Path(uri) / "_delta_log").glob(f"{v:020d}.*"):
            os.utime(path, (stamp, stamp))


def _build(ctx: Context, label: str, commits: int, spark):
    """An engine whose source, sink and ledger have ``commits`` versions (the last source commit not
    yet seen by the stream's cursor), and that cursor."""
    from deltalake import DeltaTable

    from cq_engine.config import Settings
    from cq_engine.housekeeping import STATE_LOG_RETENTION
    from cq_engine.storage.ledger import SCHEMA
    from cq_engine.streams.sensor import evaluate_stream

    # CQ_BENCH_HK_LOG_RETENTION: the tables' CQ_LOG_RETENTION (default: the engine's), to see what another buys.
    retention = os.environ.get("CQ_BENCH_HK_LOG_RETENTION", Settings().log_retention)
    engine = make_engine(ctx.workdir(f"{NAME}/{label}"), SQL, spark, log_retention=retention)
    now = datetime.now(UTC)
    when = lambda v: now - SPAN * (commits - v) / commits
    newest = max((v for v in range(99, commits - 1, 100)), default=None)

    def points(keep: timedelta) -> set[int]:
        # The newest checkpoint a log cleanup keeping `keep` may delete up to (a writer checkpointing
        # every 100 versions leaves one just past the boundary), and the newest.
        cutoff = now - keep - timedelta(days=1)
        old = max((v for v in range(99, commits, 100) if when(v) < cutoff), default=None)
        return {v for v in (old, newest) if v is not None}

    keep = parse_duration(retention)
    engine.storage.append("sensors", _minute(1))  # version 1: minute 1 (version v holds minute v)
    engine.run_firing("q", T0 + timedelta(minutes=2))  # creates the sink (its schema) and the ledger
    sink_uri, ledger_uri = engine.storage.uri("out"), engine.storage.state_uri("firings")
    sink_schema = pa.schema(DeltaTable(sink_uri).schema().to_arrow())
    first = {u: DeltaTable(u).version() + 1 for u in (engine.storage.uri("sensors"), sink_uri, ledger_uri)}
    for uri, upto in first.items():
        _age(uri, upto, when)
    src = engine.storage.uri("sensors")
    append_commits(src, first[src], commits - 1 - first[src], _minute, when=when, checkpoint_at=points(keep))
    cursor = evaluate_stream(engine, engine.stream("s"), cursor=None, now=now).cursor.to_json()
    append_commits(src, commits - 1, 1, _minute, when=when)  # the commit each timed tick finds
    append_commits(
        sink_uri,
        first[sink_uri],
        commits - first[sink_uri],
        lambda v: _sink_rows(sink_schema, v + 1),
        when=when,
        checkpoint_at=points(keep),
    )
    append_commits(
        ledger_uri,
        first[ledger_uri],
        commits - first[ledger_uri],
        lambda v: _ledger_rows(SCHEMA, v, when(v)),
        when=when,
        checkpoint_at=points(min(keep, STATE_LOG_RETENTION)),  # a state table's log retention
    )
    return engine, cursor


def _tick(engine, cursor: str) -> int:
    from cq_engine.streams.sensor import evaluate_stream

    plan = evaluate_stream(engine, engine.stream("s"), cursor=cursor, now=datetime.now(UTC))
    engine.ledger.entries_since(datetime.now(UTC) - timedelta(hours=1))
    return plan.cursor.version


def _advance(engine, cursor: str, minute: int) -> str:
    """The stream's cursor after one tick from ``cursor``, then one more source commit for ticks to find."""
    from cq_engine.streams.sensor import evaluate_stream

    ahead = evaluate_stream(engine, engine.stream("s"), cursor=cursor, now=datetime.now(UTC)).cursor.to_json()
    engine.storage.append("sensors", _minute(minute))
    return ahead


def _log_shape(uri: str) -> tuple[int, int]:
    """The table's log files, and the actions of its last checkpoint (live files plus tombstones)."""
    log = Path(uri) / "_delta_log"
    pointer = log / "_last_checkpoint"
    actions = json.loads(pointer.read_text()).get("size", 0) if pointer.exists() else 0
    return sum(1 for _ in log.iterdir()), actions


def _counts(engine) -> tuple[int, int, int]:
    from deltalake import DeltaTable

    uris = (engine.storage.uri("sensors"), engine.storage.uri("out"), engine.storage.state_uri("firings"))
    return tuple(DeltaTable(u).count() for u in uris)  # type: ignore[return-value]


def run(ctx: Context) -> Outcome:
    from deltalake import DeltaTable

    commits = 2000 if ctx.quick else int(os.environ.get("CQ_BENCH_HK_COMMITS", "20000"))
    repeat = 5
    clock = time.perf_counter()
    ctx.log(f"writing {SMALL} and {commits} commits to the source, the sink and the ledger")
    small, s_cursor = _build(ctx, "small", SMALL, ctx.spark)
    large, l_cursor = _build(ctx, "large", commits, ctx.spark)
    built = time.perf_counter() - clock
    minute = {"small": SMALL - 3, "large": commits - 3}

    def firing(engine, label: str):
        minute[label] -= 1
        return engine.run_firing("q", T0 + timedelta(minutes=minute[label] + 1))

    def phase() -> tuple[dict, dict]:
        ticks, _, _ = measure(
            {"small": lambda: _tick(small, s_cursor), "large": lambda: _tick(large, l_cursor)}, repeat=repeat
        )
        fires, _, _ = measure(
            {"small": lambda: firing(small, "small"), "large": lambda: firing(large, "large")}, repeat=repeat
        )
        return ticks, fires

    ctx.log("timing before housekeeping")
    tick_before, fire_before = phase()
    counts = {"small": _counts(small), "large": _counts(large)}
    log_dir = Path(large.storage.uri("sensors")) / "_delta_log"
    logs_before = sum(1 for _ in log_dir.iterdir())
    ctx.log("housekeeping")
    spent, dropped = {}, {}
    for label, engine in (("small", small), ("large", large)):
        start = time.perf_counter()
        reports = engine.maintain(sources=True)
        spent[label] = time.perf_counter() - start
        dropped[label] = sum(r.dropped_entries for r in reports)  # ledger entries past 30 days
        failed = [r.line() for r in reports if r.error]
        if failed:
            raise RuntimeError(f"maintenance failed: {failed}")
    after = {"small": _counts(small), "large": _counts(large)}
    # The source and the sink keep every row; the ledger loses exactly the entries past its retention.
    if any(after[k] != (*counts[k][:2], counts[k][2] - dropped[k]) for k in after):
        raise RuntimeError(f"housekeeping changed the tables' row counts: {counts} -> {after} ({dropped} dropped)")
    logs_after = sum(1 for _ in log_dir.iterdir())
    # A sensor's next tick after housekeeping reads its commits once (the compaction's adds and removes,
    # no data change); the timed ticks are the ones after it, each finding one new commit.
    s_cursor, l_cursor = _advance(small, s_cursor, SMALL + 1), _advance(large, l_cursor, commits + 1)
    files_after = len(DeltaTable(large.storage.uri("out")).file_uris())
    shape = {
        name: _log_shape(uri)
        for name, uri in (
            ("source", large.storage.uri("sensors")),
            ("sink", large.storage.uri("out")),
            ("ledger", large.storage.state_uri("firings")),
        )
    }
    ctx.log("timing after housekeeping")
    tick_after, fire_after = phase()
    ratios = {
        "tick before": tick_before["large"] / tick_before["small"],
        "firing before": fire_before["large"] / fire_before["small"],
        "tick after": tick_after["large"] / tick_after["small"],
        "firing after": fire_after["large"] / fire_after["small"],
    }
    ratio = max(ratios["tick after"], ratios["firing after"])
    ms = lambda s: f"{s * 1000:.0f}ms"
    line = (
        f"{NAME}: {SMALL} vs {commits:,} commits (source, sink, ledger): sensor tick {ms(tick_before['small'])} vs "
        f"{ms(tick_before['large'])} before ({ratios['tick before']:.2f}), {ms(tick_after['small'])} vs "
        f"{ms(tick_after['large'])} after ({ratios['tick after']:.2f}); firing {ms(fire_before['small'])} vs "
        f"{ms(fire_before['large'])} before ({ratios['firing before']:.2f}), {ms(fire_after['small'])} vs "
        f"{ms(fire_after['large'])} after ({ratios['firing after']:.2f}); {verdict(ratio, TARGET)}"
    )
    notes = [
        f"cq maintain took {spent['small']:.1f}s (small) and {spent['large']:.1f}s ({commits:,} commits); the large "
        f"sink went to {files_after} file(s), the source's _delta_log from {logs_before:,} to {logs_after:,} "
        f"files; log files / checkpoint actions after: "
        + ", ".join(f"{name} {files:,} / {actions:,}" for name, (files, actions) in shape.items())
        + f"; source and sink rows unchanged, {dropped['large']:,} ledger entries past the 30-day retention dropped; building the tables took {built:.0f}s; load average "
        + " ".join(f"{x:.1f}" for x in os.getloadavg())
    ]
    return Outcome(NAME, line, ratio=ratio, target=TARGET, notes=notes)
