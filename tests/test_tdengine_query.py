"""A new-form stream's query is a TDengine query (docs/dialects/tdengine.md, A stream's query): HAVING,
GROUP BY / PARTITION BY inside it (several rows per trigger window), CASE, ORDER BY ... LIMIT / SLIMIT
(top-N per window), a row's own timestamp as the sink's time column, over %%trows and over a table
restricted by the placeholders — against results computed by hand from TDengine's semantics
(tests/tdengine_reference.py, ``query``), in INTERVAL, SESSION and COUNT_WINDOW triggers, with NULLs,
single-row windows and a late row that reruns a window of several rows."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
import tdengine_reference as td
from streams_util import T0, Bench, us

from cq_engine.errors import CQError

SEC = 1_000_000
# (seconds after T0, tbname, current, voltage, status): NULL currents, a window of one row (15 s), two
# meters; the rows at 100 s close every earlier window.
ROWS = [
    (0, "d1", 10.0, 220, 1),
    (2, "d1", None, 226, 1),
    (3, "d1", 12.0, 230, 1),
    (7, "d1", 9.0, 226, 2),
    (8, "d1", None, 214, 2),
    (15, "d1", 15.0, 220, 9),
    (30, "d1", 11.0, 220, 3),
    (31, "d1", 13.0, 226, 4),
    (32, "d1", 8.0, 212, 4),
    (33, "d1", None, 220, 4),
    (50, "d1", 20.0, 222, 5),
    (1, "d2", 5.0, 221, 1),
    (4, "d2", 6.0, 221, 2),
    (31, "d2", 30.0, 219, 4),
    (45, "d2", None, 218, 4),
    (100, "d1", 1.0, 220, 0),
    (100, "d2", 1.0, 220, 0),
]
# The streams, by name: tests/test_fuzz.py mutates the same file.
STREAMS = dict(
    re.findall(
        r"CREATE STREAM (\w+) (.*?);", (Path(__file__).parent / "corpus" / "tdengine_queries.sql").read_text(), re.S
    )
)


# (status, cap): the table the join streams read; statuses 0, 3 and 5 have no cap.
LIMITS = [(1, 11.0), (2, 8.0), (4, 12.0), (9, 20.0)]
LIMITS_TABLE = "CREATE TABLE limits (ts TIMESTAMP, status INT, cap DOUBLE);\n"


def _limits() -> pa.Table:
    return pa.table(
        {
            "ts": pa.array([T0] * len(LIMITS), pa.timestamp("us", tz="UTC")),
            "status": pa.array([s for s, _ in LIMITS], pa.int32()),
            "cap": pa.array([c for _, c in LIMITS], pa.float64()),
        }
    )


def _rows(rows=ROWS) -> list[dict]:
    return [dict(t=us(T0 + timedelta(seconds=s)), tbname=g, current=c, voltage=v, status=st) for s, g, c, v, st in rows]


def _tumbling(rows: list[dict]) -> dict[tuple[str, int], list[dict]]:
    """INTERVAL(10s) SLIDING(10s) per meter, the closed windows (before the rows at 100 s)."""
    out: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        ws = r["t"] - (r["t"] - us(T0)) % (10 * SEC)
        if ws < us(T0) + 100 * SEC:
            out.setdefault((r["tbname"], ws), []).append(r)
    return out


@pytest.fixture(scope="module")
def bench(tmp_path_factory, spark):
    sql = LIMITS_TABLE + "".join(f"CREATE STREAM {name} {body};\n" for name, body in STREAMS.items())
    b = Bench(tmp_path_factory.mktemp("tdq"), spark, sql)
    for name in STREAMS:
        assert b.tick(name).works == ()  # created on an empty table
    b.append([r for r in ROWS])
    b.engine.storage.append("limits", _limits())
    b.errors = {}
    for name in STREAMS:
        try:
            b.tick(name)
        except CQError as err:
            b.errors[name] = str(err)
    return b


def _cut(rows: list[dict], *names: str) -> list[tuple]:
    return _sorted(tuple(us(r[n]) if hasattr(r[n], "timestamp") else r[n] for n in names) for r in rows)


def _sorted(rows) -> list[tuple]:
    """Rows in order, NULL before any value (tuples of plain values sort as ``sorted`` does)."""
    return sorted(rows, key=lambda t: [(v is not None, v) for v in t])


def _closed_sessions(rows: list[dict]):
    """(meter, session rows) of SESSION(ts, 5s) per meter, the closed ones (the last is open)."""
    for g, members in td.groups(rows, "tbname").items():
        for session in td.sessions(members, gap=5 * SEC)[:-1]:
            yield g, session


def _count_windows(rows: list[dict]):
    """(meter, window rows) of COUNT_WINDOW(3) per meter (a short last one stays open)."""
    for g, members in td.groups(rows, "tbname").items():
        ordered = sorted(members, key=lambda r: r["t"])
        for i in range(0, len(ordered) - len(ordered) % 3, 3):
            yield g, ordered[i : i + 3]


def _sub_top_want(rows: list[dict]) -> list[tuple]:
    """``sub_top``: the two highest of each window's currents and voltages, ties by time."""
    want = []
    for (g, _), members in _tumbling(rows).items():
        both = [{"t": r["t"], "c": r["current"]} for r in members] + [{"t": r["t"], "c": r["voltage"]} for r in members]
        ranked = sorted(both, key=lambda r: r["t"])
        want += [(g, r["t"], r["c"]) for r in td.top_n(ranked, key="c", descending=True, limit=2)]
    return want


