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
    assert rows == [(0, "b", 10.0), (10, "a", 5.0)]  # ordered by time then device: skip (0,a), keep 2


def test_iotdb_aggregates(spark, data):
    rows = run(
        spark,
        data,
        "SELECT first_value(v) AS f, last_value(v) AS l, extreme(v) AS e, "
        "max_time(v) AS mt, min_time(v) AS nt, avg(v) AS a INTO o FROM t "
        "WHERE device = 'a' GROUP BY (40s)",
    )
    assert rows == [(T0, 1.0, -7.0, -7.0, at(31), at(1), 0.5)]


def test_aggregate_without_group_by_time_is_one_window_per_range(spark, data):
    rows = secs(run(spark, data, "SELECT count(v) AS c INTO o FROM t GROUP BY device", every="20s", range_="40s"))
    assert rows == [(0, "a", 4), (0, "b", 2)]


def test_row_wise_align_by_device_respects_range_edges(spark, data):
    rows = secs(run(spark, data, "SELECT v * 2 AS w INTO o FROM t ALIGN BY DEVICE", fire=31, range_="30s"))
    # range [1, 31): 1s included, 31s excluded; the NULL row is all-null and not written
    assert rows == [(1, "a", 2.0), (2, "a", 6.0), (5, "b", 20.0), (12, "a", 10.0), (25, "b", 40.0)]
