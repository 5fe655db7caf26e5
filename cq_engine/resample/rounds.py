"""A batch run's rounds (ARCHITECTURE.md §6.1), orchestrator-neutral: every definition's firings in time
order on one warm session, a round's continuous queries in one Spark job (``resample.fused``) and its
PERIOD streams beside it; each outcome put on a queue for the adapter to report. The adapter
(``dagster_defs.batch_run``) turns what comes off the queue into materializations and run tags."""

from __future__ import annotations

import logging
import os
import queue
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from functools import partial

from cq_engine.errors import AlreadyCommitted, CQError
from cq_engine.model import ContinuousQuery, Definition
from cq_engine.recovery import AWAY, RECOVERED, SparkRecovery
from cq_engine.resample.fused import FiringRequest, run_firings
from cq_engine.resample.run import write_identity
from cq_engine.times import UTC

log = logging.getLogger(__name__)

FOLLOW_POLL_SECONDS = 0.5  # a pipelined definition looks this often for the commit it waits for
ROUND_GATHER = timedelta(seconds=1)  # firings due this close after a round's first one join it
SWITCH_CHECK_SECONDS = 5.0  # a run looks this often (at most) whether a definition was stopped
# Sinks opened at once while a run waits for its first firing: on an object store each open is a few
# requests that wait on the network, not the CPU (the soak's cold first rounds: 45-80 s per 100 sinks).
WARM_THREADS = 8
WARM_MIN_SECONDS = 1.0  # a wait shorter than this is not worth starting threads for


def wait_for(fire: datetime) -> None:
    """Sleep until ``fire``: a firing requested early runs at its time, when its range is complete."""
    delay = (fire - datetime.now(UTC)).total_seconds()
    if delay > 0:
        time.sleep(delay)


def warm_sinks(engine, names: list[str], *, until: datetime) -> int:
    """Open the sinks of ``names`` (``Storage.warm``: snapshot, who writes it, a continuous query's
    firing identities) on ``WARM_THREADS`` threads while the run waits for its first firing at
    ``until``; a sink not started by then is opened by its first commit, as without this. Returns how
    many were warmed. A sink that fails to open is left to its commit, which reports the error."""
    deadline = time.monotonic() + (until - datetime.now(UTC)).total_seconds()
    if deadline - time.monotonic() < WARM_MIN_SECONDS:
        return 0
    storage = engine.ctx.storage

    def one(name: str) -> bool:
        if time.monotonic() >= deadline:
            return False
        d = engine.definition(name)
        try:
            if isinstance(d, ContinuousQuery):
                storage.warm(d.sink, app_id=write_identity(d, "firing"))
            elif d.sink:
                storage.warm(d.sink)
        except Exception as exc:  # the commit meets it again and reports it
            log.debug("warming %s's sink failed: %s", name, exc)
            return False
        return True

    with ThreadPoolExecutor(max_workers=WARM_THREADS, thread_name_prefix="cq-warm") as pool:
        return sum(pool.map(one, names))


def batch_threads() -> int:
    """Definitions executed at once in a batch run (``CQ_BATCH_THREADS``, default 2): while one
    firing waits on Spark, another plans or commits. A definition's own firings stay sequential."""
    value = os.environ.get("CQ_BATCH_THREADS", "2")
    if not value.isdigit() or int(value) < 1:
        raise CQError(f"CQ_BATCH_THREADS={value!r}: expected a positive integer")
    return int(value)


Gate = Callable[[dict[str, list[str]]], dict[str, bool | None]]
Stopped = Callable[[set[str]], set[str]]


