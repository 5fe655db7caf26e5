"""Firing instants ("ticks") of RESAMPLE and PERIOD definitions, and their exact cron form.

Pure functions over timezone-aware datetimes; UTC inside. A definition becomes a Dagster schedule
only when a list of 5-field cron strings, evaluated the way Dagster evaluates them in the plan's
``execution_timezone``, yields exactly its ticks; otherwise :func:`compile_cron` returns ``None`` and
the caller uses a tick sensor (ARCHITECTURE.md §5, §6).

DST rule for PERIOD (a documented choice): only the daily base point is calendar-aware. It is the
local date's first instant (its wall-clock midnight, or the end of a gap that swallows midnight).
Everything after it is exact elapsed time: ``midnight + offset + k*interval``. So no tick has a
non-existent or ambiguous wall time to resolve; on a 23-hour or 25-hour day the ticks keep their
spacing and the day simply has fewer or more of them. Wall times after the change move by the
change: 5h30m in America/New_York on 2025-03-09 is 00:00, 06:30, 12:00, 17:30, 23:00 EDT. Intervals
of a day or more never reset, so 1d PERIOD drifts by an hour in wall time across a DST change
(it is fixed in UTC).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

from cq_engine.times import EPOCH, UTC

_SECOND = timedelta(seconds=1)
_MINUTE = timedelta(minutes=1)
_DAY = timedelta(days=1)
_EPOCH_DATE = date(1970, 1, 1)
_FIELD_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))

Ticks = Callable[[datetime, datetime], "list[datetime]"]


@dataclass(frozen=True)
class CronPlan:
    """Cron strings for ``ScheduleDefinition(cron_schedule=list(cron_strings),
    execution_timezone=timezone)``: their merged firings are exactly the definition's ticks."""

    cron_strings: tuple[str, ...]
    timezone: str


# --- ticks -------------------------------------------------------------------------------------


def resample_ticks(*, every: timedelta, boundary: datetime, start: datetime, end: datetime) -> list[datetime]:
    """IoTDB RESAMPLE ticks ``boundary + i*every`` (i >= 0, absolute UTC arithmetic) in [start, end)."""
    _positive(every, "every")
    boundary, start, end = _utc(boundary, "boundary"), _utc(start, "start"), _utc(end, "end")
    lo = max(start, boundary)
    if lo >= end:
        return []
    first, stop = _ceil_div(lo - boundary, every), _ceil_div(end - boundary, every)
    return [boundary + i * every for i in range(first, stop)]


def period_ticks(
    *,
    interval: timedelta,
    offset: timedelta,
    timezone: str,
    created: datetime,
    start: datetime,
    end: datetime,
) -> list[datetime]:
    """TDengine PERIOD(interval, offset) ticks in [start, end) that are at or after ``created``.

    interval < 1 day: for each local date d of ``timezone``, ``M_d + offset + k*interval`` (k >= 0)
    while before ``M_{d+1}``, where ``M_d`` is the first instant of d (wall-clock midnight; fold 0).
    interval >= 1 day: ``M_c + offset + k*interval`` (k >= 1), c the local date of ``created``, no reset.
    Offsets and intervals are exact elapsed time (see the module docstring for the DST consequences).
    """
    _positive(interval, "interval")
    if offset < timedelta(0):
        raise ValueError(f"offset must not be negative: {offset!r}")
    tz = ZoneInfo(timezone)
    created, start, end = _utc(created, "created"), _utc(start, "start"), _utc(end, "end")
    lo = max(start, created)
    if lo >= end:
        return []
    if interval >= _DAY:
        base = local_midnight(created.astimezone(tz).date(), tz) + offset
        first = max(1, _ceil_div(lo - base, interval))
        return [base + k * interval for k in range(first, _ceil_div(end - base, interval))]
    out: list[datetime] = []
    day = lo.astimezone(tz).date()
    day_start = local_midnight(day, tz)
    while day_start < end:
        day += _DAY
        next_start = local_midnight(day, tz)
        base = day_start + offset
        first = max(0, _ceil_div(lo - base, interval))
        stop = _ceil_div(min(next_start, end) - base, interval)
        out.extend(base + k * interval for k in range(first, stop))
        day_start = next_start
    return out


