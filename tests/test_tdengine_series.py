"""TDengine's multi-row functions in a new-form stream's query (docs/dialects/tdengine.md, Multi-row
functions) against values computed by hand from TDengine's definitions (tests/tdengine_reference.py):
DIFF, CSUM, MAVG, DERIVATIVE, STATECOUNT and STATEDURATION side by side in INTERVAL, SESSION, STATE,
EVENT and COUNT windows (NULLs, single-row windows); the selections TOP, BOTTOM, TAIL, UNIQUE, SAMPLE
and HISTOGRAM; a PERIOD trigger over a table; a late row rerunning a window of several rows."""

from __future__ import annotations

from datetime import timedelta

import pytest
import tdengine_reference as td
from streams_util import T0, Bench, us
from test_tdengine_functions import ROWS, TRIGGERS, _rows, _windows

SEC = 1_000_000
ROW_ITEMS = (
    "ts, diff(current) d, diff(voltage, 1) d1, diff(ts) dt, csum(current) cs, csum(voltage) csv, "
    "mavg(current, 2) ma, derivative(current, 1s, 0) dv, statecount(voltage, 'GE', 222) sc, "
    "stateduration(voltage, 'GE', 222, 1s) sd, current"
)
DROP_ITEMS = "ts, diff(current, 2) d2, diff(voltage, 3) d3, derivative(voltage, 1s, 1) dn"
SELECTIONS = {
    "top": "ts, top(current, 2) v, voltage",
    "bottom": "ts, bottom(voltage, 2) v, current",
    "tail": "ts, tail(current, 2, 1) v",
    "unique": "ts, unique(status) v",
    "sample": "ts, sample(current, 2) v",
    "hist": "_twstart, histogram(current, 'user_input', '[0, 10, 12.5, 20]', 0) h",
    "hist_lin": "_twstart, histogram(current, 'linear_bin', "
    '\'{"start": 20, "width": -5, "count": 2, "infinity": true}\', 1) h',
}
EDGES = {"hist": [0, 10, 12.5, 20], "hist_lin": [-float("inf"), 10, 15, 20, float("inf")]}


@pytest.fixture(scope="module")
def bench(tmp_path_factory, spark):
    sql = "".join(
        f"CREATE STREAM r_{k} {t} FROM meters PARTITION BY tbname INTO out_r_{k} AS SELECT {ROW_ITEMS} FROM %%trows;\n"
        for k, t in TRIGGERS.items()
    )
    for k in ("interval", "count"):
        sql += (
            f"CREATE STREAM drop_{k} {TRIGGERS[k]} FROM meters PARTITION BY tbname INTO out_drop_{k} AS "
            f"SELECT {DROP_ITEMS} FROM %%trows;\n"
        )
    for name, items in SELECTIONS.items():
        for k in ("interval", "session") if name in ("top", "hist") else ("interval",):
            sql += (
                f"CREATE STREAM {name}_{k} {TRIGGERS[k]} FROM meters PARTITION BY tbname INTO out_{name}_{k} AS "
                f"SELECT {items} FROM %%trows;\n"
            )
    b = Bench(tmp_path_factory.mktemp("tds"), spark, sql)
    for name in _names():
        assert b.tick(name).works == ()  # created on an empty table
    b.append([(sec, "d1", current, voltage, status) for sec, current, voltage, status in ROWS])
    for name in _names():
        b.tick(name)
    return b


def _names() -> list[str]:
    names = [f"r_{k}" for k in TRIGGERS] + ["drop_interval", "drop_count"]
    return names + [
        f"{n}_{k}" for n in SELECTIONS for k in (("interval", "session") if n in ("top", "hist") else ("interval",))
    ]


def _series(members: list[dict], column: str) -> list[tuple]:
    return [(m["t"], m[column]) for m in sorted(members, key=lambda m: m["t"])]


def _row_expected(members: list[dict]) -> dict[int, dict]:
    cur, volt = _series(members, "current"), _series(members, "voltage")
    times = [(m["t"], m["t"]) for m in sorted(members, key=lambda m: m["t"])]
    columns = {
        "d": td.diff(cur),
        "d1": td.diff(volt, 1),
        "dt": td.diff(times, millis=True),
        "cs": td.csum(cur),
        "csv": td.csum(volt),
        "ma": td.mavg(cur, 2),
        "dv": td.derivative(cur, SEC, 0),
        "sc": td.statecount(volt, "GE", 222),
        "sd": td.stateduration(volt, "GE", 222, SEC),
    }
    # every call outputs a row here (DIFF with option 0 and the STATE functions keep them all)
    return {t: {c: values.get(t) for c, values in columns.items()} for t, _ in cur}


def _same(got, want) -> bool:
    if isinstance(want, float) and got is not None:
        return got == pytest.approx(want, rel=1e-9, abs=1e-9)
    return got == want


@pytest.mark.parametrize("kind", list(TRIGGERS))
def test_row_functions_match_tdengine_definitions(bench, kind):
    windows = _windows(kind, _rows())
    want = {}
    for members, _ in windows.values():
        want.update(_row_expected(members))
    got = {us(r["ts"]): r for r in bench.sink(f"out_r_{kind}")}
    assert sorted(got) == sorted(want), kind
    for t, columns in want.items():
        for column, value in columns.items():
            assert _same(got[t][column], value), (kind, t, column, got[t][column], value)
    # the first row of a window has no difference, a NULL row no sum; a later window starts afresh
    assert any(v["d"] is None for v in want.values()) and any(v["cs"] is None for v in want.values())


