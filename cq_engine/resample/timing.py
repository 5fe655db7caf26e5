"""RESAMPLE timing (seed 004), pure: ``now`` is always an argument; aware datetimes, UTC inside.

Firing i runs at ``boundary + i*every`` (i >= 0) over ``[fire - start_offset, fire - end_offset)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from cq_engine.durations import format_duration, micros
from cq_engine.errors import TimeError
from cq_engine.model import Resample
from cq_engine.times import UTC, iso

TimeRange = tuple[datetime, datetime]


@dataclass(frozen=True)
class Firing:
    """One scheduled execution of a definition over its half-open time range."""

    definition: str
    fire_time: datetime
    time_range: TimeRange

    def as_dict(self) -> dict[str, str]:
        return {
            "fire_time": iso(self.fire_time),
            "range_start": iso(self.time_range[0]),
            "range_end": iso(self.time_range[1]),
        }


def _index_at_or_after(r: Resample, t: datetime) -> int:
    """Smallest i >= 0 with ``boundary + i*every >= t``."""
    delta = micros(t - r.boundary)
    if delta <= 0:
        return 0
    return -(-delta // micros(r.every))


def fire_time(r: Resample, index: int) -> datetime:
    return (r.boundary + index * r.every).astimezone(UTC)


def time_range(r: Resample, fire: datetime) -> TimeRange:
    """The range firing ``fire`` computes: ``[fire - start_offset, fire - end_offset)``."""
    return (fire - r.start_offset).astimezone(UTC), (fire - r.end_offset).astimezone(UTC)


def first_firing(r: Resample, *, deployed_at: datetime) -> datetime:
    """BOUNDARY if deployment is not later, else the first ``boundary + i*every`` at or after it."""
    return fire_time(r, _index_at_or_after(r, deployed_at))


def firing_times(r: Resample, *, start: datetime, count: int) -> list[datetime]:
    """The next ``count`` firing times at or after ``start``."""
    first = _index_at_or_after(r, start)
    return [fire_time(r, first + k) for k in range(count)]


def firing_times_between(r: Resample, *, start: datetime, end: datetime) -> list[datetime]:
    """Firing times in ``[start, end)``."""
    out, i = [], _index_at_or_after(r, start)
    while (t := fire_time(r, i)) < end:
        out.append(t)
        i += 1
    return out


def is_firing_time(r: Resample, t: datetime) -> bool:
    delta = micros(t - r.boundary)
    return delta >= 0 and delta % micros(r.every) == 0


def latest_firing(r: Resample, *, now: datetime) -> datetime | None:
    """The last firing time at or before ``now``, or None before the boundary."""
    if now < r.boundary:
        return None
    return fire_time(r, micros(now - r.boundary) // micros(r.every))


def check_firing_time(name: str, r: Resample, t: datetime) -> Firing:
    """The firing of ``name`` at ``t``; a ``TimeError`` naming the nearest firing times otherwise."""
    if is_firing_time(r, t):
        return Firing(name, t.astimezone(UTC), time_range(r, t))
    after = first_firing(r, deployed_at=t)
    before = latest_firing(r, now=t)
    near = " or ".join(iso(x) for x in (before, after) if x is not None)
    raise TimeError(
        f"{iso(t)} is not a firing time of {name!r} (it fires every "
        f"{format_duration(r.every)} from {iso(r.boundary)}); nearest: {near}"
    )


def recalculation_range(r: Resample, *, start: datetime, end: datetime) -> tuple[list[datetime], TimeRange]:
    """Firings whose ranges lie inside ``[start, end)`` and the union of those ranges.

    Raises ``TimeError`` when no firing's range fits, naming the smallest range that would.
    """
    if end <= start:
        raise TimeError(f"recalculate: --to {iso(end)} must be after --from {iso(start)}")
    fires = firing_times_between(r, start=start + r.start_offset, end=end + r.end_offset + timedelta(microseconds=1))
    fires = [f for f in fires if time_range(r, f)[1] <= end]
    if not fires:
        f = first_firing(r, deployed_at=start + r.start_offset)
        lo, hi = time_range(r, f)
        raise TimeError(
            f"recalculate: no firing's range lies within [{iso(start)}, {iso(end)}); "
            f"the first one after --from covers [{iso(lo)}, {iso(hi)})"
        )
    return fires, (time_range(r, fires[0])[0], time_range(r, fires[-1])[1])


@dataclass(frozen=True)
class Coverage:
    """The ranges of ``count`` consecutive firings: ``[start + j*every, start + j*every + length)``.

    One firing is ``count == 1``; a recalculation chunk is several. Output rows (window starts or row
    times) are emitted only below ``emit_end``, so consecutive chunks never write the same row.
    """

    start: datetime
    every: timedelta
    length: timedelta
    count: int
    emit_end: datetime

    @property
    def end(self) -> datetime:
        return self.start + (self.count - 1) * self.every + self.length

    @property
    def read_range(self) -> TimeRange:
        return self.start, self.end


def coverage_of(r: Resample, fires: list[datetime], *, emit_end: datetime | None = None) -> Coverage:
    """The coverage of consecutive firing times ``fires`` of ``r``."""
    lo, hi = time_range(r, fires[0])
    cov = Coverage(start=lo, every=r.every, length=hi - lo, count=len(fires), emit_end=lo)
    return Coverage(
        start=lo,
        every=r.every,
        length=hi - lo,
        count=len(fires),
        emit_end=emit_end if emit_end is not None else cov.end,
    )


def chunk_firings(fires: list[datetime], *, size: int) -> list[list[datetime]]:
    """Split consecutive firings into chunks of at most ``size``."""
    size = max(1, size)
    return [fires[i : i + size] for i in range(0, len(fires), size)]