def _unioned_want(rows: list[dict]) -> list[tuple]:
    """``unioned``: each window's own count, and the other meters' when they have rows."""
    want = []
    for (g, ws), members in _tumbling(rows).items():
        want.append((g, ws, "own", len(members)))
        others = [r for r in rows if ws <= r["t"] < ws + 10 * SEC and r["tbname"] != g]
        if others:
            want.append((g, ws, "others", len(others)))
    return want


def test_having_keeps_the_windows_whose_aggregate_passes(bench):
    want = []
    for (g, ws), members in _tumbling(_rows()).items():
        a = td.query_avg(members)
        if a is not None and a > 10:
            want.append((g, ws, a, len(members)))
    assert _cut(bench.sink("o_having"), "tbname", "_twstart", "a", "n") == sorted(want)


def test_group_by_gives_one_row_per_window_and_group(bench):
    want = [
        (g, ws, key, len(rows), td.query_max(rows))
        for (g, ws), members in _tumbling(_rows()).items()
        for key, rows in td.groups(members, "status").items()
        if sum(r["current"] is not None for r in rows) >= 1
    ]
    got = _cut(bench.sink("o_grouped"), "tbname", "_twstart", "status", "n", "m")
    assert got == sorted(want)
    assert any(n > 1 for n in __import__("collections").Counter((g, ws) for g, ws, *_ in got).values())


def test_case(bench):
    def level(members):
        m = td.query_max(members)
        return "none" if m is None else "high" if m > 12 else "low"

    want = [(g, ws, level(m)) for (g, ws), m in _tumbling(_rows()).items()]
    assert _cut(bench.sink("o_case"), "tbname", "_twstart", "lvl") == sorted(want)
    assert {w[2] for w in want} == {"none", "high", "low"}


def test_order_by_limit_is_a_top_n_per_window_at_the_rows_own_time(bench):
    want = [
        (g, r["t"], r["current"])
        for (g, _), members in _tumbling(_rows()).items()
        for r in td.top_n(members, key="current", descending=True, limit=2)
    ]
    assert _cut(bench.sink("o_top"), "tbname", "ts", "current") == sorted(want)
    # PARTITION BY in the query: LIMIT counts per partition (the last row of each status per window)
    want = [
        (g, r["t"], key, r["current"])
        for (g, _), members in _tumbling(_rows()).items()
        for key, rows in td.groups(members, "status").items()
        for r in td.top_n(rows, key="t", descending=True, limit=1)
    ]
    assert _cut(bench.sink("o_lps"), "tbname", "ts", "status", "current") == sorted(want)