@pytest.mark.parametrize("kind", ["interval", "count"])
def test_rows_are_dropped_only_when_every_call_drops_them(bench, kind):
    want: dict[int, dict] = {}
    for members, _ in _windows(kind, _rows()).values():
        cur, volt = _series(members, "current"), _series(members, "voltage")
        columns = {"d2": td.diff(cur, 2), "d3": td.diff(volt, 3), "dn": td.derivative(volt, SEC, 1)}
        for t in sorted(set().union(*columns.values())):
            want[t] = {c: values.get(t) for c, values in columns.items()}
    got = {us(r["ts"]): r for r in bench.sink(f"out_drop_{kind}")}
    assert sorted(got) == sorted(want) and len(got) < len(ROWS)
    for t, columns in want.items():
        assert all(_same(got[t][c], v) for c, v in columns.items()), (t, got[t], columns)


@pytest.mark.parametrize(
    "name,kind",
    [("top", "interval"), ("top", "session"), ("bottom", "interval"), ("tail", "interval"), ("unique", "interval")],
)
def test_selections_choose_tdengine_rows(bench, name, kind):
    column = {"top": "current", "bottom": "voltage", "tail": "current", "unique": "status"}[name]
    want = {}
    for members, _ in _windows(kind, _rows()).values():
        series = _series(members, column)
        if name in ("top", "bottom"):
            want.update(td.top(series, 2, largest=name == "top"))
        elif name == "tail":
            want.update(td.tail(series, 2, 1))
        else:
            want.update(td.unique(series))
    got = {us(r["ts"]): r["v"] for r in bench.sink(f"out_{name}_{kind}")}
    assert got == want
    if name == "top":  # the other columns are the chosen row's
        by_t = {r["t"]: r for r in _rows()}
        assert all(r["voltage"] == by_t[us(r["ts"])]["voltage"] for r in bench.sink(f"out_top_{kind}"))


def test_sample_is_the_same_in_every_run(bench):
    first = bench.sink("out_sample_interval")
    by_window: dict[int, list] = {}
    for ws, (members, _) in _windows("interval", _rows()).items():
        present = [(m["t"], m["current"]) for m in members if m["current"] is not None]
        by_window[ws] = present
    chosen = {us(r["ts"]): r["v"] for r in first}
    for present in by_window.values():
        mine = [p for p in present if p[0] in chosen]
        assert len(mine) == min(2, len(present)) and all(chosen[t] == v for t, v in mine)
    bench.engine.recalculate("sample_interval", start=T0, end=T0 + timedelta(seconds=60), now=T0 + timedelta(hours=2))
    assert bench.sink("out_sample_interval") == first


@pytest.mark.parametrize("name,kind", [("hist", "interval"), ("hist", "session"), ("hist_lin", "interval")])
def test_histogram_gives_a_row_per_bin(bench, name, kind):
    want = []
    for ws, (members, _) in _windows(kind, _rows()).items():
        want += [(ws, text) for text in td.histogram(_series(members, "current"), EDGES[name], name == "hist_lin")]
    got = sorted((us(r["_twstart"]), r["h"]) for r in bench.sink(f"out_{name}_{kind}"))
    assert got == sorted(want) and want
    if name == "hist":
        assert (us(T0), '{"lower_bin":10, "upper_bin":12.5, "count":1}') in got
    else:
        assert (us(T0), '{"lower_bin":-inf, "upper_bin":10, "count":0.666667}') in got


def test_period_and_a_late_row_rerun_windows_of_several_rows(tmp_path, spark):
    sql = (
        "CREATE STREAM late_diff INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname INTO late_out AS "
        "SELECT ts, diff(current) d, csum(current) cs FROM %%trows;\n"
        "CREATE STREAM per_mavg PERIOD(1m) INTO per_out AS SELECT ts, tbname, mavg(current, 2) m FROM meters "
        "WHERE ts >= _tprev_localtime AND ts < _tlocaltime PARTITION BY tbname;\n"
    )
    b = Bench(tmp_path, spark, sql)
    b.tick("late_diff")
    rows = [(sec, "d1", current, voltage, status) for sec, current, voltage, status in ROWS]
    b.append([r for r in rows if r[0] != 7])
    b.tick("late_diff")
    b.append([r for r in rows if r[0] == 7] + [(5, "d1", 1.0, 220, 1)])  # late rows in [0 s, 10 s)
    b.tick("late_diff")
    members = sorted([*_rows(), dict(t=us(T0) + 5 * SEC, current=1.0, voltage=220, status=1)], key=lambda m: m["t"])
    want = {}
    for window, _ in _windows("interval", members).values():
        series = _series(window, "current")
        d, cs = td.diff(series), td.csum(series)
        want.update({t: (d.get(t), cs.get(t)) for t, v in series if t in d or t in cs})
    got = {us(r["ts"]): (r["d"], r["cs"]) for r in b.sink("late_out")}
    assert got == want and want[us(T0) + 5 * SEC] == (1.0 - 12.0, 23.0)
    tick = T0 + timedelta(minutes=1)
    b.engine.run_period("per_mavg", tick)
    inside = [m for m in members if m["t"] < us(tick)]
    want = {(t, "d1"): v for t, v in td.mavg(_series(inside, "current"), 2).items()}
    assert {(us(r["ts"]), r["tbname"]): r["m"] for r in b.sink("per_out")} == pytest.approx(want)
