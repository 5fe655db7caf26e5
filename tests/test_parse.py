"""Parser: every clause of seed 004's CREATE CONTINUOUS QUERY and every rejection rule."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from cq_engine.catalog import load_catalog
from cq_engine.errors import ParseError
from cq_engine.model import ContinuousQuery, Fill, TableDecl, TimeGrouping
from cq_engine.parse import ParseOptions, parse_text

S = timedelta(seconds=1)


def cq(sql: str, **opts) -> ContinuousQuery:
    (stmt,) = parse_text(sql, file="t.sql", options=ParseOptions(**opts))
    return stmt


def error(sql: str, **opts) -> str:
    with pytest.raises(ParseError) as info:
        parse_text(sql, file="t.sql", options=ParseOptions(**opts))
    return str(info.value)


FULL = """CREATE CONTINUOUS QUERY cq_id
RESAMPLE EVERY 20s RANGE 40s, 20s BOUNDARY 2021-05-11T22:18:40+08:00
TIMEOUT POLICY DISCARD
BEGIN
  SELECT max_value(temperature) AS temperature_max, min_value(temperature) AS tmin,
         first_value(temperature) AS f, last_value(temperature) AS l, extreme(temperature) AS e,
         max_time(temperature) AS mt, min_time(temperature) AS nt, count(temperature) AS c,
         sum(temperature) AS s, avg(temperature) AS a
  INTO ln_temperature_max
  FROM ln
  WHERE temperature > 0 AND device <> 'x'
  GROUP BY (10s, 5s), device
  HAVING count(temperature) > 1
  FILL (100.0)
  LIMIT 10 OFFSET 2
  ALIGN BY DEVICE
