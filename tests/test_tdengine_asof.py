"""LEFT ASOF JOIN in a new-form stream's query (docs/dialects/tdengine.md, A stream's query): each trigger
row with the one nearest row of another table its time comparison allows (>=, >, <=, <; the default
without ON), among the rows equal on the ON's equalities, NULL where none — against the nearest rows
found by hand, including caps set before the run's range."""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa
import pytest
from streams_util import T0, Bench, us
from test_tdengine_query import ROWS, _rows

SEC = 1_000_000
# (seconds after T0, status, cap): one before every trigger row, several per status over time
CAPS = [(-50, 1, 5.0), (-50, 4, 6.0), (3, 1, 11.0), (7, 2, 8.0), (31, 4, 12.0), (40, 1, 20.0), (60, 9, 1.0)]
QUERIES = {
    "ge": "ON m.ts >= c.ts AND m.status = c.status",
    "gt": "ON c.ts < m.ts AND m.status = c.status JLIMIT 1",
    "le": "ON m.ts <= c.ts",
    "lt": "ON m.ts < c.ts AND c.status = m.status",
    "default": "",
}


@pytest.fixture(scope="module")
def bench(tmp_path_factory, spark):
    sql = "CREATE TABLE caps (ts TIMESTAMP, status INT, cap DOUBLE);\n" + "".join(
        f"CREATE STREAM a_{k} INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname INTO out_{k} AS "
        f"SELECT m.ts, m.status, c.cap, c.ts AS cap_ts FROM %%trows m LEFT ASOF JOIN caps c {on};\n"
        for k, on in QUERIES.items()
    )
    b = Bench(tmp_path_factory.mktemp("tda"), spark, sql)
    b.engine.storage.append(
        "caps",
        pa.table(
            {
                "ts": pa.array([T0 + timedelta(seconds=s) for s, _, _ in CAPS], pa.timestamp("us", tz="UTC")),
                "status": pa.array([st for _, st, _ in CAPS], pa.int32()),
                "cap": pa.array([c for _, _, c in CAPS], pa.float64()),
            }
        ),
    )
    for k in QUERIES:
        assert b.tick(f"a_{k}").works == ()
    b.append(ROWS)
    for k in QUERIES:
        b.tick(f"a_{k}")
    return b


def _nearest(row: dict, op: str, same_status: bool):
    caps = [(us(T0) + s * SEC, st, c) for s, st, c in CAPS if not same_status or st == row["status"]]
    t = row["t"]
    allowed = {
        ">=": [x for x in caps if x[0] <= t],
        ">": [x for x in caps if x[0] < t],
        "<=": [x for x in caps if x[0] >= t],
        "<": [x for x in caps if x[0] > t],
    }[op]
    if not allowed:
        return None, None
    best = max(allowed) if op in (">=", ">") else min(allowed)
    return best[2], best[0]


@pytest.mark.parametrize("kind", list(QUERIES))
def test_each_trigger_row_gets_the_nearest_row_allowed(bench, kind):
    op = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "default": ">="}[kind]
    same = kind in ("ge", "gt", "lt")
    closed = [r for r in _rows() if r["t"] < us(T0) + 100 * SEC]  # the rows at 100 s close the rest
    want = sorted((r["tbname"], r["t"], *_nearest(r, op, same)) for r in closed)
    got = sorted(
        (r["tbname"], us(r["ts"]), r["cap"], None if r["cap_ts"] is None else us(r["cap_ts"]))
        for r in bench.sink(f"out_{kind}")
    )
    assert got == want
    if same:  # statuses without a cap of their own: NULL
        assert any(w[2] is None for w in want)
    if op in (">=", ">"):  # caps set before the run's range are found
        assert any(w[3] is not None and w[3] < us(T0) for w in want)