def test_rows_tied_on_the_order_by_keys_go_by_their_time_so_a_rerun_keeps_the_same_ones(bench):
    """LIMIT keeps a function of the window's rows: ties on the ORDER BY keys are broken by the rows'
    other columns in the table's order, its time first (d1's [30 s, 40 s) holds 220 V twice, d2's
    [0 s, 10 s) 221 V twice)."""
    for name, descending, limit in (("o_ties_low", False, 2), ("o_ties_high", True, 1)):
        want = [
            (g, r["t"], r["voltage"])
            for (g, _), members in _tumbling(_rows()).items()
            for r in td.top_n(sorted(members, key=lambda r: r["t"]), key="voltage", descending=descending, limit=limit)
        ]
        assert _cut(bench.sink(name), "tbname", "ts", "voltage") == sorted(want), name


def test_slimit_keeps_groups_by_their_group_by_values(bench):
    want = []
    for (g, ws), members in _tumbling(_rows()).items():
        groups = td.groups(members, "status")
        for key in sorted(groups)[1:2]:  # SLIMIT 1 SOFFSET 1
            want.append((g, ws, key, len(groups[key])))
    assert _cut(bench.sink("o_slimit"), "tbname", "_twstart", "status", "n") == sorted(want)


def test_a_table_restricted_by_the_placeholders_partitioned_in_the_query(bench):
    rows = _rows()
    want = []
    for ws in sorted({w for _, w in _tumbling(rows)}):
        inside = [r for r in rows if ws <= r["t"] < ws + 10 * SEC]
        for g, members in td.groups(inside, "tbname").items():
            want.append((ws, g, len(members), sum(r["voltage"] for r in members)))
    assert _cut(bench.sink("o_fleet"), "_twstart", "tbname", "n", "v") == sorted(want)


def test_data_shaped_windows(bench):
    rows = _rows()
    want = []
    for g, session in _closed_sessions(rows):
        (top,) = td.top_n(session, key="current", descending=True, limit=1, nulls_first=False)
        want.append((g, top["t"], top["current"]))
    assert _cut(bench.sink("o_session_top"), "tbname", "ts", "current") == sorted(want)
    want = []
    for g, window in _count_windows(rows):
        groups = td.groups(window, "status")
        key = sorted(groups, key=lambda k: (-len(groups[k]), k))[0]
        want.append((g, max(r["t"] for r in groups[key]), key, len(groups[key])))
    assert _cut(bench.sink("o_count_grouped"), "tbname", "t", "status", "n") == sorted(want)


def test_a_row_time_outside_its_window_is_a_run_error_and_nothing_is_written(bench):
    message = bench.errors["outside"]
    # the rows at 7 s and 8 s, read by the window [10 s, 20 s) through its WHERE's ts >= _twstart - 5s
    assert re.search(
        r"outside: the sink's time column 'ts' is 2026-11-21 10:00:0[78]\+00:00 in the window starting at 2026-11-21 10:00:10",
        message,
    ), message
    assert "nothing of this run was written" in message
    assert bench.sink("o_outside") == []


def test_a_subquery_in_from_over_the_trigger_rows(bench):
    """The outer query aggregates each window's rows of its subquery: a filtered projection (LAST over
    its rows' own time, NULLs skipped; a window whose rows all fail the WHERE gives its NULL row), and
    a grouped subquery (one row per status, aggregated again)."""
    want, grouped = [], []
    for (g, ws), members in _tumbling(_rows()).items():
        inner = td.subquery(members, lambda r: {"a": r["current"]}, where=lambda r: r["voltage"] > 215)
        want.append((g, ws, td.query_max(inner, "a"), td.query_count(inner, "a"), td.query_last(inner, "a")))
        avgs = [{"a": td.query_avg(rows)} for rows in td.groups(members, "status").values()]
        grouped.append((g, ws, td.query_max(avgs, "a"), len(avgs)))
    assert _cut(bench.sink("o_sub_max"), "tbname", "_twstart", "m", "n", "l") == _sorted(want)
    assert any(w[2] is None and w[3] == 0 for w in want)  # d2's [40 s, 50 s): its one row's current is NULL
    assert _cut(bench.sink("o_sub_grouped"), "tbname", "_twstart", "m", "k") == _sorted(grouped)
    assert any(k > 1 for *_, k in grouped)


