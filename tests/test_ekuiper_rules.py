"""eKuiper rules (seed 003) from ``.sql``: stream declarations, the rule dialect's errors, and rules run
end to end on real Spark and Delta through the stream sensor (``streams_util.Bench``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from streams_util import T0, Bench

from cq_engine.catalog import load_catalog
from cq_engine.errors import ParseError
from cq_engine.model import CountTrigger, EkSessionTrigger, EkSlidingTrigger, SlidingTrigger
from cq_engine.parse import ParseOptions, parse_text

DEMO = 'CREATE STREAM demo (ID STRING, temperature DOUBLE, revenue DOUBLE, ts BIGINT) WITH (DATASOURCE="demo", FORMAT="json", KEY="ts", TIMESTAMP="ts");\n'
S = timedelta(seconds=1)


def parse(sql: str, tz: str = "UTC"):
    from zoneinfo import ZoneInfo

    return parse_text(sql, file="r.sql", options=ParseOptions(tz=ZoneInfo(tz)))


def error(sql: str) -> str:
    with pytest.raises(ParseError) as info:
        parse(sql)
    return str(info.value)


def test_stream_declaration_is_a_source_table_named_by_its_datasource():
    (decl,) = parse(
        "CREATE STREAM demo (color STRING, size BIGINT, ts BIGINT) "
        'WITH (DATASOURCE="demo_t", FORMAT="json", KEY="ts", TIMESTAMP="ts")'
    )
    assert (decl.name, decl.alias, decl.time_column) == ("demo_t", "demo", "ts")
    assert [(c.name, c.type) for c in decl.columns] == [("color", "string"), ("size", "bigint"), ("ts", "timestamp")]


@pytest.mark.parametrize(
    "window,trigger",
    [
        ("TUMBLINGWINDOW(ss, 10)", SlidingTrigger(sliding=10 * S, interval=10 * S)),
        ("HOPPINGWINDOW(mi, 10, 5)", SlidingTrigger(sliding=timedelta(minutes=5), interval=timedelta(minutes=10))),
        ("SLIDINGWINDOW(ss, 5, 5)", EkSlidingTrigger(size=5 * S, delay=5 * S)),
        ("SLIDINGWINDOW(ms, 1500)", EkSlidingTrigger(size=timedelta(milliseconds=1500))),
        # eKuiper: SESSIONWINDOW(unit, max_duration, timeout)
        ("SESSIONWINDOW(mi, 2, 1)", EkSessionTrigger(timeout=timedelta(minutes=1), max_duration=timedelta(minutes=2))),
        ("COUNTWINDOW(5)", CountTrigger(count=5, slide=5, ekuiper=True)),
        ("COUNTWINDOW(5, 2)", CountTrigger(count=5, slide=2, ekuiper=True)),
    ],
)
def test_window_functions_become_triggers(window, trigger):
    (rule,) = parse(f"CREATE RULE r INTO out AS SELECT count(*) FROM demo GROUP BY ID, {window}")
    # windows over the whole stream (no partition), GROUP BY ID splits each window's rows
    assert rule.trigger == trigger and rule.form == "ekuiper"
    assert (rule.partition_by, rule.group_by) == ((), ("ID",))
    assert [(i.name, i.is_aggregate) for i in rule.select] == [
        ("window_start", False),
        ("window_end", False),
        ("count", True),
    ]


def test_day_windows_end_at_local_midnight():
    (rule,) = parse(
        "CREATE RULE r INTO out AS SELECT count(*) FROM demo GROUP BY TUMBLINGWINDOW(dd, 1)", tz="Asia/Shanghai"
    )
    assert rule.trigger.interval_offset == timedelta(hours=16)  # 00:00 +08:00


def test_filter_over_where_having_and_window_functions():
    (rule,) = parse(
        "CREATE RULE r INTO out AS SELECT window_end() AS we, sum(revenue) AS s FROM demo "
        "WHERE temperature > 20 GROUP BY SlidingWindow(ss, 1) FILTER(where revenue > 100) "
        "OVER(when revenue > 200) HAVING count(*) > 2"
    )
    assert rule.options.pre_filter == "revenue > 100" and rule.trigger.over == "revenue > 200"
    assert (rule.where, rule.having) == ("temperature > 20", "COUNT(*) > 2")
    # window_end() selected is the automatic window_end column, under its alias: one column per meaning
    assert [(i.name, i.expression) for i in rule.select] == [
        ("window_start", "__cq_twstart"),
        ("we", "__cq_twend"),
        ("s", "SUM(revenue)"),
    ]


@pytest.mark.parametrize(
    "sql,message",
    [
        (
            "CREATE RULE x INTO o AS SELECT count(*) FROM demo GROUP BY COUNTWINDOW(2, 5)",
            "r.sql:1:75: COUNTWINDOW's interval (5) must not exceed its count (2)",
        ),
        (
            "CREATE RULE x INTO o AS SELECT count(*) FROM demo GROUP BY TUMBLINGWINDOW(yy, 5)",
            "r.sql:1:75: unknown time unit 'yy' (DD, HH, MI, SS or MS)",
        ),
        (
            "CREATE RULE x INTO o AS SELECT count(*) FROM demo GROUP BY id",
            "r.sql:1:51: GROUP BY needs a window function: TUMBLINGWINDOW(unit, size), ",
        ),
        (
            "CREATE RULE x INTO o AS SELECT count(*) FROM demo GROUP BY TUMBLINGWINDOW(ss, 5) OVER(when a > 1)",
            "r.sql:1:82: OVER (WHEN ...) only follows SLIDINGWINDOW",
        ),
        (
            "CREATE RULE x INTO o AS SELECT count(*) FROM demo GROUP BY TUMBLINGWINDOW(ss, 0)",
            "r.sql:1:79: the size must be a positive integer",
        ),
        (
            "CREATE RULE x INTO o AS SELECT count(*) FROM demo GROUP BY HOPPINGWINDOW(ss, 5)",
            "r.sql:1:60: HOPPINGWINDOW takes 3 arguments: HOPPINGWINDOW(unit, size, hop)",
        ),
        (
            "CREATE RULE x AS SELECT count(*) FROM demo GROUP BY TUMBLINGWINDOW(ss, 5)",
            "r.sql:1:15: expected INTO sink (where the rule's results go), found 'AS'",
        ),
        (
            "CREATE RULE x INTO o AS SELECT count(*) FROM demo",
            "r.sql:1:25: a rule needs GROUP BY with a window function",
        ),
        (
            "CREATE RULE x INTO o AS SELECT count(*) FROM demo GROUP BY COUNTWINDOW(3) FILTER(revenue > 1)",
            "r.sql:1:75: FILTER takes (WHERE condition)",
        ),
        ('CREATE STREAM d (a INT) WITH (DATASOURCE="d")', "r.sql:1:15: stream 'd' needs TIMESTAMP=\"field\" in WITH"),
        (
            'CREATE STREAM d (a INT, ts BIGINT) WITH (TIMESTAMP="t")',
            "r.sql:1:52: TIMESTAMP names 't', which is not a field",
        ),
    ],
)
def test_rule_errors_name_file_line_col(sql, message):
    assert error(sql).startswith(message)


def test_select_star_expands_to_the_declared_fields(tmp_path):
    (tmp_path / "r.sql").write_text(
        DEMO + "CREATE RULE r INTO out AS SELECT * FROM demo GROUP BY COUNTWINDOW(3);\n"
        "CREATE RULE bad INTO out2 AS SELECT * FROM nowhere GROUP BY COUNTWINDOW(3);\n"
    )
    catalog = load_catalog(tmp_path)
    rule = catalog.definition("r")
    assert [i.name for i in rule.select] == ["window_start", "window_end", "ID", "temperature", "revenue", "ts"]
    assert (rule.trigger_table, rule.source) == ("demo", "demo")
    errors = tuple(map(str, catalog.errors))
    assert errors == (
        f"{tmp_path}/r.sql:3:1: 'bad': SELECT * needs 'nowhere' declared (CREATE STREAM "
        "nowhere (...) WITH (...) or CREATE TABLE) to know its fields",
    )


def test_tumbling_and_hopping_rules_are_labelled_as_such(tmp_path):
    from cq_engine.cli.main import _trigger

    (tmp_path / "r.sql").write_text(
        DEMO + "CREATE RULE t INTO t_out AS SELECT count(*) AS n FROM demo GROUP BY TUMBLINGWINDOW(ss, 10);\n"
        "CREATE RULE h INTO h_out AS SELECT count(*) AS n FROM demo GROUP BY HOPPINGWINDOW(ss, 10, 5);\n"
    )
    catalog = load_catalog(tmp_path)
    assert _trigger(catalog.definition("t")) == "tumbling(size=10s) from demo"
    assert _trigger(catalog.definition("h")) == "hopping(size=10s, hop=5s) from demo"


def _demo(b: Bench, rows: list[tuple]) -> None:
    """Rows ``(seconds after T0, ID, temperature[, revenue])`` in one commit."""
    rows = [([*r, 0.0])[:4] for r in rows]
    b.engine.storage.append(
        "demo",
        pa.table(
            {
                "ID": [r[1] for r in rows],
                "temperature": [float(r[2]) for r in rows],
                "revenue": [float(r[3]) for r in rows],
                "ts": pa.array([T0 + timedelta(seconds=r[0]) for r in rows], pa.timestamp("us", tz="UTC")),
            }
        ),
    )


def test_tumbling_and_hopping_rules_end_to_end(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        DEMO
        + """
        CREATE RULE tumble INTO tumble_out AS SELECT count(*) AS n, avg(temperature) AS t FROM demo
            GROUP BY ID, TUMBLINGWINDOW(ss, 10) HAVING count(*) > 1;
        CREATE RULE hop INTO hop_out AS SELECT count(*) AS n FROM demo GROUP BY HOPPINGWINDOW(ss, 10, 5);
        CREATE RULE hot INTO hot_out AS SELECT ID, temperature FROM demo WHERE temperature > 20
            GROUP BY TUMBLINGWINDOW(ss, 10);""",
    )
    for name in ("tumble", "hop", "hot"):
        b.tick(name)
    _demo(b, [(s, d, s) for s in range(0, 40, 3) for d in ("a", "b")] + [(21, "c", 1.0)])
    for name in ("tumble", "hop", "hot"):
        b.tick(name)
    at = lambda s: T0 + timedelta(seconds=s)
    # windows end at multiples of 10 s; [30, 40) is still open (latest event 39 s); c's window has one row
    assert sorted((r["ID"], r["window_start"], r["window_end"], r["n"], r["t"]) for r in b.sink("tumble_out")) == [
        (d, at(a), at(a + 10), n, t) for d in ("a", "b") for a, n, t in ((0, 4, 4.5), (10, 3, 15.0), (20, 3, 24.0))
    ]
    assert sorted((r["window_start"], r["n"]) for r in b.sink("hop_out")) == [
        (at(-5), 4),
        (at(0), 8),
        (at(5), 6),
        (at(10), 6),
        (at(15), 9),
        (at(20), 7),
        (at(25), 6),
    ]
    assert sorted((r["window_start"], r["ID"], r["temperature"]) for r in b.sink("hot_out")) == [
        (at(20), d, float(s)) for d in ("a", "b") for s in (21, 24, 27)
    ]


def test_day_window_ends_at_local_midnight_end_to_end(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        DEMO + "CREATE RULE daily INTO daily_out AS SELECT count(*) AS n FROM demo GROUP BY TUMBLINGWINDOW(dd, 1);",
        timezone="Asia/Shanghai",
    )
    b.tick("daily")
    midnight = datetime(2026, 11, 21, 16, 0, tzinfo=UTC)  # 2026-11-22 00:00 +08:00
    b.engine.storage.append(
        "demo",
        pa.table(
            {
                "ID": ["a"] * 3,
                "temperature": [1.0] * 3,
                "revenue": [0.0] * 3,
                "ts": pa.array(
                    [midnight - timedelta(hours=1), midnight - S, midnight + timedelta(hours=1)],
                    pa.timestamp("us", tz="UTC"),
                ),
            }
        ),
    )
    b.tick("daily", now=midnight + timedelta(hours=2))
    assert [(r["window_start"], r["window_end"], r["n"]) for r in b.sink("daily_out")] == [
        (midnight - timedelta(days=1), midnight, 2)
    ]


# --- data-shaped eKuiper windows: incremental runs (a tick after each commit) against the reference ------

from ekuiper_reference import count_windows, session_windows, sliding_windows  # noqa: E402

US = 1_000_000


def _us(seconds: float) -> int:
    return int((T0 + timedelta(seconds=seconds)).timestamp() * US)


def _at(us: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)


def _closed(windows, rows_by_t) -> list[tuple]:
    """(start, count, sum of temperature) of every closed reference window."""
    return sorted(
        (_at(w["start"]), len(w["members"]), round(sum(rows_by_t[t] for t in w["members"]), 6))
        for w in windows
        if w["closed"]
    )


def _feed_in_commits(b: Bench, name: str, rows: list[tuple], commits: int) -> None:
    """Append ``rows`` in ``commits`` time-ordered commits, with a tick after each."""
    b.tick(name)
    step = -(-len(rows) // commits)
    for i in range(0, len(rows), step):
        _demo(b, rows[i : i + step])
        b.tick(name)


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize(
    "window", ["COUNTWINDOW(5, 2)", "COUNTWINDOW(4)", "SLIDINGWINDOW(ss, 20, 5)", "SESSIONWINDOW(ss, 15, 60)"]
)
def test_data_shaped_rules_match_the_reference_across_ticks(tmp_path, spark, window, seed):
    import random

    rng = random.Random(seed)
    seconds, t = [], 0
    while len(seconds) < 60:
        t += rng.choice([1, 3, 5, 10, 15, 16, 40])
        seconds.append(t)
    rows = [(s, "a", float(rng.randint(0, 50))) for s in seconds]
    b = Bench(
        tmp_path,
        spark,
        DEMO + f"CREATE RULE r INTO r_out AS SELECT count(*) AS n, sum(temperature) AS s "
        f"FROM demo GROUP BY ID, {window};",
    )
    _feed_in_commits(b, "r", rows, commits=4)
    times = [_us(s) for s, _, _ in rows]
    by_t = dict(zip(times, (temp for _, _, temp in rows)))
    until = max(times)  # the watermark: the latest event time (WATERMARK 0)
    if window.startswith("COUNT"):
        n, k = (int(x) for x in window[12:-1].replace(" ", "").split(",")) if "," in window else (4, 4)
        ref = count_windows(times, count=n, interval=k, until=until)
    elif window.startswith("SLIDING"):
        ref = sliding_windows(times, size=20 * US, delay=5 * US, until=until)
    else:
        ref = session_windows(times, timeout=15 * US, max_duration=60 * US, until=until)
    got = sorted((r["window_start"], r["n"], round(r["s"], 6)) for r in b.sink("r_out"))
    assert got == _closed(ref, by_t) and got


def test_seed_countwindow_having_and_filter_versus_where(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        DEMO
        + """
        CREATE RULE having INTO having_out AS SELECT count(*) AS n FROM demo WHERE temperature > 20
            GROUP BY COUNTWINDOW(5, 1) HAVING COUNT(*) > 2;
        CREATE RULE filtered INTO filtered_out AS SELECT count(*) AS n, min(revenue) AS low FROM demo
            GROUP BY COUNTWINDOW(3, 1) FILTER(WHERE revenue > 100);
        CREATE RULE whered INTO whered_out AS SELECT count(*) AS n, min(revenue) AS low FROM demo
            WHERE revenue > 100 GROUP BY COUNTWINDOW(3, 1);""",
    )
    for name in ("having", "filtered", "whered"):
        b.tick(name)
    temps = [25, 10, 30, 26, 5, 40, 21, 22]
    revenue = [150, 50, 120, 90, 300, 110, 20, 130]
    _demo(b, [(i, "a", temp, rev) for i, (temp, rev) in enumerate(zip(temps, revenue))])
    for name in ("having", "filtered", "whered"):
        b.tick(name)
    at = lambda s: T0 + timedelta(seconds=s)
    # COUNTWINDOW(5,1): a window at each row from the 5th, holding the last 5 rows; WHERE keeps the
    # rows above 20 inside each, HAVING the windows with more than 2 of them.
    assert sorted((r["window_start"], r["n"]) for r in b.sink("having_out")) == [
        (at(0), 3),
        (at(1), 3),
        (at(2), 4),
        (at(3), 4),
    ]
    # FILTER before windowing: windows of exactly 3 kept rows (revenue 150, 120, 300, 110, 130)
    assert sorted((r["window_start"], r["n"], r["low"]) for r in b.sink("filtered_out")) == [
        (at(0), 3, 120.0),
        (at(2), 3, 110.0),
        (at(4), 3, 110.0),
    ]
    # WHERE after windowing: windows of 3 rows of which only those above 100 are counted
    assert sorted((r["window_start"], r["n"], r["low"]) for r in b.sink("whered_out")) == [
        (at(0), 2, 120.0),
        (at(1), 1, 120.0),
        (at(2), 2, 120.0),
        (at(3), 2, 110.0),
        (at(4), 2, 110.0),
        (at(5), 2, 110.0),
    ]


def test_seed_sliding_window_with_over(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        DEMO
        + """CREATE RULE spikes INTO spikes_out AS
        SELECT count(*) AS n, max(revenue) AS peak FROM demo
        GROUP BY SLIDINGWINDOW(ss, 10) FILTER(WHERE revenue > 100) OVER(WHEN revenue > 200);""",
    )
    b.tick("spikes")
    _demo(
        b,
        [(0, "a", 0, 150), (4, "a", 0, 90), (6, "a", 0, 250), (12, "a", 0, 120), (15, "a", 0, 210), (30, "a", 0, 500)],
    )
    b.tick("spikes")
    at = lambda s: T0 + timedelta(seconds=s)
    # windows (t-10, t] at the rows above 200 (6 s, 15 s, 30 s), over the rows above 100
    assert sorted((r["window_start"], r["window_end"], r["n"], r["peak"]) for r in b.sink("spikes_out")) == [
        (at(-4), at(6), 2, 250.0),
        (at(5), at(15), 3, 250.0),
        (at(20), at(30), 1, 500.0),
    ]


def test_a_stream_grouped_by_a_window_function_is_a_rule():
    (s,) = parse(
        "CREATE STREAM IF NOT EXISTS tc INTO tc_out AS SELECT count(*) AS n FROM demo "
        "GROUP BY ID, TUMBLINGWINDOW(ss, 10)"
    )
    assert (s.form, s.if_not_exists, s.sink, s.group_by) == ("ekuiper", True, "tc_out", ("ID",))
    assert s.trigger == SlidingTrigger(sliding=10 * S, interval=10 * S)
    (old,) = parse(
        "CREATE STREAM avg_vol_s INTO avg_vol AS SELECT _wstart, count(*) FROM meters "
        "PARTITION BY tbname INTERVAL(1m) SLIDING(30s)"
    )
    assert old.form == "old"  # TDengine's own streams are untouched
