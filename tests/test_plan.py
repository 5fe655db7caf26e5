"""Planner semantics on real Spark against hand-computed results."""

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from cq_engine.parse import ParseOptions, parse_text
from cq_engine.resample import timing
from cq_engine.resample.plan import plan_query

T0 = datetime(2024, 1, 1, tzinfo=UTC)
S = timedelta(seconds=1)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ms(seconds: float) -> int:
    """IoTDB's time of a point: INT64 milliseconds since the epoch (max_time, min_time)."""
    return int(at(seconds).timestamp() * 1000)


@pytest.fixture(scope="module")
def data(spark):
    # device a: values at 1s, 2s, 12s, 31s; device b: at 5s and 25s (nothing in [10, 20))
    rows = [
        (at(1), "a", 1.0),
        (at(2), "a", 3.0),
        (at(12), "a", 5.0),
        (at(31), "a", -7.0),
        (at(5), "b", 10.0),
        (at(25), "b", 20.0),
        (at(26), "b", None),
    ]
    table = pa.table(
        {
            "ts": pa.array([r[0] for r in rows], pa.timestamp("us", tz="UTC")),
            "device": [r[1] for r in rows],
            "v": pa.array([r[2] for r in rows], pa.float64()),
        }
    )
    return spark.createDataFrame(table)


def run(spark, data, body: str, *, fire: float = 40, every="40s", range_="40s") -> list[tuple]:
    sql = f"CREATE CQ q RESAMPLE EVERY {every} RANGE {range_} BEGIN {body} END"
    (cq,) = parse_text(sql, options=ParseOptions(min_every=timedelta(0)))
    cq = type(cq)(
        **{
            **cq.__dict__,
            "resample": type(cq.resample)(
                every=cq.resample.every,
                start_offset=cq.resample.start_offset,
                end_offset=cq.resample.end_offset,
                boundary=T0,
            ),
        }
    )
    cov = timing.coverage_of(cq.resample, [at(fire)])
    out = plan_query(spark, cq, data, time_column="ts", coverage=cov).to_arrow().to_pylist()
    return sorted(tuple(r.values()) for r in out)


def secs(rows):
    return [((r[0] - T0).total_seconds(), *r[1:]) for r in rows]


def test_group_by_time_and_device_skips_all_null_rows(spark, data):
    rows = secs(run(spark, data, "SELECT max_value(v) AS m INTO o FROM t GROUP BY (10s), device"))
    assert rows == [(0, "a", 3.0), (0, "b", 10.0), (10, "a", 5.0), (20, "b", 20.0), (30, "a", -7.0)]


def test_count_reports_zero_for_empty_windows(spark, data):
    rows = secs(run(spark, data, "SELECT count(v) AS c INTO o FROM t GROUP BY (10s), device"))
    assert rows == [
        (0, "a", 2),
        (0, "b", 1),
        (10, "a", 1),
        (10, "b", 0),
        (20, "a", 0),
        (20, "b", 1),
        (30, "a", 1),
        (30, "b", 0),
    ]


def test_fill_previous_linear_constant(spark, data):
    prev = secs(run(spark, data, "SELECT max_value(v) AS m INTO o FROM t GROUP BY (10s), device FILL(PREVIOUS)"))
    assert [r for r in prev if r[1] == "b"] == [(0, "b", 10.0), (10, "b", 10.0), (20, "b", 20.0), (30, "b", 20.0)]
    lin = secs(run(spark, data, "SELECT max_value(v) AS m INTO o FROM t GROUP BY (10s), device FILL(LINEAR)"))
    assert [r for r in lin if r[1] == "b"] == [(0, "b", 10.0), (10, "b", 15.0), (20, "b", 20.0)]  # no next after 20
    assert [r for r in lin if r[1] == "a"] == [(0, "a", 3.0), (10, "a", 5.0), (20, "a", -1.0), (30, "a", -7.0)]
    const = secs(run(spark, data, "SELECT max_value(v) AS m INTO o FROM t GROUP BY (10s), device FILL(0.5)"))
    assert (20, "a", 0.5) in const and (10, "b", 0.5) in const and len(const) == 8
    text = secs(run(spark, data, "SELECT max_value(v) AS m INTO o FROM t GROUP BY (10s), device FILL('x')"))
    assert len(text) == 5  # a string constant does not fill a double column (IoTDB's type rule)


def test_sliding_step_windows_overlap(spark, data):
    rows = secs(run(spark, data, "SELECT count(v) AS c INTO o FROM t WHERE device = 'a' GROUP BY (20s, 10s)"))
    # windows [0,20) [10,30) [20,40) [30,40)
    assert rows == [(0, 3), (10, 1), (20, 1), (30, 1)]


