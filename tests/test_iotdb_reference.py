"""Random IoTDB continuous queries (eight aggregates and times, sliding windows, ALIGN BY DEVICE or
GROUP BY device or one device, WHERE on values or devices, FILL, LIMIT/OFFSET, row-wise with FILL)
fired by the engine against the pure-Python reference of IoTDB's rules (tests/iotdb_reference.py):
NULL is an absent point, LIMIT numbers every window, every known device is a row. All firings run
fused (one Spark job per ten), a third of them again alone: both give the reference's rows."""

import random
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from deltalake import DeltaTable
from iotdb_reference import TIMES, expected, random_case, random_rows, upserted

from cq_engine.config import Settings
from cq_engine.engine import Engine
from cq_engine.resample.fused import FiringRequest, run_firings

T0 = datetime(2024, 1, 1, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)
SPAN = 60  # seconds: EVERY = RANGE, one firing over [T0, T0 + 60s)
CASES = 30


def _sink(engine: Engine, case, table: str | None = None) -> set[tuple]:
    uri = engine.settings.table_uri(table or f"{case.name}_out")
    out = set()
    for r in DeltaTable(uri).to_pyarrow_table().to_pylist():
        values = []
        for (func, _), name in zip(case.items, case.names):
            v = r[name]
            values.append(v - T0_MS if func in TIMES and v is not None else v)  # INT64 ms
        row = (int((r["ts"] - T0).total_seconds()), r.get("device"), *values)
        out.add(tuple(round(v, 6) if isinstance(v, float) else v for v in row))
    return out


def test_random_continuous_queries_write_what_iotdb_writes(spark, tmp_path):
    rng = random.Random(22)
    rows = random_rows(rng, span=SPAN)
    cases = [random_case(rng, f"q{i}") for i in range(CASES)]
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "q.sql").write_text(
        "CREATE TABLE IF NOT EXISTS t (ts TIMESTAMP, device STRING, s1 DOUBLE, s2 DOUBLE);\n"
        + ";\n".join(c.sql(every=SPAN) for c in cases)
        + ";\n"
    )
    engine = Engine(
        settings=Settings(sql_dir=str(tmp_path / "sql"), warehouse=str(tmp_path / "wh"), home=str(tmp_path / ".cq")),
        spark_session=spark,
    )
    assert not engine.catalog.errors, engine.catalog.errors
    engine.ensure_tables()
    table = pa.table(
        {
            "ts": pa.array([T0 + timedelta(seconds=r["t"]) for r in rows], pa.timestamp("us", tz="UTC")),
            "device": [r["device"] for r in rows],
            "s1": pa.array([r["s1"] for r in rows], pa.float64()),
            "s2": pa.array([r["s2"] for r in rows], pa.float64()),
        }
    )
    for k in range(0, table.num_rows, 12):  # several commits, as a live feed
        engine.storage.append("t", table.slice(k, 12))
    fire = T0 + timedelta(seconds=SPAN)
    wanted = {c.name: expected(c, rows, lo=0, hi=SPAN) for c in cases}
    assert sum(bool(w) for w in wanted.values()) > CASES * 2 // 3, "most cases must write rows"

    outcomes = run_firings(
        engine.ctx, [FiringRequest(cq=engine.continuous_query(c.name), fire_time=fire) for c in cases]
    )
    assert all(not isinstance(o, Exception) for o in outcomes), [o for o in outcomes if isinstance(o, Exception)]
    for case in cases:
        assert _sink(engine, case) == wanted[case.name], (case.sql(every=SPAN), sorted(wanted[case.name], key=str))
    for case in cases[::3]:
        engine.run_firing(case.name, fire)
        assert _sink(engine, case) == wanted[case.name], ("alone", case.sql(every=SPAN))


def _engine(spark, tmp_path, sql: str) -> Engine:
    (tmp_path / "sql").mkdir(exist_ok=True)
    (tmp_path / "sql" / "q.sql").write_text(
        "CREATE TABLE IF NOT EXISTS t (ts TIMESTAMP, device STRING, s1 DOUBLE, s2 DOUBLE);\n" + sql
    )
    engine = Engine(
        settings=Settings(sql_dir=str(tmp_path / "sql"), warehouse=str(tmp_path / "wh"), home=str(tmp_path / ".cq")),
        spark_session=spark,
    )
    assert not engine.catalog.errors, engine.catalog.errors
    engine.ensure_tables()
    return engine


