"""The firing instants of a scheduled definition — a continuous query's RESAMPLE or a stream's
PERIOD — behind one small interface, so schedules, tick sensors and ``cq tick`` treat both alike."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from cq_engine.durations import format_duration
from cq_engine.errors import CQError
from cq_engine.model import ContinuousQuery, PeriodTrigger, Resample, Stream
from cq_engine.resample import timing
from cq_engine.schedule.cron import CronPlan, period_cron, period_ticks, resample_cron
from cq_engine.times import EPOCH, UTC, iso, parse_time

_US = timedelta(microseconds=1)
TimeRange = tuple[datetime, datetime]


@dataclass(frozen=True)
class Ticks:
    """Instants in ``[start, end)`` (``between``), the time range each one covers, a cron plan when
    one exists, and the first instant at or after a time when it is known directly (``first_from``)."""

    every: timedelta
    description: str
    between: Callable[[datetime, datetime], list[datetime]]
    range_of: Callable[[datetime], TimeRange]
    cron: Callable[[datetime], CronPlan | None]
    first_from: Callable[[datetime], datetime] | None = None

    def is_tick(self, t: datetime) -> bool:
        return bool(self.between(t, t + _US))

    def latest(self, now: datetime) -> datetime | None:
        """The last tick at or before ``now``: looked for in the last two periods (and an hour, for a
        daylight-saving shift) first, then in the last two days. The batch sensor asks this of every
        definition at each evaluation: two days of 30 s ticks (5,760) each were most of a thousand
        definitions' evaluation time."""
        for lookback in (self.every * 2 + timedelta(hours=1), max(self.every, timedelta(days=1)) * 2):
            found = self.between(now - lookback, now + _US)
            if found:
                return found[-1]
        return None

    def next(self, at: datetime) -> datetime | None:
        """The first tick at or after ``at`` (None if none comes): ``first_from`` when the schedule
        knows it directly, else looked for in the next two periods and a day (a PERIOD's ticks start
        again at each local midnight, or every period past a day)."""
        if self.first_from is not None:
            return self.first_from(at)
        found = self.between(at, at + max(self.every, timedelta(days=1)) * 2 + timedelta(hours=1))
        return found[0] if found else None

    def due(self, *, cursor: datetime | None, now: datetime) -> list[datetime]:
        """Ticks after ``cursor`` up to ``now``; without a cursor only the latest one."""
        latest = self.latest(now)
        if latest is None:
            return []
        if cursor is None:
            return [latest]
        return self.between(cursor + _US, latest + _US)


def ticks_of(definition: ContinuousQuery | Stream, *, timezone: str, created: datetime = EPOCH) -> Ticks:
    """The ticks of a continuous query (RESAMPLE) or a PERIOD stream (created: its creation time)."""
    if isinstance(definition, ContinuousQuery):
        return resample_ticks(definition.resample, timezone=timezone)
    trig = definition.trigger
    assert isinstance(trig, PeriodTrigger)
    return period_ticks_of(trig, timezone=timezone, created=created)


def resample_ticks(r: Resample, *, timezone: str) -> Ticks:
    """The firings of a RESAMPLE clause (``timezone``: where its cron plan is expressed)."""
    return Ticks(
        every=r.every,
        description=f"every {format_duration(r.every)} from {iso(r.boundary)}",
        between=lambda a, b: timing.firing_times_between(r, start=a, end=b),
        range_of=lambda t: timing.time_range(r, t),
        cron=lambda now: resample_cron(every=r.every, boundary=r.boundary, timezone=timezone, verify_from=now),
        first_from=lambda t: timing.first_firing(r, deployed_at=t),
    )


def period_ticks_of(trig: PeriodTrigger, *, timezone: str, created: datetime = EPOCH) -> Ticks:
    """The ticks of ``PERIOD(period, offset)`` in ``timezone``, from ``created`` on."""

    def between(a: datetime, b: datetime) -> list[datetime]:
        return period_ticks(
            interval=trig.period, offset=trig.offset, timezone=timezone, created=created, start=a, end=b
        )

    def range_of(t: datetime) -> TimeRange:
        before = period_ticks(
            interval=trig.period,
            offset=trig.offset,
            timezone=timezone,
            created=EPOCH,
            start=t - max(trig.period, timedelta(days=1)) * 2,
            end=t,
        )
        return (before[-1] if before else t - trig.period), t

    return Ticks(
        every=trig.period,
        description=f"PERIOD({format_duration(trig.period)}, {format_duration(trig.offset)}) in {timezone}",
        between=between,
        range_of=range_of,
        cron=lambda now: period_cron(
            interval=trig.period, offset=trig.offset, timezone=timezone, created=created, verify_from=now
        ),
    )


CURSOR_FORMAT = 1


def tick_cursor(last: datetime) -> str:
    """A tick sensor's cursor: the last tick requested, as versioned JSON."""
    return json.dumps({"format": CURSOR_FORMAT, "last": iso(last)}, separators=(",", ":"))


def parse_tick_cursor(text: str | None) -> datetime | None:
    """The last tick of a :func:`tick_cursor`; a bare ISO-8601 time (the format before the version
    field) still reads. Anything else is a ``CQError`` quoting it."""
    if not text:
        return None
    if not text.lstrip().startswith("{"):
        return parse_time(text, tz=UTC, bounded=False)
    try:
        raw = json.loads(text)
        fmt, last = raw.get("format"), raw["last"]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise CQError(f"tick sensor cursor {text[:200]!r} is not one cq-engine wrote") from None
    if not isinstance(fmt, int) or fmt > CURSOR_FORMAT:
        raise CQError(
            f"tick sensor cursor {text[:200]!r}: format {fmt!r} was written by a newer cq-engine "
            f"(this one reads up to {CURSOR_FORMAT})"
        )
    return parse_time(last, tz=UTC, bounded=False)