END"""


def test_every_clause():
    q = cq(FULL)
    assert q.name == "cq_id" and q.source == "ln" and q.sink == "ln_temperature_max"
    assert q.resample.every == 20 * S and q.resample.start_offset == 40 * S and q.resample.end_offset == 20 * S
    assert q.resample.boundary == datetime(2021, 5, 11, 14, 18, 40, tzinfo=UTC)
    assert q.timeout_policy == "DISCARD"
    assert q.time_grouping == TimeGrouping(interval=10 * S, step=5 * S)
    assert q.group_keys == ("device",)
    assert q.where == "temperature > 0 AND device <> 'x'"
    assert q.having == "COUNT(temperature) > 1"
    assert q.fill == Fill(kind="constant", value=100.0)
    assert (q.limit, q.offset, q.align_by_device) == (10, 2, True)
    exprs = {i.name: i.expression for i in q.select}
    assert exprs["temperature_max"] == "MAX(temperature)" and exprs["tmin"] == "MIN(temperature)"
    # first/last *point*: a NULL value is no point, so it has no time to order by
    assert exprs["f"] == "MIN_BY(temperature, IF(NOT temperature IS NULL, __cq_time, NULL))"
    assert exprs["l"] == "MAX_BY(temperature, IF(NOT temperature IS NULL, __cq_time, NULL))"
    assert exprs["e"] == "MAX_BY(temperature, STRUCT(ABS(temperature), temperature))"
    assert "MAX(" in exprs["mt"] and "__cq_time" in exprs["mt"]
    assert all(i.is_aggregate for i in q.select)


def test_defaults_follow_seed_004():
    q = cq("CREATE CQ c BEGIN SELECT max_value(t) AS m INTO o FROM s GROUP BY(10s) END")
    r = q.resample
    assert (r.every, r.start_offset, r.end_offset) == (10 * S, 10 * S, timedelta(0))
    assert r.boundary == datetime(1970, 1, 1, tzinfo=UTC)
    assert q.timeout_policy == "BLOCKED"
    q = cq("CREATE CQ c RESAMPLE RANGE 40s BEGIN SELECT max_value(t) AS m INTO o FROM s GROUP BY(10s) END")
    assert (q.resample.every, q.resample.start_offset) == (10 * S, 40 * S)
    q = cq("CREATE CQ c RESAMPLE EVERY 20s BEGIN SELECT max_value(t) AS m INTO o FROM s GROUP BY(10s) END")
    assert q.resample.start_offset == 20 * S


def test_into_column_list_names_items_and_row_wise_query():
    q = cq(
        "CREATE CQ cq5 RESAMPLE EVERY 20s BEGIN SELECT temperature + 1 INTO p(temperature) FROM ln align by device END"
    )
    assert [(i.name, i.expression, i.is_aggregate) for i in q.select] == [("temperature", "temperature + 1", False)]
    assert q.align_by_device and q.time_grouping is None


@pytest.mark.parametrize(
    "fill,expected",
    [
        ("PREVIOUS", Fill("previous")),
        ("linear", Fill("linear")),
        ("100", Fill("constant", 100)),
        ("'n/a'", Fill("constant", "n/a")),
        ("true", Fill("constant", True)),
        ("-1.5", Fill("constant", -1.5)),
    ],
)
def test_fill_forms(fill, expected):
    assert cq(f"CREATE CQ c BEGIN SELECT max(t) AS m INTO o FROM s GROUP BY(10s) FILL({fill}) END").fill == expected


def test_durations_units_and_boundary_forms():
    q = cq(
        "CREATE CQ c RESAMPLE EVERY 1h30m RANGE 2h BOUNDARY 2024-01-01T00:00:00 BEGIN SELECT max(t) AS m INTO o FROM s GROUP BY(1500ms) END",
        tz=ZoneInfo("Asia/Shanghai"),
    )
    assert q.resample.every == timedelta(minutes=90) and q.time_grouping.interval == timedelta(milliseconds=1500)
    assert q.resample.boundary == datetime(2023, 12, 31, 16, tzinfo=UTC)  # naive → CQ_TIMEZONE
    q = cq(
        "CREATE CQ c RESAMPLE EVERY 1w BOUNDARY 1620742720000 BEGIN SELECT max(t) AS m INTO o FROM s GROUP BY(1d) END"
    )
    assert q.resample.boundary == datetime(2021, 5, 11, 14, 18, 40, tzinfo=UTC)
    assert cq(
        "CREATE CQ c RESAMPLE EVERY 2000000ns BEGIN SELECT t AS m INTO o FROM s END", min_every=timedelta(0)
    ).resample.every == timedelta(milliseconds=2)


def test_several_statements_and_table_declaration():
    stmts = parse_text(
        """
        CREATE TABLE IF NOT EXISTS meters (ts TIMESTAMP, current FLOAT, voltage INT UNSIGNED) TAGS (location VARCHAR(64), groupId INT);
        CREATE TABLE t2 (a TIMESTAMP, b TIMESTAMP TIMESTAMP KEY, v DOUBLE);
        CREATE CQ c BEGIN SELECT max(current) AS m INTO o FROM meters GROUP BY(10s) END;
    """,
        file="t.sql",
    )
    meters, t2, c = stmts
    assert isinstance(meters, TableDecl) and meters.if_not_exists and meters.time_column == "ts"
    assert [(x.name, x.type, x.is_tag) for x in meters.columns] == [
        ("ts", "timestamp", False),
        ("current", "float", False),
        ("voltage", "bigint", False),
        ("tbname", "string", True),
        ("location", "string", True),
        ("groupId", "int", True),
    ]  # a super table
    assert t2.time_column == "b"
    assert c.location.line == 4


REJECTIONS = [
    # (sql, expected position, message fragment)
    ("CREATE CQ a BEGIN SELECT max(t) AS m INTO b FROM c WHERE time > 5 GROUP BY(10s) END", "1:58", "time filter"),
    ("CREATE CQ a BEGIN SELECT max(t) AS m INTO b FROM c GROUP BY([0, 10), 10s) END", "1:61", "[start, end)"),
    ("CREATE CQ a BEGIN SELECT t AS m INTO b FROM c END", "1:11", "GROUP BY (interval) or RESAMPLE EVERY"),
    ("CREATE CQ a RESAMPLE EVERY 500ms BEGIN SELECT t AS m INTO b FROM c END", "1:28", "below the minimum"),
    (
        "CREATE CQ a RESAMPLE RANGE 5s BEGIN SELECT max(t) AS m INTO b FROM c GROUP BY (10s) END",
        "1:22",
        "greater than or equal to every interval",
    ),
    (
        "CREATE CQ a RESAMPLE EVERY 5s RANGE 5s BEGIN SELECT max(t) AS m INTO b FROM c GROUP BY (10s) END",
        "1:89",
        "larger than the RANGE start offset",
    ),
    # IoTDB: "CQ: The start time offset should be greater than or equal to every interval."
    (
        "CREATE CQ a RESAMPLE EVERY 10s RANGE 5s BEGIN SELECT max(t) AS m INTO b FROM c GROUP BY (5s) END",
        "1:32",
        "greater than or equal to every interval",
    ),
    # IoTDB's HAVING rules (QueryStatement.semanticCheck) and SELECT ... INTO's refusal of SLIMIT/SOFFSET
    (
        "CREATE CQ a RESAMPLE EVERY 10s BEGIN SELECT s1 AS x INTO b FROM c HAVING s1 > 3 ALIGN BY DEVICE END",
        "1:74",
        "Expression of HAVING clause must to be an Aggregation",
    ),
    (
        "CREATE CQ a RESAMPLE EVERY 10s BEGIN SELECT s1 AS x INTO b FROM c HAVING count(s1) > 3 END",
        "1:80",
        "can not be used in NonAggregationQuery",
    ),
    (
        "CREATE CQ a BEGIN SELECT count(s1) AS x INTO b FROM c GROUP BY (10s) HAVING count(s1) + s1 > 3 END",
        "1:89",
        "'s1' is not inside an aggregate",
    ),
    (
        "CREATE CQ a BEGIN SELECT count(s1) AS x INTO b FROM c GROUP BY (10s) SLIMIT 1 END",
        "1:70",
        "SLIMIT is not supported in a continuous query",
    ),
    (
        "CREATE CQ a BEGIN SELECT count(s1) AS x INTO b FROM c GROUP BY (10s) LIMIT 2 SOFFSET 1 END",
        "1:78",
        "SOFFSET is not supported in a continuous query",
    ),
    (
        "CREATE CQ a RESAMPLE RANGE 5s, 5s BEGIN SELECT max(t) AS m INTO b FROM c GROUP BY (1s) END",
        "1:22",
        "greater than the end offset",
    ),
    (
        "CREATE CQ a RESAMPLE RANGE 5s, 10s BEGIN SELECT max(t) AS m INTO b FROM c GROUP BY (1s) END",
        "1:22",
        "greater than the end offset",
    ),
    ("CREATE CQ a RESAMPLE EVERY 0s BEGIN SELECT t AS m INTO b FROM c END", "1:28", "greater than 0"),
    (
        "CREATE CQ a RESAMPLE RANGE 0s BEGIN SELECT max(t) AS m INTO b FROM c GROUP BY (1s) END",
        "1:28",
        "greater than 0",
    ),
    ("CREATE CQ a BEGIN SELECT max(t) AS m INTO b FROM c GROUP BY (0s) END", "1:62", "greater than 0"),
    ("CREATE CQ a BEGIN SELECT max(t) AS m INTO b FROM c GROUP BY (10s, 0ms) END", "1:67", "greater than 0"),
    ("CREATE CQ a RESAMPLE EVERY 10x BEGIN SELECT t AS m INTO b FROM c END", "1:28", "unknown unit 'x'"),
    ("CREATE CQ a BEGIN SELECT max(t) AS m INTO b FROM c GROUP BY (10s) FILL(foo) END", "1:72", "FILL takes"),
    ("CREATE CQ a BEGIN SELECT max(t) AS m, min(t) AS M INTO b FROM c GROUP BY (10s) END", "1:49", "named twice"),
    ("CREATE CQ a BEGIN SELECT max(t) AS m INTO b FROM c GROUP BY (10s) ORDER BY m END", "1:67", "ORDER BY"),
    ("CREATE CQ a BEGIN SELECT max(t AS m INTO b FROM c GROUP BY (10s) END", "1:29", "unclosed '('"),
    ("CREATE CQ a BEGIN SELECT max(t) AS m INTO b FROM c GROUP BY (10s)", "1:66", "expected END"),
    ("CREATE CQ a BEGIN SELECT max(t) AS m FROM c GROUP BY (10s) END", "1:19", "needs a INTO clause"),
    ("CREATE CQ a BEGIN SELECT max(t) AS m INTO b(x, y) FROM c GROUP BY (10s) END", "1:38", "INTO lists 2 columns"),
    ("CREATE CQ a BEGIN SELECT max(t) AS m INTO b FROM c GROUP BY (10s), level = 1 END", "1:68", "GROUP BY LEVEL"),
    (
        "CREATE CQ a TIMEOUT POLICY LATER BEGIN SELECT max(t) AS m INTO b FROM c GROUP BY (10s) END",
        "1:28",
        "BLOCKED or DISCARD",
    ),
    ("CREATE CQ a RESAMPLE EVERY 1s EVERY 2s BEGIN SELECT t AS m INTO b FROM c END", "1:31", "given twice"),
    (
        "CREATE CQ a RESAMPLE BOUNDARY yesterday BEGIN SELECT max(t) AS m INTO b FROM c GROUP BY (1s) END",
        "1:31",
        "not a time",
    ),
    ("CREATE CQ a BEGIN SELECT * INTO b FROM c GROUP BY (1s) END", "1:26", "SELECT *"),
    ("CREATE CQ a BEGIN SELECT max(t) + AS m INTO b FROM c GROUP BY (1s) END", "1:35", "near"),
    ("CREATE CQ a BEGIN SELECT t AS m INTO b FROM c WHERE count(t) > 1 GROUP BY (1s) END", "1:59", "HAVING"),
    ("CREATE CQ a BEGIN SELECT t AS m INTO b FROM c FILL(previous) END", "1:11", "or RESAMPLE EVERY"),
    ("CREATE CQ a BEGIN SELECT max(t) AS m INTO b FROM c GROUP BY (1s) END extra", "1:70", "after END"),
    ("DROP CQ a", "1:1", "is a command"),
    ("SELECT 1", "1:1", "unknown statement"),
    ("CREATE TABLE t (v DOUBLE)", "1:14", "needs a TIMESTAMP column"),
    ("CREATE TABLE t (ts TIMESTAMP, v NUMBERWANG)", "1:33", "unknown column type"),
]


@pytest.mark.parametrize("sql,where,fragment", REJECTIONS)
def test_rejections_name_file_line_col(sql, where, fragment):
    message = error(sql)
    assert message.startswith(f"t.sql:{where}: "), message
    assert fragment in message


def test_errors_on_later_lines_point_there():
    message = error("CREATE CQ a\nBEGIN\n  SELECT max(t) AS m\n  INTO b FROM c\n  WHERE time > 1\n  GROUP BY (1s)\nEND")
    assert message.startswith("t.sql:5:9: ")


def test_catalog_loads_good_files_and_reports_bad_ones(tmp_path):
    (tmp_path / "a.sql").write_text(
        "CREATE TABLE ln (time TIMESTAMP, device STRING, temperature DOUBLE);\n"
        "CREATE CQ good BEGIN SELECT max(temperature) AS m INTO o1 FROM ln GROUP BY (1s), device END;"
    )
    (tmp_path / "b.sql").write_text("CREATE CQ bad BEGIN SELECT max(t) AS m INTO o2 FROM ln GROUP BY ([0,1), 1s) END;")
    (tmp_path / "c.sql").write_text(
        "CREATE CQ unknown_col BEGIN SELECT max(humidity) AS m INTO o3 FROM ln GROUP BY (1s) END;"
    )
    (tmp_path / "d.sql").write_text(
        "CREATE CQ same_sink BEGIN SELECT max(temperature) AS m INTO o1 FROM ln GROUP BY (1s) END;"
    )
    (tmp_path / "e.sql").write_text(
        "CREATE CQ ts_filter BEGIN SELECT max(temperature) AS m INTO o5 FROM ln WHERE time > 3 GROUP BY (1s) END;"
    )
    catalog = load_catalog(tmp_path)
    assert [d.name for d in catalog.definitions] == ["good"]
    errors = "\n".join(map(str, catalog.errors))
    assert f"{tmp_path}/b.sql:1:" in errors and "[start, end)" in errors
    assert "has no column 'humidity'" in errors
    assert "already writes" in errors
    assert "time filter" in errors
    assert len(catalog.errors) == 4


def test_select_items_without_a_name_get_one_from_their_text():
    (cq,) = parse_text(
        "CREATE CQ a BEGIN SELECT count(s1), Max_Value( temperature ), avg(s1) * 2, last_value(s2), 1 + 2, count(s1) "
        "INTO b FROM c GROUP BY (10s) END"
    )
    names = ["count_s1", "max_value_temperature", "avg_s1_2", "last_value_s2", "_1_2", "count_s1_2"]
    assert [i.name for i in cq.select] == names
    # AS and the INTO list still win; FILL is allowed without GROUP BY (rows are filled per device).
    (cq,) = parse_text("CREATE CQ a RESAMPLE EVERY 1m BEGIN SELECT s1 + 1 INTO b(x) FROM c FILL(PREVIOUS) END")
    assert [i.name for i in cq.select] == ["x"] and cq.fill is not None and cq.time_grouping is None


def test_count_star_is_one_count_per_series_of_the_source(tmp_path):
    # IoTDB expands count(*) to count() of every series the FROM path holds, and its SELECT ... INTO
    # refuses an INTO list whose length differs from the expanded items.
    table = "CREATE TABLE ln (ts TIMESTAMP, device STRING, s1 DOUBLE, s2 DOUBLE) TAGS (site STRING);\n"

    def load(body: str):
        (tmp_path / "q.sql").write_text(
            table + f"CREATE CQ q BEGIN SELECT {body} FROM ln GROUP BY (10s) ALIGN BY DEVICE END;\n"
        )
        return load_catalog(tmp_path)

    catalog = load("count(*), max_value(s1) AS m INTO o")
    assert not catalog.errors, catalog.errors
    (q,) = catalog.definitions
    assert [(i.expression, i.name) for i in q.select] == [
        ("count(`s1`)", "count_s1"),
        ("count(`s2`)", "count_s2"),
        ("MAX(s1)", "m"),
    ]
    (q,) = load("count(*) INTO o(a, b)").definitions
    assert [(i.expression, i.name) for i in q.select] == [("count(`s1`)", "a"), ("count(`s2`)", "b")]
    (error,) = load("count(*) INTO o(a)").errors
    assert "the number of source paths and the number of target paths should be the same" in str(error)
    (error,) = load("count(*) AS n INTO o").errors
    assert "an alias names one column" in str(error)
    (tmp_path / "q.sql").write_text("CREATE CQ q BEGIN SELECT count(*) INTO o FROM elsewhere GROUP BY (10s) END;\n")
    (error,) = load_catalog(tmp_path).errors
    assert str(error).startswith(f"{tmp_path}/q.sql:1:26: ") and "count(*) needs 'elsewhere' declared" in str(error)
