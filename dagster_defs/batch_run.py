"""The op's side of the batched run model (``dagster_defs.batch``): a batch run executes its
definitions' firings in time-ordered rounds on one warm session, waits for the commits a pipelined
definition follows, leaves out a definition stopped meanwhile, and tags how far its rounds got; and
what the runs say of themselves (``keyed_runs``), which the sensor and the rounds both read."""

import os
import queue
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial

import dagster as dg

from cq_engine.context import RunResult
from cq_engine.errors import CQError
from cq_engine.model import ContinuousQuery, Definition
from cq_engine.resample.fused import FiringRequest, run_firings
from cq_engine.scheduling.batch import RUNNING
from cq_engine.storage.ledger import LedgerEntry
from cq_engine.times import UTC, iso, parse_time

from .builders import materialization

COMMITS_PER_LOG_LINE = 100
FOLLOW_POLL_SECONDS = 0.5  # a pipelined definition looks this often for the commit it waits for
ROUND_GATHER = timedelta(seconds=1)  # firings due this close after a round's first one join it
DONE_BEFORE_TAG = "cq/done_before"  # a batch run: every firing of it due before this time is done
ROUND_SECONDS_TAG = "cq/round_seconds"  # a batch run: how long its latest round took
PROGRESS_AT_TAG = "cq/progress_at"  # a batch run: when (epoch seconds) it last set its progress tags
SWITCH_CHECK_SECONDS = 5.0  # a run looks this often (at most) whether a definition was stopped


def wait_for(fire: datetime) -> None:
    """Sleep until ``fire``: a firing requested early runs at its time, when its range is complete."""
    delay = (fire - datetime.now(UTC)).total_seconds()
    if delay > 0:
        time.sleep(delay)


def batch_threads() -> int:
    """Definitions executed at once in a batch run (``CQ_BATCH_THREADS``, default 2): while one
    firing waits on Spark, another plans or commits. A definition's own firings stay sequential."""
    value = os.environ.get("CQ_BATCH_THREADS", "2")
    if not value.isdigit() or int(value) < 1:
        raise CQError(f"CQ_BATCH_THREADS={value!r}: expected a positive integer")
    return int(value)


Gate = Callable[[dict[str, list[str]]], dict[str, bool | None]]
Stopped = Callable[[set[str]], set[str]]


def _execute(
    engine,
    firings: dict[str, list[datetime]],
    done: dict,
    out: queue.Queue,
    *,
    after: dict[str, list[str]] | None = None,
    gate: Gate | None = None,
    stopped: Stopped | None = None,
    progress: Callable[[datetime, float], None] | None = None,
) -> None:
    """Every definition's firings in rounds, in time order (a round: each definition's next firing,
    those due within ``ROUND_GATHER`` of the earliest, run once the newest is due), each result (or
    a definition's first failure, after which it stops) put on ``out``; a round's continuous
    queries share one Spark job (``resample.fused``), its PERIOD streams run beside it. A definition
    in ``after`` (pipelined: [run key, range end]) joins the rounds once ``gate`` says that run
    committed it (True), or is left out if that run ended without (False; None: not yet). A
    definition ``stopped`` names (its switch was stopped) is left out from its next firing on. After
    each round, ``progress(t, seconds)``: every firing before ``t`` is done (committed or failed; after
    the last round, ``t`` is just after the run's last firing), and the round took ``seconds``."""
    pending = {n: list(fs) for n, fs in firings.items()}
    end = max((f for fs in firings.values() for f in fs), default=datetime.now(UTC)) + timedelta(microseconds=1)
    told: datetime | None = None
    waiting = {n: a for n, a in (after or {}).items() if n in pending}
    looked = 0.0
    with ThreadPoolExecutor(max_workers=batch_threads(), thread_name_prefix="cq-batch") as pool:
        while pending:
            if waiting and gate is not None:
                wait_for(min(fs[0] for fs in pending.values()))  # nothing runs before its time anyway
                for name, go in gate(waiting).items():
                    if go is not None:
                        del waiting[name]
                    if go is False:
                        del pending[name]
                        out.put(("left_out", engine.definition(name), None, after[name] if after else None))
                if pending and all(n in waiting for n in pending):
                    time.sleep(FOLLOW_POLL_SECONDS)
                    continue
                if not pending:
                    break
            ready = {n: fs for n, fs in pending.items() if n not in waiting}
            soonest = min(fs[0] for fs in ready.values())
            wait_for(soonest)
            if stopped is not None and time.monotonic() - looked >= SWITCH_CHECK_SECONDS:
                looked = time.monotonic()
                for name in stopped(set(pending)):
                    out.put(("stopped", engine.definition(name), pending.pop(name)[0], None))
                    waiting.pop(name, None)
                    ready.pop(name, None)
                if not ready:
                    continue
                soonest = min(fs[0] for fs in ready.values())
            cutoff = max(soonest, datetime.now(UTC)) + ROUND_GATHER
            due = {n: fs.pop(0) for n, fs in ready.items() if fs[0] <= cutoff}
            wait_for(max(due.values()))  # a round requested early runs when its newest firing is due
            began = time.monotonic()
            queries: list[FiringRequest] = []
            periods = []
            for name, fire in due.items():
                d = engine.definition(name)
                if (name, fire) in done:
                    out.put(("skipped", d, fire, done[name, fire]))
                elif isinstance(d, ContinuousQuery):
                    queries.append(FiringRequest(cq=d, fire_time=fire))
                else:
                    periods.append(pool.submit(_period, engine, d, fire, out))
            failed = {d.name for d, ok in (f.result() for f in periods) if not ok}

            if queries:
                outcomes = run_firings(engine.ctx, queries, on_outcome=partial(_heard, out))
                failed |= {f.cq.name for f, o in zip(queries, outcomes) if isinstance(o, Exception)}
            # A failed firing stops its definition (BLOCKED order); the sensor retries it from there.
            pending = {n: fs for n, fs in pending.items() if fs and n not in failed}
            if progress is not None:
                # All done: every firing up to the run's last one (the sensor goes on with its
                # definitions at once, once the last round's events precede cq/progress_at).
                before = min(fs[0] for fs in pending.values()) if pending else end
                if before != told:
                    told = before
                    progress(before, time.monotonic() - began)