def _append(engine: Engine, rows: list[dict]) -> None:
    engine.storage.append(
        "t",
        pa.table(
            {
                "ts": pa.array([T0 + timedelta(seconds=r["t"]) for r in rows], pa.timestamp("us", tz="UTC")),
                "device": [r["device"] for r in rows],
                "s1": pa.array([r["s1"] for r in rows], pa.float64()),
                "s2": pa.array([r.get("s2") for r in rows], pa.float64()),
            }
        ),
    )


def test_overlapping_firings_add_points_and_keep_the_earlier_ones(spark, tmp_path):
    # issue 41's case, run side by side with IoTDB: d1's s1 = 1 @0s, 2 @5s, 3 @8s, 3.5 @12s, 4 @21s,
    # 5 @33s; GROUP BY (10s) LIMIT 1 OFFSET 1 over RANGE 30s fired at +30, +40, +50 s writes each
    # firing's second window (10s, 20s, 30s), and IoTDB keeps all three: it never deletes a point.
    body = "SELECT max_value(s1) AS m INTO {n}_out FROM t WHERE device = 'd1' GROUP BY (10s) LIMIT 1 OFFSET 1"
    engine = _engine(
        spark,
        tmp_path,
        "".join(f"CREATE CQ {n} RESAMPLE EVERY 10s RANGE 30s BEGIN {body.format(n=n)} END;\n" for n in ("seq", "rec")),
    )
    points = [(0, 1.0), (5, 2.0), (8, 3.0), (12, 3.5), (21, 4.0), (33, 5.0)]
    _append(engine, [{"t": t, "device": "d1", "s1": v} for t, v in points])
    for fire in (30, 40, 50):
        engine.run_firing("seq", T0 + timedelta(seconds=fire))
    engine.recalculate("rec", start=T0, end=T0 + timedelta(seconds=50))
    for name in ("seq", "rec"):
        sink = DeltaTable(engine.settings.table_uri(f"{name}_out")).to_pyarrow_table().to_pylist()
        assert sorted(((r["ts"] - T0).total_seconds(), r["m"]) for r in sink) == [(10, 3.5), (20, 4.0), (30, 5.0)], name


def test_random_firing_sequences_and_recalculations_give_the_union_of_firings(spark, tmp_path):
    # Random definitions over RANGE 30s EVERY 10s (overlapping ranges: FILL, LIMIT and windows cut at a
    # range end differ between firings), fired one by one (fused, in rounds) and recalculated: both
    # leave what IoTDB's firings leave, the upsert of each firing's non-NULL cells in order.
    rng = random.Random(41)
    rows = random_rows(rng, span=SPAN)
    cases = [random_case(rng, f"u{i}") for i in range(12)]
    sql = "".join(f"{c.sql(every=10, range_=30)};\n{c.sql(every=10, range_=30, name=c.name + 'r')};\n" for c in cases)
    engine = _engine(spark, tmp_path, sql)
    _append(engine, rows)
    fires = [30, 40, 50, 60]
    wanted = {c.name: upserted([expected(c, rows, lo=f - 30, hi=f) for f in fires]) for c in cases}
    assert sum(bool(w) for w in wanted.values()) > len(cases) // 2
    for f in fires:  # a batch run's round: every definition's firing at f, fused
        outcomes = run_firings(
            engine.ctx,
            [FiringRequest(cq=engine.continuous_query(c.name), fire_time=T0 + timedelta(seconds=f)) for c in cases],
        )
        assert all(not isinstance(o, Exception) for o in outcomes), outcomes
    for c in cases:
        engine.recalculate(c.name + "r", start=T0, end=T0 + timedelta(seconds=fires[-1]))
        assert _sink(engine, c) == wanted[c.name], ("fired", c.sql(every=10, range_=30))
        assert _sink(engine, c, table=f"{c.name}r_out") == wanted[c.name], ("recalculated", c.sql(every=10, range_=30))
