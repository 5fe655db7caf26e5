"""TDengine's time-series joins in a new-form stream's query (docs/dialects/tdengine.md, A stream's query),
against the matches found by hand from TDengine's definitions:
- LEFT ASOF JOIN: each trigger row with the JLIMIT nearest rows of another table its time comparison
  allows (>=, >, =, <=, <; >= without ON), among the rows equal on the ON's equalities, NULL where none,
  including caps set before the run's range; JLIMIT 0 matches none.
- LEFT WINDOW JOIN: each trigger row with the rows in [ts + start, ts + end], earliest first up to
  JLIMIT; with aggregates one row per trigger row, HAVING over them.
A row arriving late reruns its window, which has several result rows."""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa
import pytest
from streams_util import T0, Bench, us
from test_tdengine_query import ROWS, _rows

SEC = 1_000_000
# (seconds after T0, status, cap): one before every trigger row, several per status over time
CAPS = [(-50, 1, 5.0), (-50, 4, 6.0), (3, 1, 11.0), (7, 2, 8.0), (31, 4, 12.0), (40, 1, 20.0), (60, 9, 1.0)]
ASOF = {  # name: (ON ... JLIMIT, operator, same status, JLIMIT)
    "ge": ("ON m.ts >= c.ts AND m.status = c.status", ">=", True, 1),
    "gt": ("ON c.ts < m.ts AND m.status = c.status JLIMIT 1", ">", True, 1),
    "le": ("ON m.ts <= c.ts", "<=", False, 1),
    "lt": ("ON m.ts < c.ts AND c.status = m.status", "<", True, 1),
    "default": ("", ">=", False, 1),
    "ge2": ("ON m.ts >= c.ts AND m.status = c.status JLIMIT 2", ">=", True, 2),
    "le3": ("ON m.ts <= c.ts JLIMIT 3", "<=", False, 3),
    "gt9": ("ON m.ts > c.ts JLIMIT 9", ">", False, 9),
    "eq": ("ON m.ts = c.ts", "=", False, 1),
    "none": ("ON m.ts >= c.ts JLIMIT 0", ">=", False, 0),
}
WINDOW = {  # name: (ON ... WINDOW_OFFSET ... JLIMIT, start, end, same status, JLIMIT)
    "w": ("WINDOW_OFFSET(-5s, 2s)", -5, 2, False, None),
    "w_status": ("ON m.status = c.status WINDOW_OFFSET(-10s, 10s) JLIMIT 1", -10, 10, True, 1),
    "w_after": ("WINDOW_OFFSET(1s, 30s) JLIMIT 2", 1, 30, False, 2),
}
LATE = (7, "d1", 9.0, 226, 2)  # arrives after its window ran: the window reruns


@pytest.fixture(scope="module")
def bench(tmp_path_factory, spark):
    cols = "SELECT m.ts, m.status, c.cap, c.ts AS cap_ts FROM %%trows m"
    head = "INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname"
    sql = "CREATE TABLE caps (ts TIMESTAMP, status INT, cap DOUBLE);\n"
    sql += "".join(
        f"CREATE STREAM a_{k} {head} INTO out_{k} AS {cols} LEFT ASOF JOIN caps c {on};\n"
        for k, (on, *_) in ASOF.items()
    )
    sql += "".join(
        f"CREATE STREAM a_{k} {head} INTO out_{k} AS {cols} LEFT WINDOW JOIN caps c {on};\n"
        for k, (on, *_) in WINDOW.items()
    )
    sql += (
        f"CREATE STREAM a_agg {head} INTO out_agg AS SELECT m.ts, m.current, count(c.cap) n, sum(c.cap) s, "
        "max(c.ts) last_ts FROM %%trows m LEFT WINDOW JOIN caps c WINDOW_OFFSET(-5s, 2s);\n"
        f"CREATE STREAM a_having {head} INTO out_having AS SELECT m.ts, m.current, count(*) n FROM %%trows m "
        "LEFT WINDOW JOIN caps c WINDOW_OFFSET(-5s, 2s) HAVING count(c.cap) > 0;\n"
    )
    b = Bench(tmp_path_factory.mktemp("tdj"), spark, sql)
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
    b.names = [f"a_{k}" for k in [*ASOF, *WINDOW, "agg", "having"]]
    for name in b.names:
        assert b.tick(name).works == ()
    b.append([r for r in ROWS if r != LATE])
    for name in b.names:
        b.tick(name)
    b.append([LATE])
    for name in b.names:
        b.tick(name)
    return b


def _closed() -> list[dict]:
    return [r for r in _rows() if r["t"] < us(T0) + 100 * SEC]  # the rows at 100 s close the rest


