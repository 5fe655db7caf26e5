"""The batch sensor's planner, pure (``now`` is an argument): its cursor (per definition: the last
firing requested and the runs holding its firings), which firings to request now under BLOCKED and
DISCARD, retries after a failed run, and runs adopted from a cursor the orchestrator did not store.
Runs are known by plain keys and status names; ``dagster_defs.batch`` maps the decisions onto Dagster
runs, tags and cursors (ARCHITECTURE.md §6.1)."""

import hashlib
import json
import math
import zlib
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from cq_engine.errors import CQError
from cq_engine.model import Definition
from cq_engine.schedule.ticks import Ticks
from cq_engine.times import UTC, iso, parse_time

CURSOR_VERSION = 2  # 2: a definition's state may name the run before its own (``prev``: pipelined)
READABLE_VERSIONS = (1, 2)  # a version 1 cursor is a version 2 one with no ``prev``
MAX_FIRINGS_PER_DEFINITION = 100  # per batch; a longer backlog continues in the next batch
# Firings due at once per run (definitions beyond it wait for the next batch): five rounds of a
# thousand definitions, a minute or two of fused work. At 1,000 it cut a thousand definitions two or
# three periods late (a cold start) into runs of 333-500 that queued for the two slots.
MAX_FIRINGS_PER_RUN = 5000
LOST_AFTER = timedelta(minutes=5)  # a requested run that never appeared is requested again
# Seconds before the attempt after a failed one: the first retry as soon as Spark answers (``plan_batch``'s
# ``ready``), a second failure 5 s later, and so on (then every 60 s): a fault of the deployment is
# retried the moment it ends, a definition that fails on its own is not retried in a loop.
RETRY_BACKOFF = (0, 5, 10, 30, 60)
# The run statuses in which a run still holds its firings (Dagster's names; the adapter checks they
# are its in-flight statuses).
RUNNING = frozenset({"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING"})