def test_a_subquery_of_a_union_ranked_at_the_rows_own_time(bench):
    """ORDER BY ... LIMIT over a subquery that is a UNION ALL of the window's currents and voltages; the
    sink's time column is the rows' own ts through both branches, ties go by time."""
    assert _cut(bench.sink("o_sub_top"), "tbname", "ts", "c") == _sorted(_sub_top_want(_rows()))


def test_a_subquery_over_a_table_restricted_by_the_placeholders(bench):
    rows = _rows()
    want = []
    for ws in sorted({w for _, w in _tumbling(rows)}):
        inside = [r for r in rows if ws <= r["t"] < ws + 10 * SEC]
        sums = [sum(r["voltage"] for r in m) for m in td.groups(inside, "tbname").values()]
        want.append((ws, len(sums), sum(sums)))
    assert _cut(bench.sink("o_sub_fleet"), "_twstart", "n", "s") == _sorted(want)


def test_union_all_of_the_trigger_rows_and_a_table(bench):
    """Each window and group gives one row per query of the UNION ALL, under the first query's names."""
    want = _unioned_want(_rows())
    assert _cut(bench.sink("o_unioned"), "tbname", "_twstart", "src", "n") == _sorted(want)


def test_union_all_in_data_shaped_windows(bench):
    rows = _rows()
    want = []
    for g, session in _closed_sessions(rows):
        want += [(g, r["t"], r["current"]) for r in session if r["current"] is not None and r["current"] > 12]
        want += [(g, r["t"], None) for r in session if r["current"] is None]
    assert _cut(bench.sink("o_unioned_rows"), "tbname", "ts", "current") == _sorted(want)
    want = []
    for g, window in _count_windows(rows):
        present = [r["current"] for r in window if r["current"] is not None]
        t = max(r["t"] for r in window)
        want += [(g, t, "max", max(present, default=None)), (g, t, "min", min(present, default=None))]
    assert _cut(bench.sink("o_count_union"), "tbname", "t", "k", "m") == _sorted(want)


def test_joins_of_the_trigger_rows_with_a_table(bench):
    """Per window, the trigger rows joined with ``limits`` on status: an inner join filtered across its
    sides and aggregated, a LEFT join keeping the rows without a cap (NULL cap) at their own time, and
    GROUP BY a joined column in session windows."""
    caps = dict(LIMITS)
    want, rows_want = [], []
    for (g, ws), members in _tumbling(_rows()).items():
        over = [
            r for r in members if r["status"] in caps and r["current"] is not None and r["current"] > caps[r["status"]]
        ]
        if over:
            want.append((g, ws, len(over), max(r["current"] - caps[r["status"]] for r in over)))
        rows_want += [(g, r["t"], r["current"], caps.get(r["status"])) for r in members]
    assert _cut(bench.sink("o_j_over"), "tbname", "_twstart", "n", "over_cap") == _sorted(want)
    assert _cut(bench.sink("o_j_rows"), "tbname", "ts", "current", "cap") == _sorted(rows_want)
    assert any(w[3] is None for w in rows_want)
    want = []
    for g, session in _closed_sessions(_rows()):
        capped = [caps[r["status"]] for r in session if r["status"] in caps]
        want += [(g, session[0]["t"], cap, capped.count(cap)) for cap in set(capped)]
    assert _cut(bench.sink("o_j_grouped"), "tbname", "_twstart", "cap", "n") == _sorted(want)


def test_a_join_on_time_reads_the_other_side_at_the_same_instants(bench):
    """``ON m.ts = o.ts``: the other meters' readings at the window's instants (d1 and d2 both read
    at 31 s)."""
    rows = _rows()
    want = []
    for (g, ws), members in _tumbling(rows).items():
        pairs = [o for m in members for o in rows if o["t"] == m["t"] and o["tbname"] != g]
        if pairs:
            want.append((g, ws, len(pairs), td.query_max(pairs)))
    assert want and _cut(bench.sink("o_j_same"), "tbname", "_twstart", "n", "other") == _sorted(want)


