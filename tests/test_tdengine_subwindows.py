"""SESSION, STATE_WINDOW, EVENT_WINDOW and COUNT_WINDOW inside a new-form stream's query (docs/dialects/
tdengine.md, A stream's query): per trigger window (and group), the rows read are aggregated per
data-shaped sub-window, ``_wstart`` / ``_wend`` its first and last row — against sub-windows computed by
hand (tests/tdengine_reference.py), over %%trows and in a PERIOD trigger over a table, with NULL
states, windows of one row, TRUE_FOR and an event window left open."""

from __future__ import annotations

from datetime import timedelta

import pytest
import tdengine_reference as td
from streams_util import T0, Bench, us
from test_tdengine_query import ROWS, _rows

SEC = 1_000_000
TRIGGER = "INTERVAL(20s) SLIDING(20s) FROM meters PARTITION BY tbname"
QUERIES = {
    "session": "SELECT _wstart, _wend, _wduration, count(*) n, avg(current) a FROM %%trows SESSION(ts, 3s)",
    "state": "SELECT _wstart, status, count(*) n FROM %%trows STATE_WINDOW(status)",
    "state_long": "SELECT _wstart, count(*) n FROM %%trows STATE_WINDOW(status) TRUE_FOR(2s)",
    "event": "SELECT _wstart, _wend, count(*) n, max(voltage) m FROM %%trows "
    "EVENT_WINDOW START WITH voltage >= 226 END WITH voltage <= 212",
    "count": "SELECT _wstart, count(*) n, sum(voltage) v FROM %%trows COUNT_WINDOW(2)",
    "count_sliding": "SELECT _wstart, count(*) n, sum(voltage) v FROM %%trows COUNT_WINDOW(3, 2)",
}
_REFERENCE = {
    "session": lambda rs: td.sessions(rs, gap=3 * SEC),
    "state": lambda rs: td.state_windows(rs, "status"),
    "state_long": lambda rs: [w for w in td.state_windows(rs, "status") if w[-1]["t"] - w[0]["t"] >= 2 * SEC],
    "event": lambda rs: td.event_windows(rs, lambda r: r["voltage"] >= 226, lambda r: r["voltage"] <= 212),
    "count": lambda rs: td.count_windows(rs, 2, 2),
    "count_sliding": lambda rs: td.count_windows(rs, 3, 2),
}


@pytest.fixture(scope="module")
def bench(tmp_path_factory, spark):
    sql = "".join(f"CREATE STREAM q_{k} {TRIGGER} INTO out_{k} AS {q};\n" for k, q in QUERIES.items())
    sql += (
        "CREATE STREAM per_sessions PERIOD(1m) INTO per_out AS SELECT _wstart, count(*) n FROM meters "
        "WHERE ts >= _tprev_localtime AND ts < _tlocaltime PARTITION BY tbname SESSION(ts, 5s);\n"
    )
    b = Bench(tmp_path_factory.mktemp("tdsw"), spark, sql)
    for k in QUERIES:
        assert b.tick(f"q_{k}").works == ()
    b.append(ROWS)
    for k in QUERIES:
        b.tick(f"q_{k}")
    return b


def _trigger_windows(rows):
    """The closed INTERVAL(20s) windows per meter (the rows at 100 s close every earlier one)."""
    out: dict = {}
    for r in rows:
        ws = r["t"] - (r["t"] - us(T0)) % (20 * SEC)
        if ws < us(T0) + 100 * SEC:
            out.setdefault((r["tbname"], ws), []).append(r)
    return out


def _want(kind: str) -> list[tuple]:
    out = []
    for (g, _), members in _trigger_windows(_rows()).items():
        for w in _REFERENCE[kind](members):
            row = {"tbname": g, "_wstart": w[0]["t"], "n": len(w)}
            if kind == "session":
                currents = [r["current"] for r in w if r["current"] is not None]
                row.update(
                    _wend=w[-1]["t"],
                    _wduration=(w[-1]["t"] - w[0]["t"]) // 1000,
                    a=sum(currents) / len(currents) if currents else None,
                )
            elif kind == "state":
                row["status"] = w[0]["status"]
            elif kind == "event":
                row.update(_wend=w[-1]["t"], m=max(r["voltage"] for r in w))
            elif kind.startswith("count"):
                row["v"] = sum(r["voltage"] for r in w)
            out.append(row)
    return sorted(out, key=lambda r: (r["tbname"], r["_wstart"]))


def _got(bench, kind: str, columns) -> list[dict]:
    rows = []
    for r in bench.sink(f"out_{kind}"):
        row = {c: us(r[c]) if c in ("_wstart", "_wend") else r[c] for c in columns}
        rows.append(row)
    return sorted(rows, key=lambda r: (r["tbname"], r["_wstart"]))


@pytest.mark.parametrize("kind", list(QUERIES))
def test_data_shaped_sub_windows_match_tdengine(bench, kind):
    want = _want(kind)
    got = _got(bench, kind, want[0].keys())
    assert len(got) == len(want) and want
    for g, w in zip(got, want):
        assert g == pytest.approx(w), (kind, g, w)
    if kind == "state":  # a NULL state belongs to no window, one row is a window of its own
        assert any(w["n"] == 1 for w in want)
    if kind == "event":  # d1's window opened at 2 s (226 V) never closes within [0 s, 20 s); 31 s-32 s does
        starts = [w["_wstart"] for w in want if w["tbname"] == "d1"]
        assert us(T0) + 2 * SEC not in starts and us(T0) + 31 * SEC in starts


def test_sessions_of_a_period_trigger_over_a_table(bench):
    tick = T0 + timedelta(minutes=1)
    bench.engine.run_period("per_sessions", tick)
    inside = [r for r in _rows() if r["t"] < us(tick)]
    want = sorted(
        (g, w[0]["t"], len(w))
        for g in ("d1", "d2")
        for w in td.sessions([r for r in inside if r["tbname"] == g], gap=5 * SEC)
    )
    got = sorted((r["tbname"], us(r["_wstart"]), r["n"]) for r in bench.sink("per_out"))
    assert got == want and len(want) > 4
