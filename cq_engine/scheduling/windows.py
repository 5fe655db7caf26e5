"""Fixed-window batches, pure (``now`` is an argument): the decisions of an orchestrator that starts one
run per aligned time window and has it execute every firing of the window across definitions, the
engine's ledger being the cursor (the Airflow adapter's batched form, ``airflow_dags.batch``).

Where the Dagster batch sensor (``scheduling.batch``) keeps a cursor of its own and decides at every
evaluation, a window run plans once, at its start, from what the ledger holds as succeeded: per
definition the firings after its last succeeded one (none: from its first firing at or after the
window's start), up to the window's end. BLOCKED: all of them, in order; DISCARD: of those already due, only the latest (the
others came due while the orchestrator was behind, the firings IoTDB discards), then the window's
later ones (a round that starts after the next firing of a DISCARD definition is due is discarded
by ``resample.rounds.execute_rounds``). Runs of one window never overlap (the orchestrator allows one
at a time), so the ledger read at a run's start is the truth about the runs before it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from cq_engine.model import Definition
from cq_engine.schedule.ticks import Ticks
from cq_engine.scheduling.batch import MAX_FIRINGS_PER_DEFINITION
from cq_engine.times import UTC, iso

_US = timedelta(microseconds=1)
MIN_CADENCE = timedelta(seconds=10)  # a window run is a process start, a parse and a Spark session
MAX_CADENCE = timedelta(minutes=10)  # a run lives about one window; a longer one is hard to follow


def window_cadence(periods: list[timedelta], *, override: timedelta | None = None) -> timedelta:
    """The window length: ``override`` if given, else the greatest common divisor of ``periods`` (the
    definitions' EVERY or PERIOD, whole seconds), so aligned definitions fire at a window's start;
    at least ``MIN_CADENCE`` (a run then holds several firings of a faster definition, in rounds) and
    at most ``MAX_CADENCE``."""
    if override is not None:
        if override < timedelta(seconds=1):
            raise ValueError(f"a window cadence of {override} is below one second")
        return override
    seconds = [max(1, int(p.total_seconds())) for p in periods]
    gcd = math.gcd(*seconds) if seconds else 60
    return min(MAX_CADENCE, max(MIN_CADENCE, timedelta(seconds=gcd)))


def window_of(t: datetime, cadence: timedelta) -> tuple[datetime, datetime]:
    """The window ``[start, end)`` holding ``t`` (windows are multiples of ``cadence`` since the Unix
    epoch, UTC)."""
    us = cadence // _US
    start_us = math.floor(t.timestamp() * 1_000_000) // us * us
    start = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=start_us)
    return start, start + cadence


@dataclass(frozen=True)
class WindowPlan:
    """A window run's firings (definition -> firing times, in order), the DISCARD definitions among
    them, and one line per decision worth logging (skipped firings, stopped definitions, a backlog
    left to the next window)."""

    firings: dict[str, list[datetime]]
    discard: frozenset[str] = frozenset()
    notes: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(len(fs) for fs in self.firings.values())


def plan_window(
    definitions: list[Definition],
    *,
    ticks: dict[str, Ticks],
    last_fired: dict[str, datetime],
    window: tuple[datetime, datetime],
    now: datetime,
    paused: set[str] | frozenset[str] = frozenset(),
) -> WindowPlan:
    """The firings a window run executes (see the module docstring). ``last_fired``: per definition,
    the fire time of its latest succeeded firing or PERIOD tick in the ledger; ``window``: the run's
    ``[start, end)``; ``paused``: definitions whose switch is off (left out; their firings wait:
    BLOCKED runs them all once on again, DISCARD only the latest). A backlog longer than
    ``MAX_FIRINGS_PER_DEFINITION`` continues in the next window."""
    start, end = window
    firings: dict[str, list[datetime]] = {}
    discard: set[str] = set()
    notes: list[str] = []
    for d in definitions:
        if d.name in paused:
            notes.append(f"{d.name}: stopped (its DAG is paused); its firings wait")
            continue
        t = ticks[d.name]
        last = last_fired.get(d.name)
        if last is None:
            # Never fired: from its first firing at or after the window's start (IoTDB: at or after
            # deployment); earlier ones are a recalculation's (or a backfill's).
            first = t.next(start)
            if first is None or first >= end:
                continue
            fires = [first, *t.between(first + _US, end)]
        else:
            fires = t.between(last + _US, end)
        if not fires:
            continue
        if d.timeout_policy == "DISCARD":
            discard.add(d.name)
            due = [f for f in fires if f <= now]
            if len(due) > 1:
                notes.append(
                    f"{d.name}: DISCARD skipped {len(due) - 1} firing(s) up to {iso(due[-2])} (due while none ran)"
                )
            fires = due[-1:] + [f for f in fires if f > now]
        if len(fires) > MAX_FIRINGS_PER_DEFINITION:
            notes.append(
                f"{d.name}: {len(fires)} firings from {iso(fires[0])}: the first {MAX_FIRINGS_PER_DEFINITION} "
                "in this window, the rest in the next"
            )
            fires = fires[:MAX_FIRINGS_PER_DEFINITION]
        firings[d.name] = fires
    return WindowPlan(firings=firings, discard=frozenset(discard), notes=notes)


def firings_per_minute(ticks: list[Ticks]) -> float:
    """How many firings a minute ``ticks`` make together (each EVERY or PERIOD's share of a minute)."""
    return sum(timedelta(minutes=1) / t.every for t in ticks if t.every > timedelta(0))
