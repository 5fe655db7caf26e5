"""eKuiper rules (seed 003) from ``.sql``: stream declarations, the rule dialect's errors, and rules run
end to end on real Spark and Delta through the stream sensor (``streams_util.Bench``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

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


def test_natural_time_is_local_for_every_unit():
    # eKuiper aligns windows on the local day, hour, minute... of its time zone: in +05:30 an hour
    # window ends at hh:30 UTC (offset 30 min), a 60-minute one too; hopping windows end at the hop's
    # multiples; session check points likewise
    def trigger(window):
        (rule,) = parse(f"CREATE RULE r INTO out AS SELECT count(*) FROM demo GROUP BY {window}", tz="Asia/Kolkata")
        return rule.trigger

    half = timedelta(minutes=30)
    assert trigger("TUMBLINGWINDOW(hh, 1)").interval_offset == half
    assert trigger("TUMBLINGWINDOW(mi, 60)").interval_offset == half
    assert trigger("TUMBLINGWINDOW(mi, 10)").interval_offset == timedelta(0)
    assert trigger("TUMBLINGWINDOW(dd, 1)").interval_offset == timedelta(hours=18, minutes=30)
    hop = trigger("HOPPINGWINDOW(hh, 2, 1)")  # windows [k h + 30 min, + 2 h): ending at hh:30
    assert (hop.interval_offset, hop.sliding, hop.interval) == (half, timedelta(hours=1), timedelta(hours=2))
    assert trigger("SESSIONWINDOW(hh, 1, 5)").offset == half
    assert trigger("HOPPINGWINDOW(ss, 10, 4)").interval_offset == timedelta(seconds=2)  # ends at 4k s


def test_field_types_are_ekuipers():
    (decl,) = parse(
        "CREATE STREAM s (a FLOAT, b BIGINT, c DATETIME, d BYTEA, e BOOLEAN, f STRING, g ARRAY(FLOAT), "
        'h STRUCT(x BIGINT, y ARRAY(STRING)), ts BIGINT) WITH (TIMESTAMP="ts")'
    )
    assert [c.type for c in decl.columns] == [
        "double",  # eKuiper's float is 64-bit
        "bigint",
        "timestamp",
        "binary",
        "boolean",
        "string",
        "array<double>",
        "struct<x:bigint,y:array<string>>",
        "timestamp",
    ]


def test_late_tolerance_rule_option():
    (rule,) = parse(
        "CREATE RULE r INTO out WITH (lateTolerance = 1500) AS SELECT count(*) FROM demo "
        "GROUP BY TUMBLINGWINDOW(ss, 10)"
    )
    assert (rule.options.watermark, rule.options.ignore_disorder) == (timedelta(milliseconds=1500), True)
    (default,) = parse("CREATE RULE r INTO out AS SELECT count(*) FROM demo GROUP BY TUMBLINGWINDOW(ss, 10)")
    assert (default.options.watermark, default.options.ignore_disorder) == (timedelta(0), False)
    assert error(
        "CREATE RULE r INTO out WITH (isEventTime = 1) AS SELECT count(*) FROM demo GROUP BY COUNTWINDOW(2)"
    ) == ("r.sql:1:30: a rule's WITH takes lateTolerance = milliseconds, such as WITH (lateTolerance = 1000)")
    assert error(
        "CREATE RULE r INTO out WITH (lateTolerance = 1.5) AS SELECT count(*) FROM demo GROUP BY COUNTWINDOW(2)"
    ).startswith("r.sql:1:46: lateTolerance must be a whole number of milliseconds")


def test_selected_bounds_keys_having_aliases_and_first_row_values():
    (rule,) = parse(
        "CREATE RULE r INTO out AS SELECT window_start(), ID, temperature, count(*) AS c FROM demo "
        "GROUP BY ID, TUMBLINGWINDOW(ss, 10) HAVING c > 1 AND max(revenue) > 2"
    )
    assert [(i.name, i.expression) for i in rule.select] == [
        ("window_start", "__cq_twstart"),  # the one window_start column
        ("window_end", "__cq_twend"),
        ("ID", "ID"),  # a GROUP BY column: its value
        ("temperature", "MIN_BY(temperature, __cq_ekrowtime)"),  # else the first row's (eKuiper)
        ("c", "COUNT(*)"),
    ]
    assert rule.having == "(COUNT(*)) > 1 AND MAX(revenue) > 2"
    assert error(
        "CREATE RULE r INTO out AS SELECT window_start(), window_start() AS s FROM demo GROUP BY COUNTWINDOW(2)"
    ).startswith("r.sql:1:50: window_start() is selected twice")


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

import ekuiper_reference as ref  # noqa: E402

US = 1_000_000


def _us(seconds: float) -> int:
    return int((T0 + timedelta(seconds=seconds)).timestamp() * US)


def _at(us: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)


def _feed_in_commits(b: Bench, name: str, rows: list[tuple], commits: int) -> None:
    """Append ``rows`` in about ``commits`` time-ordered commits, with a tick after each; the rows of
    one time (a sensor tick's readings) arrive in one commit."""
    b.tick(name)
    step, i = -(-len(rows) // commits), 0
    while i < len(rows):
        j = min(i + step, len(rows))
        while j < len(rows) and rows[j][0] == rows[j - 1][0]:
            j += 1
        _demo(b, rows[i:j])
        b.tick(name)
        i = j


def _reference_rows(window: str, rows: list[tuple], until: int) -> list[tuple]:
    """What eKuiper emits for ``SELECT ID, count(*), sum(temperature) ... GROUP BY ID, window``:
    the stream's windows (tests/ekuiper_reference.py), each split by ID; closed windows only."""
    times = [_us(sec) for sec, _, _ in rows]
    if window.startswith("COUNT"):
        n, k = (int(x) for x in window[12:-1].split(","))
        windows = ref.count_windows(times, count=n, interval=k, until=until)
    elif window.startswith("SLIDING"):
        size, *delay = (int(x) for x in window[18:-1].split(","))
        windows = ref.sliding_windows(times, size=size * US, delay=(delay or [0])[0] * US, until=until)
    else:
        d, timeout = (int(x) for x in window[18:-1].split(","))
        windows = ref.session_windows(times, timeout=timeout * US, max_duration=d * US, until=until)
    dicts = [dict(t=t, ID=r[1], temp=r[2]) for t, r in zip(times, rows)]
    return sorted(
        (_at(w["start"]), k, len(rs), round(sum(r["temp"] for r in rs), 6))
        for w, k, rs in ref.split([w for w in windows if w["closed"]], dicts, key=lambda r: r["ID"])
    )


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize(
    "window", ["COUNTWINDOW(5, 2)", "SLIDINGWINDOW(ss, 20, 5)", "SLIDINGWINDOW(ss, 10)", "SESSIONWINDOW(ss, 60, 15)"]
)
def test_data_shaped_rules_match_the_reference_across_ticks(tmp_path, spark, window, seed):
    # eKuiper's windows are the stream's: several devices, often at one time (not for COUNTWINDOW,
    # whose order among rows of one time is their arrival); GROUP BY ID splits each window's rows and
    # the key is selected (issue 21: that crashed)
    import random

    rng = random.Random(seed)
    rows, t = [], 0
    while len(rows) < 60:
        t += rng.choice([1, 3, 5, 10, 15, 16, 40])
        ties = 1 if window.startswith("COUNT") else rng.choice([1, 1, 2, 3])
        rows += [(t, d, float(rng.randint(0, 50))) for d in rng.sample(["a", "b", "c"], ties)]
    b = Bench(
        tmp_path,
        spark,
        DEMO + f"CREATE RULE r INTO r_out AS SELECT ID, count(*) AS n, sum(temperature) AS s "
        f"FROM demo GROUP BY ID, {window};",
    )
    _feed_in_commits(b, "r", rows, commits=4)
    until = _us(rows[-1][0])  # the watermark: the latest event time (lateTolerance 0)
    got = sorted((r["window_start"], r["ID"], r["n"], round(r["s"], 6)) for r in b.sink("r_out"))
    assert got == _reference_rows(window, rows, until) and got


FORMS = (Path(__file__).parent / "corpus" / "ekuiper_forms.sql").read_text()


def test_every_window_with_the_key_selected_and_the_other_forms(tmp_path, spark):
    b = Bench(tmp_path, spark, FORMS)
    names = [line.split()[2] for line in FORMS.splitlines() if line.startswith("CREATE RULE")]
    for name in names:
        b.tick(name)
    x = 22.123456789  # FLOAT is eKuiper's 64-bit float: stored exactly
    data = [(1, "a", 10), (5, "b", 20), (5, "c", 30), (7, "a", 15), (11, "a", 40), (12, "b", 50), (25, "c", 60)]
    _demo(b, [(sec, d, v + x, v) for sec, d, v in data])
    for name in names:
        b.tick(name)
    at = lambda sec: T0 + timedelta(seconds=sec)

    def rows(table, *cols):
        return sorted(tuple(round(r[c], 6) if isinstance(r[c], float) else r[c] for c in cols) for r in b.sink(table))

    # windows of the whole stream, split by device; the watermark is 25 s
    assert rows("k_tumble", "window_start", "ID", "c", "t") == [
        (at(0), "a", 2, round(25 + 2 * x, 6)),
        (at(0), "b", 1, round(20 + x, 6)),
        (at(0), "c", 1, round(30 + x, 6)),
        (at(10), "a", 1, round(40 + x, 6)),
        (at(10), "b", 1, round(50 + x, 6)),
    ]
    assert [r["t"] for r in b.sink("k_tumble") if r["ID"] == "b"] == [20 + x, 50 + x]
    assert rows("k_hop", "window_start", "ID", "c") == [
        (at(-5), "a", 1),
        (at(0), "a", 2),
        (at(0), "b", 1),
        (at(0), "c", 1),
        (at(5), "a", 2),
        (at(5), "b", 2),
        (at(5), "c", 1),
        (at(10), "a", 1),
        (at(10), "b", 1),
    ]
    # a window at every row, both rows at 5 s included: [t - 10 s, t]
    assert rows("k_slide", "window_start", "ID", "c", "s") == sorted(
        [(at(-9), "a", 1, 10.0)]
        + [(at(-5), d, 1, v) for d, v in (("a", 10.0), ("b", 20.0), ("c", 30.0))] * 2
        + [(at(-3), "a", 2, 25.0), (at(-3), "b", 1, 20.0), (at(-3), "c", 1, 30.0)]
        + [(at(1), "a", 3, 65.0), (at(1), "b", 1, 20.0), (at(1), "c", 1, 30.0)]
        + [(at(2), "a", 2, 55.0), (at(2), "b", 2, 70.0), (at(2), "c", 1, 30.0)]
        + [(at(15), "c", 1, 60.0)]
    )
    # one session of the stream (gaps up to 4 s) from 1 s to 12 s + 5 s; 25 s opens the next
    assert rows("k_session", "window_start", "window_end", "ID", "c") == [
        (at(1), at(17), "a", 3),
        (at(1), at(17), "b", 2),
        (at(1), at(17), "c", 1),
    ]
    # every 3 rows of the stream
    assert rows("k_count", "window_start", "ID", "c") == [
        (at(1), "a", 1),
        (at(1), "b", 1),
        (at(1), "c", 1),
        (at(7), "a", 2),
        (at(7), "b", 1),
    ]
    # window_start() selected is the window_start column, under its alias; window_end() is window_end
    assert [c for c in b.sink("k_bounds")[0]] == ["ws", "window_end", "ID", "c", "group_id"]
    assert rows("k_bounds", "ws", "ID", "c") == rows("k_tumble", "window_start", "ID", "c")
    assert len(b.sink("k_star")) == 6 and list(b.sink("k_star")[0]) == [
        "window_start",
        "window_end",
        "ID",
        "temperature",
        "revenue",
        "ts",
        "group_id",
    ]
    # columns outside aggregates take the window group's first row's values (eKuiper)
    assert rows("k_first", "window_start", "ID", "revenue", "ts", "n") == [
        (at(0), "a", 10.0, at(1), 2),
        (at(0), "b", 20.0, at(5), 1),
        (at(0), "c", 30.0, at(5), 1),
        (at(10), "a", 40.0, at(11), 1),
        (at(10), "b", 50.0, at(12), 1),
    ]
    # without GROUP BY columns or aggregates a rule emits every row, of the windows HAVING keeps (seed 003)
    assert rows("k_rows", "window_start", "ID", "revenue") == [
        (at(0), "a", 15.0),
        (at(0), "b", 20.0),
        (at(0), "c", 30.0),
    ]
    # GROUP BY columns make a rule aggregate (eKuiper): one row per window group, the first row's values
    assert rows("k_plain", "window_start", "ID", "temperature") == [
        (at(0), "a", round(10 + x, 6)),
        (at(0), "b", round(20 + x, 6)),
        (at(0), "c", round(30 + x, 6)),
        (at(10), "a", round(40 + x, 6)),
        (at(10), "b", round(50 + x, 6)),
    ]
    assert rows("k_having", "window_start", "ID", "c") == [(at(0), "a", 2)]
    # watermark 25 s - 2 s: [20 s, 30 s) stays open as well
    assert rows("k_late", "window_start", "ID", "c") == rows("k_tumble", "window_start", "ID", "c")
    # FILTER before windowing, OVER picks the triggering rows (revenue > 35: 11 s, 12 s, 25 s)
    assert rows("k_over", "window_start", "ID", "c") == [
        (at(1), "a", 1),
        (at(1), "b", 1),
        (at(1), "c", 1),
        (at(2), "a", 1),
        (at(2), "b", 2),
        (at(2), "c", 1),
        (at(15), "c", 1),
    ]


def test_hour_and_minute_windows_align_on_local_time(tmp_path, spark):
    # Asia/Kolkata is +05:30: eKuiper's hour windows end on local hours, at hh:30 UTC
    b = Bench(
        tmp_path,
        spark,
        DEMO + "CREATE RULE hourly INTO hourly AS SELECT count(*) AS n FROM demo GROUP BY TUMBLINGWINDOW(hh, 1);\n"
        "CREATE RULE minutes INTO minutes AS SELECT count(*) AS n FROM demo GROUP BY TUMBLINGWINDOW(mi, 60);\n"
        "CREATE RULE hops INTO hops AS SELECT count(*) AS n FROM demo GROUP BY HOPPINGWINDOW(hh, 2, 1);",
        timezone="Asia/Kolkata",
    )
    for name in ("hourly", "minutes", "hops"):
        b.tick(name)
    m = timedelta(minutes=1)
    _demo(b, [(sec * 60, "a", 1.0) for sec in (20, 40, 70, 95, 151)])  # T0 is 10:00 UTC
    for name in ("hourly", "minutes", "hops"):
        b.tick(name, now=T0 + timedelta(hours=4))
    at = lambda minutes: T0 + minutes * m
    expected = [(at(-30), at(30), 1), (at(30), at(90), 2), (at(90), at(150), 1)]  # 12:31 is past 12:30
    for name in ("hourly", "minutes"):
        assert [(r["window_start"], r["window_end"], r["n"]) for r in b.sink(name)] == expected
    assert [(r["window_start"], r["window_end"], r["n"]) for r in b.sink("hops")] == [
        (at(-90), at(30), 1),
        (at(-30), at(90), 3),
        (at(30), at(150), 3),
    ]


def test_late_rows_recomputed_by_default_dropped_with_late_tolerance(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        DEMO + "CREATE RULE again INTO again AS SELECT count(*) AS n FROM demo GROUP BY TUMBLINGWINDOW(ss, 10);\n"
        "CREATE RULE dropped INTO dropped WITH (lateTolerance = 5000) AS SELECT count(*) AS n FROM demo "
        "GROUP BY TUMBLINGWINDOW(ss, 10);",
    )
    for name in ("again", "dropped"):
        b.tick(name)
    _demo(b, [(1, "a", 1.0), (5, "a", 1.0), (12, "a", 1.0), (25, "a", 1.0)])
    for name in ("again", "dropped"):
        b.tick(name)
    at = lambda sec: T0 + timedelta(seconds=sec)
    _demo(b, [(27, "a", 1.0)])
    _demo(b, [(3, "a", 1.0)])  # late for both (their watermarks: 25 s, 20 s)
    plans = {name: b.tick(name) for name in ("again", "dropped")}
    # the default recomputes [0, 10 s) with the late row
    assert [(r["window_start"], r["n"]) for r in b.sink("again")] == [(at(0), 3), (at(10), 1)]
    # eKuiper drops it (watermark = latest event time - lateTolerance): reported as ignored
    assert [(r["window_start"], r["n"]) for r in b.sink("dropped")] == [(at(0), 2), (at(10), 1)]
    assert not plans["again"].ignored
    (ignored,) = plans["dropped"].ignored
    assert ignored.rows == 1 and "lateTolerance 5s drops rows older than the watermark" in ignored.text


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


def test_avg_of_integers_is_an_integer_as_in_ekuiper(tmp_path, spark):
    # eKuiper's funcs_agg.go: avg over int64 values returns the int64 total divided by the count of
    # non-NULL values (Go's division, toward zero); floats average as floats.
    b = Bench(
        tmp_path,
        spark,
        'CREATE STREAM orders (ID STRING, qty BIGINT, price FLOAT, ts BIGINT) WITH (DATASOURCE="orders", TIMESTAMP="ts");\n'
        "CREATE RULE avgs INTO avgs_out AS SELECT avg(qty) AS q, avg(qty * 2 + 1) AS q2, avg(price) AS p, "
        "avg(qty + 0.5) AS h FROM orders GROUP BY ID, TUMBLINGWINDOW(ss, 10);",
    )
    b.tick("avgs")
    rows = [
        (1, "a", 1, 1.0),
        (2, "a", 2, 2.0),
        (3, "a", None, None),
        (4, "b", -3, 1.0),
        (5, "b", 0, 2.0),
        (30, "a", 1, 1.0),
    ]
    b.engine.storage.append(
        "orders",
        pa.table(
            {
                "ID": [r[1] for r in rows],
                "qty": pa.array([r[2] for r in rows], pa.int64()),
                "price": pa.array([r[3] for r in rows], pa.float64()),
                "ts": pa.array([T0 + timedelta(seconds=r[0]) for r in rows], pa.timestamp("us", tz="UTC")),
            }
        ),
    )
    b.tick("avgs")
    out = [(r["ID"], r["q"], r["q2"], r["p"], r["h"]) for r in b.sink("avgs_out")]
    assert sorted(out) == [("a", 1, 4, 1.5, 2.0), ("b", -1, -2, 1.5, -1.0)]
    assert all(isinstance(r[1], int) for r in out)


def test_empty_windows_of_ungrouped_tumbling_and_hopping_rules_are_rows_of_nulls(tmp_path, spark):
    # eKuiper's event-time trigger (event_window_trigger.go getNextWindow) steps from the first event's
    # aligned window end by the hop, and scan() emits each window, empty or not: an aggregate rule
    # without GROUP BY columns gets one row for an empty window, its aggregates NULL (count(*) too).
    # With GROUP BY columns an empty window has no group, so no row.
    b = Bench(
        tmp_path,
        spark,
        DEMO
        + """
        CREATE RULE tumble INTO tumble_out AS SELECT count(*) AS n, max(temperature) AS t FROM demo
            GROUP BY TUMBLINGWINDOW(ss, 10);
        CREATE RULE hop INTO hop_out AS SELECT count(*) AS n FROM demo GROUP BY HOPPINGWINDOW(ss, 10, 5);
        CREATE RULE keyed INTO keyed_out AS SELECT count(*) AS n FROM demo GROUP BY ID, TUMBLINGWINDOW(ss, 10);""",
    )
    for name in ("tumble", "hop", "keyed"):
        b.tick(name)
    _demo(b, [(12, "a", 1.0), (14, "a", 3.0), (41, "a", 2.0), (55, "b", 1.0)])
    for name in ("tumble", "hop", "keyed"):
        b.tick(name)
    at = lambda s: T0 + timedelta(seconds=s)
    # windows from the first event's ([10, 20)) to the last closed one ([40, 50): the latest event is 55 s)
    assert sorted((r["window_start"], r["window_end"], r["n"], r["t"]) for r in b.sink("tumble_out")) == [
        (at(10), at(20), 2, 3.0),
        (at(20), at(30), None, None),
        (at(30), at(40), None, None),
        (at(40), at(50), 1, 2.0),
    ]
    assert sorted((r["window_start"], r["n"]) for r in b.sink("hop_out")) == [
        (at(5), 2),
        (at(10), 2),
        (at(15), None),
        (at(20), None),
        (at(25), None),
        (at(30), None),
        (at(35), 1),
        (at(40), 1),
        (at(45), None),  # [45 s, 55 s) closed at the latest event, 55 s
    ]
    assert sorted((r["window_start"], r["n"]) for r in b.sink("keyed_out")) == [(at(10), 2), (at(40), 1)]


def test_late_notice_counts_exactly_the_rows_beyond_late_tolerance(tmp_path, spark):
    # One commit holding 5 rows, one of them older than the watermark (latest event 25 s - 5 s = 20 s):
    # the notice counts that one row and its event time, not the whole file.
    b = Bench(
        tmp_path,
        spark,
        DEMO + "CREATE RULE dropped INTO dropped WITH (lateTolerance = 5000) AS SELECT count(*) AS n FROM demo "
        "GROUP BY TUMBLINGWINDOW(ss, 10);",
    )
    b.tick("dropped")
    _demo(b, [(1, "a", 1.0), (25, "a", 1.0)])
    b.tick("dropped")
    _demo(b, [(3, "a", 1.0), (21, "a", 1.0), (22, "a", 1.0), (23, "a", 1.0), (24, "a", 1.0)])
    plan = b.tick("dropped")
    (ignored,) = plan.ignored
    assert ignored.rows == 1 and ignored.span == (T0 + 3 * S, T0 + 3 * S), ignored
    assert ignored.text.startswith("late: 1 row(s) ignored, event time [2026-11-21T10:00:03+00:00, "), ignored.text
    assert "before any window" in ignored.text


def test_rows_beyond_late_tolerance_trigger_and_join_no_window(tmp_path, spark):
    # eKuiper's WatermarkOp.track drops a row older than the watermark (latest event time seen before
    # it - lateTolerance) before the window operator: it triggers no SLIDINGWINDOW window and is not
    # counted in a window still open (here TUMBLINGWINDOW [0 s, 10 s), open until the watermark passes 10 s).
    b = Bench(
        tmp_path,
        spark,
        DEMO
        + """
        CREATE RULE slide INTO slide_out WITH (lateTolerance = 2000) AS SELECT count(*) AS c, sum(revenue) AS s
            FROM demo GROUP BY SLIDINGWINDOW(ss, 3);
        CREATE RULE tumble INTO tumble_out WITH (lateTolerance = 2000) AS SELECT count(*) AS c, sum(revenue) AS s
            FROM demo GROUP BY TUMBLINGWINDOW(ss, 10);""",
    )
    names = ("slide", "tumble")
    for name in names:
        b.tick(name)
    _demo(b, [(1, "d1", 1.0, 1.0), (9, "d1", 1.0, 2.0)])  # watermark 7 s
    for name in names:
        b.tick(name)
    _demo(b, [(5, "d2", 1.0, 99.0), (9.5, "d1", 1.0, 3.0)])  # 5 s < 7 s: dropped
    for name in names:
        b.tick(name)
    _demo(b, [(20, "d1", 1.0, 4.0)])  # watermark 18 s
    for name in names:
        b.tick(name)
    at = lambda sec: T0 + timedelta(seconds=sec)
    kept = ref.kept_rows([[1, 9], [5, 9.5], [20]], tolerance=2)
    assert kept == [1, 9, 9.5, 20]
    windows = ref.sliding_windows(kept, size=3, delay=0, until=18)
    assert [(w["start"], w["end"], len(w["members"])) for w in windows if w["closed"]] == [
        (-2, 1, 1),
        (6, 9, 1),
        (6.5, 9.5, 2),
    ]
    assert [(r["window_start"], r["window_end"], r["c"], r["s"]) for r in b.sink("slide_out")] == [
        (at(-2), at(1), 1, 1.0),
        (at(6), at(9), 1, 2.0),
        (at(6.5), at(9.5), 2, 5.0),
    ]
    assert [(r["window_start"], r["c"], r["s"]) for r in b.sink("tumble_out")] == [(at(0), 3, 6.0)]  # 1, 9, 9.5 s
