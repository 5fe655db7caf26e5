"""RESAMPLE timing: pure functions, exactly as seed 004 states."""

from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from cq_engine.errors import TimeError
from cq_engine.model import Resample
from cq_engine.resample import timing
from cq_engine.times import parse_time

S = timedelta(seconds=1)
CST = timezone(timedelta(hours=8))
BOUNDARY = datetime(2021, 5, 11, 22, 18, 40, tzinfo=CST)


def resample(every=20, start=40, end=0, boundary=BOUNDARY) -> Resample:
    return Resample(every=every * S, start_offset=start * S, end_offset=end * S, boundary=boundary.astimezone(UTC))


def test_first_firing_is_boundary_when_deployed_before_or_at_it():
    r = resample()
    assert timing.first_firing(r, deployed_at=BOUNDARY - timedelta(hours=3)) == BOUNDARY
    assert timing.first_firing(r, deployed_at=BOUNDARY) == BOUNDARY


def test_first_firing_after_boundary_is_next_multiple_at_or_after_deployment():
    r = resample()
    assert timing.first_firing(r, deployed_at=BOUNDARY + 1 * S) == BOUNDARY + 20 * S
    assert timing.first_firing(r, deployed_at=BOUNDARY + 40 * S) == BOUNDARY + 40 * S
    assert (
        timing.first_firing(r, deployed_at=BOUNDARY + timedelta(days=1, microseconds=1))
        == BOUNDARY + timedelta(days=1) + 20 * S
    )


def test_window_i_formula():
    # [boundary - start + (i-1)*every, boundary - end + (i-1)*every)
    r = resample(every=20, start=40, end=20)
    for i in range(1, 6):
        fire = timing.firing_times(r, start=BOUNDARY, count=i)[-1]
        assert timing.time_range(r, fire) == (
            BOUNDARY - 40 * S + (i - 1) * 20 * S,
            BOUNDARY - 20 * S + (i - 1) * 20 * S,
        )


def test_results_are_utc_and_timezone_independent():
    shanghai = ZoneInfo("Asia/Shanghai")
    r = resample(boundary=datetime(2021, 5, 11, 22, 18, 40, tzinfo=shanghai))
    fires = timing.firing_times(r, start=datetime(2021, 5, 11, 14, 0, tzinfo=UTC), count=2)
    assert [f.tzinfo for f in fires] == [UTC, UTC]
    assert fires[0] == datetime(2021, 5, 11, 14, 18, 40, tzinfo=UTC)


def test_default_boundary_epoch_multiples():
    r = Resample(every=20 * S, start_offset=20 * S, end_offset=timedelta(0), boundary=datetime(1970, 1, 1, tzinfo=UTC))
    t = parse_time("2021-05-11T22:18:41+08:00", tz=UTC)
    assert timing.firing_times(r, start=t, count=2) == [
        parse_time("2021-05-11T22:19:00+08:00", tz=UTC),
        parse_time("2021-05-11T22:19:20+08:00", tz=UTC),
    ]
    assert timing.is_firing_time(r, parse_time("2021-05-11T22:18:40+08:00", tz=UTC))
    assert not timing.is_firing_time(r, t)


def test_check_firing_time_names_the_nearest():
    r = resample()
    with pytest.raises(TimeError) as info:
        timing.check_firing_time("cq1", r, BOUNDARY + 5 * S)
    assert "not a firing time of 'cq1'" in str(info.value)
    assert "2021-05-11T14:18:40+00:00 or 2021-05-11T14:19:00+00:00" in str(info.value)
    with pytest.raises(TimeError):
        timing.check_firing_time("cq1", r, BOUNDARY - 20 * S)  # before BOUNDARY: never fires


def test_latest_firing_and_between():
    r = resample()
    assert timing.latest_firing(r, now=BOUNDARY - S) is None
    assert timing.latest_firing(r, now=BOUNDARY + 39 * S) == BOUNDARY + 20 * S
    assert timing.firing_times_between(r, start=BOUNDARY, end=BOUNDARY + 60 * S) == [
        BOUNDARY + k * 20 * S for k in range(3)
    ]


def test_recalculation_range_keeps_firings_inside():
    r = resample(every=20, start=40)
    fires, (lo, hi) = timing.recalculation_range(r, start=BOUNDARY - 40 * S, end=BOUNDARY + 20 * S)
    assert fires == [BOUNDARY, BOUNDARY + 20 * S]
    assert (lo, hi) == (BOUNDARY - 40 * S, BOUNDARY + 20 * S)
    with pytest.raises(TimeError, match="no firing's range"):
        timing.recalculation_range(r, start=BOUNDARY, end=BOUNDARY + 10 * S)


def test_coverage_and_chunks():
    r = resample(every=20, start=40)
    fires = timing.firing_times(r, start=BOUNDARY, count=5)
    chunks = timing.chunk_firings(fires, size=2)
    assert [len(c) for c in chunks] == [2, 2, 1]
    cov = timing.coverage_of(r, chunks[0], emit_end=timing.time_range(r, chunks[1][0])[0])
    assert cov.read_range == (BOUNDARY - 40 * S, BOUNDARY + 20 * S)
    assert cov.emit_end == BOUNDARY