def _windows_of(rows: list[dict], size: int) -> dict[tuple[str, int], list[dict]]:
    """Tumbling trigger windows of ``size`` seconds per meter, the closed ones (before 100 s)."""
    out: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        ws = r["t"] - (r["t"] - us(T0)) % (size * SEC)
        if ws < us(T0) + 100 * SEC:
            out.setdefault((r["tbname"], ws), []).append(r)
    return out


def test_interval_inside_the_query_aggregates_sub_windows(bench):
    """Per 20 s trigger window, INTERVAL(5s) sub-windows per status (the sink's time column is the
    sub-window's start, each within its trigger window), and INTERVAL(10s) SLIDING(5s) sub-windows
    (a row in two of them; the first starts before the trigger window) kept by HAVING."""
    want, sliding = [], []
    for (g, ws), members in _windows_of(_rows(), 20).items():
        for status, rows in td.groups(members, "status").items():
            for start, sub in td.sub_windows(rows, interval=5 * SEC).items():
                want.append((g, start, start + 5 * SEC, status, len(sub), td.query_max(sub)))
        for start, sub in td.sub_windows(members, interval=10 * SEC, sliding=5 * SEC).items():
            if len(sub) > 1:
                sliding.append((g, ws, start, len(sub), td.query_avg(sub)))
    assert _cut(bench.sink("o_sub_interval"), "tbname", "_wstart", "we", "status", "n", "m") == _sorted(want)
    assert _cut(bench.sink("o_sub_sliding"), "tbname", "_twstart", "ws", "n", "a") == _sorted(sliding)
    assert any(w[2] < w[1] for w in sliding)  # [-5 s, 5 s) in the window at 0 s


@pytest.mark.parametrize(
    "mode, aggregates, constants",
    [
        ("null", lambda rs: (len(rs), td.query_avg(rs)), ()),
        ("value", lambda rs: (len(rs), td.query_max(rs)), (0, -1.5)),
        ("prev", lambda rs: (td.query_avg(rs), td.query_max(rs)), ()),
        ("next", lambda rs: (td.query_avg(rs), td.query_max(rs)), ()),
        ("linear", lambda rs: (td.query_avg(rs), td.query_max(rs)), ()),
    ],
)
def test_fill_over_the_querys_sub_windows(bench, mode, aggregates, constants):
    """Each 20 s trigger window's four 5 s sub-windows, those without rows filled; NULL aggregates (d2's
    sub-window at 45 s holds one NULL current) are values PREV / NEXT / LINEAR skip."""
    want, filled = [], 0
    for (g, ws), members in _windows_of(_rows(), 20).items():
        slots = [ws + k * 5 * SEC for k in range(4)]
        rows_of = td.sub_windows(members, interval=5 * SEC)
        filled += len(set(slots) - set(rows_of))
        for start, (n, a) in td.fill(slots, rows_of, aggregates, mode, constants).items():
            want.append((g, start, n, a))
    got = _cut(bench.sink(f"o_fill_{mode}"), "tbname", "_wstart", "n", "a")
    assert [g[:2] for g in got] == [w[:2] for w in _sorted(want)]
    for g, w in zip(got, _sorted(want)):
        assert g[2:] == pytest.approx(w[2:]), (mode, g, w)
    assert filled > 5 and any(w[3] is None for w in want)


