"""The catalog's checks of CREATE STREAM against declared tables: PARTITION BY aliases, queries reading
another table, sinks declared with CREATE TABLE, one writer per sink."""

import pytest

from cq_engine.catalog import check_sink_columns, load_catalog, referenced_columns
from cq_engine.errors import ParseError
from cq_engine.parse import parse_text
from cq_engine.streams.output import sink_mismatch

TABLES = """CREATE TABLE meters (ts TIMESTAMP, current FLOAT, voltage INT) TAGS (location VARCHAR(64), groupid INT);
CREATE TABLE plain (ts TIMESTAMP, v DOUBLE, st INT);
CREATE TABLE out3 (ts TIMESTAMP, c BIGINT, a DOUBLE);
CREATE TABLE out_super (ts TIMESTAMP, c BIGINT) TAGS (loc VARCHAR(64));
"""


def load(tmp_path, **files: str):
    (tmp_path / "0_tables.sql").write_text(TABLES)
    for name, sql in files.items():
        (tmp_path / f"{name}.sql").write_text(sql + ";")
    return load_catalog(tmp_path)


def only_error(catalog, name: str) -> str:
    (message,) = map(str, catalog.errors)
    assert catalog.definition(name) is None
    return message


def test_old_form_partition_aliases_are_not_table_columns(tmp_path):
    catalog = load(
        tmp_path,
        a="CREATE STREAM s INTO o TAGS (cc VARCHAR(100)) SUBTABLE(CONCAT('x', cc)) AS "
        "SELECT _wstart, count(*) AS n, cc, tname FROM meters "
        'PARTITION BY concat("tag-", location) AS cc, tbname tname INTERVAL(1m)',
    )
    assert catalog.errors == ()
    assert referenced_columns(catalog.definition("s")) == {"location", "tbname"}


def test_an_alias_of_tbname_still_groups_by_subtable(tmp_path):
    catalog = load(
        tmp_path,
        a="CREATE STREAM s INTO o AS SELECT _wstart, count(*) AS n FROM meters "
        "PARTITION BY tbname tname SESSION(ts, 10s)",
        b="CREATE STREAM s2 INTO o2 AS SELECT _wstart, count(*) AS n FROM meters "
        "PARTITION BY upper(tbname) AS tname SESSION(ts, 10s)",
    )
    assert [d.name for d in catalog.definitions] == ["s"]
    errors = tuple(map(str, catalog.errors))
    assert errors == (
        f"{tmp_path}/b.sql:1:1: 's2': SESSION on super table 'meters' needs PARTITION BY "
        "tbname (each subtable has its own windows)",
    )


def test_old_form_partition_expression_columns_are_checked(tmp_path):
    catalog = load(
        tmp_path,
        a="CREATE STREAM s INTO o AS SELECT _wstart, count(*) AS n FROM meters "
        "PARTITION BY tbname, upper(humidity) AS h INTERVAL(1m)",
    )
    assert only_error(catalog, "s") == (
        f"{tmp_path}/a.sql:1:96: 's': table 'meters' has no column 'humidity' "
        "(columns: ts, current, voltage, tbname, location, groupid)"
    )


def test_query_reading_another_table_may_name_the_trigger_group(tmp_path):
    catalog = load(
        tmp_path,
        a="CREATE STREAM s INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname, location "
        "INTO o AS SELECT _twstart, avg(v) AS a, %%2 FROM plain "
        "WHERE ts >= _twstart AND ts < _twend AND st = %%1",
    )
    assert catalog.errors == ()
    s = catalog.definition("s")
    assert (s.reads, s.source, s.trigger_table) == ("table", "plain", "meters")
    assert referenced_columns(s) == {"v", "ts", "st", "tbname", "location"}


def test_query_reading_another_table_is_checked_against_it(tmp_path):
    catalog = load(
        tmp_path,
        a="CREATE STREAM s SESSION(ts, 1s) FROM meters PARTITION BY tbname INTO o AS "
        "SELECT _twstart, avg(voltage) AS a FROM plain",
    )
    assert only_error(catalog, "s") == (
        f"{tmp_path}/a.sql:1:96: 's': table 'plain' has no column 'voltage' (columns: ts, v, st)"
    )