def test_where_having_limit_offset(spark, data):
    rows = secs(
        run(spark, data, "SELECT sum(v) AS s INTO o FROM t WHERE v > 2 GROUP BY (10s), device HAVING sum(v) > 4")
    )
    assert rows == [(0, "b", 10.0), (10, "a", 5.0), (20, "b", 20.0)]
    rows = secs(run(spark, data, "SELECT max(v) AS m INTO o FROM t GROUP BY (10s), device LIMIT 2 OFFSET 1"))
    # Without ALIGN BY DEVICE a row of IoTDB's result is a window holding every device: skip the
    # window at 0 s, keep those at 10 s and 20 s (b has no value at 10 s, a none at 20 s).
    assert rows == [(10, "a", 5.0), (20, "b", 20.0)]


def test_iotdb_aggregates(spark, data):
    rows = run(
        spark,
        data,
        "SELECT first_value(v) AS f, last_value(v) AS l, extreme(v) AS e, "
        "max_time(v) AS mt, min_time(v) AS nt, avg(v) AS a INTO o FROM t "
        "WHERE device = 'a' GROUP BY (40s)",
    )
    assert rows == [(T0, 1.0, -7.0, -7.0, ms(31), ms(1), 0.5)]


def test_aggregate_without_group_by_time_is_one_window_per_range(spark, data):
    rows = secs(run(spark, data, "SELECT count(v) AS c INTO o FROM t GROUP BY device", every="20s", range_="40s"))
    assert rows == [(0, "a", 4), (0, "b", 2)]


def test_row_wise_align_by_device_respects_range_edges(spark, data):
    rows = secs(run(spark, data, "SELECT v * 2 AS w INTO o FROM t ALIGN BY DEVICE", fire=31, every="30s", range_="30s"))
    # range [1, 31): 1s included, 31s excluded; the NULL row is all-null and not written
    assert rows == [(1, "a", 2.0), (2, "a", 6.0), (5, "b", 20.0), (12, "a", 10.0), (25, "b", 40.0)]


# --- IoTDB's rules (issue 22), on the rows a side-by-side run with IoTDB used -----------------------
# In IoTDB every measurement is its own series: a NULL here is a point that does not exist there.
# d1: s1 = 1 @0s, 2 @5s, 3 @8s, 4 @21s; s2 = NULL @0s, 7 @5s, NULL @8s, 5 @21s. d2: one row @3s
# (s2 NULL). d3: one row @40s, outside the firing's range [0s, 30s), so it is a known, silent device.
# Every expected value below is written out from IoTDB's rules, not from the engine.


@pytest.fixture(scope="module")
def points(spark):
    rows = [
        (0, "d1", 1.0, None),
        (5, "d1", 2.0, 7.0),
        (8, "d1", 3.0, None),
        (21, "d1", 4.0, 5.0),
        (3, "d2", 10.0, None),
        (40, "d3", 9.0, 9.0),
    ]
    table = pa.table(
        {
            "ts": pa.array([at(r[0]) for r in rows], pa.timestamp("us", tz="UTC")),
            "device": [r[1] for r in rows],
            "s1": pa.array([r[2] for r in rows], pa.float64()),
            "s2": pa.array([r[3] for r in rows], pa.float64()),
        }
    )
    return spark.createDataFrame(table)


def fire30(spark, points, body: str, **kw) -> list[tuple]:
    return secs(run(spark, points, body, fire=30, every="30s", range_="30s", **kw))


def test_first_and_last_value_are_the_first_and_last_points(spark, points):
    rows = fire30(
        spark, points, "SELECT first_value(s2) AS f, last_value(s2) AS l INTO o FROM t GROUP BY (10s) ALIGN BY DEVICE"
    )
    # d1's s2 points: 7 @5s, 5 @21s (the NULLs at 0s and 8s are no points); d2 has no s2 point.
    assert rows == [(0, "d1", 7.0, 7.0), (20, "d1", 5.0, 5.0)]
    # Every IoTDB aggregate over a window whose first and last rows hold NULL.
    rows = fire30(
        spark,
        points,
        "SELECT first_value(s2) AS f, last_value(s2) AS l, max_value(s2) AS mx, min_value(s2) AS mn, "
        "extreme(s2) AS e, max_time(s2) AS mt, min_time(s2) AS nt, count(s2) AS c, sum(s2) AS su, avg(s2) AS a "
        "INTO o FROM t WHERE device = 'd1' GROUP BY (30s)",
    )
    assert rows == [(0, 7.0, 5.0, 7.0, 5.0, 7.0, ms(21), ms(5), 2, 12.0, 6.0)]


