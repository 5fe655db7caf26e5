"""Ticks of RESAMPLE / PERIOD and their cron plans, re-verified with croniter and Dagster's own iterator."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter_range
from dagster._utils.schedules import schedule_execution_time_iterator

from cq_engine.durations import parse_duration
from cq_engine.schedule.cron import (
    CronPlan,
    compile_cron,
    period_cron,
    period_ticks,
    resample_cron,
    resample_ticks,
)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SH, NY = "Asia/Shanghai", "America/New_York"
SEED_BOUNDARY = datetime.fromisoformat("2021-05-11T22:18:40+08:00")
MINUTE_BOUNDARY = datetime.fromisoformat("2021-05-11T22:18:00+08:00")
RESAMPLE_FROM = datetime(2025, 1, 1, 3, 7, 30, tzinfo=UTC)  # mid-day: partial first and last days
YEAR = timedelta(days=366)


def d(text: str) -> timedelta:
    return parse_duration(text)


def local(tz: str, *args: int) -> datetime:
    return datetime(*args, tzinfo=ZoneInfo(tz))


def walls(ticks: list[datetime], tz: str, fmt: str = "%m-%d %H:%M:%S") -> list[str]:
    return [t.astimezone(ZoneInfo(tz)).strftime(fmt) for t in ticks]


# --- independent re-verification --------------------------------------------------------------


def windows(ticks: list[datetime], start: datetime, end: datetime, zones: set[str]):
    """The whole range when cheap; else the first and last two days and two days around every
    offset change of ``zones`` (dense plans: croniter costs ~35 us per firing, 18 s per year of minutes)."""
    if len(ticks) <= 3_000:
        return [(start, end)]
    out = [(start, start + timedelta(days=2)), (end - timedelta(days=2), end)]
    for name in zones:
        tz, t = ZoneInfo(name), start
        while t < end:
            if t.astimezone(tz).utcoffset() != (t + timedelta(hours=6)).astimezone(tz).utcoffset():
                out.append((max(start, t - timedelta(days=1)), min(end, t + timedelta(days=1))))
            t += timedelta(hours=6)
    return out


def croniter_instants(plan: CronPlan, start: datetime, end: datetime) -> set[datetime]:
    tz = ZoneInfo(plan.timezone)
    got = set()
    for cron in plan.cron_strings:
        for t in croniter_range(start.astimezone(tz), end.astimezone(tz), cron):
            if start <= t < end:
                got.add(t.astimezone(UTC))
    return got


def dagster_instants(plan: CronPlan, start: datetime, end: datetime) -> set[datetime]:
    got = set()
    for t in schedule_execution_time_iterator(start.timestamp(), list(plan.cron_strings), plan.timezone):
        if t >= end:
            return got
        got.add(t.astimezone(UTC))
    raise AssertionError("unreachable")


def assert_plan_reproduces(plan: CronPlan, ticks: list[datetime], start: datetime, end: datetime, tz: str):
    for lo, hi in windows(ticks, start, end, {tz, plan.timezone}):
        want = {t for t in ticks if lo <= t < hi}
        assert want, (lo, hi)
        assert croniter_instants(plan, lo, hi) == want, (plan, lo, hi)
        assert dagster_instants(plan, lo, hi) == want, (plan, lo, hi)


# --- resample_ticks ----------------------------------------------------------------------------


def test_resample_ticks_boundary_before_start():
    start = datetime(2025, 1, 1, 0, 0, 1, tzinfo=UTC)
    got = resample_ticks(every=d("5m"), boundary=EPOCH, start=start, end=start + timedelta(minutes=15))
    assert got == [datetime(2025, 1, 1, 0, m, tzinfo=UTC) for m in (5, 10, 15)]


def test_resample_ticks_boundary_after_start_is_the_first_tick():
    boundary = SEED_BOUNDARY
    got = resample_ticks(
        every=d("20s"), boundary=boundary, start=boundary - timedelta(hours=1), end=boundary + timedelta(seconds=60)
    )
    assert got == [boundary + timedelta(seconds=s) for s in (0, 20, 40)]
    assert all(t.tzinfo == UTC for t in got)


def test_resample_ticks_half_open_range():
    start = datetime(2025, 1, 1, tzinfo=UTC)
    got = resample_ticks(every=d("1h"), boundary=EPOCH, start=start, end=start + timedelta(hours=2))
    assert got == [start, start + timedelta(hours=1)]
    assert resample_ticks(every=d("1h"), boundary=start, start=EPOCH, end=start) == []


def test_ticks_reject_naive_times_and_bad_durations():
    with pytest.raises(ValueError):
        resample_ticks(every=d("1m"), boundary=datetime(2025, 1, 1), start=EPOCH, end=EPOCH)
    with pytest.raises(ValueError):
        resample_ticks(every=timedelta(0), boundary=EPOCH, start=EPOCH, end=EPOCH)
    with pytest.raises(ValueError):
        period_ticks(interval=d("1h"), offset=-d("1s"), timezone=SH, created=EPOCH, start=EPOCH, end=EPOCH)


# --- period_ticks ------------------------------------------------------------------------------


def test_period_ticks_seed_5h30m():
    day = local(SH, 2025, 5, 2)
    got = period_ticks(
        interval=d("5h30m"),
        offset=d("0s"),
        timezone=SH,
        created=local(SH, 2025, 5, 1),
        start=day,
        end=day + timedelta(days=1),
    )
    assert walls(got, SH, "%H:%M:%S") == ["00:00:00", "05:30:00", "11:00:00", "16:30:00", "22:00:00"]


def test_period_ticks_offset_is_added_exactly():
    day = local(SH, 2025, 5, 2)
    got = period_ticks(
        interval=d("5h30m"),
        offset=d("1s"),
        timezone=SH,
        created=local(SH, 2025, 5, 1),
        start=day,
        end=day + timedelta(days=1),
    )
    assert walls(got, SH, "%H:%M:%S") == ["00:00:01", "05:30:01", "11:00:01", "16:30:01", "22:00:01"]


def test_period_ticks_none_before_creation():
    created = local(SH, 2025, 5, 1, 12)
    got = period_ticks(
        interval=d("5h30m"),
        offset=d("0s"),
        timezone=SH,
        created=created,
        start=created - timedelta(days=2),
        end=local(SH, 2025, 5, 2, 6),
    )
    assert walls(got, SH) == ["05-01 16:30:00", "05-01 22:00:00", "05-02 00:00:00", "05-02 05:30:00"]


def test_period_ticks_seed_1d1h_never_resets():
    created = local(SH, 2025, 5, 1, 12)
    got = period_ticks(
        interval=d("1d1h"),
        offset=d("0s"),
        timezone=SH,
        created=created,
        start=created - timedelta(days=3),
        end=local(SH, 2025, 5, 5),
    )
    assert walls(got, SH) == ["05-02 01:00:00", "05-03 02:00:00", "05-04 03:00:00"]


def test_period_ticks_dst_days_keep_exact_spacing_from_local_midnight():
    created = local(NY, 2025, 1, 1)
    spring = period_ticks(
        interval=d("5h30m"),
        offset=d("0s"),
        timezone=NY,
        created=created,
        start=local(NY, 2025, 3, 9),
        end=local(NY, 2025, 3, 10),
    )
    assert walls(spring, NY, "%H:%M %Z") == ["00:00 EST", "06:30 EDT", "12:00 EDT", "17:30 EDT", "23:00 EDT"]
    fall = period_ticks(
        interval=d("5h30m"),
        offset=d("0s"),
        timezone=NY,
        created=created,
        start=local(NY, 2025, 11, 2),
        end=local(NY, 2025, 11, 3),
    )
    assert walls(fall, NY, "%H:%M %Z") == ["00:00 EDT", "04:30 EST", "10:00 EST", "15:30 EST", "21:00 EST"]
    hourly = [
        period_ticks(
            interval=d("1h"),
            offset=d("0s"),
            timezone=NY,
            created=created,
            start=local(NY, 2025, m, day),
            end=local(NY, 2025, m, day + 1),
        )
        for m, day in ((3, 9), (11, 2), (11, 3))
    ]
    assert [len(h) for h in hourly] == [23, 25, 24]
    assert all(b - a == timedelta(hours=1) for h in hourly for a, b in itertools.pairwise(h))


# --- compile_cron: RESAMPLE --------------------------------------------------------------------

RESAMPLE_CASES = [
    # (zone, every, boundary, expected plan or None)
    (SH, "1m", EPOCH, CronPlan(("* * * * *",), SH)),
    (NY, "1m", EPOCH, CronPlan(("* * * * *",), "UTC")),
    (SH, "5m", EPOCH, CronPlan(("*/5 * * * *",), SH)),
    (NY, "5m", EPOCH, CronPlan(("*/5 * * * *",), "UTC")),
    (SH, "5m", MINUTE_BOUNDARY, CronPlan(("3-58/5 * * * *",), SH)),
    (NY, "5m", MINUTE_BOUNDARY, CronPlan(("3-58/5 * * * *",), "UTC")),
    (SH, "7m", EPOCH, None),
    (NY, "7m", EPOCH, None),
    (SH, "90m", EPOCH, CronPlan(("30 */3 * * *", "0 2-23/3 * * *"), SH)),
    (NY, "90m", EPOCH, CronPlan(("0 */3 * * *", "30 1-22/3 * * *"), "UTC")),
    (SH, "90m", MINUTE_BOUNDARY, CronPlan(("18 1-22/3 * * *", "48 2-23/3 * * *"), SH)),
    (SH, "5h30m", EPOCH, None),
    (NY, "5h30m", EPOCH, None),
    (SH, "1d", EPOCH, CronPlan(("0 8 * * *",), SH)),
    (NY, "1d", EPOCH, CronPlan(("0 0 * * *",), "UTC")),
    (SH, "1d", MINUTE_BOUNDARY, CronPlan(("18 22 * * *",), SH)),
    (NY, "1d", MINUTE_BOUNDARY, CronPlan(("18 14 * * *",), "UTC")),
    (SH, "1w", EPOCH, CronPlan(("0 8 * * 4",), SH)),
    (NY, "2d", EPOCH, None),
    (NY, "1d1h", EPOCH, None),
    (SH, "20s", EPOCH, None),
    (NY, "20s", EPOCH, None),
    # half-hour offsets (Dagster's minute-resolution hourly path) and a 30-minute DST shift
    ("Asia/Kolkata", "1h", EPOCH, CronPlan(("30 * * * *",), "Asia/Kolkata")),
    ("Asia/Kathmandu", "30m", EPOCH, CronPlan(("15,45 * * * *",), "Asia/Kathmandu")),
    ("Australia/Lord_Howe", "30m", EPOCH, CronPlan(("*/30 * * * *",), "UTC")),
] + [(zone, every, SEED_BOUNDARY, None) for zone in (SH, NY) for every in ("1m", "5m", "90m", "1d")]


@pytest.mark.parametrize(
    "zone,every,boundary,expected",
    RESAMPLE_CASES,
    ids=[f"{z.split('/')[1]}-{e}-{b:%Y%m%d%H%M%S}" for z, e, b, _ in RESAMPLE_CASES],
)
def test_resample_cron(zone, every, boundary, expected):
    plan = resample_cron(every=d(every), boundary=boundary, timezone=zone, verify_from=RESAMPLE_FROM)
    assert plan == expected
    if plan is not None:
        end = RESAMPLE_FROM + YEAR
        ticks = resample_ticks(every=d(every), boundary=boundary, start=RESAMPLE_FROM, end=end)
        assert_plan_reproduces(plan, ticks, RESAMPLE_FROM, end, zone)


# --- compile_cron: PERIOD ----------------------------------------------------------------------

PERIOD_CASES = [
    # (zone, interval, offset, expected plan or None); created 2025-05-01 12:00 local
    (SH, "5h30m", "0s", CronPlan(("0 0,11,22 * * *", "30 5,16 * * *"), SH)),
    (NY, "5h30m", "0s", None),  # 6:30 EDT on the spring-forward day: neither local nor UTC cron
    (SH, "5h30m", "1s", None),
    (NY, "5h30m", "1s", None),
    (SH, "1h", "0s", CronPlan(("0 * * * *",), SH)),
    (NY, "1h", "0s", CronPlan(("0 * * * *",), "UTC")),  # local would need 02:00 / both 01:00s
    (SH, "1h", "15m", CronPlan(("15 * * * *",), SH)),
    (SH, "7h", "0s", CronPlan(("0 0,7,14,21 * * *",), SH)),
    (SH, "12h", "3h", CronPlan(("0 3,15 * * *",), SH)),
    (SH, "1d", "0s", CronPlan(("0 0 * * *",), SH)),
    (NY, "1d", "0s", CronPlan(("0 4 * * *",), "UTC")),  # 24h steps: midnight EDT, 23:00 EST
    (SH, "1d1h", "0s", None),
    (NY, "1d1h", "0s", None),
    (SH, "30s", "0s", None),
]


@pytest.mark.parametrize(
    "zone,interval,offset,expected", PERIOD_CASES, ids=[f"{z.split('/')[1]}-{i}-{o}" for z, i, o, _ in PERIOD_CASES]
)
def test_period_cron(zone, interval, offset, expected):
    created = local(zone, 2025, 5, 1, 12)
    plan = period_cron(interval=d(interval), offset=d(offset), timezone=zone, created=created, verify_from=created)
    assert plan == expected
    if plan is not None:
        end = created + YEAR
        ticks = period_ticks(
            interval=d(interval), offset=d(offset), timezone=zone, created=created, start=created, end=end
        )
        assert_plan_reproduces(plan, ticks, created, end, zone)


def test_period_cron_ticks_before_verify_window_start_are_not_required():
    created = local(SH, 2025, 5, 1, 12)
    plan = period_cron(
        interval=d("5h30m"),
        offset=d("0s"),
        timezone=SH,
        created=created,
        verify_from=created + timedelta(days=30, hours=3),
    )
    assert plan == CronPlan(("0 0,11,22 * * *", "30 5,16 * * *"), SH)


def test_resample_boundary_after_verify_from_is_not_cron():
    # a cron schedule cannot start later: it would fire before the boundary
    plan = resample_cron(
        every=d("5m"), boundary=datetime(2025, 6, 1, tzinfo=UTC), timezone=SH, verify_from=RESAMPLE_FROM
    )
    assert plan is None


# --- DST faithfulness --------------------------------------------------------------------------


def wall_clock_ticks(zone: str, hour: int, minute: int):
    """Custom tick family: daily at a wall time; days where it does not exist have no tick."""
    tz = ZoneInfo(zone)

    def ticks(start: datetime, end: datetime) -> list[datetime]:
        out, day = [], start.astimezone(tz).date()
        while day <= end.astimezone(tz).date():
            t = datetime(day.year, day.month, day.day, hour, minute, tzinfo=tz)
            exists = t.astimezone(UTC).astimezone(tz).replace(tzinfo=None) == t.replace(tzinfo=None)
            if exists and start <= t < end:
                out.append(t.astimezone(UTC))
            day += timedelta(days=1)
        return out

    return ticks


def test_local_plan_in_dst_zone_when_no_wall_time_is_affected():
    ticks = wall_clock_ticks(NY, 12, 0)
    start = local(NY, 2025, 1, 1)
    plan = compile_cron(ticks=ticks, every=d("1d"), anchor=start, timezone=NY, verify_from=start)
    assert plan == CronPlan(("0 12 * * *",), NY)
    assert_plan_reproduces(plan, ticks(start, start + YEAR), start, start + YEAR, NY)


def test_local_plan_touching_a_dst_gap_is_refused_because_dagster_moves_it():
    ticks = wall_clock_ticks(NY, 2, 30)  # no tick on 2025-03-09, when 02:30 does not exist
    start = local(NY, 2025, 1, 1)
    plan = compile_cron(ticks=ticks, every=d("1d"), anchor=start, timezone=NY, verify_from=start)
    assert plan is None
    # Dagster would fire "30 2 * * *" at 03:00 EDT that day, which is no tick.
    fired = dagster_instants(CronPlan(("30 2 * * *",), NY), local(NY, 2025, 3, 8), local(NY, 2025, 3, 11))
    assert walls(sorted(fired), NY, "%m-%d %H:%M %Z") == ["03-08 02:30 EST", "03-09 03:00 EDT", "03-10 02:30 EDT"]


def test_hourly_local_plan_in_dst_zone_falls_back_to_utc():
    ticks = lambda a, b: resample_ticks(every=d("1h"), boundary=EPOCH, start=a, end=b)
    plan = compile_cron(ticks=ticks, every=d("1h"), anchor=EPOCH, timezone=NY, verify_from=RESAMPLE_FROM)
    assert plan == CronPlan(("0 * * * *",), "UTC")


def test_long_weekly_cycles_are_refused():
    ticks = lambda a, b: resample_ticks(every=d("7m"), boundary=EPOCH, start=a, end=b)
    assert (
        compile_cron(ticks=ticks, every=d("7m"), anchor=EPOCH, timezone="UTC", verify_from=RESAMPLE_FROM) is None
    )  # 49 weekday-specific strings
    plan = compile_cron(
        ticks=ticks,
        every=d("7m"),
        anchor=EPOCH,
        timezone="UTC",
        verify_from=RESAMPLE_FROM,
        horizon=timedelta(days=15),
        max_strings=49,
    )
    assert plan is not None and len(plan.cron_strings) == 49
    end = RESAMPLE_FROM + timedelta(days=15)
    assert croniter_instants(plan, RESAMPLE_FROM, end) == set(ticks(RESAMPLE_FROM, end))


def test_latest_tick_looks_back_two_periods_first_and_two_days_only_when_needed():
    from cq_engine.schedule.ticks import Ticks

    every, origin = timedelta(seconds=30), datetime(2026, 1, 1, tzinfo=UTC)
    enumerated: list[int] = []

    def between(a: datetime, b: datetime, *, after: datetime = origin) -> list[datetime]:
        first = max(0, -(-int((a - after).total_seconds()) // 30))
        out = [after + k * every for k in range(first, first + 100_000) if after + k * every < b]
        enumerated.append(len(out))
        return out

    ticks = Ticks(every=every, description="", between=between, range_of=lambda t: (t - every, t), cron=lambda n: None)
    now = datetime(2026, 1, 3, 12, 0, 10, tzinfo=UTC)
    assert ticks.latest(now) == datetime(2026, 1, 3, 12, 0, 0, tzinfo=UTC)
    assert enumerated == [122]  # not the 5,760 ticks of two days
    # No tick in the short window (the first one is 90 minutes back): the two days find it.
    late = Ticks(
        every=every,
        description="",
        between=lambda a, b: [t for t in between(a, b) if t <= now - timedelta(minutes=90)],
        range_of=lambda t: (t - every, t),
        cron=lambda n: None,
    )
    assert late.latest(now) == now - timedelta(minutes=90, seconds=10)
    assert ticks.latest(origin - timedelta(days=3)) is None