def batch_interval(definitions: list[Definition], ticks: dict[str, Ticks]) -> int:
    """The batch sensor's cadence: half the shortest EVERY, between 1 and 5 seconds."""
    shortest = min((ticks[d.name].every.total_seconds() for d in definitions if d.name in ticks), default=10)
    return int(max(1, min(5, shortest // 2)))


@dataclass
class DefinitionState:
    upto: str | None = None  # last firing requested
    key: str | None = None  # run key of the run holding its firings
    first: str | None = None  # first firing in that run
    since: float = 0.0  # when that run was requested (epoch seconds)
    attempt: int = 0  # failed attempts at the firings from `first`
    checked: float = 0.0  # when a run last evaluated its completeness check (epoch seconds)
    # Pipelined: `key` was requested while the run `prev` still held the definition's firings from
    # `prev_first` up to the one whose range ends at `prev_end`; `key` waits for that commit.
    prev: str | None = None
    prev_first: str | None = None
    prev_end: str | None = None
    prev_since: float = 0.0
    # Its firings in `key` follow a run that ended (or left it out) without committing its own: `key`
    # leaves them out too, so it is retried from `first` once `key` is done with it, never followed.
    redo: bool = False

    def clear_prev(self) -> None:
        self.prev, self.prev_first, self.prev_end, self.prev_since = None, None, None, 0.0

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v not in (None, 0, 0.0)}


def _cursor_data(text: str | None) -> dict:
    if not text:
        return {}
    data = json.loads(text)
    if data.get("v") not in READABLE_VERSIONS:
        raise CQError(
            f"cq_firings: cursor version {data.get('v')!r} is not {CURSOR_VERSION}; reset the sensor's cursor"
        )
    return data


def load_cursor(text: str | None) -> dict[str, DefinitionState]:
    return {name: DefinitionState(**s) for name, s in _cursor_data(text).get("defs", {}).items()}


def cursor_time(text: str | None) -> float | None:
    """When the evaluation that returned cursor ``text`` started (epoch seconds; None: not recorded)."""
    at = _cursor_data(text).get("at")
    return float(at) if at is not None else None


def dump_cursor(states: dict[str, DefinitionState], *, at: float | None = None) -> str:
    data: dict = {"v": CURSOR_VERSION, "defs": {n: s.to_json() for n, s in sorted(states.items())}}
    if at is not None:
        data["at"] = at
    return json.dumps(data, separators=(",", ":"))


@dataclass(frozen=True)
class RequestedRun:
    """A batch run as its run record holds it: key, creation time, attempt and firings."""

    key: str
    created: float  # epoch seconds
    attempt: int
    firings: dict[str, list[str]]  # definition -> ISO firing times, in order
    after: dict[str, list[str]] = field(default_factory=dict)  # pipelined: definition -> [prev key, its end]


def adopt_runs(states: dict[str, DefinitionState], runs: list[RequestedRun]) -> list[str]:
    """Put into ``states`` (in place) the batch runs their cursor does not know (``runs``: created after
    the cursor's evaluation, oldest first). Dagster stores a sensor's cursor only once its tick has
    ended, after it created the tick's runs: a daemon killed (or a tick failing) in between leaves the
    previous cursor, and planning from it requested the same firings again in a run of another key
    (its due set had grown meanwhile), so both runs committed them. Returns a note per adopted run."""
    known = {s.key for s in states.values() if s.key}
    notes = []
    for run in sorted(runs, key=lambda r: r.created):
        if not run.key or run.key in known:
            continue
        for name, fires in run.firings.items():
            if not fires:
                continue
            s = states.setdefault(name, DefinitionState())
            if name in run.after:  # it followed another run of the definition: keep that one too
                prev_key, prev_end = run.after[name]
                first = s.first if s.key == prev_key else s.prev_first or s.first
                s.prev, s.prev_first, s.prev_end, s.prev_since = prev_key, first, prev_end, s.since
            last = parse_time(fires[-1], tz=UTC)
            upto = max(last, parse_time(s.upto, tz=UTC)) if s.upto else last
            s.key, s.first, s.upto, s.since, s.attempt = run.key, fires[0], iso(upto), run.created, run.attempt
        known.add(run.key)
        notes.append(
            f"adopted run key {run.key} ({sum(map(len, run.firings.values()))} firing(s) of "
            f"{len(run.firings)} definition(s)): requested by an evaluation whose cursor Dagster did not store"
        )
    return notes


@dataclass(frozen=True)
class Batch:
    firings: dict[str, list[datetime]]  # definition -> firing times, in order
    cursor: str
    skipped: list[str]  # DISCARD skips and definitions held back, for the tick's log
    attempt: int
    checks: frozenset[str] = frozenset()  # definitions whose completeness check the run evaluates
    after: dict[str, list[str]] = field(default_factory=dict)  # pipelined: definition -> [prev key, its end]
    # Keeping up, its next window within the lead, but its run has not committed all but its last
    # firing yet: it would be followed a moment later (see the sensor's two leads).
    unready: frozenset[str] = frozenset()

    @property
    def run_key(self) -> str:
        text = json.dumps({n: [iso(f) for f in fs] for n, fs in sorted(self.firings.items())}) + f"#{self.attempt}"
        return "cq_firings:" + hashlib.sha1(text.encode()).hexdigest()[:20]


def plan_batch(
    definitions: list[Definition],
    *,
    ticks: dict[str, Ticks],
    cursor: str | None,
    now: datetime,
    run_status: dict[str, str],
    busy: set[str],
    paused: set[str],
    failed: dict[str, set[str]] | None = None,
    finished: frozenset[str] = frozenset(),
    prev_done: frozenset[str] = frozenset(),
    lead: dict[str, timedelta] | None = None,
    check_every: timedelta = timedelta(0),
    horizon: dict[str, timedelta] | None = None,
    horizon_lead: dict[str, timedelta] | None = None,
    caught_up: frozenset[str] = frozenset(),
    ready: bool = True,
) -> Batch:
    """The firings to request now. ``run_status``: run key -> Dagster status of the runs named in the
    cursor (missing: not created yet); ``failed``: run key -> the definitions whose firings failed in
    that run or that it left out (its ``cq/failed`` and ``cq/left_out`` tags; a failed run without them
    failed as a whole; a running run that left a definition out no longer holds it); ``busy``: definitions
    with another run of theirs in flight (their own job, a recalculation); ``paused``: definitions
    whose switch is stopped; ``finished``: definitions whose every firing in their still-running run
    is committed (a long catch-up of another definition in that run does not hold them);
    ``prev_done``: definitions whose firings in their ``prev`` run are committed; ``ready``: whether
    Spark answers now (False: a crashed Connect server is starting again), without which no failed
    run is retried; ``lead``:
    per definition, how long before a firing is due it may be requested (the run waits for it);
    ``check_every``: a definition's completeness check is evaluated by its first run after that long
    (and by every retry), not by every run: each evaluation is two events in Dagster's event log, which
    a thousand definitions firing every 30 s cannot afford on every run; ``horizon``: per BLOCKED
    definition, the length of the aligned windows (UTC epoch multiples) whose firings are requested
    together (see ``window_of``); ``horizon_lead``: how early a window's batch may be requested (at
    least ``lead``); ``caught_up``: definitions whose firings in their running run are committed but
    for the last.

    Pipelining: a BLOCKED definition whose one firing is in a run that has started is requested
    again, in the next batch, as soon as its next firing is within its lead, without waiting for the
    commit; the batch's ``after`` names the run and range end it waits for before that definition's
    first firing. A definition is in at most two runs, the second waiting for the first. If its
    firing fails in the first, the second leaves it out and it is retried from the first's firing.

    Horizon: a BLOCKED definition with a ``horizon`` (the sensor gives one only to a definition that
    keeps pace), when it is followed (above; under a horizon also when its run is behind by up to a
    window), gets every firing up to the end of the horizon window ``horizon_lead`` reaches, once its
    next firing is within that lead; the run waits for each (one process for several periods), and
    the next window's batch follows it in turn. A definition not followed (its first run, a retry, a
    catch-up) gets what is due within its lead, as without a horizon. Windows are aligned, so
    definitions of any phase come due together, once per window, and batches that split (a retry, a
    straggler) merge again at the next window."""
    failed = failed or {}
    lead = lead or {}
    horizon = horizon or {}
    horizon_lead = horizon_lead or {}
    states = load_cursor(cursor)
    states = {d.name: states.get(d.name, DefinitionState()) for d in definitions}
    firings: dict[str, list[datetime]] = {}
    after: dict[str, list[str]] = {}
    skipped: list[str] = []
    unready: set[str] = set()
    attempt = 0
    total = 0
    # Furthest behind first: when a batch is full (MAX_FIRINGS_PER_RUN), what waits for the next one
    # is what was requested last, not the same definitions at the end of the list every time.
    for d in sorted(definitions, key=lambda d: states[d.name].upto or ""):
        s = states[d.name]
        original = replace(s)
        in_flight = d.name in busy
        follow: tuple[str, str | None, str, float] | None = None
        retry = False
        if s.prev:
            status, age = run_status.get(s.prev), now.timestamp() - s.prev_since
            if d.name in finished or d.name in prev_done or _done_in(status, s.prev, d.name, failed):
                s.clear_prev()
            elif _holds(status, age, s.prev, d.name, failed):
                in_flight = True
            else:  # its firings failed in `prev` (or it left them out): `key` leaves them out, all retried from prev's first
                s.first, s.redo = s.prev_first, True
                s.clear_prev()
        if s.key:
            status, age = run_status.get(s.key), now.timestamp() - s.since
            if d.name in finished:
                s.key, s.first, s.attempt, s.redo = None, None, 0, False
                s.clear_prev()
            elif _holds(status, age, s.key, d.name, failed):
                in_flight = True
            elif _done_in(status, s.key, d.name, failed):
                if s.prev:  # its firings there followed `prev`'s, still unresolved: wait for it
                    in_flight = True
                else:
                    s.key, s.first, s.attempt, s.redo = None, None, 0, False
            elif not ready or age < RETRY_BACKOFF[min(s.attempt, len(RETRY_BACKOFF) - 1)]:
                in_flight = True  # failed (or lost): held until Spark answers and a back-off, then retried from `first`
            else:
                s.key, s.attempt, s.redo, retry = None, s.attempt + 1, False, True
        if d.name in paused:
            continue
        if not retry and not s.key and s.attempt and s.first and s.upto:
            retry = True  # its run failed (or left it out) while it was stopped: retried now it runs again
        t = ticks[d.name]
        reach = now + lead.get(d.name, timedelta(0))
        due = t.due(cursor=parse_time(s.upto, tz=UTC) if s.upto else None, now=reach)
        if s.upto is None:  # first evaluation: the latest firing due now, then those within the lead
            now_due = t.due(cursor=None, now=now)
            if now_due:
                due = now_due + t.between(now_due[-1] + timedelta(microseconds=1), reach + timedelta(microseconds=1))
        span = horizon.get(d.name, timedelta(0)) if d.timeout_policy != "DISCARD" else timedelta(0)
        if d.timeout_policy == "DISCARD":
            if in_flight:
                if due:
                    s.upto = iso(due[-1])
                    skipped.append(
                        f"{d.name}: DISCARD skipped {len(due)} firing(s) up to {iso(due[-1])} "
                        "(a run of it is queued or running)"
                    )
                continue
            fires = due[-1:] or ([parse_time(s.first, tz=UTC)] if retry and s.first else [])
        else:
            # Keeping up (one firing in a run that has started, the next one due; a queued run could
            # start after its follower and hold a slot while it waits), no retry pending, no run of
            # its own: it may be followed. A run behind holds its definition (BLOCKED) as before.
            # Under a horizon: its next firing is within the horizon lead, at most a window's worth of
            # firings is due within the usual lead, and its run has done all but its last firing; it
            # gets every firing up to the end of the window the horizon lead reaches. A run behind
            # (a slow start: a thousand definitions three periods late, each run ~25 s a round) is
            # followed too, so its successor's start overlaps its last round: caught up run after run
            # instead, each start a gap, the stack stayed three periods late for good. A definition
            # slower than its period has no horizon (the sensor's `keeps_pace`).
            one = bool(
                s.key
                and s.upto
                and not s.prev
                and not s.attempt
                and not s.redo
                and (s.first == s.upto or d.name in caught_up)
            )
            window: tuple[datetime, datetime] | None = None
            ahead: list[datetime] = []  # under a horizon: every firing after `upto` to its window's end
            if span > timedelta(0) and s.upto:
                far = now + max(lead.get(d.name, timedelta(0)), horizon_lead.get(d.name, timedelta(0)))
                window = window_of(far, span)
                ahead = t.between(parse_time(s.upto, tz=UTC) + timedelta(microseconds=1), window[1])
                next_only = bool(ahead) and ahead[0] <= far and len(due) * t.every <= span
            else:
                next_only = len(due) == 1
            started = in_flight and next_only and d.name not in busy and run_status.get(s.key or "") == "STARTED"
            if started and one:
                end = iso(t.range_of(parse_time(s.upto or "", tz=UTC))[1])
                follow = (s.key or "", s.first, end, s.since)
            elif started and window and s.key and s.upto and not s.prev and not s.attempt and not s.redo:
                unready.add(d.name)
            if in_flight and not follow:
                if due:
                    skipped.append(f"{d.name}: BLOCKED holds {len(due)} firing(s) until its run finishes")
                continue
            again = []
            if retry and s.first and s.upto:  # a retry always has both
                first = parse_time(s.first, tz=UTC)
                again = [
                    first,
                    *t.between(
                        first + timedelta(microseconds=1), parse_time(s.upto, tz=UTC) + timedelta(microseconds=1)
                    ),
                ]
            fires = (again + (ahead if follow and window else due))[:MAX_FIRINGS_PER_DEFINITION]
        if not fires:
            if retry:
                s.first, s.attempt = None, 0
            continue
        # The run's size is what it can run at once: the firings due now (one round each), a followed
        # definition's at most one (they wait for its previous run anyway). Later firings, requested
        # early or of the horizon, come one period at a time. Counting the firings within the lead
        # (two per definition at a cold start, or for a follower a period late) cut a thousand
        # definitions into runs of 500 that queued for the two slots and never merged again.
        need = sum(1 for f in fires if f <= now)
        if follow:
            need = min(need, 1)
        if total and total + need > MAX_FIRINGS_PER_RUN:
            states[d.name] = original  # as if not looked at: the next batch decides again
            continue
        total += need
        firings[d.name] = fires
        if follow:
            s.prev, s.prev_first, s.prev_end, s.prev_since = follow
            after[d.name] = [follow[0], follow[2]]
        if retry:
            attempt = max(attempt, s.attempt)
        else:
            s.attempt = 0
        s.first = iso(fires[0])
        # BLOCKED: what a full batch left out is due again; DISCARD never goes back.
        keep = d.timeout_policy == "DISCARD" and s.upto and parse_time(s.upto, tz=UTC) > fires[-1]
        s.upto = s.upto if keep else iso(fires[-1])
    batch = Batch(firings=firings, cursor="", skipped=skipped, attempt=attempt, after=after)
    checks = set()
    key = batch.run_key  # once: it hashes the whole batch (a thousand definitions' firings)
    for name in firings:
        s = states[name]
        s.key, s.since = key, now.timestamp()
        if s.attempt or now.timestamp() - s.checked >= check_every.total_seconds():
            checks.add(name)
            s.checked = now.timestamp() - check_stagger(name, check_every)
    return Batch(
        firings=firings,
        cursor=dump_cursor(states, at=now.timestamp()),
        skipped=skipped,
        attempt=attempt,
        checks=frozenset(checks),
        after=after,
        unready=frozenset(unready),
    )


def window_of(t: datetime, span: timedelta) -> tuple[datetime, datetime]:
    """The horizon window ``[start, end)`` of length ``span`` (aligned to UTC epoch multiples) holding ``t``."""
    seconds = span.total_seconds()
    start = datetime.fromtimestamp(math.floor(t.timestamp() / seconds) * seconds, UTC)
    return start, start + span


def _holds(status: str | None, age: float, key: str, name: str, failed: dict[str, set[str]]) -> bool:
    """Whether run ``key`` (of ``status``, requested ``age`` seconds ago) may still run firings of
    ``name``: it is running and has not left it out (a stopped switch, a lost Spark server, a run it
    followed without the commit: its ``cq/left_out`` tag, written as it happens), or it was requested
    lately and is not created yet."""
    if status in RUNNING:
        return name not in failed.get(key, ())
    return status is None and age < LOST_AFTER.total_seconds()


def _done_in(status: str | None, key: str, name: str, failed: dict[str, set[str]]) -> bool:
    """Whether run ``key`` (of ``status``) ended with every firing of ``name`` in it committed: it
    succeeded and left none out (``failed`` holds what a run failed or left out), or it failed in
    other definitions only."""
    if status == "SUCCESS":
        return name not in failed.get(key, ())
    return status == "FAILURE" and key in failed and name not in failed[key]


def check_stagger(name: str, check_every: timedelta) -> float:
    """Seconds (a fixed share of half ``check_every``, by name) by which a definition's next check
    comes early. Definitions that start together are otherwise all due together: a thousand checks,
    3,000 events in one run, kept that run (a batch slot, and the event log) busy 30 s longer every
    five minutes, and the next cadence's firings waited. Each is still evaluated at least every
    ``check_every``."""
    return (zlib.crc32(name.encode()) % 1000) / 1000 * check_every.total_seconds() / 2
