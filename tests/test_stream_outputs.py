"""Placeholders, output shaping, FORCE_OUTPUT / CALC_NOTIFY_ONLY and queries reading another table, from
``.sql`` to the sink on real Spark and Delta (the sensor evaluated as Dagster's, runs by the engine)."""

from __future__ import annotations

import logging
from datetime import timedelta

import pyarrow as pa
import pytest
from streams_util import NOW, T0, Bench, M

from cq_engine.errors import CQError

# Storage-sensitive: a representative subset runs on Spark's Delta connector and on delta-rs with the
# same expectations (on_both_storages); the rest on delta-rs only, to keep the suite's time.
BOTH = pytest.mark.usefixtures("on_both_storages")

MS = 1000


def _two_meters(b: Bench, seconds: range = range(0, 150, 10)) -> None:
    b.append([(s, d, float(s) + (0.5 if d == "d1002" else 0.0)) for s in seconds for d in ("d1001", "d1002")])


def _gid(spark, *values) -> int:
    from pyspark.sql import functions as F

    df = spark.createDataFrame([tuple(values)], [f"k{i}" for i in range(len(values))])
    return df.select(F.xxhash64(*df.columns)).first()[0]


def test_window_placeholders_match_hand_computed_values(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        """CREATE STREAM ph INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname, location
        INTO ph_out AS SELECT _twstart, _twend, _twduration AS dur, _twrownum AS rownum, _tgrpid AS grp,
                              %%1 AS p1, %%2, %%tbname AS tb, _tlocaltime AS lt, count(*) AS n
        FROM %%trows;""",
    )
    b.tick("ph")
    _two_meters(b)  # 0..140 s: the windows [0, 60) and [60, 120) close
    b.tick("ph")
    rows = [r for r in b.sink("ph_out") if r["p1"] == "d1001"]
    assert [(r["_twstart"], r["_twend"], r["dur"], r["rownum"], r["n"]) for r in rows] == [
        (T0, T0 + M, 60 * MS, 6, 6),
        (T0 + M, T0 + 2 * M, 60 * MS, 6, 6),
    ]
    gid = _gid(spark, "d1001", "loc-d1001")
    assert {(r["grp"], r["group_id"], r["location"], r["tb"], r["lt"]) for r in rows} == {
        (gid, gid, "loc-d1001", "d1001", NOW)
    }


def test_sliding_and_period_placeholders(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        """CREATE STREAM sl SLIDING(1m) FROM meters INTO sl_out AS
            SELECT _tprev_ts, _tcurrent_ts, _tnext_ts, count(*) AS n FROM %%trows;
        CREATE STREAM pe PERIOD(1m) FROM meters INTO pe_out AS
            SELECT _tlocaltime, _tprev_localtime AS prev, _tnext_localtime AS nxt, count(*) AS n FROM %%trows;""",
    )
    b.tick("sl")
    _two_meters(b)
    b.tick("sl")
    assert [(r["_tprev_ts"], r["_tcurrent_ts"], r["_tnext_ts"], r["n"]) for r in b.sink("sl_out")] == [
        (T0, T0 + M, T0 + 2 * M, 12),
        (T0 + M, T0 + 2 * M, T0 + 3 * M, 12),
    ]
    tick = NOW.replace(second=0)
    b.engine.run_period("pe", tick - M)  # the first tick sets the %%trows baseline
    _two_meters(b, seconds=[200, 210])
    b.engine.run_period("pe", tick)
    rows = b.sink("pe_out")
    assert [(r["_tlocaltime"], r["prev"], r["nxt"], r["n"]) for r in rows if r["n"]] == [(tick, tick - M, tick + M, 4)]