def _caps(row: dict, same_status: bool) -> list[tuple[int, int, float]]:
    return [(us(T0) + s * SEC, st, c) for s, st, c in CAPS if not same_status or st == row["status"]]


def _nearest(row: dict, op: str, same_status: bool, limit: int) -> list[tuple[float | None, int | None]]:
    t, caps = row["t"], _caps(row, same_status)
    allowed = {
        ">=": [x for x in caps if x[0] <= t],
        ">": [x for x in caps if x[0] < t],
        "=": [x for x in caps if x[0] == t],
        "<=": [x for x in caps if x[0] >= t],
        "<": [x for x in caps if x[0] > t],
    }[op]
    # the nearest first; of caps at one time, the engine takes the one whose columns sort last (backward)
    # or first (forward): TDengine leaves that choice open, the engine makes it the same every rerun
    allowed.sort(reverse=op in (">=", ">"))
    found = [(c, ts) for ts, _, c in allowed[:limit]]
    return found or [(None, None)]


def _got(bench, name: str) -> list[tuple]:
    return sorted(
        (r["tbname"], us(r["ts"]), r["cap"], None if r["cap_ts"] is None else us(r["cap_ts"]))
        for r in bench.sink(f"out_{name}")
    )


@pytest.mark.parametrize("kind", list(ASOF))
def test_each_trigger_row_gets_the_nearest_rows_allowed(bench, kind):
    _, op, same, limit = ASOF[kind]
    want = sorted((r["tbname"], r["t"], *m) for r in _closed() for m in _nearest(r, op, same, limit))
    # no two caps of one status share a time, and none of the rows' nearest ties: the choice is TDengine's
    assert _got(bench, kind) == want
    if same:  # statuses without a cap of their own: NULL
        assert any(w[2] is None for w in want)
    if op in (">=", ">") and limit:  # caps set before the run's range are found
        assert any(w[3] is not None and w[3] < us(T0) for w in want)
    if limit > 1:  # several matches for some rows
        assert len(want) > len(_closed())


def _in_window(row: dict, start: int, end: int, same: bool, limit: int | None) -> list[tuple[int, int, float]]:
    t = row["t"]
    inside = sorted(x for x in _caps(row, same) if t + start * SEC <= x[0] <= t + end * SEC)
    return inside[:limit] if limit is not None else inside


@pytest.mark.parametrize("kind", list(WINDOW))
def test_each_trigger_row_gets_the_rows_in_its_window(bench, kind):
    _, start, end, same, limit = WINDOW[kind]
    want = []
    for r in _closed():
        found = _in_window(r, start, end, same, limit)
        want += [(r["tbname"], r["t"], c, ts) for ts, _, c in found] or [(r["tbname"], r["t"], None, None)]
    assert _got(bench, kind) == sorted(want)
    if kind != "w_after":  # rows whose window holds no cap
        assert any(w[2] is None for w in want)
    if limit != 1:  # rows whose window holds several
        assert len({w[:2] for w in want}) < len(want)


def test_aggregates_of_a_window_join_are_per_trigger_row(bench):
    want = []
    for r in _closed():
        found = _in_window(r, -5, 2, False, None)
        total = sum(c for _, _, c in found) if found else None
        want.append(
            (r["tbname"], r["t"], r["current"], len(found), total, max((ts for ts, _, _ in found), default=None))
        )
    got = [
        (x["tbname"], us(x["ts"]), x["current"], x["n"], x["s"], None if x["last_ts"] is None else us(x["last_ts"]))
        for x in bench.sink("out_agg")
    ]
    assert sorted(got, key=repr) == sorted(want, key=repr)
    assert {w[3] for w in want} >= {0, 1, 2}  # rows with no cap, one, and several


def test_having_keeps_the_trigger_rows_whose_window_matched(bench):
    want = sorted(
        (r["tbname"], r["t"], len(_in_window(r, -5, 2, False, None)))
        for r in _closed()
        if _in_window(r, -5, 2, False, None)
    )
    got = sorted((x["tbname"], us(x["ts"]), x["n"]) for x in bench.sink("out_having"))
    assert got == want
    assert 0 < len(got) < len(_closed())


def test_a_late_row_reruns_its_window_of_several_rows(bench):
    late = us(T0 + timedelta(seconds=LATE[0]))
    assert [r for r in _got(bench, "w") if r[:2] == ("d1", late)]  # the late row was joined
    runs = [r for r in bench.sink("out_w") if r["tbname"] == "d1" and us(T0) <= us(r["ts"]) < us(T0) + 10 * SEC]
    assert len(runs) > 3  # the rerun window holds several result rows, each once (the hand reference above)