def execute_rounds(
    engine,
    firings: dict[str, list[datetime]],
    done: dict,
    out: queue.Queue,
    *,
    after: dict[str, list[str]] | None = None,
    gate: Gate | None = None,
    stopped: Stopped | None = None,
    progress: Callable[[datetime, float], None] | None = None,
    recover: Callable[[list[BaseException]], str] | None = None,
    discard: frozenset[str] = frozenset(),
) -> None:
    """Every definition's firings in rounds, in time order (a round: each definition's next firing,
    those due within ``ROUND_GATHER`` of the earliest, run once the newest is due), each result (or
    a definition's first failure, after which it stops) put on ``out``; a round's continuous
    queries share one Spark job (``resample.fused``), its PERIOD streams run beside it. A definition
    in ``after`` (pipelined: [run key, range end]) joins the rounds once ``gate`` says that run
    committed it (True), or is left out if that run ended without (False; None: not yet). A
    definition ``stopped`` names (its switch was stopped) is left out from its next firing on. After
    each round, ``progress(t, seconds)``: every firing before ``t`` is done (committed or failed; after
    the last round, ``t`` is just after the run's last firing), and the round took ``seconds``.

    A round with failures asks ``recover`` (default: ``recovery.SparkRecovery`` on the engine's
    context) whether the Spark session was lost: if a new one answers, the failed firings run again
    in the next round and their failures are not reported; if no server answered in time, their
    definitions are handed back (``("handed_back", d, fire, reason)``: the sensor requests them
    again); otherwise the failures stand.

    ``discard``: DISCARD definitions whose later firings are in ``firings`` too (a window run holds
    several): a round that starts once such a definition's next firing is due already runs only the
    latest due one, the earlier ones put on ``out`` as ``("discarded", d, fire, None)`` (IoTDB's
    DISCARD: a firing that came due while the one before ran is skipped). The Dagster batch sensor
    gives a DISCARD definition one firing per run and decides this when it requests."""
    pending = {n: list(fs) for n, fs in firings.items()}
    end = max((f for fs in firings.values() for f in fs), default=datetime.now(UTC)) + timedelta(microseconds=1)
    told: datetime | None = None
    waiting = {n: a for n, a in (after or {}).items() if n in pending}
    looked = 0.0
    first = min((fs[0] for fs in pending.values() if fs), default=None)
    if first is not None:
        warm_sinks(engine, list(pending), until=first)
    if recover is None:
        recover = SparkRecovery(engine.ctx)
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
            if discard:
                now = datetime.now(UTC)
                for name in discard & ready.keys():
                    fs = ready[name]
                    while len(fs) > 1 and fs[1] <= now:
                        out.put(("discarded", engine.definition(name), fs.pop(0), None))
                soonest = min(fs[0] for fs in ready.values())
            cutoff = max(soonest, datetime.now(UTC)) + ROUND_GATHER
            due = {n: fs.pop(0) for n, fs in ready.items() if fs[0] <= cutoff}
            wait_for(max(due.values()))  # a round requested early runs when its newest firing is due
            began = time.monotonic()
            queries: list[FiringRequest] = []
            periods = []
            # A round's failures are held back until it is known whether the session was lost.
            held: queue.Queue = queue.Queue()
            for name, fire in due.items():
                d = engine.definition(name)
                if (name, fire) in done:
                    out.put(("skipped", d, fire, done[name, fire]))
                elif isinstance(d, ContinuousQuery):
                    queries.append(FiringRequest(cq=d, fire_time=fire))
                else:
                    periods.append(pool.submit(_period, engine, d, fire, _Holding(out, held)))
            failed = {d.name for d, ok in (f.result() for f in periods) if not ok}

            if queries:
                outcomes = run_firings(engine.ctx, queries, on_outcome=partial(_heard, _Holding(out, held)))
                failed |= {f.cq.name for f, o in zip(queries, outcomes) if _failed(o)}
            if failed:
                failures = _drain(held)
                how = recover([value for *_, value in failures if isinstance(value, BaseException)])
                for kind, d, fire, value in failures:
                    if how == RECOVERED:  # its session was lost, a new one answers: again, next round
                        pending[d.name].insert(0, fire)
                    elif how == AWAY:
                        out.put(("handed_back", d, fire, "its Spark Connect server did not answer again in time"))
                    else:
                        out.put((kind, d, fire, value))
                if how == RECOVERED:
                    failed = set()
            # A failed firing stops its definition (BLOCKED order); the sensor retries it from there.
            pending = {n: fs for n, fs in pending.items() if fs and n not in failed}
            if progress is not None:
                # All done: every firing up to the run's last one (the sensor goes on with its
                # definitions at once, once the last round's events precede cq/progress_at).
                before = min(fs[0] for fs in pending.values()) if pending else end
                if before != told:
                    told = before
                    progress(before, time.monotonic() - began)


class _Holding:
    """The round's outcome queue: failures go to ``held`` (``recover`` decides), the rest to ``out``."""

    def __init__(self, out: queue.Queue, held: queue.Queue):
        self.out, self.held = out, held

    def put(self, item: tuple) -> None:
        (self.held if item[0] == "failed" else self.out).put(item)


def _drain(q: queue.Queue) -> list[tuple]:
    items = []
    while not q.empty():
        items.append(q.get_nowait())
    return items


def _failed(outcome) -> bool:
    return isinstance(outcome, Exception) and not isinstance(outcome, AlreadyCommitted)


def _heard(out, f: FiringRequest, outcome) -> None:
    # A firing another run committed (its sink holds it) is skipped, as one the ledger holds is.
    kind = "skipped" if isinstance(outcome, AlreadyCommitted) else "failed" if _failed(outcome) else "ok"
    out.put((kind, f.cq, f.fire_time, outcome))


def _period(engine, d: Definition, fire: datetime, out) -> tuple[Definition, bool]:
    try:
        out.put(("ok", d, fire, engine.run_period(d.name, fire, once=True)))
        return d, True
    except AlreadyCommitted as exc:  # another run at the same time committed the tick: skipped, as a firing
        out.put(("skipped", d, fire, exc))
        return d, True
    except Exception as exc:  # one definition's failure must not stop the others
        out.put(("failed", d, fire, exc))
        return d, False
