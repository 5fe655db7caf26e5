"""resample.fused: many firings in one Spark job give exactly the sinks and ledger of running each
alone; a failing firing costs only itself (real Spark, real Delta tables)."""

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from seed_tables import CQ1, CQ2, CQ3, CQ4, CQ5, CST, aligned_to_rows, wide_to_rows

from cq_engine.config import Settings
from cq_engine.engine import Engine
from cq_engine.resample import fused as fused_module
from cq_engine.resample.fused import FiringRequest, run_firings
from cq_engine.times import parse_time

DATA = Path(__file__).parent / "data"
T0 = datetime(2024, 3, 1, tzinfo=UTC)
M1 = timedelta(minutes=1)

# Same source, range and grouping (one shared aggregation), plus queries that cannot share it
# (FILL, HAVING, LIMIT, another grouping, a WHERE, row-wise), and columns that are NULL for one
# query where another has values.
MIXED = """
CREATE TABLE IF NOT EXISTS m (ts TIMESTAMP, device STRING, a DOUBLE, b DOUBLE);
CREATE CQ s_max RESAMPLE EVERY 1m BEGIN SELECT max_value(a) AS v INTO s_max_out FROM m GROUP BY (10s), device END;
CREATE CQ s_cnt RESAMPLE EVERY 1m BEGIN SELECT count(b) AS n, avg(b) AS ab INTO s_cnt_out FROM m GROUP BY (10s), device END;
CREATE CQ s_min RESAMPLE EVERY 1m BEGIN SELECT min_value(b) AS lo, sum(a) AS total INTO s_min_out FROM m GROUP BY (10s), device END;
CREATE CQ filled RESAMPLE EVERY 1m BEGIN SELECT max_value(a) AS v INTO filled_out FROM m GROUP BY (10s), device FILL(PREVIOUS) END;
CREATE CQ having RESAMPLE EVERY 1m BEGIN SELECT count(a) AS n INTO having_out FROM m GROUP BY (10s), device HAVING count(a) > 1 END;
CREATE CQ limited RESAMPLE EVERY 1m BEGIN SELECT max_value(a) AS v INTO limited_out FROM m GROUP BY (10s), device LIMIT 3 END;
CREATE CQ coarse RESAMPLE EVERY 1m BEGIN SELECT avg(a) AS v INTO coarse_out FROM m GROUP BY (30s) END;
CREATE CQ filtered RESAMPLE EVERY 1m BEGIN SELECT count(a) AS n INTO filtered_out FROM m WHERE device = 'd1' GROUP BY (10s), device END;
CREATE CQ rows RESAMPLE EVERY 1m BEGIN SELECT a * 2 AS a2 INTO rows_out FROM m END;
CREATE CQ whole RESAMPLE EVERY 1m BEGIN SELECT count(a) AS n, max_value(b) AS mb INTO whole_out FROM m END;
CREATE CQ filtered2 RESAMPLE EVERY 1m BEGIN SELECT max_value(b) AS mb, count(b) AS nb INTO filtered2_out FROM m WHERE device = 'd1' GROUP BY (10s), device END;
CREATE CQ aligned RESAMPLE EVERY 1m BEGIN SELECT first_value(b) AS fb, count(a) AS n INTO aligned_out FROM m GROUP BY (10s) LIMIT 7 OFFSET 2 ALIGN BY DEVICE END;
CREATE CQ rowfill RESAMPLE EVERY 1m BEGIN SELECT a, b INTO rowfill_out FROM m FILL(PREVIOUS) ALIGN BY DEVICE END;
"""
NAMES = [
    "s_max",
    "s_cnt",
    "s_min",
    "filled",
    "having",
    "limited",
    "coarse",
    "filtered",
    "rows",
    "whole",
    "filtered2",
    "aligned",
    "rowfill",
]


def _rows() -> pa.Table:
    """Three minutes of readings every 2 s from three devices, with holes: `b` is NULL where `a` is
    set on d2 (so one query's values are all NULL where another's are not), and d3 is silent in the
    second minute (empty windows: count 0, FILL)."""
    ts, dev, a, b = [], [], [], []
    for s in range(0, 180, 2):
        for d in ("d1", "d2", "d3"):
            if d == "d3" and 60 <= s < 120:
                continue
            ts.append(T0 + timedelta(seconds=s))
            dev.append(d)
            a.append(float(s % 17) if not (d == "d1" and 20 <= s < 30) else None)
            b.append(None if d == "d2" else float(s % 5))
    return pa.table(
        {"ts": pa.array(ts, pa.timestamp("us", tz="UTC")), "device": dev, "a": pa.array(a), "b": pa.array(b)}
    )


