"""What a sink's health is made of, as pure functions (no Dagster, no Spark, no I/O): how stale a sink
may get before it counts as late (its freshness window), and which firings the schedule owed over a
recent horizon that the ledger does not show as done (the completeness check). ``dagster_defs.health``
turns both into Dagster's freshness policies and asset checks (docs/dagster/health.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from cq_engine.durations import format_duration
from cq_engine.model import (
    ContinuousQuery,
    CountTrigger,
    Definition,
    EkSessionTrigger,
    EkSlidingTrigger,
    PeriodTrigger,
    SessionTrigger,
    SlidingTrigger,
)
from cq_engine.times import iso

if TYPE_CHECKING:
    from cq_engine.storage.ledger import LedgerEntry

# Dagster refuses a time-window freshness policy shorter than one minute.
MIN_WINDOW = timedelta(minutes=1)
FIRING_KINDS = ("firing", "period")
MAX_REPORTED_RANGES = 50  # the check's metadata lists at most this many missing ranges (the newest)


@dataclass(frozen=True)
class FreshnessWindow:
    """A sink is late (``fail``) when its newest materialization is older than the cadence at which
    it should change (``expected``) plus the grace; ``warn`` (when Dagster can express it) flags a
    sink past its cadence but still within the grace."""

    expected: timedelta
    grace: timedelta
    fail: timedelta
    warn: timedelta | None
    why: str


def expected_cadence(definition: Definition, *, lead: timedelta = timedelta(0)) -> tuple[timedelta, str]:
    """How often the sink should receive its next result, and why: a continuous query's (or PERIOD
    stream's) EVERY plus the batch lead (a firing may be requested that much early); a window
    stream's window step plus its WATERMARK (a window closes that long after its end). Data-shaped
    windows (state, event, count) close when data says so: only their watermark."""
    if isinstance(definition, ContinuousQuery):
        every = definition.resample.every
        return every + lead, f"EVERY {format_duration(every)} + batch lead {format_duration(lead)}"
    trig = definition.trigger
    if isinstance(trig, PeriodTrigger):
        return trig.period + lead, f"PERIOD {format_duration(trig.period)} + batch lead {format_duration(lead)}"
    watermark = definition.options.watermark
    step, what = timedelta(0), f"{trig.kind} windows close on data"
    if isinstance(trig, SlidingTrigger):
        step, what = trig.sliding, f"window step {format_duration(trig.sliding)}"
    elif isinstance(trig, SessionTrigger):
        step, what = trig.gap, f"session gap {format_duration(trig.gap)}"
    elif isinstance(trig, EkSessionTrigger):
        step, what = trig.timeout, f"session timeout {format_duration(trig.timeout)}"
    elif isinstance(trig, EkSlidingTrigger):
        step, what = trig.size + trig.delay, f"window {format_duration(trig.size + trig.delay)}"
    elif isinstance(trig, CountTrigger):
        what = "count windows close on data"
    return step + watermark, f"{what} + WATERMARK {format_duration(watermark)}"


def freshness_window(definition: Definition, *, grace: timedelta, lead: timedelta = timedelta(0)) -> FreshnessWindow:
    """The definition's :class:`FreshnessWindow`: ``grace`` is its ``-- cq: freshness_grace`` if it
    has one, else the caller's default (``CQ_FRESHNESS_GRACE``)."""
    grace = definition.freshness_grace if definition.freshness_grace is not None else grace
    expected, why = expected_cadence(definition, lead=lead)
    fail = max(MIN_WINDOW, expected + grace)
    warn = expected if MIN_WINDOW <= expected < fail else None
    return FreshnessWindow(
        expected=expected, grace=grace, fail=fail, warn=warn, why=f"{why} + grace {format_duration(grace)}"
    )


# -- completeness -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Gap:
    """Consecutive owed firings (or stream runs) with the same reason the sink lacks their range."""

    start: datetime
    end: datetime
    # "missing" (never ran), "failed" (ran, failed, not redone), "skipped" (DISCARD), "empty" (committed
    # no row while rows for its range were still arriving: its source received them after it read)
    reason: str
    count: int

    def to_json(self) -> dict:
        return {"start": iso(self.start), "end": iso(self.end), "reason": self.reason, "count": self.count}


@dataclass(frozen=True)
class Completeness:
    """The owed firings of ``[since, until]`` against the ledger. It passes when nothing is missing or
    failed; DISCARD skips (by design under load) only warn."""

    since: datetime | None
    until: datetime | None
    owed: int
    gaps: tuple[Gap, ...] = ()

    def count(self, reason: str) -> int:
        return sum(g.count for g in self.gaps if g.reason == reason)

    @property
    def passed(self) -> bool:
        return not any(g.reason in ("missing", "failed", "empty") for g in self.gaps)

    @property
    def description(self) -> str:
        if self.until is None:
            return "nothing ran yet within the horizon"
        head = f"{self.owed} owed in [{iso(self.since)}, {iso(self.until)}]" if self.since else "no runs owed"
        if not self.gaps:
            return f"complete: {head}"
        labels = {"empty": "empty (no row written, though rows for their range arrived later)"}
        parts = [
            f"{self.count(r)} {labels.get(r, r)}" for r in ("missing", "failed", "empty", "skipped") if self.count(r)
        ]
        return f"{', '.join(parts)} of {head}"

    def metadata(self) -> dict:
        """JSON-able: counts, the horizon and the newest gaps."""
        return {
            "owed": self.owed,
            "missing": self.count("missing"),
            "failed": self.count("failed"),
            "skipped": self.count("skipped"),
            "empty": self.count("empty"),
            "since": iso(self.since) if self.since else None,
            "until": iso(self.until) if self.until else None,
            "missing_ranges": [g.to_json() for g in self.gaps[-MAX_REPORTED_RANGES:]],
        }