# --- cron --------------------------------------------------------------------------------------


def compile_cron(
    *,
    ticks: Ticks,
    every: timedelta,
    anchor: datetime,
    timezone: str,
    verify_from: datetime,
    horizon: timedelta = timedelta(days=366),
    max_strings: int = 24,
) -> CronPlan | None:
    """Cron strings firing exactly at ``ticks(verify_from, verify_from + horizon)``, or ``None``.

    ``every`` is the tick spacing (RESAMPLE every, PERIOD interval) and ``anchor`` an instant the
    ticks share their seconds with when ``every`` is whole minutes (RESAMPLE boundary, PERIOD
    creation-day midnight + offset); both only reject hopeless cases before ticks are generated.
    Tries ``timezone``, then ``"UTC"``. A candidate is derived from the ticks' local wall times
    (the set of (hour, minute) per weekday in the first whole week; one string per group of minutes
    sharing the same hours, or of hours sharing the same minutes) and verified over the horizon:
    fields are expanded with croniter's parser, each matching wall time is mapped to its instant,
    and the merged, deduplicated instants must equal the ticks. A candidate with any matching wall
    time that is non-existent or ambiguous in its zone is rejected: there Dagster applies its own
    DST rules (post-transition time, or both/second occurrence), which the engine's ticks do not
    follow. The plan is exact for the verified horizon; recompile to extend it. Any daily pattern
    fits in 24 strings (one per hour); longer lists (7m's weekly cycle needs 49) are refused in
    favour of a tick sensor.
    """
    if every < _MINUTE:
        return None
    anchor, verify_from = _utc(anchor, "anchor"), _utc(verify_from, "verify_from")
    if every % _MINUTE == timedelta(0) and (anchor - EPOCH) % _MINUTE:
        return None
    end = verify_from + horizon
    secs: list[int] = []
    for t in ticks(verify_from, end):
        if t.tzinfo is None:
            raise ValueError(f"tick must be timezone-aware: {t!r}")
        if t.microsecond:
            return None
        ts = t.timestamp()  # whole seconds: an exact float
        if ts % 60:
            return None
        secs.append(int(ts))
    if not secs:
        return None
    want = set(secs)
    lo, hi = -((EPOCH - verify_from) // _SECOND), -((EPOCH - end) // _SECOND)  # ceil seconds
    for name in dict.fromkeys((timezone, "UTC")):
        tz = ZoneInfo(name)
        strings = _propose(secs, tz, lo, hi)
        if strings and len(strings) <= max_strings and _expand(strings, tz, lo, hi) == want:
            return CronPlan(tuple(strings), name)
    return None


def resample_cron(
    *,
    every: timedelta,
    boundary: datetime,
    timezone: str,
    verify_from: datetime,
    horizon: timedelta = timedelta(days=366),
) -> CronPlan | None:
    """:func:`compile_cron` for :func:`resample_ticks`."""
    return compile_cron(
        ticks=lambda a, b: resample_ticks(every=every, boundary=boundary, start=a, end=b),
        every=every,
        anchor=boundary,
        timezone=timezone,
        verify_from=verify_from,
        horizon=horizon,
    )


def period_cron(
    *,
    interval: timedelta,
    offset: timedelta,
    timezone: str,
    created: datetime,
    verify_from: datetime,
    horizon: timedelta = timedelta(days=366),
) -> CronPlan | None:
    """:func:`compile_cron` for :func:`period_ticks`."""
    tz = ZoneInfo(timezone)
    anchor = local_midnight(_utc(created, "created").astimezone(tz).date(), tz) + offset
    return compile_cron(
        ticks=lambda a, b: period_ticks(
            interval=interval, offset=offset, timezone=timezone, created=created, start=a, end=b
        ),
        every=interval,
        anchor=anchor,
        timezone=timezone,
        verify_from=verify_from,
        horizon=horizon,
    )


# --- synthesis ---------------------------------------------------------------------------------


def _propose(secs: list[int], tz: ZoneInfo, lo: int, hi: int) -> list[str] | None:
    """Cron strings repeating the ticks' local wall times of the first whole week in [lo, hi)."""
    offset_at = _offset_lookup(tz)
    first_day = (lo + offset_at(lo)) // 86_400 + 1
    if (hi - 1 + offset_at(hi - 1)) // 86_400 - first_day < 7:
        return None
    limit = (first_day + 8) * 86_400 + 14 * 3_600  # past the week's last instant in any zone
    by_day: dict[int, set[tuple[int, int]]] = {day: set() for day in range(first_day, first_day + 7)}
    for s in secs:
        if s < limit:
            day, tod = divmod(s + offset_at(s), 86_400)
            if day in by_day:
                if tod % 60:
                    return None
                by_day[day].add(divmod(tod // 60, 60))
    per_weekday = {(day + 4) % 7: frozenset(times) for day, times in by_day.items()}  # 1970-01-01: Thu
    weekdays_by_times: dict[frozenset[tuple[int, int]], list[int]] = {}
    for weekday, times in sorted(per_weekday.items()):
        weekdays_by_times.setdefault(times, []).append(weekday)
    keyed = []
    for times, weekdays in weekdays_by_times.items():
        if times:
            dow = _field(weekdays, 0, 6)
            keyed += [((first, weekdays[0]), f"{m} {h} * * {dow}") for first, m, h in _time_strings(times)]
    return [s for _, s in sorted(keyed)]


def _time_strings(times: frozenset[tuple[int, int]]) -> list[tuple[tuple[int, int], str, str]]:
    """(earliest time, minute field, hour field) per string; the fewer of two groupings."""

    def group(pairs: list[tuple[int, int]]) -> dict[frozenset[int], list[int]]:
        inner: dict[int, set[int]] = {}
        for key, value in pairs:
            inner.setdefault(key, set()).add(value)
        out: dict[frozenset[int], list[int]] = {}
        for key in sorted(inner):
            out.setdefault(frozenset(inner[key]), []).append(key)
        return out

    by_minute = group([(m, h) for h, m in times])  # hours -> minutes sharing them
    by_hour = group([(h, m) for h, m in times])  # minutes -> hours sharing them
    if len(by_hour) < len(by_minute):
        return [
            ((hours[0], min(mins)), _field(sorted(mins), 0, 59), _field(hours, 0, 23))
            for mins, hours in by_hour.items()
        ]
    return [
        ((min(hours), mins[0]), _field(mins, 0, 59), _field(sorted(hours), 0, 23)) for hours, mins in by_minute.items()
    ]


def _field(values: list[int], lo: int, hi: int) -> str:
    """Exact spelling: ``*``; ``*/n`` when n divides the field's size; ``a-b/n`` for 5+ evenly
    spaced values; else a list of values and runs (``0,11,22``, ``1-5,9``)."""
    n = len(values)
    if values == list(range(lo, hi + 1)):
        return "*"
    if n >= 2:
        step = values[1] - values[0]
        if step > 1 and values == list(range(values[0], values[-1] + 1, step)):
            if values[0] == lo and values[-1] + step > hi and (hi - lo + 1) % step == 0:
                return f"*/{step}"
            if n >= 5:
                return f"{values[0]}-{values[-1]}/{step}"
    parts, i = [], 0
    while i < n:
        j = i
        while j + 1 < n and values[j + 1] == values[j] + 1:
            j += 1
        parts += [f"{values[i]}-{values[j]}"] if j - i >= 2 else [str(v) for v in values[i : j + 1]]
        i = j + 1
    return ",".join(parts)


# --- verification ------------------------------------------------------------------------------


def _expand(strings: list[str], tz: ZoneInfo, lo: int, hi: int) -> set[int] | None:
    """Instants (epoch seconds) in [lo, hi) at which the cron strings fire in ``tz``; ``None`` if
    any matching wall time is non-existent or ambiguous there (Dagster's DST rules would apply)."""
    specs = [_parse(s) for s in strings]
    offset_at = _offset_lookup(tz)
    out: set[int] = set()
    for day in range((lo + offset_at(lo)) // 86_400, (hi - 1 + offset_at(hi - 1)) // 86_400 + 1):
        today = _EPOCH_DATE + timedelta(days=day)
        day_offset = _day_offset(day, tz)
        for minutes, hours, doms, months, dows in specs:
            if not _day_matches(today, (day + 4) % 7, doms, months, dows):
                continue
            for h in hours:
                for m in minutes:
                    wall = day * 86_400 + h * 3_600 + m * 60
                    if day_offset is None:
                        s = _wall_to_instant(wall, tz)
                        if s is None:
                            return None
                    else:
                        s = wall - day_offset
                    if lo <= s < hi:
                        out.add(s)
    return out


def _parse(cron: str):
    """Fields of a 5-field cron string as croniter expands them; ``None`` for a ``*`` day field."""
    if len(cron.split()) != 5:
        raise ValueError(f"not a 5-field cron string: {cron!r}")
    from croniter import croniter  # only here: a command that never expands a cron string skips its import

    fields, nth_weekday, *_ = croniter.expand(cron)
    if nth_weekday:
        raise ValueError(f"unsupported cron field in {cron!r}")
    out: list[tuple[int, ...] | frozenset[int] | None] = []
    for index, (values, (lo, hi)) in enumerate(zip(fields, _FIELD_RANGES)):
        if values == ["*"]:
            out.append(tuple(range(lo, hi + 1)) if index < 2 else None)
        else:
            ints = [v for v in values if isinstance(v, int)]
            if len(ints) != len(values):
                raise ValueError(f"unsupported cron field in {cron!r}")
            ints = [0 if index == 4 and v == 7 else v for v in ints]  # Sunday is 0 or 7
            out.append(tuple(ints) if index < 2 else frozenset(ints))
    return out


def _day_matches(today: date, dow: int, doms, months, dows) -> bool:
    """croniter's (and Dagster's) day rule: day-of-month OR day-of-week when both are restricted."""
    if months is not None and today.month not in months:
        return False
    if doms is None or dows is None:
        return (doms is None or today.day in doms) and (dows is None or dow in dows)
    return today.day in doms or dow in dows


def _day_offset(day: int, tz: ZoneInfo) -> int | None:
    """The UTC offset (s) of local day ``day`` if constant all day, else ``None``.

    Instants of a local day lie within [day start - 14h, day end + 12h]; equal offsets at both ends
    mean no change in between (zones never change twice within ~50 hours).
    """
    before = _offset(day * 86_400 - 14 * 3_600, tz)
    after = _offset((day + 1) * 86_400 + 12 * 3_600, tz)
    return before if before == after else None


def _wall_to_instant(wall: int, tz: ZoneInfo) -> int | None:
    """Epoch seconds of a local wall time, ``None`` when it does not exist or exists twice."""
    naive = datetime(1970, 1, 1) + timedelta(seconds=wall)
    first, second = naive.replace(tzinfo=tz).utcoffset(), naive.replace(tzinfo=tz, fold=1).utcoffset()
    if first != second or first is None:
        return None
    return wall - first // _SECOND


def _offset_lookup(tz: ZoneInfo) -> Callable[[int], int]:
    """``instant -> UTC offset (s)``, cached per UTC day without an offset change."""
    cache: dict[int, int | None] = {}

    def offset_at(s: int) -> int:
        day = s // 86_400
        if day not in cache:
            a, b = _offset(day * 86_400, tz), _offset(day * 86_400 + 86_399, tz)
            cache[day] = a if a == b else None
        cached = cache[day]
        return _offset(s, tz) if cached is None else cached

    return offset_at


def _offset(s: int, tz: ZoneInfo) -> int:
    offset = (EPOCH + timedelta(seconds=s)).astimezone(tz).utcoffset()
    assert offset is not None  # an aware datetime always has one
    return offset // _SECOND


# --- helpers -----------------------------------------------------------------------------------


def local_midnight(day: date, tz: ZoneInfo) -> datetime:
    """First instant of local date ``day`` (fold 0: the first midnight, or the end of a gap at it)."""
    return datetime(day.year, day.month, day.day, tzinfo=tz).astimezone(UTC)


def _ceil_div(a: timedelta, b: timedelta) -> int:
    return -((-a) // b)


def _positive(value: timedelta, what: str) -> None:
    if value <= timedelta(0):
        raise ValueError(f"{what} must be positive: {value!r}")


def _utc(t: datetime, what: str) -> datetime:
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware: {t!r}")
    return t.astimezone(UTC)