def _engine(spark, root: Path, sql: str = MIXED) -> Engine:
    """An engine over ``root`` with ``sql``, and `m` holding ``_rows()`` in several commits (like a live feed)."""
    (root / "sql").mkdir(parents=True)
    (root / "sql" / "m.sql").write_text(sql)
    engine = Engine(
        settings=Settings(sql_dir=str(root / "sql"), warehouse=str(root / "wh"), home=str(root / ".cq")),
        spark_session=spark,
    )
    assert not engine.catalog.errors, engine.catalog.errors
    engine.ensure_tables()
    rows = _rows()
    for k in range(0, rows.num_rows, 90):
        engine.storage.append("m", rows.slice(k, 90))
    return engine


def _sink(engine: Engine, name: str) -> list[dict]:
    table = DeltaTable(engine.settings.table_uri(f"{name}_out")).to_pyarrow_table()
    return sorted(table.to_pylist(), key=lambda r: tuple(str(v) for v in r.values()))


def test_fused_firings_equal_firings_run_alone(spark, tmp_path, monkeypatch):
    # Chunks of 4: planned, computed and committed while the next chunk plans; a shared shape
    # (s_max, s_cnt, s_min) is in one chunk, filtered and filtered2 fall in two.
    monkeypatch.setattr(fused_module, "FUSE_CHUNK", 4)
    alone, fused = _engine(spark, tmp_path / "alone"), _engine(spark, tmp_path / "fused")
    fires = [T0 + timedelta(minutes=k) for k in (1, 2, 3)]
    for fire in fires:
        for name in NAMES:
            alone.run_firing(name, fire)
        outcomes = run_firings(fused.ctx, [FiringRequest(cq=fused.continuous_query(n), fire_time=fire) for n in NAMES])
        assert [type(o).__name__ for o in outcomes] == ["RunResult"] * len(NAMES)
        assert [o.definition for o in outcomes] == NAMES
    for name in NAMES:
        expected = _sink(alone, name)
        assert expected, f"{name} wrote nothing: the comparison would prove nothing"
        assert _sink(fused, name) == expected, name
    # In the shared aggregation each query keeps its own rows: b is NULL on d2, so s_cnt has d2's
    # windows with count 0; a is NULL on d1 in [20s, 30s), so s_max drops that window, s_cnt keeps it.
    assert len([r for r in _sink(fused, "s_cnt") if r["device"] == "d2" and r["n"] == 0]) == 18
    # d3, silent in the second minute, is still a device: s_cnt has its windows with count 0.
    assert len([r for r in _sink(fused, "s_cnt") if r["device"] == "d3" and r["n"] == 0]) == 6
    hole = T0 + timedelta(seconds=20)
    assert not [r for r in _sink(fused, "s_max") if r["device"] == "d1" and r["ts"] == hole]
    assert [r for r in _sink(fused, "s_cnt") if r["device"] == "d1" and r["ts"] == hole]

    # One ledger entry per firing, as alone: same definitions, fire times, ranges and row counts.
    def entries(engine):
        return sorted(
            (e.definition, e.fire_time, e.range_start, e.range_end, e.rows_written, e.status)
            for e in engine.ledger.entries()
        )

    assert entries(fused) == entries(alone)
    assert len(entries(fused)) == len(NAMES) * len(fires)


def test_fused_firings_reproduce_the_seed_tables(spark, tmp_path):
    (tmp_path / "sql").mkdir()
    shutil.copy(DATA / "seed004.sql", tmp_path / "sql" / "seed004.sql")
    engine = Engine(
        settings=Settings(sql_dir=str(tmp_path / "sql"), warehouse=str(tmp_path / "wh"), timezone="Asia/Shanghai"),
        spark_session=spark,
    )
    engine.ingest("ln", str(DATA / "ln.csv"))
    rounds = [
        {"cq1": "22:18:40", "cq2": "22:18:40", "cq3": "22:18:40", "cq4": "22:18:40", "cq5": "22:18:40"},
        {"cq2": "22:18:50"},
        {"cq1": "22:19:00", "cq2": "22:19:00", "cq3": "22:19:00", "cq4": "22:19:00", "cq5": "22:19:00"},
    ]
    for r in rounds:
        firings = [
            FiringRequest(cq=engine.continuous_query(n), fire_time=parse_time(f"2021-05-11T{t}", tz=CST))
            for n, t in r.items()
        ]
        assert all(not isinstance(o, Exception) for o in run_firings(engine.ctx, firings))

    def rows(table, column):
        data = DeltaTable(engine.settings.table_uri(table)).to_pyarrow_table().to_pylist()
        return {(r["time"], r["device"], r[column]) for r in data}

    for name, expected in (("cq1", CQ1), ("cq2", CQ2), ("cq3", CQ3), ("cq4", CQ4)):
        assert rows(f"{name}_out", "temperature_max") == wide_to_rows(expected), name
    # As in test_seed_cq: seed 004 prints 45.0 where its own input gives 43.0 (an erratum).
    erratum = (parse_time("2021-05-11T22:18:39.990", tz=CST), "root.ln.wf02.wt02")
    expected = {r for r in aligned_to_rows(CQ5) if r[:2] != erratum} | {(*erratum, 43.0)}
    assert rows("cq5_out", "temperature") == expected