def _heard(out: queue.Queue, f: FiringRequest, outcome) -> None:
    out.put(("failed" if isinstance(outcome, Exception) else "ok", f.cq, f.fire_time, outcome))


def _period(engine, d: Definition, fire: datetime, out: queue.Queue) -> tuple[Definition, bool]:
    try:
        out.put(("ok", d, fire, engine.run_period(d.name, fire)))
        return d, True
    except Exception as exc:  # one definition's failure must not stop the others
        out.put(("failed", d, fire, exc))
        return d, False


def run_batch(
    context,
    engine,
    firings: dict[str, list[str]],
    *,
    sink_keys: dict[str, dg.AssetKey],
    retry: bool,
    on_done: Callable[[list[str]], Iterable] | None = None,
    after: dict[str, list[str]] | None = None,
    stopped: Stopped | None = None,
) -> Iterator:
    """Execute each definition's firings in order; a failing firing stops its definition (BLOCKED
    order) but not the others. Yields one materialization per firing as it commits, and what
    ``on_done(names)`` yields for the definitions done since the last lull (their completeness
    checks: a long catch-up of one definition does not hold the others'); raises at the end naming
    the definitions that failed (run tag ``cq/failed``). A definition in ``after`` (a pipelined
    batch: the run it follows and the range end it waits for) starts once that run has committed
    it; if that run ends without, it is left out (run tag ``cq/left_out``) and the sensor retries it.
    A definition ``stopped`` names is left out from its next firing on (the same tag: the sensor
    requests those firings again once it is started)."""
    done: dict[tuple[str, datetime], LedgerEntry] = {}
    if retry:  # a retried batch: what already succeeded is not redone
        done = {
            (e.definition, e.fire_time): e
            for e in engine.ledger.entries()
            if e.status == "succeeded" and e.kind in ("firing", "period") and e.fire_time is not None
        }
    reported: dict[str, set[str]] = {}  # per definition with a skipped firing: its sink's reported range ends
    out: queue.Queue = queue.Queue()
    failures: list[str] = []
    failed_names: list[str] = []
    left_out: list[str] = []
    times = {n: [parse_time(t, tz=UTC) for t in fs] for n, fs in firings.items()}
    left = {n: len(fs) for n, fs in times.items()}  # firings not yet heard of, per definition
    finished: list[str] = []  # done since the last lull
    # One log line for many commits: each line is an event written to Dagster's event log, and a
    # thousand firings' lines cost a batch more than their materializations' own events.
    committed: list[str] = []

    def flush() -> None:
        if committed:
            context.log.info(f"{len(committed)} firing(s) committed: " + "; ".join(committed))
            committed.clear()

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cq-batch-rounds") as pool:
        gate = partial(_followed, context.instance, sink_keys)

        def progress(before: datetime, seconds: float) -> None:
            # How far the rounds got, tagged by the rounds' thread as soon as the round has committed:
            # the sensor may request a definition's next window then (its follower waits for the
            # events itself). When, by this thread once it has yielded the round's materializations.
            tags = {DONE_BEFORE_TAG: iso(before), ROUND_SECONDS_TAG: f"{seconds:.1f}"}
            out.put(("progress", None, before, _tag_run(context, tags)))

        future = pool.submit(
            _execute, engine, times, done, out, after=after, gate=gate, stopped=stopped, progress=progress
        )
        while not (future.done() and out.empty()):
            try:
                outcome, d, fire, value = out.get(timeout=0.5)
            except queue.Empty:
                flush()
                if finished and on_done is not None:
                    yield from on_done(finished)
                    finished = []
                continue
            if outcome == "progress":
                flush()
                for problem in (value, _tag_run(context, {PROGRESS_AT_TAG: f"{time.time():.6f}"})):
                    if problem:
                        context.log.warning(f"could not record the batch's progress: {problem}")
                continue
            left[d.name] = 0 if outcome in ("failed", "stopped") else left[d.name] - 1
            if left[d.name] == 0:
                finished.append(d.name)
            if outcome == "stopped":
                left_out.append(d.name)
                context.log.warning(
                    f"{d.name}: stopped: its firings from {iso(fire)} are left out of this run; the sensor "
                    "requests them again once it is started"
                )
                continue
            if outcome == "left_out":
                left_out.append(d.name)
                context.log.warning(
                    f"{d.name}: left out: run key {value[0]} ended without committing its firing ending "
                    f"{value[1]}, which this run's firings follow; the sensor retries them from there"
                )
                continue
            if outcome == "skipped":
                context.log.info(f"{d.name}: firing {iso(fire)} already succeeded (ledger); skipped")
                # Committed by a run killed before it reported the firing: reported now, once.
                if d.name not in reported:
                    reported[d.name] = _reported_ends(context.instance, sink_keys[d.name], since=value.started_at)
                if iso(value.range_end) not in reported[d.name]:
                    reported[d.name].add(iso(value.range_end))
                    context.log.warning(
                        f"{d.name}: firing {iso(fire)} was committed by a run that ended before reporting it; "
                        "its materialization is reported now"
                    )
                    metadata = materialization(d, _result_of(value), engine=engine).metadata
                    yield dg.AssetMaterialization(asset_key=sink_keys[d.name], metadata=metadata)
            elif outcome == "failed":
                failures.append(f"{d.name} @ {iso(fire)}: {' '.join(str(value).split())[:500]}")
                failed_names.append(d.name)
                context.log.error(f"{d.name}: firing {iso(fire)} failed: {value}")
            else:  # one materialization per firing, as it commits (the sinks' outputs are skippable)
                committed.append(
                    f"{d.name}: firing {iso(fire)} committed ({value.rows_written} rows, {d.sink} v{value.sink_version})"
                )
                if len(committed) >= COMMITS_PER_LOG_LINE:
                    flush()
                metadata = materialization(d, value, engine=engine).metadata
                yield dg.AssetMaterialization(asset_key=sink_keys[d.name], metadata=metadata)
        future.result()  # a bug in _execute itself surfaces here
    flush()
    if finished and on_done is not None:
        yield from on_done(finished)
    requested = sum(len(fs) for fs in firings.values())
    context.log.info(f"batch: {len(firings)} definition(s), {requested} firing(s) requested, {len(failures)} failed")
    if left_out:
        context.instance.add_run_tags(context.run_id, {"cq/left_out": ",".join(sorted(left_out))})
    if failures:
        # Which definitions failed, for the sensor: it retries those only.
        context.instance.add_run_tags(context.run_id, {"cq/failed": ",".join(sorted(failed_names))})
        raise dg.Failure(
            description=f"{len(failures)} firing(s) failed (their definitions are retried from "
            f"there; the others are committed): " + "; ".join(failures)
        )