def test_a_late_row_reruns_a_window_of_several_rows(tmp_path, spark):
    b = Bench(tmp_path, spark, f"CREATE STREAM grouped {STREAMS['grouped']};\nCREATE STREAM top {STREAMS['top']};")
    for name in ("grouped", "top"):
        b.tick(name)
    first = [r for r in ROWS if r[0] != 7]
    b.append(first)
    for name in ("grouped", "top"):
        b.tick(name)
    b.append([r for r in ROWS if r[0] == 7] + [(9, "d1", 14.0, 215, 1)])  # late rows in [0s, 10s) of d1
    for name in ("grouped", "top"):
        b.tick(name)
    rows = _rows([*ROWS, (9, "d1", 14.0, 215, 1)])
    want = [
        (g, ws, key, len(rs), td.query_max(rs))
        for (g, ws), members in _tumbling(rows).items()
        for key, rs in td.groups(members, "status").items()
        if sum(r["current"] is not None for r in rs) >= 1
    ]
    assert _cut(b.sink("o_grouped"), "tbname", "_twstart", "status", "n", "m") == sorted(want)
    want = [
        (g, r["t"], r["current"])
        for (g, _), members in _tumbling(rows).items()
        for r in td.top_n(members, key="current", descending=True, limit=2)
    ]
    assert _cut(b.sink("o_top"), "tbname", "ts", "current") == sorted(want)


def test_a_late_row_reruns_the_windows_of_composed_queries(tmp_path, spark):
    """A late row reruns its window: the rows of a UNION ALL, and a top-N over a subquery, replaced."""
    names = ("sub_top", "unioned", "sub_interval")
    b = Bench(tmp_path, spark, "".join(f"CREATE STREAM {n} {STREAMS[n]};\n" for n in names))
    for name in names:
        b.tick(name)
    b.append([r for r in ROWS if r[0] != 7])
    for name in names:
        b.tick(name)
    b.append([r for r in ROWS if r[0] == 7] + [(9, "d1", 14.0, 240, 1)])  # late rows in [0s, 10s) of d1
    for name in names:
        b.tick(name)
    rows = _rows([*ROWS, (9, "d1", 14.0, 240, 1)])
    want = _sub_top_want(rows)
    assert (us(T0) + 9 * SEC, 240) in [(t, c) for _, t, c in want]
    assert _cut(b.sink("o_sub_top"), "tbname", "ts", "c") == _sorted(want)
    assert _cut(b.sink("o_unioned"), "tbname", "_twstart", "src", "n") == sorted(_unioned_want(rows))
    want = []  # INTERVAL(5s) per status in 20 s windows: d1's [0 s, 20 s) rerun with its late rows
    for (g, _), members in _windows_of(rows, 20).items():
        for status, rs in td.groups(members, "status").items():
            want += [(g, t, status, len(sub)) for t, sub in td.sub_windows(rs, interval=5 * SEC).items()]
    assert (us(T0) + 5 * SEC, 2) in [(t, st) for g, t, st, _ in want if g == "d1"]
    assert _cut(b.sink("o_sub_interval"), "tbname", "_wstart", "status", "n") == sorted(want)


PERIOD = """CREATE STREAM per_top PERIOD(1m) INTO per_top_out AS SELECT ts, tbname, current FROM meters
    WHERE ts >= _tprev_localtime AND ts < _tlocaltime ORDER BY current DESC LIMIT 2;
CREATE STREAM per_groups PERIOD(1m) INTO per_groups_out AS SELECT _tlocaltime, tbname, count(*) AS n FROM meters
    WHERE ts >= _tprev_localtime AND ts < _tlocaltime GROUP BY tbname;
CREATE STREAM per_late PERIOD(1m) INTO per_late_out AS SELECT ts, current FROM meters WHERE ts < _tlocaltime;
CREATE STREAM per_sub PERIOD(1m) INTO per_sub_out AS SELECT _tlocaltime, max(n) AS most, count(*) AS k
    FROM (SELECT tbname, count(*) n FROM meters WHERE ts >= _tprev_localtime AND ts < _tlocaltime PARTITION BY tbname);
CREATE STREAM per_union PERIOD(1m) INTO per_union_out AS
    SELECT ts, current FROM meters WHERE ts >= _tprev_localtime AND ts < _tlocaltime AND current >= 5
    UNION ALL SELECT ts, current FROM meters WHERE ts >= _tprev_localtime AND ts < _tlocaltime AND current < 1;
CREATE STREAM per_interval PERIOD(1m) INTO per_interval_out AS SELECT _wstart, avg(current) AS a, count(*) AS n
    FROM meters WHERE ts >= _tprev_localtime AND ts < _tlocaltime PARTITION BY tbname INTERVAL(20s);
CREATE STREAM per_fill PERIOD(1m) INTO per_fill_out AS SELECT _wstart, count(*) AS n
    FROM meters WHERE ts >= _tprev_localtime AND ts < _tlocaltime INTERVAL(5s) FILL(VALUE, 0);
CREATE STREAM per_hour PERIOD(1m) INTO per_hour_out AS SELECT _tlocaltime, _wstart AS slot, count(*) AS n
    FROM meters WHERE ts >= _tlocaltime - 2m AND ts < _tlocaltime INTERVAL(30s);
"""


