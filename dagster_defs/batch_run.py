"""The op's side of the batched run model (``dagster_defs.batch``): a batch run executes its
definitions' firings in time-ordered rounds on one warm session, waits for the commits a pipelined
definition follows, leaves out a definition stopped meanwhile, and tags how far its rounds got; and
what the runs say of themselves (``keyed_runs``), which the sensor and the rounds both read."""

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from functools import partial
from typing import Any

import dagster as dg

from cq_engine.context import RunResult
from cq_engine.errors import AlreadyCommitted
from cq_engine.resample.rounds import Stopped, execute_rounds
from cq_engine.scheduling.batch import RUNNING
from cq_engine.scheduling.runs import KeyedRuns, SinkCommit, committed_through
from cq_engine.storage.ledger import LedgerEntry
from cq_engine.times import UTC, iso, parse_time

from .builders import materialization

COMMITS_PER_LOG_LINE = 100
DONE_BEFORE_TAG = "cq/done_before"  # a batch run: every firing of it due before this time is done
ROUND_SECONDS_TAG = "cq/round_seconds"  # a batch run: how long its latest round took
PROGRESS_AT_TAG = "cq/progress_at"  # a batch run: when (epoch seconds) it last set its progress tags


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
    requests those firings again once it is started), and so is one whose Spark Connect server went
    away and did not answer again in time (``execute_rounds``: a server that does answer again
    carries the run on, without a failure)."""
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
    left_out: set[str] = set()
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

        tagging, asking, leaving = Advisory(), Advisory(), Advisory()

        def progress(before: datetime, seconds: float) -> None:
            # How far the rounds got, tagged by the rounds' thread as soon as the round has committed:
            # the sensor may request a definition's next window then (its follower waits for the
            # events itself). When, by this thread once it has yielded the round's materializations.
            tags = {DONE_BEFORE_TAG: iso(before), ROUND_SECONDS_TAG: f"{seconds:.1f}"}
            problem = tagging(partial(_tag_run, context, tags), "the run storage did not answer within a second")
            out.put(("progress", None, before, problem))

        if stopped is not None:
            asked = stopped
            stopped = lambda names: asking(partial(asked, names), set())

        future = pool.submit(
            execute_rounds, engine, times, done, out, after=after, gate=gate, stopped=stopped, progress=progress
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
            left[d.name] = 0 if outcome in ("failed", "stopped", "handed_back") else left[d.name] - 1
            if left[d.name] == 0:
                finished.append(d.name)
            if outcome in ("stopped", "handed_back", "left_out"):
                # Tagged at once, not when the run ends (a batch under a horizon runs for minutes):
                # the sensor requests the definition again as soon as this run no longer holds it.
                # Advisory too: a tag that is not written now is written as the run ends.
                left_out.add(d.name)
                leaving(partial(_tag_run, context, {"cq/left_out": ",".join(sorted(left_out))}), None)
            if outcome == "stopped":
                context.log.warning(
                    f"{d.name}: stopped: its firings from {iso(fire)} are left out of this run; the sensor "
                    "requests them again once it is started"
                )
                continue
            if outcome == "handed_back":  # not a failure: the sensor requests them once Spark answers
                context.log.warning(
                    f"{d.name}: firings from {iso(fire)} handed back: {value}; the sensor requests them again"
                )
                continue
            if outcome == "left_out":
                context.log.warning(
                    f"{d.name}: left out: run key {value[0]} ended without committing its firing ending "
                    f"{value[1]}, which this run's firings follow; the sensor retries them from there"
                )
                continue
            if outcome == "skipped" and isinstance(value, AlreadyCommitted):
                # Another run committed it (and reports it): its sink holds the firing's identity.
                context.log.warning(f"{d.name}: firing {iso(fire)} already committed by another run ({value}); skipped")
            elif outcome == "skipped":
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
        future.result()  # a bug in execute_rounds itself surfaces here
    flush()
    if finished and on_done is not None:
        yield from on_done(finished)
    requested = sum(len(fs) for fs in firings.values())
    context.log.info(f"batch: {len(firings)} definition(s), {requested} firing(s) requested, {len(failures)} failed")
    if left_out:  # again: a tag written during the run may have given up on a storage that was away
        context.instance.add_run_tags(context.run_id, {"cq/left_out": ",".join(sorted(left_out))})
    if failures:
        # Which definitions failed, for the sensor: it retries those only.
        context.instance.add_run_tags(context.run_id, {"cq/failed": ",".join(sorted(failed_names))})
        raise dg.Failure(
            description=f"{len(failures)} firing(s) failed (their definitions are retried from "
            f"there; the others are committed): " + "; ".join(failures)
        )


class Advisory:
    """Calls the rounds make to the run storage for advice only (progress tags, which switches were
    stopped), bounded: one at a time, in a thread of its own, waited for ``wait`` seconds; a call that
    has not returned by then gives ``default`` and finishes in the background, and a call made while
    one is still out gives ``default`` at once. While PostgreSQL is away (the storage waits for it,
    ``dagster_defs.pgstorage``) the rounds go on committing firings instead of waiting with it."""

    def __init__(self, wait: float = 1.0):
        self.wait = wait
        self.busy = threading.Lock()

    def __call__(self, fn: Callable[[], Any], default: Any) -> Any:
        if not self.busy.acquire(blocking=False):
            return default
        result: list = []

        def call() -> None:
            try:
                result.append(fn())
            finally:
                self.busy.release()

        threading.Thread(target=call, name="cq-advisory", daemon=True).start()
        deadline = time.monotonic() + self.wait
        while not result and time.monotonic() < deadline and self.busy.locked():
            time.sleep(0.01)
        return result[0] if result else default


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
    runs = keyed_runs(instance, {key for key, _ in waiting.values()})
    latest = latest_commits(instance, {n: sink_keys[n] for n in waiting})
    return {
        name: True
        if committed_through(latest.get(name), end)
        # A run still going that left the definition out (its tag) will not commit it either.
        else (None if runs.status.get(key) in RUNNING and name not in runs.failed.get(key, ()) else False)
        for name, (key, end) in waiting.items()
    }


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


def sink_commit(event) -> SinkCommit | None:
    """A sink's latest materialization event as the scheduler reads it (``cq/range_end``,
    ``cq/seconds``), or None."""
    mat = event.asset_materialization if event else None
    if mat is None:
        return None
    end, seconds = mat.metadata.get("cq/range_end"), mat.metadata.get("cq/seconds")
    return SinkCommit(
        run_id=event.run_id,
        timestamp=event.timestamp,
        range_end=parse_time(end.value, tz=UTC) if end is not None and end.value else None,
        seconds=seconds.value if seconds is not None and isinstance(seconds.value, int | float) else None,
    )


def latest_commits(instance, sink_keys: dict[str, dg.AssetKey]) -> dict[str, SinkCommit | None]:
    """Per definition (``sink_keys``: name -> its sink's key): its sink's latest commit."""
    latest = instance.get_latest_materialization_events(list(sink_keys.values()))
    return {name: sink_commit(latest.get(key)) for name, key in sink_keys.items()}
