"""The shared stream sensor's bookkeeping, pure: per stream its ``StreamCursor``, the works planned
and not yet done (its *backlog*), the run holding them and its failed attempts; where each stream's
works go this evaluation (computed in the sensor, or into the evaluation's run); and the journal
that makes an evaluation's progress survive a daemon that dies before it saves the cursor.

Dagster's objects stay in ``dagster_defs.streams``; this module is tested without them."""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

from cq_engine.errors import CQError
from cq_engine.model import Stream
from cq_engine.recovery import AWAY, RECOVERED
from cq_engine.statefile import read_json_state, write_atomic
from cq_engine.streams.timing import StreamWork, work_range

CURSOR_VERSION = 1
LOST_AFTER_SECONDS = 300  # a requested run that never appeared is requested again
# Seconds before the attempt after a failed one: the first retry as soon as the sensor finds Spark
# answering (``settle``'s ``ready``), a second failure 5 s later, and so on (then every 60 s): a fault of
# the deployment is retried the moment it ends, a work that fails on its own is not retried in a loop.
RETRY_BACKOFF = (0, 5, 10, 30, 60)
RUNNING = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING"}
SENSOR, RUN = "sensor", "run"


@dataclass
class StreamState:
    cursor: str | None = None  # the StreamCursor JSON
    backlog: list[str] = field(default_factory=list)  # StreamWork JSON planned and not yet done, in order
    key: str | None = None  # run key of the run holding the backlog
    since: float = 0.0  # when that run was requested (epoch seconds)
    attempt: int = 0  # failed attempts at the backlog (> 0: it goes to runs until one succeeds)
    served: float = 0.0  # when the sensor last computed its works (the least recently served go first)
    adopted: str = ""  # id of the cursor last taken from its switch (`cq start --ignore-untreated`)

    def to_json(self) -> dict:
        """Its fields, the JSON ones (cursor, backlog) nested as objects rather than escaped strings,
        so the sensor's cursor reads as one JSON document in the UI."""
        out = {k: v for k, v in self.__dict__.items() if v not in (None, 0, 0.0, "", [])}
        if "cursor" in out:
            out["cursor"] = json.loads(out["cursor"])
        if "backlog" in out:
            out["backlog"] = [json.loads(w) for w in out["backlog"]]
        return out

    @classmethod
    def from_json(cls, data: dict) -> StreamState:
        """``to_json``'s inverse; a cursor of an older engine holds them as strings."""
        data = dict(data)
        if isinstance(data.get("cursor"), dict):
            data["cursor"] = _compact(data["cursor"])
        data["backlog"] = [w if isinstance(w, str) else _compact(w) for w in data.get("backlog") or []]
        return cls(**data)


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"))


@dataclass
class Cursor:
    """The sensor's cursor: ``seq`` counts the evaluations that did something (the journal's link)."""

    seq: int = 0
    streams: dict[str, StreamState] = field(default_factory=dict)

    def to_json(self) -> str:
        streams = {n: s.to_json() for n, s in sorted(self.streams.items())}
        return json.dumps({"v": CURSOR_VERSION, "seq": self.seq, "streams": streams}, separators=(",", ":"))


def load_cursor(text: str | None, *, sensor: str = "cq_streams") -> Cursor:
    if not text:
        return Cursor()
    try:
        data = json.loads(text)
    except ValueError:
        raise CQError(f"{sensor}: its cursor is not JSON; reset the sensor's cursor") from None
    if not isinstance(data, dict) or data.get("v") != CURSOR_VERSION:
        version = data.get("v") if isinstance(data, dict) else None
        raise CQError(f"{sensor}: cursor version {version!r} is not {CURSOR_VERSION}; reset the sensor's cursor")
    return Cursor(
        seq=int(data.get("seq", 0)),
        streams={n: StreamState.from_json(s) for n, s in (data.get("streams") or {}).items()},
    )


def settle(
    state: StreamState, *, now: float, status: str | None, failed: set[str] | None, name: str, ready: bool = True
) -> str:
    """Bring ``state``'s run up to date: ``status`` of its run (None: not created yet), ``failed``
    the streams its ``cq/failed`` or ``cq/left_out`` tag names (None: neither tag). Returns ``free``
    (nothing in flight: plan or compute), ``held`` (its run is in flight, or it failed and waits for
    Spark to answer, ``ready``, and its back-off) or ``retry`` (its backlog goes to a run again, one
    more attempt). A run that succeeded but handed a stream back (``cq/left_out``) is a retry of it."""
    if not state.key:
        return "free"
    age = now - state.since
    if status in RUNNING or (status is None and age < LOST_AFTER_SECONDS):
        return "held"
    if (status in ("SUCCESS", "FAILURE") and failed is not None and name not in failed) or (
        status == "SUCCESS" and failed is None
    ):
        state.key, state.backlog, state.attempt, state.since = None, [], 0, 0.0
        return "free"
    if not ready or age < RETRY_BACKOFF[min(state.attempt, len(RETRY_BACKOFF) - 1)]:
        return "held"
    state.key, state.attempt = None, state.attempt + 1
    return "retry"