def test_range_join_reads_another_table_per_window_in_one_job(tmp_path, spark):
    sql = """CREATE TABLE prices (ts TIMESTAMP, price DOUBLE);
        CREATE STREAM joined INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname INTO joined_out AS
            SELECT _twstart, count(*) AS n, avg(price) AS p FROM prices WHERE ts >= _twstart AND ts < _twend;
        CREATE STREAM own INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname INTO own_out AS
            SELECT _twstart, count(*) AS n, sum(current) AS c FROM %%tbname WHERE ts >= _twstart AND ts < _twend;"""
    b = Bench(tmp_path, spark, sql)
    b.engine.storage.append(
        "prices",
        pa.table(
            {
                "ts": pa.array([T0 + timedelta(seconds=s) for s in range(0, 180, 20)], pa.timestamp("us", tz="UTC")),
                "price": pa.array([float(s) for s in range(0, 180, 20)]),
            }
        ),
    )
    for name in ("joined", "own"):
        b.tick(name)
    _two_meters(b)
    b.tick("joined")
    b.tick("own")
    # prices at 0, 20, 40 | 60, 80, 100 | ...: every meter's window sees the window's prices
    assert sorted((r["tbname"], r["_twstart"], r["n"], r["p"]) for r in b.sink("joined_out")) == [
        ("d1001", T0, 3, 20.0),
        ("d1001", T0 + M, 3, 80.0),
        ("d1002", T0, 3, 20.0),
        ("d1002", T0 + M, 3, 80.0),
    ]
    # %%tbname: each group reads its own subtable (the trigger table filtered to its tbname)
    assert sorted((r["tbname"], r["_twstart"], r["n"], r["c"]) for r in b.sink("own_out")) == [
        ("d1001", T0, 6, 150.0),
        ("d1001", T0 + M, 6, 510.0),
        ("d1002", T0, 6, 153.0),
        ("d1002", T0 + M, 6, 513.0),
    ]


def test_nondeterministic_where_falls_back_to_per_window_evaluation_and_says_so(tmp_path, spark, caplog):
    b = Bench(
        tmp_path,
        spark,
        """CREATE TABLE prices (ts TIMESTAMP, price DOUBLE);
        CREATE STREAM lucky INTERVAL(1m) SLIDING(1m) FROM meters INTO lucky_out AS
            SELECT _twstart, count(*) AS n FROM prices WHERE ts >= _twstart AND ts < _twend AND rand() >= 0;""",
    )
    b.engine.storage.append(
        "prices",
        pa.table(
            {
                "ts": pa.array([T0 + timedelta(seconds=s) for s in range(0, 180, 20)], pa.timestamp("us", tz="UTC")),
                "price": pa.array([1.0] * 9),
            }
        ),
    )
    b.tick("lucky")
    _two_meters(b)
    with caplog.at_level(logging.WARNING, logger="cq_engine.streams.plan"):
        b.tick("lucky")
    assert [(r["_twstart"], r["n"]) for r in b.sink("lucky_out")] == [(T0, 3), (T0 + M, 3)]
    assert "per-window evaluation of 2 window(s): the WHERE uses rand" in caplog.text


@BOTH
def test_output_subtable_and_tags_new_form(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        """CREATE STREAM shaped INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname, location
        INTO shaped_out OUTPUT_SUBTABLE(CONCAT('out_', %%1))
        TAGS (loc VARCHAR(24) COMMENT 'where' AS CONCAT('at-', %%2), meter VARCHAR(8) AS %%1)
        AS SELECT _twstart, count(*) AS n FROM %%trows;""",
    )
    b.tick("shaped")
    _two_meters(b)
    b.tick("shaped")
    rows = b.sink("shaped_out")
    assert set(rows[0]) == {"_twstart", "n", "tbname", "loc", "meter", "group_id"}
    assert {(r["tbname"], r["loc"], r["meter"], r["group_id"]) for r in rows} == {
        ("out_d1001", "at-loc-d1001", "d1001", _gid(spark, "d1001", "loc-d1001")),
        ("out_d1002", "at-loc-d1002", "d1002", _gid(spark, "d1002", "loc-d1002")),
    }