def _merge(items: list[tuple[datetime, datetime, str]]) -> tuple[Gap, ...]:
    """Adjacent items (in order) with one reason become one gap spanning their ranges."""
    gaps: list[Gap] = []
    for lo, hi, reason in items:
        last = gaps[-1] if gaps else None
        if last and last.reason == reason and lo <= last.end:
            gaps[-1] = Gap(start=last.start, end=max(last.end, hi), reason=reason, count=last.count + 1)
        else:
            gaps.append(Gap(start=lo, end=hi, reason=reason, count=1))
    return tuple(gaps)


def _covered(time_range: tuple[datetime, datetime], ranges: list[tuple[datetime, datetime]]) -> bool:
    """Is ``time_range`` inside one of ``ranges`` (a recalculation's)?"""
    return any(lo <= time_range[0] and time_range[1] <= hi for lo, hi in ranges)


def firing_completeness(
    *,
    between: Callable[[datetime, datetime], list[datetime]],
    range_of: Callable[[datetime], tuple[datetime, datetime]],
    entries: Iterable[LedgerEntry],
    since: datetime,
    discard: bool,
    every: timedelta | None = None,
    max_owed: int | None = None,
    arrived_later: Callable[[list[LedgerEntry]], set[datetime]] | None = None,
) -> Completeness:
    """A continuous query's (or PERIOD stream's) firings owed from ``since`` (or its first recorded
    firing, if later) up to its newest recorded firing, against its ledger ``entries``: a firing is
    done when a succeeded firing at that time or a succeeded recalculation over its whole range is
    recorded. What is due after the newest firing is the freshness policy's business, not this.
    With ``every`` and ``max_owed``, only about the newest ``max_owed`` firings are owed.
    ``arrived_later`` (given the succeeded firings that wrote no row): the fire times among them whose
    source received rows for their range after the version they read; those are not done ("empty")."""
    entries = list(entries)
    fired = [e for e in entries if e.kind in FIRING_KINDS and e.fire_time is not None]
    if not fired:
        return Completeness(since=None, until=None, owed=0)
    first = min(e.fire_time for e in fired if e.fire_time is not None)
    until = max(e.fire_time for e in fired if e.fire_time is not None)
    start = max(since, first)
    if every is not None and max_owed is not None:
        start = max(start, until - every * max_owed)
    if start > until:
        return Completeness(since=None, until=until, owed=0)
    owed = between(start, until + timedelta(microseconds=1))
    ok = {e.fire_time for e in fired if e.status == "succeeded"}
    failed = {e.fire_time for e in fired if e.status == "failed"}
    empty: set[datetime] = set()
    if arrived_later is not None:
        zero = [e for e in fired if e.status == "succeeded" and e.rows_written == 0 and e.fire_time is not None]
        zero = [e for e in zero if start <= e.fire_time <= until]  # type: ignore[operator]
        # A firing run again (a retry, its own run) that wrote rows is done, whatever an earlier one wrote.
        wrote = {e.fire_time for e in fired if e.status == "succeeded" and e.rows_written > 0}
        empty = arrived_later([e for e in zero if e.fire_time not in wrote]) if zero else set()
        ok -= empty
    recalculated = [
        (e.range_start, e.range_end) for e in entries if e.kind == "recalculate" and e.status == "succeeded"
    ]
    items = []
    for fire in owed:
        if fire in ok:
            continue
        time_range = range_of(fire)
        if _covered(time_range, recalculated):
            continue
        reason = "empty" if fire in empty else "failed" if fire in failed else "skipped" if discard else "missing"
        items.append((*time_range, reason))
    return Completeness(since=start, until=until, owed=len(owed), gaps=_merge(items))


def run_completeness(*, entries: Iterable[LedgerEntry], since: datetime) -> Completeness:
    """A window-triggered stream's runs since ``since``: what its data makes due is only known to its
    sensor, so the check finds the runs that failed and whose range no later succeeded run or
    recalculation has covered since. Ignored rows (late, expired) are by the stream's options."""
    runs = sorted(
        (e for e in entries if e.kind != "ignored" and e.started_at >= since),
        key=lambda e: (e.started_at, e.range_start),
    )
    if not runs:
        return Completeness(since=None, until=None, owed=0)
    items = []
    for i, run in enumerate(runs):
        if run.status != "failed":
            continue
        later = [(e.range_start, e.range_end) for e in runs[i + 1 :] if e.status == "succeeded"]
        if not _covered((run.range_start, run.range_end), later):
            items.append((run.range_start, run.range_end, "failed"))
    items.sort()
    return Completeness(
        since=runs[0].range_start, until=max(r.range_end for r in runs), owed=len(runs), gaps=_merge(items)
    )