def destination(state: StreamState, works: list[StreamWork], *, inline: bool) -> str:
    """Where a free stream's backlog goes: the sensor computes live works when a Spark Connect server
    serves (``inline``); history chunks, recalculations and a stream that failed go to the run."""
    if not inline or state.attempt > 0 or any(w.kind != "realtime" for w in works):
        return RUN
    return SENSOR


def service_order(states: dict[str, StreamState], names: list[str]) -> list[str]:
    """The order the sensor computes streams in: least recently served first (fair under load)."""
    return sorted(names, key=lambda n: (states[n].served, n))


def run_key(works: dict[str, list[str]], attempt: int) -> str:
    """A run's key: a hash of its works and attempt, so a repeated evaluation requests nothing new."""
    text = json.dumps(sorted(works.items()), separators=(",", ":")) + f"#{attempt}"
    return "cq_streams:" + hashlib.sha1(text.encode()).hexdigest()[:20]


def work_identity(stream: Stream, work: StreamWork, tz: str) -> tuple:
    """What the ledger holds of a work: kind, range and trigger version (and a recalculation's tick).
    Not a live work's tick: a work planned again from a cursor that was lost (an evaluation killed
    with its code server after it committed) has a new tick and the same windows over the same
    commit, and computing it again recorded it twice; a recalculation asked for twice runs twice."""
    lo, hi = work_range(stream, work, tz)
    return (work.kind, work.tick if work.kind == "recalculate" else None, lo, hi, work.version)


def done_works(entries, stream: Stream) -> set[tuple]:
    """The identities of ``stream``'s succeeded runs in the ledger ``entries`` (``work_identity``)."""
    table = stream.trigger_source
    return {
        (
            e.kind,
            e.fire_time if e.kind == "recalculate" else None,
            e.range_start,
            e.range_end,
            e.source_versions.get(table),
        )
        for e in entries
        if e.definition == stream.name and e.status == "succeeded"
    }


# -- the journal -------------------------------------------------------------------------------
# Dagster stores a sensor's cursor (and the materializations it reports) only after the evaluation
# returned; a daemon that dies in between loses both, though the sinks were committed. The sensor
# therefore writes the cursor it returns, and the materializations, to a journal first; the next
# evaluation that gets the cursor the journal was derived from adopts the journal's instead.
@dataclass(frozen=True)
class Journal:
    base: int  # seq of the cursor the evaluation started from
    cursor: str  # the cursor it returned
    events: list  # (stream, metadata) of the materializations it reported


def journal_path(home: str | Path, sensor: str, location: str) -> Path:
    digest = hashlib.sha1(location.encode()).hexdigest()[:12]
    return Path(home) / "streams" / f"{sensor}-{digest}.json"


def write_journal(path: Path, journal: Journal) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"base": journal.base, "cursor": journal.cursor, "events": journal.events})
    write_atomic(path, text)


def adopt(path: Path, cursor: Cursor) -> Journal | None:
    """The journal of the evaluation whose cursor was lost, if it descends from ``cursor``: it started
    from it, or from a later cursor that was lost too (each evaluation runs alone, under a lock, and
    numbers its cursor one past the one it started from). Two evaluations in a row can lose theirs:
    under load one outlived Dagster's 60 s sensor time-out, the next (which adopted its journal) too,
    and taking only a journal based on Dagster's own cursor computed the first one's windows again."""
    data = read_json_state(path, what="stream sensor journal")
    if not data or int(data.get("base", -1)) < cursor.seq or (cursor.seq == 0 and not cursor.streams):
        return None
    return Journal(base=int(data["base"]), cursor=str(data["cursor"]), events=list(data.get("events") or []))