def test_max_time_and_min_time_are_int64_milliseconds(spark, points):
    # IoTDB's max_time/min_time are INT64 (ms since the epoch): arithmetic on them runs, FILL(0)
    # writes 0 and FILL(LINEAR) interpolates them like any INT64 series.
    rows = fire30(
        spark,
        points,
        "SELECT max_time(s1) - min_time(s1) AS d, max_time(s2) AS mt INTO o FROM t WHERE device = 'd1' GROUP BY (10s)",
    )
    assert rows == [(0, 8000, ms(5)), (20, 0, ms(21))]
    rows = fire30(spark, points, "SELECT max_time(s2) AS mt INTO o FROM t WHERE device = 'd1' GROUP BY (10s) FILL(0)")
    assert rows == [(0, ms(5)), (10, 0), (20, ms(21))]
    rows = fire30(
        spark, points, "SELECT max_time(s2) AS mt INTO o FROM t WHERE device = 'd1' GROUP BY (10s) FILL(LINEAR)"
    )
    assert rows == [(0, ms(5)), (10, ms(13)), (20, ms(21))]


def test_limit_and_offset_number_empty_windows(spark, points):
    # IoTDB's rows after OFFSET 1 are 5s = 3.0 and 10s = NULL: only 5s = 3.0 is written.
    rows = fire30(
        spark, points, "SELECT max_value(s1) AS m INTO o FROM t WHERE device = 'd1' GROUP BY (5s) LIMIT 2 OFFSET 1"
    )
    assert rows == [(5, 3.0)]
    # ALIGN BY DEVICE: device by device (d1, d2, d3: every known device), each with its 3 windows:
    # d1@0 3, d1@10 -, d1@20 4, d2@0 10, d2@10 -, d2@20 -, d3@0 -, ... OFFSET 2 LIMIT 4 keeps rows 3-6.
    rows = fire30(
        spark, points, "SELECT max_value(s1) AS m INTO o FROM t GROUP BY (10s) LIMIT 4 OFFSET 2 ALIGN BY DEVICE"
    )
    assert rows == [(0, "d2", 10.0), (20, "d1", 4.0)]


def test_fill_without_group_by_fills_rows_per_device(spark, points):
    rows = fire30(spark, points, "SELECT s1, s2 INTO o FROM t FILL(PREVIOUS) ALIGN BY DEVICE")
    assert rows == [
        (0, "d1", 1.0, None),
        (3, "d2", 10.0, None),
        (5, "d1", 2.0, 7.0),
        (8, "d1", 3.0, 7.0),
        (21, "d1", 4.0, 5.0),
    ]
    rows = fire30(spark, points, "SELECT s1, s2 INTO o FROM t WHERE device = 'd1' FILL(LINEAR) ALIGN BY DEVICE")
    # 8s lies between 7 @5s and 5 @21s: 7 + (5 - 7) * 3/16; 0s has no point before it.
    assert rows == [(0, "d1", 1.0, None), (5, "d1", 2.0, 7.0), (8, "d1", 3.0, 6.625), (21, "d1", 4.0, 5.0)]
    rows = fire30(spark, points, "SELECT s1, s2 INTO o FROM t FILL(0.5) ALIGN BY DEVICE")
    assert rows == [
        (0, "d1", 1.0, 0.5),
        (3, "d2", 10.0, 0.5),
        (5, "d1", 2.0, 7.0),
        (8, "d1", 3.0, 0.5),
        (21, "d1", 4.0, 5.0),
    ]
    # A row exists where a selected series has a point: selecting s2 alone, 0s and 8s are no rows.
    rows = fire30(spark, points, "SELECT s2 INTO o FROM t FILL(PREVIOUS) ALIGN BY DEVICE")
    assert rows == [(5, "d1", 7.0), (21, "d1", 5.0)]