def test_subtable_without_tags_moves_the_trigger_tbname_aside(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        """CREATE STREAM sub INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname
        INTO sub_out OUTPUT_SUBTABLE(CONCAT('s_', %%tbname)) AS SELECT _twstart, count(*) AS n FROM %%trows;""",
    )
    b.tick("sub")
    _two_meters(b)
    b.tick("sub")
    assert {(r["tbname"], r["tag_tbname"]) for r in b.sink("sub_out")} == {("s_d1001", "d1001"), ("s_d1002", "d1002")}


def test_old_form_subtable_and_custom_tag(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        """CREATE STREAM avg_vol_s INTO avg_vol SUBTABLE(CONCAT('new-', tname)) AS
            SELECT _wstart, count(*) AS n, avg(voltage) AS v FROM meters PARTITION BY tbname tname INTERVAL(1m);
        CREATE STREAM streams2 TRIGGER AT_ONCE INTO st1 TAGS(cc VARCHAR(100)) AS
            SELECT _wstart, count(*) AS c1 FROM meters PARTITION BY CONCAT("tag-", tbname) AS cc INTERVAL(10s);""",
    )
    for name in ("avg_vol_s", "streams2"):
        b.tick(name)
    _two_meters(b)
    for name in ("avg_vol_s", "streams2"):
        b.tick(name)
    gid = _gid(spark, "d1001")
    names = {r["tname"]: r["tbname"] for r in b.sink("avg_vol")}
    assert names["d1001"] == f"new-d1001_avg_vol_{gid}"  # seed 000: "_<stable>_<groupId>" appended
    st1 = b.sink("st1")
    assert set(st1[0]) == {"_wstart", "c1", "cc", "group_id"}
    assert {r["cc"] for r in st1} == {"tag-d1001", "tag-d1002"}
    assert {r["group_id"] for r in st1 if r["cc"] == "tag-d1001"} == {_gid(spark, "tag-d1001")}


def test_group_id_is_stable_across_runs(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        """CREATE STREAM g INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname
        INTO g_out AS SELECT _twstart, count(*) AS n FROM %%trows;""",
    )
    b.tick("g")
    _two_meters(b, seconds=range(0, 70, 10))
    b.tick("g")
    _two_meters(b, seconds=range(70, 200, 10))
    b.tick("g")
    ids = {}
    for r in b.sink("g_out"):
        ids.setdefault(r["tbname"], set()).add(r["group_id"])
    assert ids == {"d1001": {_gid(spark, "d1001")}, "d1002": {_gid(spark, "d1002")}}
    assert len(b.sink("g_out")) == 6


@BOTH
def test_writing_into_an_existing_table_maps_columns_and_casts(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        """CREATE TABLE target (wts TIMESTAMP, cnt DOUBLE, avgc FLOAT, note STRING) TAGS (site STRING);
        CREATE STREAM listed INTERVAL(1m) SLIDING(1m) FROM meters INTO target (wts, cnt, avgc) AS
            SELECT _twstart, count(*), avg(current) FROM %%trows;
        CREATE TABLE positional (wts TIMESTAMP, cnt DOUBLE, avgc DOUBLE);
        CREATE STREAM bypos INTERVAL(1m) SLIDING(1m) FROM meters INTO positional AS
            SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;""",
    )
    for name in ("listed", "bypos"):
        b.tick(name)
    _two_meters(b)
    for name in ("listed", "bypos"):
        b.tick(name)
    target = b.engine.storage.schema("target")
    assert target.field("cnt").type == pa.float64() and target.field("avgc").type == pa.float32()
    assert [(r["wts"], r["cnt"], r["note"], r["site"]) for r in b.sink("target")] == [
        (T0, 12.0, None, None),
        (T0 + M, 12.0, None, None),
    ]
    assert [(r["wts"], r["cnt"], r["avgc"]) for r in b.sink("positional")] == [(T0, 12.0, 25.25), (T0 + M, 12.0, 85.25)]