def mark_inflight(path: Path, *, base: int, streams: list[str]) -> None:
    """Before the sensor computes: which streams an evaluation from cursor ``base`` is computing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(_inflight(path), json.dumps({"base": base, "streams": sorted(streams)}))


def clear_inflight(path: Path) -> None:
    _inflight(path).unlink(missing_ok=True)


def unfinished(path: Path, cursor: Cursor) -> list[str]:
    """The streams an evaluation from ``cursor`` was computing when it never finished (its process
    died, or a work hung past the daemon's time-out): they go to runs, where a hang is visible."""
    data = read_json_state(_inflight(path), what="stream sensor in-flight mark")
    if not data or data.get("base") != cursor.seq:
        return []
    return [str(n) for n in data.get("streams") or []]


def _inflight(path: Path) -> Path:
    return path.with_suffix(".inflight")


def process_exiting() -> bool:
    """Has this process begun to exit? Python's exit first runs the exit hooks of ``threading``, among
    them ``concurrent.futures``' (every thread pool then refuses new work, Spark Connect's own
    included: "cannot schedule new futures after interpreter shutdown"), and waits there for the
    pools' running work before it stops the main thread. A Dagster code server the daemon replaces
    (a sensor evaluation past its gRPC deadline) exits so while the old evaluation still computes in
    one of its gRPC pool's threads. ``threading._SHUTTING_DOWN`` is set before those hooks run
    (CPython 3.10 and later); a stopped main thread is the portable sign."""
    return bool(getattr(threading, "_SHUTTING_DOWN", False)) or not threading.main_thread().is_alive()


class CallCost:
    """What a ``fused.run_works`` call of k stream works costs in this process, fitted over its
    recent calls as ``fixed + k * each``. A call's streams share its Spark jobs (one aggregation
    answers every stream of a shape), so most of a call's time is fixed: sizing calls by the time
    per work of small calls (time / k) keeps them small under load, and small calls pay the fixed
    part once per stream, which slows them further. Pure: the caller times the calls."""

    KEEP = 12  # recent calls only: a machine's load changes

    def __init__(self) -> None:
        self.calls: list[tuple[int, float]] = []

    def observe(self, works: int, seconds: float) -> None:
        """Record a call of ``works`` works that took ``seconds``."""
        self.calls = [*self.calls, (max(1, works), max(0.0, seconds))][-self.KEEP :]

    def estimate(self) -> tuple[float, float] | None:
        """(fixed seconds, seconds per work) of a call, or None before the first call. With calls of
        one size only, half of their time is taken as fixed (a larger call then tells more)."""
        if not self.calls:
            return None
        ks = [k for k, _ in self.calls]
        ts = [t for _, t in self.calls]
        mk, mt = sum(ks) / len(ks), sum(ts) / len(ts)
        spread = sum((k - mk) ** 2 for k in ks)
        if spread == 0:
            return mt / 2, mt / (2 * mk)
        each = sum((k - mk) * (t - mt) for k, t in self.calls) / spread
        # Noise can make the slope tiny or negative: never below a tenth of the cheapest work seen.
        each = max(each, min(t / k for k, t in self.calls) / 10, 1e-3)
        return max(0.0, mt - each * mk), each

    def fitting(self, seconds: float, *, most: int) -> int:
        """How many works (1..``most``) one call is expected to finish in ``seconds``; 1 before the
        first call (it pays the session's warm-up)."""
        fit = self.estimate()
        if fit is None:
            return 1
        fixed, each = fit
        return max(1, min(most, int((seconds - fixed) / each)))


def run_rounds(
    ctx,
    streams: dict[str, Stream],
    pending: dict[str, list[StreamWork]],
    *,
    deadline: float | None = None,
    chunk: int = 50,
    cost: CallCost | None = None,
    recover=None,
):
    """Execute ``pending`` (stream name -> its works, in order) in rounds — round r: each stream's
    r-th work, at most ``chunk`` streams per ``fused.run_works`` call — and yield ``(name, work,
    outcome)`` (a ``RunResult`` or the exception) as each finishes. A failing work stops its stream;
    past ``deadline`` (``time.monotonic()``) no new call starts, and what was not started stays in
    ``pending``. Once the process has begun to exit (``process_exiting``) nothing new starts, and a
    work that failed meanwhile is not a failure: it stays in ``pending`` with those not started.
    With a deadline, each call holds as many requests as ``cost`` (this process's calls so far)
    expects to fit in the time left (at least one), so a slow machine overruns it by about one
    call, not by a round. A call with failures asks ``recover`` (``recovery.SparkRecovery``) whether
    the Spark session was lost: ``RECOVERED``, the failed works stay in ``pending`` and run again on
    the new session; ``AWAY``, they stay in ``pending`` and nothing more starts (the caller hands them
    back); otherwise the failures are yielded."""
    import time

    from cq_engine.streams.fused import WorkRequest, run_works

    cost = cost if cost is not None else CallCost()
    while any(pending.values()):
        names = [n for n, ws in pending.items() if ws]
        while names:
            size = chunk
            if process_exiting():
                return
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                size = cost.fitting(left, most=chunk)
            batch, names = names[:size], names[size:]
            requests = [WorkRequest(streams[n], pending[n][0]) for n in batch]
            started = time.monotonic()
            outcomes = run_works(ctx, requests)
            errors = [o for o in outcomes if isinstance(o, Exception)]
            if not errors:  # a call that failed (a server gone) says nothing of what a call costs
                cost.observe(len(requests), time.monotonic() - started)
            exiting = process_exiting()
            how = None
            if recover is not None and not exiting and errors:
                how = recover(errors)
            for request, outcome in zip(requests, outcomes):
                name = request.stream.name
                if isinstance(outcome, Exception) and (exiting or how in (RECOVERED, AWAY)):
                    # The pools of a process that exits refuse work, and a lost session is not the
                    # work's failure either: it stays pending, computed again or handed back.
                    continue
                pending[name] = [] if isinstance(outcome, Exception) else pending[name][1:]
                yield name, request.work, outcome
            if exiting or how == AWAY:
                return
