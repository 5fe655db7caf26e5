"""Random IoTDB continuous queries (eight aggregates and times, sliding windows, ALIGN BY DEVICE or
GROUP BY device or one device, WHERE on values or devices, FILL, LIMIT/OFFSET, row-wise with FILL)
fired by the engine against the pure-Python reference of IoTDB's rules (tests/iotdb_reference.py):
NULL is an absent point, LIMIT numbers every window, every known device is a row. All firings run
fused (one Spark job per ten), a third of them again alone: both give the reference's rows."""

import random
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from deltalake import DeltaTable
from iotdb_reference import TIMES, expected, random_case, random_rows

from cq_engine.config import Settings
from cq_engine.engine import Engine
from cq_engine.resample.fused import FiringRequest, run_firings

T0 = datetime(2024, 1, 1, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)
SPAN = 60  # seconds: EVERY = RANGE, one firing over [T0, T0 + 60s)
CASES = 30


def _sink(engine: Engine, case) -> set[tuple]:
    uri = engine.settings.table_uri(f"{case.name}_out")
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