@BOTH
def test_existing_delta_table_with_other_column_count_is_an_error_naming_it(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        """CREATE STREAM odd INTERVAL(1m) SLIDING(1m) FROM meters INTO odd_out AS
        SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;""",
    )
    b.engine.storage.append(
        "odd_out", pa.table({"wts": pa.array([T0], pa.timestamp("us", tz="UTC")), "n": pa.array([1], pa.int64())})
    )
    b.tick("odd")
    _two_meters(b)
    with pytest.raises(
        CQError,
        match=r"table 'odd_out' has 2 columns \(wts, n\) but the query yields 3; give INTO odd_out \(col, \.\.\.\)",
    ):
        b.tick("odd")
    assert len(b.sink("odd_out")) == 1  # nothing half-written


def test_force_output_writes_a_null_row_keeping_constants(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        """CREATE STREAM forced INTERVAL(1m) SLIDING(1m) FROM meters
        OPTIONS(FORCE_OUTPUT) INTO forced_out AS
        SELECT _twstart, _twduration AS dur, 7 AS seven, count(*) AS n, avg(current) AS c FROM %%trows WHERE current > 100;""",
    )
    b.tick("forced")
    _two_meters(b)  # currents 0..140.5: the first window has none above 100
    b.tick("forced")
    assert [(r["_twstart"], r["dur"], r["seven"], r["n"], r["c"]) for r in b.sink("forced_out")] == [
        (T0, 60 * MS, 7, None, None),
        (T0 + M, 60 * MS, 7, 3, 107.0),
    ]  # 110, 100.5, 110.5


def test_calc_notify_only_notifies_and_writes_nothing(tmp_path, spark):
    from ws_recorder import Recorder

    with Recorder() as recorder:
        b = Bench(
            tmp_path,
            spark,
            f"""CREATE STREAM quiet INTERVAL(1m) SLIDING(1m) FROM meters
            OPTIONS(CALC_NOTIFY_ONLY) NOTIFY('{recorder.url()}') ON (WINDOW_CLOSE)
            INTO quiet_out AS SELECT _twstart, count(*) AS n FROM %%trows;""",
        )
        b.tick("quiet")
        _two_meters(b)
        b.tick("quiet")
        recorder.wait_for(1)
        assert [e["result"]["n"] for e in recorder.events()] == [12, 12]
    assert b.sink("quiet_out") == []


@BOTH
def test_delete_output_table_removes_a_dropped_meters_rows(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        """CREATE STREAM d INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname
        OPTIONS(DELETE_OUTPUT_TABLE) INTO d_out AS SELECT _twstart, count(*) AS n FROM %%trows;""",
    )
    b.tick("d")
    _two_meters(b)
    b.tick("d")
    assert {r["tbname"] for r in b.sink("d_out")} == {"d1001", "d1002"}
    b.delete("tbname = 'd1002'")
    b.tick("d")
    assert {(r["tbname"], r["_twstart"]) for r in b.sink("d_out")} == {("d1001", T0), ("d1001", T0 + M)}


def test_period_stream_reading_a_table_applies_its_where(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        """CREATE TABLE prices (ts TIMESTAMP, price DOUBLE);
        CREATE STREAM pt PERIOD(1m) INTO pt_out AS SELECT _tlocaltime, count(*) AS n FROM prices WHERE price > 100;""",
    )
    b.engine.storage.append(
        "prices",
        pa.table(
            {
                "ts": pa.array([T0 + timedelta(seconds=s) for s in range(0, 180, 20)], pa.timestamp("us", tz="UTC")),
                "price": pa.array([float(s) for s in range(0, 180, 20)]),
            }
        ),
    )
    tick = NOW.replace(second=0)
    b.engine.run_period("pt", tick)
    assert [(r["_tlocaltime"], r["n"]) for r in b.sink("pt_out")] == [(tick, 3)]  # 120, 140, 160