def _tag_run(context, tags: dict[str, str]) -> str | None:
    """Tag the run with how far its rounds got (``DONE_BEFORE_TAG`` and ``ROUND_SECONDS_TAG``, once a
    round has committed) or when its events caught up (``PROGRESS_AT_TAG``, after the round's
    materializations, which the sensor's ``finished_in`` compares with it); the error's text if the
    write failed. The sensor follows every definition of a run into the next horizon window at once
    when a round commits, and goes on with every definition a round finished at once, instead of each
    as its own commit's event arrives: a thousand commits and their events land over 10-110 s, and
    followed as they landed they split the next window into a run per sensor tick, or (following the
    events' tag) requested the next window's run only as the run ended, every run a catch-up.
    Advisory: without the tags, the run's definitions go on when it ends."""
    try:
        context.instance.add_run_tags(context.run_id, tags)
        return None
    except Exception as exc:  # the run's work does not depend on it
        return str(exc) or type(exc).__name__


def _reported_ends(instance, key: dg.AssetKey, *, since: datetime) -> set[str]:
    """The range ends (``cq/range_end``) of sink ``key``'s materializations since ``since``."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, after_timestamp=since.timestamp() - 1), limit=10_000
    ).records
    mats = [r.asset_materialization for r in records]
    return {str(m.metadata["cq/range_end"].value) for m in mats if m and "cq/range_end" in m.metadata}


def _result_of(entry: LedgerEntry) -> RunResult:
    """A committed firing's result as the ledger recorded it (what its materialization reports)."""
    return RunResult(
        definition=entry.definition,
        kind=entry.kind,
        fire_time=entry.fire_time,
        time_range=(entry.range_start, entry.range_end),
        rows_written=entry.rows_written,
        sink_version=entry.sink_version if entry.sink_version is not None else -1,
        source_versions=entry.source_versions,
        files_read=0,
        files_total=0,
        seconds=(entry.finished_at - entry.started_at).total_seconds(),
    )