def test_from_tbname_reads_the_trigger_table(tmp_path):
    catalog = load(
        tmp_path,
        a="CREATE STREAM s COUNT_WINDOW(5) FROM meters PARTITION BY tbname INTO o AS "
        "SELECT _twstart, avg(nope) AS a FROM %%tbname",
    )
    assert only_error(catalog, "s") == (
        f"{tmp_path}/a.sql:1:96: 's': table 'meters' has no column 'nope' "
        "(columns: ts, current, voltage, tbname, location, groupid)"
    )


# --- sinks declared with CREATE TABLE --------------------------------------------------------------


def test_sink_mismatch_messages():
    def stream(columns: str = ""):
        (s,) = parse_text(
            f"CREATE STREAM s SESSION(ts, 1s) FROM plain INTO out3 {columns} AS "
            "SELECT _twstart, count(*) AS c FROM %%trows",
            file="s.sql",
        )
        return s

    assert sink_mismatch(stream(), "out3", ["ts", "c"]) is None
    assert sink_mismatch(stream(), "out3", ["ts", "c", "a"]) == (
        "'s': table 'out3' has 3 columns (ts, c, a) but the query yields 2; give INTO out3 (col, ...) to map them"
    )
    assert sink_mismatch(stream("(TS, a)"), "out3", ["ts", "c", "a"]) is None
    assert sink_mismatch(stream("(ts, b)"), "out3", ["ts", "c", "a"]) == (
        "'s': table 'out3' has no column 'b' (columns: ts, c, a)"
    )


def test_check_sink_columns_raises_at_the_stream():
    tables = {t.name: t for t in parse_text(TABLES, file="t.sql")}
    (s,) = parse_text(
        "\n  CREATE STREAM s SESSION(ts, 1s) FROM plain INTO out3 AS SELECT _twstart, count(*) AS c FROM %%trows",
        file="s.sql",
    )
    with pytest.raises(ParseError) as info:
        check_sink_columns(s, tables["out3"])
    assert str(info.value) == (
        "s.sql:2:3: 's': table 'out3' has 3 columns (ts, c, a) but the query yields 2; "
        "give INTO out3 (col, ...) to map them"
    )
    check_sink_columns(s, tables["out_super"])  # ts, c: tags (tbname, loc) are not result columns


@pytest.mark.parametrize(
    "sql,fragment",
    [
        (
            "CREATE STREAM s SESSION(ts, 1s) FROM plain INTO out3 AS SELECT _twstart, count(*) AS c FROM %%trows",
            "'s': table 'out3' has 3 columns (ts, c, a) but the query yields 2; give INTO out3 (col, ...) to map them",
        ),
        (
            "CREATE STREAM s INTO out3 (ts, c, x) AS SELECT _wstart, count(*), avg(v) FROM plain INTERVAL(1m)",
            "'s': table 'out3' has no column 'x' (columns: ts, c, a)",
        ),
        (
            "CREATE STREAM s INTO out_super AS SELECT _wstart, count(*), avg(v) FROM plain PARTITION BY st INTERVAL(1m)",
            "'s': table 'out_super' has 2 columns (ts, c) but the query yields 3",
        ),
    ],
)
def test_streams_must_fit_a_declared_sink(tmp_path, sql, fragment):
    catalog = load(tmp_path, a=sql)
    message = only_error(catalog, "s")
    assert message.startswith(f"{tmp_path}/a.sql:1:1: ") and fragment in message, message


def test_streams_fitting_a_declared_sink_load(tmp_path):
    catalog = load(
        tmp_path,
        a="CREATE STREAM s1 SESSION(ts, 1s) FROM plain INTO out3 AS SELECT _twstart, count(*) AS c, "
        "avg(v) AS a FROM %%trows",
        b="CREATE STREAM s2 INTO out_super (ts, c) TAGS (loc VARCHAR(64)) AS SELECT _wstart, count(*) "
        "FROM meters PARTITION BY location INTERVAL(1m)",
    )
    assert catalog.errors == () and [d.name for d in catalog.definitions] == ["s1", "s2"]
    assert catalog.definition("s2").tags[0].expression == "location"


