"""INTERP in a new-form stream's query (docs/dialects/tdengine.md, INTERP): a row per EVERY time point of
each trigger window (or of RANGE), each call's value the row at that time or FILL's, against values
computed by hand (tests/tdengine_reference.py ``interp``) — NULL rows counted or ignored
(ignore_null_values), every FILL mode, a PERIOD trigger with RANGE over a table."""

from __future__ import annotations

from datetime import timedelta

import pytest
import tdengine_reference as td
from streams_util import T0, Bench, us
from test_tdengine_functions import ROWS, _rows, _windows

from cq_engine.errors import ParseError
from cq_engine.parse import parse_text

SEC = 1_000_000
FILLS = {"linear": "LINEAR", "prev": "PREV", "next": "NEXT", "null": "NULL", "value": "VALUE, -1, -2", "none": "NONE"}


@pytest.fixture(scope="module")
def bench(tmp_path_factory, spark):
    sql = "".join(
        f"CREATE STREAM i_{k} INTERVAL(20s) SLIDING(20s) FROM meters PARTITION BY tbname INTO out_{k} AS "
        f"SELECT _irowts, _isfilled, interp(current) c, interp(current, 1) cn FROM %%trows EVERY(5s) FILL({f});\n"
        for k, f in FILLS.items()
    )
    sql += (
        "CREATE STREAM per_interp PERIOD(1m) INTO per_out AS SELECT _irowts, tbname, interp(current, 1) c "
        "FROM meters WHERE ts >= _tprev_localtime - 1m AND ts < _tlocaltime PARTITION BY tbname "
        "RANGE(_tprev_localtime, _tlocaltime - 1a) EVERY(12s) FILL(PREV);\n"
    )
    b = Bench(tmp_path_factory.mktemp("tdi"), spark, sql)
    for k in FILLS:
        assert b.tick(f"i_{k}").works == ()
    b.append([(sec, "d1", current, voltage, status) for sec, current, voltage, status in ROWS])
    for k in FILLS:
        b.tick(f"i_{k}")
    return b


@pytest.mark.parametrize("fill", list(FILLS))
def test_interp_fills_each_time_point_as_tdengine(bench, fill):
    want = {}
    for ws, (members, _) in _windows("interval", _rows(), interval=20, sliding=20).items():
        series = [(m["t"], m["current"]) for m in members]
        points = [ws + k * 5 * SEC for k in range(4)]
        c = td.interp(series, points, fill, value=-1)
        cn = td.interp(series, points, fill, ignore_null=True, value=-2)
        for p in sorted(set(c) | set(cn)):
            want[p] = (c.get(p, (None, True))[0], cn.get(p, (None, True))[0], c.get(p, (None, True))[1])
    got = {us(r["_irowts"]): (r["c"], r["cn"], r["_isfilled"]) for r in bench.sink(f"out_{fill}")}
    assert sorted(got) == sorted(want) and want
    for p, w in want.items():
        assert got[p] == pytest.approx(w), (fill, p, got[p], w)
    if fill == "prev":  # 10 s follows the NULL at 8 s: counted, it is the previous row; ignored, 9.0 at 7 s is
        assert got[us(T0) + 10 * SEC][:2] == (None, 9.0)


def test_a_period_interp_over_a_table(bench):
    tick = T0 + timedelta(minutes=1)
    bench.engine.run_period("per_interp", tick)
    series = [(r["t"], r["current"]) for r in _rows()]
    points = [us(T0) + k * 12 * SEC for k in range(5)]
    want = {p: v for p, (v, _) in td.interp(series, points, "prev", ignore_null=True).items()}
    got = {us(r["_irowts"]): r["c"] for r in bench.sink("per_out")}
    assert got == want and got[us(T0) + 36 * SEC] == 8.0


@pytest.mark.parametrize(
    "query,message",
    [
        ("SELECT _irowts, interp(v) FROM %%trows RANGE(_twstart, _twend)", "RANGE needs EVERY(duration)"),
        ("SELECT _irowts, avg(v) FROM %%trows EVERY(1s)", "EVERY(...) needs INTERP(column) in the SELECT"),
        ("SELECT _twstart, _irowts FROM %%trows", "_irowts is INTERP's: it needs EVERY(...)"),
        ("SELECT _irowts, interp(v) FROM %%trows EVERY(1s) FILL(VALUE, 1, 2)", "gives 2 value(s) for 1 INTERP"),
        ("SELECT _irowts, interp(v) FROM %%trows EVERY(v)", "EVERY takes a duration such as 1s"),
        ("SELECT _twstart, interp(v) FROM %%trows", "INTERP() is not supported in TDengine definitions: it takes"),
    ],
)
def test_interp_refusals(query, message):
    sql = f"CREATE STREAM s INTERVAL(10s) SLIDING(10s) FROM t INTO o AS {query};"
    with pytest.raises(ParseError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        parse_text(sql, file="f.sql")