def test_raw_rows_are_where_a_series_the_select_reads_has_a_point(spark, points):
    # IoTDB's raw query has a row wherever any series it reads has a point, whatever the expressions
    # give there: s1 + s2 reads s1 and s2, so 0s, 3s and 8s (s2 NULL) are rows, which FILL fills and
    # LIMIT counts; only a row whose values stay all NULL writes nothing.
    rows = fire30(spark, points, "SELECT s1 + s2 AS x, s2 AS y INTO o FROM t FILL(0.5) ALIGN BY DEVICE")
    assert rows == [
        (0, "d1", 0.5, 0.5),
        (3, "d2", 0.5, 0.5),
        (5, "d1", 9.0, 7.0),
        (8, "d1", 0.5, 0.5),
        (21, "d1", 9.0, 5.0),
    ]
    rows = fire30(
        spark, points, "SELECT s2 * 2 AS y INTO o FROM t WHERE device = 'd1' LIMIT 2 OFFSET 1 ALIGN BY DEVICE"
    )
    assert rows == [(21, "d1", 10.0)]  # it reads s2 only: rows at its points 5s and 21s
    rows = fire30(spark, points, "SELECT s1 * 0 + s2 AS y INTO o FROM t WHERE device = 'd1' LIMIT 2 ALIGN BY DEVICE")
    assert rows == [(5, "d1", 7.0)]  # it reads s1 too: rows 0s (NULL), 5s, 8s, 21s; LIMIT 2 keeps 0s, 5s


def test_known_devices_without_rows_in_the_range_are_rows(spark, points):
    rows = fire30(spark, points, "SELECT count(s1) AS n INTO o FROM t GROUP BY (10s) ALIGN BY DEVICE")
    assert [r for r in rows if r[1] == "d3"] == [(0, "d3", 0), (10, "d3", 0), (20, "d3", 0)]
    assert len(rows) == 9
    # FILL's constant reaches them too; a WHERE on the device column picks the devices.
    rows = fire30(spark, points, "SELECT max_value(s1) AS m INTO o FROM t GROUP BY (10s), device FILL(-1.0)")
    assert [r for r in rows if r[1] == "d3"] == [(0, "d3", -1.0), (10, "d3", -1.0), (20, "d3", -1.0)]
    rows = fire30(
        spark, points, "SELECT count(s1) AS n INTO o FROM t WHERE device <> 'd3' AND s1 > 1 GROUP BY (10s), device"
    )
    assert rows == [(0, "d1", 2), (0, "d2", 1), (10, "d1", 0), (10, "d2", 0), (20, "d1", 1), (20, "d2", 0)]


def test_groups_given_to_the_plan_are_the_devices(spark, points):
    sql = "CREATE CQ q RESAMPLE EVERY 30s RANGE 30s BEGIN SELECT count(s1) AS n, count(s1) + 1 AS m INTO o FROM t GROUP BY (10s), device END"
    (cq,) = parse_text(sql, options=ParseOptions(min_every=timedelta(0)))
    cov = timing.coverage_of(cq.resample, [at(30)])
    groups = pa.table({"device": ["d1", "d9"]})  # d9: a device the source holds, none of its rows read
    out = plan_query(spark, cq, points, time_column="ts", coverage=cov, groups=groups).to_arrow().to_pylist()
    got = sorted(((r["ts"] - T0).total_seconds(), r["device"], r["n"], r["m"]) for r in out)
    assert got == [
        (0, "d1", 3, 4),
        (0, "d9", 0, 1),
        (10, "d1", 0, 1),
        (10, "d9", 0, 1),
        (20, "d1", 1, 2),
        (20, "d9", 0, 1),
    ]


@pytest.mark.parametrize(
    "body",
    [
        "SELECT max_value(s1) AS m, count(s2) AS n INTO o FROM t GROUP BY (5s) LIMIT 5 OFFSET 2 ALIGN BY DEVICE",
        "SELECT max_value(s1) AS m INTO o FROM t GROUP BY (5s), device LIMIT 2 OFFSET 1",
    ],
)
def test_a_run_of_several_firings_numbers_rows_as_each_firing(spark, points, body):
    """A recalculation covers several overlapping firings in one plan: what it writes is what the
    firings write one after another (each replacing its range), LIMIT counted per firing."""
    sql = f"CREATE CQ q RESAMPLE EVERY 10s RANGE 20s BEGIN {body} END"
    (cq,) = parse_text(sql, options=ParseOptions(min_every=timedelta(0)))
    fires = [at(20), at(30), at(40)]

    def rows(cov, lo=None, hi=None):
        out = plan_query(spark, cq, points, time_column="ts", coverage=cov).to_arrow().to_pylist()
        return {tuple(r.values()) for r in out if (lo is None or lo <= r["ts"] < hi)}

    together = rows(timing.coverage_of(cq.resample, fires))
    # Firing i's rows stay where no later firing's range starts: [its start, the next one's start).
    one_by_one = set()
    for i, fire in enumerate(fires):
        lo = timing.time_range(cq.resample, fire)[0]
        hi = timing.time_range(cq.resample, fires[i + 1])[0] if i + 1 < len(fires) else at(40)
        one_by_one |= rows(timing.coverage_of(cq.resample, [fire]), lo, hi)
    assert together == one_by_one and together