BROKEN = """
CREATE TABLE IF NOT EXISTS m (ts TIMESTAMP, device STRING, a DOUBLE, b DOUBLE);
CREATE CQ good1 RESAMPLE EVERY 1m BEGIN SELECT max_value(a) AS v INTO good1_out FROM m GROUP BY (10s), device END;
CREATE CQ bad RESAMPLE EVERY 1m BEGIN
  SELECT max_value(assert_true(a < 0, 'a is not negative')) AS v INTO bad_out FROM m GROUP BY (10s), device END;
CREATE CQ good2 RESAMPLE EVERY 1m BEGIN SELECT count(b) AS n INTO good2_out FROM m GROUP BY (10s), device END;
CREATE CQ nosrc RESAMPLE EVERY 1m BEGIN SELECT max_value(zz) AS v INTO nosrc_out FROM ghost GROUP BY (10s), device END;
"""


def test_a_failing_firing_costs_only_itself(spark, tmp_path):
    engine = _engine(spark, tmp_path, BROKEN)
    fire = T0 + timedelta(minutes=2)
    names = ["good1", "bad", "good2", "nosrc"]
    outcomes = run_firings(engine.ctx, [FiringRequest(cq=engine.continuous_query(n), fire_time=fire) for n in names])
    by_name = dict(zip(names, outcomes))
    # d3 is silent in the range: no maximum, but a count of 0 (a known device, as IoTDB's schema has it)
    assert by_name["good1"].rows_written == 12 and by_name["good2"].rows_written == 18
    assert isinstance(by_name["bad"], Exception) and "a is not negative" in str(by_name["bad"])
    assert isinstance(by_name["nosrc"], Exception) and "'ghost' does not exist" in str(by_name["nosrc"])
    status = {(e.definition, e.status) for e in engine.ledger.entries()}
    assert status == {("good1", "succeeded"), ("good2", "succeeded"), ("bad", "failed"), ("nosrc", "failed")}
    assert not engine.storage.exists("bad_out") or engine.storage.version("bad_out") == 0


def test_a_firing_another_run_committed_is_skipped_and_recorded_once(spark, tmp_path):
    # Two runs of the same firings (a sensor that lost its cursor, a run failed while its worker went
    # on): the second finds each sink holding the firing's identity and records nothing, even with
    # rows added to the source in between (computing again would record the firing twice).
    first = _engine(spark, tmp_path)
    second = Engine(settings=first.settings, spark_session=spark)
    fire = T0 + timedelta(minutes=2)
    requests = [FiringRequest(cq=first.continuous_query(n), fire_time=fire) for n in NAMES]
    assert all(type(o).__name__ == "RunResult" for o in run_firings(first.ctx, requests))
    sinks = {n: _sink(first, n) for n in NAMES}
    first.storage.append("m", _rows().slice(0, 30))
    again = run_firings(second.ctx, requests)
    assert [type(o).__name__ for o in again] == ["AlreadyCommitted"] * len(NAMES)
    assert {n: _sink(second, n) for n in NAMES} == sinks
    entries = [(e.definition, e.fire_time, e.status) for e in second.ledger.entries()]
    assert sorted(entries) == sorted((n, fire, "succeeded") for n in NAMES)
    # An earlier firing, after the later one committed, is refused the same way; a later one runs.
    (early,) = run_firings(second.ctx, [FiringRequest(cq=second.continuous_query(NAMES[0]), fire_time=fire - M1)])
    (late,) = run_firings(second.ctx, [FiringRequest(cq=second.continuous_query(NAMES[0]), fire_time=fire + M1)])
    assert type(early).__name__ == "AlreadyCommitted" and type(late).__name__ == "RunResult"


def test_one_firing_per_definition(spark, tmp_path):
    engine = _engine(spark, tmp_path)
    cq = engine.continuous_query("s_max")
    with pytest.raises(ValueError, match="one firing per definition"):
        run_firings(engine.ctx, [FiringRequest(cq=cq, fire_time=T0 + timedelta(minutes=1))] * 2)


def test_a_time_that_is_not_a_firing_time_fails_alone(spark, tmp_path):
    engine = _engine(spark, tmp_path)
    at = T0 + timedelta(minutes=1)
    requests = [
        FiringRequest(cq=engine.continuous_query("s_max"), fire_time=at),
        FiringRequest(cq=engine.continuous_query("s_cnt"), fire_time=at + timedelta(seconds=1)),
    ]
    ok, bad = run_firings(engine.ctx, requests)
    assert ok.rows_written > 0
    assert isinstance(bad, Exception) and "is not a firing time" in str(bad)