def test_period_top_n_and_groups_over_the_ticks_range(tmp_path, spark):
    b = Bench(tmp_path, spark, PERIOD)
    tick = T0 + timedelta(minutes=2)
    b.append([(s, g, float(s % 7) + (g == "d2"), 220) for s in range(40, 130, 10) for g in ("d1", "d2")])
    for name in ("per_top", "per_groups", "per_sub", "per_union", "per_interval", "per_hour", "per_fill"):
        b.engine.run_period(name, tick)
    rows = [
        r for r in _rows([(s, g, float(s % 7) + (g == "d2"), 220, 0) for s in range(40, 130, 10) for g in ("d1", "d2")])
    ]
    inside = [r for r in rows if us(tick) - 60 * SEC <= r["t"] < us(tick)]
    want = [(r["t"], r["tbname"], r["current"]) for r in td.top_n(inside, key="current", descending=True, limit=2)]
    assert _cut(b.sink("per_top_out"), "ts", "tbname", "current") == sorted(want)
    groups = td.groups(inside, "tbname")
    assert _cut(b.sink("per_groups_out"), "_tlocaltime", "tbname", "n") == [
        (us(tick), g, len(m)) for g, m in sorted(groups.items())
    ]
    assert _cut(b.sink("per_sub_out"), "_tlocaltime", "most", "k") == [
        (us(tick), max(len(m) for m in groups.values()), len(groups))
    ]
    want = [(r["t"], r["current"]) for r in inside if r["current"] >= 5 or r["current"] < 1]
    assert _cut(b.sink("per_union_out"), "ts", "current") == sorted(want) and want
    # the PERIOD pattern: every tick, the last minute per 20 s (and per meter)
    want = [
        (start, g, td.query_avg(sub), len(sub))
        for g, rows in groups.items()
        for start, sub in td.sub_windows(rows, interval=20 * SEC).items()
    ]
    assert _cut(b.sink("per_interval_out"), "_wstart", "tbname", "a", "n") == sorted(want) and len(want) == 6
    # every 5 s of the tick's range, the empty ones filled with 0
    slots = {us(tick) - 60 * SEC + k * 5 * SEC: 0 for k in range(12)}
    slots.update({start: len(sub) for start, sub in td.sub_windows(inside, interval=5 * SEC).items()})
    assert _cut(b.sink("per_fill_out"), "_wstart", "n") == sorted(slots.items()) and 0 in slots.values()
    # a wider range than the tick's: the tick as the time column, the sub-windows after it
    before = [r for r in rows if us(tick) - 120 * SEC <= r["t"] < us(tick)]
    want = [(us(tick), start, len(sub)) for start, sub in td.sub_windows(before, interval=30 * SEC).items()]
    assert _cut(b.sink("per_hour_out"), "_tlocaltime", "slot", "n") == want and len(want) == 3
    b.append([(65, "d1", 50.0, 220)])  # the tick again (a rerun): its range replaced, not added to
    b.engine.run_period("per_top", tick)
    inside.append({"t": us(T0) + 65 * SEC, "tbname": "d1", "current": 50.0})
    want = [(r["t"], r["current"]) for r in td.top_n(inside, key="current", descending=True, limit=2)]
    assert _cut(b.sink("per_top_out"), "ts", "current") == sorted(want) and (us(T0) + 65 * SEC, 50.0) in want
    with pytest.raises(CQError, match=r"per_late: the sink's time column 'ts' is .* outside that window's range"):
        b.engine.run_period("per_late", tick)
    assert b.sink("per_late_out") == []