def test_a_sink_declared_in_a_later_file_is_checked_too(tmp_path):
    (tmp_path / "a.sql").write_text("CREATE STREAM s INTO late AS SELECT _wstart, count(*) FROM src INTERVAL(1m);")
    (tmp_path / "b.sql").write_text("CREATE TABLE late (ts TIMESTAMP, a DOUBLE, b DOUBLE);")
    catalog = load_catalog(tmp_path)
    errors = tuple(map(str, catalog.errors))
    assert errors == (
        f"{tmp_path}/a.sql:1:1: 's': table 'late' has 3 columns (ts, a, b) but the query "
        "yields 2; give INTO late (col, ...) to map them",
    )


# --- one writer per sink ----------------------------------------------------------------------------


def test_two_streams_writing_one_sink_are_rejected(tmp_path):
    catalog = load(
        tmp_path,
        a="CREATE STREAM s1 SESSION(ts, 1s) FROM plain INTO shared AS SELECT _twstart, count(*) "
        "FROM %%trows;\nCREATE STREAM s2 INTO SHARED AS SELECT _wstart, count(*) FROM plain "
        "INTERVAL(1m)",
    )
    assert catalog.definitions == ()  # the whole file is rejected
    errors = tuple(map(str, catalog.errors))
    assert errors == (
        f"{tmp_path}/a.sql:2:1: 's2' writes table 'SHARED', which 's1' already writes "
        f"({tmp_path}/a.sql:1:1); give each definition its own sink",
    )


def test_a_stream_and_a_continuous_query_writing_one_sink_are_rejected(tmp_path):
    catalog = load(
        tmp_path,
        a="CREATE STREAM s1 SESSION(ts, 1s) FROM plain INTO shared AS SELECT _twstart, count(*) FROM %%trows",
        b="CREATE CQ q BEGIN SELECT max(v) AS m INTO shared FROM plain GROUP BY (1s) END",
    )
    assert [d.name for d in catalog.definitions] == ["s1"]
    errors = tuple(map(str, catalog.errors))
    assert errors == (
        f"{tmp_path}/b.sql:1:1: 'q' writes table 'shared', which 's1' already writes "
        f"({tmp_path}/a.sql:1:1); give each definition its own sink",
    )


def test_notification_only_streams_write_no_sink(tmp_path):
    catalog = load(
        tmp_path,
        a="CREATE STREAM n1 SESSION(ts, 1s) FROM plain NOTIFY('ws://h:1') ON (WINDOW_CLOSE) "
        "AS SELECT _twstart, count(*) AS c FROM %%trows;\n"
        "CREATE STREAM n2 PERIOD(1m) NOTIFY('ws://h:1')",
    )
    assert catalog.errors == ()
    assert [(d.name, d.sink) for d in catalog.definitions] == [("n1", None), ("n2", None)]


def test_partitioned_period_stream_reading_another_table_is_rejected(tmp_path):
    catalog = load(
        tmp_path,
        a="CREATE STREAM s PERIOD(1m) FROM meters PARTITION BY tbname INTO o AS "
        "SELECT _tlocaltime, count(*) AS n FROM plain",
    )
    assert only_error(catalog, "s") == (
        f"{tmp_path}/a.sql:1:1: 's': a PERIOD stream with PARTITION BY reads "
        "FROM %%trows or %%tbname, not another table ('plain')"
    )


def test_a_multi_row_function_reads_a_column_of_its_type(tmp_path):
    head = "CREATE STREAM s INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname INTO o AS SELECT ts, "
    message = only_error(load(tmp_path, a=head + "csum(location) c FROM %%trows"), "s")
    assert ":1:" in message and "CSUM(location) needs a number, but 'location' of table 'meters' is STRING" in message
    message = only_error(load(tmp_path, a=head + "diff(phase) d FROM %%trows"), "s")
    assert "table 'meters' has no column 'phase'" in message
    message = only_error(load(tmp_path, a=head + "tail(location, 2) t, unique(location) u FROM %%trows"), "s")
    assert "TAIL() chooses the rows of the result, so it cannot be combined with UNIQUE() in one query" in message
    catalog = load(tmp_path, a=head + "diff(ts) d, diff(voltage) v FROM %%trows")
    assert catalog.errors == () and [c.function for c in catalog.definition("s").series] == ["diff", "diff"]