ROWNUM_SQL = """CREATE STREAM rn_count INTERVAL(1m) SLIDING(30s) FROM meters PARTITION BY tbname INTO rn_count_out AS
        SELECT _twstart, _twrownum AS rn, _twrownum * 2 AS rn2, count(*) AS n FROM %%trows;
    CREATE STREAM rn_agg INTERVAL(1m) SLIDING(30s) FROM meters PARTITION BY tbname INTO rn_agg_out AS
        SELECT _twstart, sum(_twrownum) AS s, _twrownum AS rn FROM %%trows;
    CREATE STREAM rn_where INTERVAL(1m) SLIDING(30s) FROM meters PARTITION BY tbname INTO rn_where_out AS
        SELECT _twstart, count(*) AS n FROM %%trows WHERE _twrownum > 3;"""


def test_rownum_is_exact_as_a_count_or_per_row(tmp_path, spark):
    """``_twrownum`` outside aggregates is the window's count(1); inside one, or in the WHERE, it is
    computed per row (row_stats_needed). Both give the window's row count."""
    from cq_engine.streams.plan import row_stats_needed

    b = Bench(tmp_path, spark, ROWNUM_SQL)
    assert [row_stats_needed(b.engine.stream(n)) for n in ("rn_count", "rn_agg", "rn_where")] == [False, True, True]
    for name in ("rn_count", "rn_agg", "rn_where"):
        b.tick(name)
    b.append([(s, "d1001", 1.0) for s in range(0, 150, 10)] + [(s, "d1002", 1.0) for s in (5, 50, 100)])
    for name in ("rn_count", "rn_agg", "rn_where"):
        b.tick(name)
    # windows [-30, 30) ... [60, 120) close (T = 140 s); d1001 has 6 rows per full window, d1002 fewer
    starts = [T0 + timedelta(seconds=s) for s in (0, 30, 60)]
    d1001 = [(T0 - M / 2, 3)] + [(s, 6) for s in starts]
    d1002 = [(T0 - M / 2, 1), (T0, 2), (T0 + M / 2, 1), (T0 + M, 1)]
    count = {(r["tbname"], r["_twstart"]): (r["rn"], r["rn2"], r["n"]) for r in b.sink("rn_count_out")}
    assert count == {
        **{("d1001", s): (n, 2 * n, n) for s, n in d1001},
        **{("d1002", s): (n, 2 * n, n) for s, n in d1002},
    }
    agg = {(r["tbname"], r["_twstart"]): (r["s"], r["rn"]) for r in b.sink("rn_agg_out")}
    assert agg == {**{("d1001", s): (n * n, n) for s, n in d1001}, **{("d1002", s): (n * n, n) for s, n in d1002}}
    assert {(r["tbname"], r["_twstart"]): r["n"] for r in b.sink("rn_where_out")} == {("d1001", s): 6 for s in starts}


def test_time_windows_aggregate_without_a_sort(tmp_path, spark):
    """A sliding stream that does not need per-row window statistics is an explode and a hash
    aggregate: no window operator, no sort (the plan the run builds, as _run_time_windows builds it)."""
    from cq_engine.streams.plan import evaluate, prepare, row_stats_needed, with_placeholders
    from cq_engine.streams.windows.tdengine import WCLOSED, WSTART, assign_windows

    b = Bench(tmp_path, spark, ROWNUM_SQL)
    _two_meters(b)
    df, _ = b.engine.storage.read_range(spark, "meters", time_column="ts", time_range=None)

    def physical(name: str) -> str:
        stream = b.engine.stream(name)
        windows = assign_windows(
            prepare(stream, df),
            stream.trigger,
            time_column="ts",
            keys=["tbname"],
            close_until=NOW,
            row_stats=row_stats_needed(stream),
        )
        out = evaluate(stream, with_placeholders(stream, windows, tick=NOW, tz="UTC"), keep=[WSTART, WCLOSED])
        return out._jdf.queryExecution().executedPlan().toString()

    plan = physical("rn_count")
    assert "Generate explode" in plan and "HashAggregate" in plan
    assert "Sort" not in plan and "Window" not in plan, plan
    assert "Window" in physical("rn_agg")  # _twrownum inside an aggregate: per row, by a window function