def _followed(instance, sink_keys: dict[str, dg.AssetKey], waiting: dict[str, list[str]]) -> dict[str, bool | None]:
    """Per pipelined definition (``waiting``: name -> [run key, range end]): True once that run's
    firing is in its sink's materializations, False if the run has ended without it, else None.
    The statuses are read first: a run that has ended has written all its materializations."""
    status = keyed_runs(instance, {key for key, _ in waiting.values()}).status
    latest = instance.get_latest_materialization_events([sink_keys[n] for n in waiting])
    return {
        name: True
        if committed_through(latest.get(sink_keys[name]), end)
        else (None if status.get(key) in RUNNING else False)
        for name, (key, end) in waiting.items()
    }


@dataclass(frozen=True)
class KeyedRuns:
    """Per run key: its run's status, its run id, the definitions its ``cq/failed`` and
    ``cq/left_out`` tags name (only runs that have either tag: what failed, and what a pipelined run
    left out because the run it followed did not commit it), how far its rounds got
    (``DONE_BEFORE_TAG``), how long the latest took (``ROUND_SECONDS_TAG``) and when it said so
    (``PROGRESS_AT_TAG``; only runs that have them)."""

    status: dict[str, str] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)
    failed: dict[str, set[str]] = field(default_factory=dict)
    done_before: dict[str, datetime] = field(default_factory=dict)
    round_seconds: dict[str, float] = field(default_factory=dict)
    progress_at: dict[str, float] = field(default_factory=dict)


def keyed_runs(instance, keys) -> KeyedRuns:
    """What the runs whose run key is among ``keys`` say of themselves (see ``KeyedRuns``)."""
    runs = KeyedRuns()
    if keys:
        for record in instance.get_run_records(dg.RunsFilter(tags={"dagster/run_key": sorted(keys)})):
            run = record.dagster_run
            key = run.tags["dagster/run_key"]
            runs.status[key], runs.ids[key] = run.status.value, run.run_id
            for tag in ("cq/failed", "cq/left_out"):
                if tag in run.tags:
                    runs.failed.setdefault(key, set()).update(run.tags[tag].split(","))
            if DONE_BEFORE_TAG in run.tags:
                runs.done_before[key] = parse_time(run.tags[DONE_BEFORE_TAG], tz=UTC)
            if ROUND_SECONDS_TAG in run.tags:
                runs.round_seconds[key] = float(run.tags[ROUND_SECONDS_TAG])
            if PROGRESS_AT_TAG in run.tags:
                runs.progress_at[key] = float(run.tags[PROGRESS_AT_TAG])
    return runs


def committed_through(event, end: str) -> bool:
    """Whether materialization ``event`` (the sink's latest, or None) is of a firing whose range ends
    at or after ``end`` (ISO)."""
    mat = event.asset_materialization if event else None
    value = mat.metadata.get("cq/range_end") if mat else None
    return bool(value and value.value and parse_time(value.value, tz=UTC) >= parse_time(end, tz=UTC))
