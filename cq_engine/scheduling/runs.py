"""What the batch sensor reads off running batch runs, orchestrator-neutral: which definitions a
running run has finished or nearly finished, and which keep pace with their period (ARCHITECTURE.md
§6.1). The adapter turns its orchestrator's records into ``KeyedRuns`` and ``SinkCommit`` values."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from cq_engine.times import UTC, parse_time


@dataclass(frozen=True)
class SinkCommit:
    """A sink's latest recorded commit: the run that made it, when it was recorded (epoch seconds),
    the end of the firing's range and the seconds the firing took (its share of a fused job)."""

    run_id: str
    timestamp: float
    range_end: datetime | None = None
    seconds: float | None = None


@dataclass(frozen=True)
class KeyedRuns:
    """Per run key: its run's status, its run id, the definitions its failed and left-out tags name
    (only runs that have either: what failed, and what a pipelined run left out because the run it
    followed did not commit it), how far its rounds got (``done_before``: every firing before it is
    done), how long the latest took (``round_seconds``) and when it said so (``progress_at``, epoch
    seconds; only runs that have them)."""

    status: dict[str, str] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)
    failed: dict[str, set[str]] = field(default_factory=dict)
    done_before: dict[str, datetime] = field(default_factory=dict)
    round_seconds: dict[str, float] = field(default_factory=dict)
    progress_at: dict[str, float] = field(default_factory=dict)


def committed_through(commit: SinkCommit | None, end: str) -> bool:
    """Whether ``commit`` (a sink's latest, or None) is of a firing whose range ends at or after
    ``end`` (ISO)."""
    return bool(commit and commit.range_end and commit.range_end >= parse_time(end, tz=UTC))


def finished_in(
    states: dict, running: dict[str, tuple[str, str]], runs: KeyedRuns, latest: dict[str, SinkCommit | None]
) -> set[str]:
    """The definitions (of ``running``: name -> (run id, range end of its last firing in its running
    batch run)) whose every firing there is committed: their sink's latest commit (``latest``) is
    that firing's, from that run, and was recorded before the run's latest progress
    (``progress_at``, set once a round's commits are all recorded): every definition a round
    finished comes free at the same tick, a definition done long before the others in its run
    (theirs a long catch-up) after its own round. By each sink's commit alone, a thousand of them
    landing over 10-50 s, a cold start split into runs of 192, 71 and 737 definitions that took
    windows to merge again. A run without progress: its definitions go on when it ends."""
    finished = set()
    for name, (run_id, end) in running.items():
        commit = latest.get(name)
        tagged = runs.progress_at.get(states[name].key or "", float("-inf"))
        # From that run no firing ends after its last, so committed through its end is that firing's.
        if commit and commit.run_id == run_id and committed_through(commit, end) and commit.timestamp <= tagged:
            finished.add(name)
    return finished


def caught_up_in(states: dict, ticks: dict, running: dict, runs: KeyedRuns) -> set[str]:
    """The definitions (of ``running``: in a running batch run) whose run has done all their firings
    there but the last, by the run's progress (``done_before``): every definition of a run at the
    same tick. Not by each sink's own commit: a thousand of them land over 10-30 s, and followed as
    they landed the definitions of one run split the next window into a run per tick. A run without
    progress (its write failed) is not followed; its definitions go on when it ends."""
    return {
        name
        for name, fire in penultimate(states, ticks, running).items()
        if runs.done_before.get(states[name].key or "", fire) > fire
    }


def penultimate(states: dict, ticks: dict, running: dict) -> dict[str, datetime]:
    """Per definition in a running batch run with several firings there: the firing before its last
    one."""
    ends = {}
    for name in running:
        s = states[name]
        if s.first and s.upto and s.first != s.upto:
            before = ticks[name].between(parse_time(s.first, tz=UTC), parse_time(s.upto, tz=UTC))
            if before:
                ends[name] = before[-1]
    return ends


def keeps_pace(
    commit: SinkCommit | None, every: timedelta, *, round_seconds: float | None = None, in_run: bool = False
) -> bool:
    """Whether a definition keeps pace with its period ``every``: its run's latest round took less
    than ``every`` (``round_seconds``, known for all of the run's definitions at once); without it,
    and outside a running run (``in_run``), its sink's latest ``commit`` is of a firing that took
    under half of it (in a fused round, its share of the job and its commit). Not known before
    either: a thousand commits land over 10-110 s, and a definition's pace known as its commit landed
    split the next window's batch a group per tick (also when only the run's first commits came
    before its round time: 11, 202, 475 and 312 definitions)."""
    if round_seconds is not None:
        return round_seconds < every.total_seconds()
    if in_run:
        return False
    return bool(commit and commit.seconds is not None and commit.seconds < every.total_seconds() / 2)
