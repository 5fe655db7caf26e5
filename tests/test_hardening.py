"""Issue 13's loader and path cases, each reproduced: the name rule in every dialect and command, no
crash on extreme values, structured load errors, no user code in validation, SQL that reaches outside
its data refused. No Spark: everything here fails (or passes) before a session would start."""

from pathlib import Path

import pytest

from cq_engine.catalog import load_catalog, require_definition
from cq_engine.cli.main import main
from cq_engine.config import Settings
from cq_engine.errors import CQError, ParseError
from cq_engine.names import MAX_NAME_BYTES, check_name, inside
from cq_engine.parse import parse_text
from cq_engine.parse.safety import check_read_only
from cq_engine.storage.delta import DeltaRsStorage

TABLE = "CREATE TABLE IF NOT EXISTS ln (time TIMESTAMP, device STRING, temperature DOUBLE);\n"
CQ = "CREATE CQ c1 {header} BEGIN SELECT max_value(temperature) AS m INTO {sink} FROM {source} GROUP BY (1m) END"


def cq(header="RESAMPLE EVERY 1m", sink="c1_out", source="ln", select="max_value(temperature) AS m"):
    return CQ.format(header=header, sink=sink, source=source).replace("max_value(temperature) AS m", select)


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "tables.sql").write_text(TABLE)
    (tmp_path / "sql" / "cq.sql").write_text(cq() + ";\n")
    for var, value in {
        "CQ_SQL_DIR": tmp_path / "sql",
        "CQ_WAREHOUSE": tmp_path / "wh",
        "CQ_HOME": tmp_path / ".cq",
        "CQ_CONFIG": tmp_path / "none.toml",
    }.items():
        monkeypatch.setenv(var, str(value))
    monkeypatch.delenv("CQ_TRIGGER_PATH", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(capsys, *args) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def error_of(sql: str) -> str:
    with pytest.raises(ParseError) as info:
        parse_text(sql, file="x.sql")
    return str(info.value)


def assert_parse_error(sql: str, where: str, message: str) -> None:
    """``sql`` fails at ``where``'s first occurrence with ``message`` in the error."""
    text = error_of(sql)
    assert text.startswith(place(sql, where)) and message in text, text


def place(sql: str, needle: str) -> str:
    """``x.sql:1:<col>:`` of ``needle``'s first occurrence (one-line statements); ``x.sql:1:`` for ``''``."""
    return f"x.sql:1:{sql.index(needle) + 1}:" if needle else "x.sql:1:"


# -- the name rule ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql, where, message",
    [
        (cq(sink='"../escaped_sink"'), '"../', "bad sink '../escaped_sink'"),
        (cq(source='"../../wh/src"'), '"../', "bad source '../../wh/src'"),
        (cq(sink='"/abs/path"'), '"/abs', "bad sink '/abs/path'"),
        (cq(sink='"a\\\\b"'), '"a', "not '\\\\'"),
        ("CREATE TABLE " + "t" * 300 + " (ts TIMESTAMP, v DOUBLE)", "ttt", f"at most {MAX_NAME_BYTES} bytes"),
        ('CREATE TABLE "a\x00b" (ts TIMESTAMP, v DOUBLE)', '"a', "control character U+0000"),
        ('CREATE TABLE t (ts TIMESTAMP, "v\u202e" DOUBLE)', '"v', "control character U+202E"),
        (
            'CREATE STREAM s1 INTERVAL(1m) SLIDING(1m) FROM meters INTO "../out" AS SELECT _twstart, avg(c) AS a '
            "FROM %%trows",
            '"../out',
            "expected a table name after INTO, found '../out'",
        ),
        ('CREATE STREAM st (a BIGINT, ts BIGINT) WITH (DATASOURCE="../x", TIMESTAMP="ts")', '"../x', "bad name '../x'"),
        (
            'CREATE RULE r INTO ".." AS SELECT count(*) AS c FROM st GROUP BY TUMBLINGWINDOW(ss, 10)',
            '".."',
            "expected a table name after INTO, found '..'",
        ),
    ],
)
def test_names_that_escape_the_warehouse_are_refused_at_parse(sql, where, message):
    assert_parse_error(sql, where, message)


def test_the_name_rule_itself():
    for good in ("ln", "cq1_out", "温度", "_x"):
        assert check_name(good) == good
    for bad in ("", "..", ".", "a/b", "a\\b", "/etc", "a\x00", "a\u202eb", "1abc", "a" * (MAX_NAME_BYTES + 1), "a-b"):
        with pytest.raises(CQError):
            check_name(bad)


def test_storage_and_engine_state_refuse_escaping_names(tmp_path):
    storage = DeltaRsStorage(warehouse=str(tmp_path / "wh"))
    for bad in ("../x", "..", "a/../../b", "/tmp/x"):
        with pytest.raises(CQError):
            storage.uri(bad)
    settings = Settings(warehouse=str(tmp_path / "wh"))
    with pytest.raises(CQError):
        settings.state_uri("streams/../../victim")
    with pytest.raises(CQError):
        settings.table_uri("../other/t")
    assert settings.state_uri("streams/s1/frontier").endswith("/_cq/streams/s1/frontier")
    with pytest.raises(CQError):
        inside(tmp_path / "wh", "..")
    assert inside(tmp_path, "a") == (tmp_path / "a").resolve()


@pytest.mark.parametrize(
    "args",
    [
        ["drop", "../../../victim"],
        ["drop", ".."],
        ["drop", "a/b"],
        ["ingest", "../other/t", "f.csv"],
        ["run", "../x", "--at", "2021-05-11T22:18:40"],
        ["plan", "..", "--from", "2021-05-11"],
        ["tick", "../x"],
        ["recalculate", "/abs", "--from", "2021-05-11"],
        ["stop", ".."],
    ],
)
def test_cli_refuses_bad_names_before_touching_anything(project, capsys, args):
    victim = project / "victim"
    victim.mkdir()
    (victim / "keep").write_text("precious")
    (project / "wh" / "_cq" / "streams").mkdir(parents=True)
    code, _, err = run(capsys, *args)
    assert code == 2 and "is not a valid name" in err and "Traceback" not in err
    assert (victim / "keep").read_text() == "precious"
    assert (project / "wh" / "_cq" / "streams").is_dir()
    assert not (project / "other").exists() and sorted(p.name for p in (project / "wh").iterdir()) == ["_cq"]


# -- the loader never crashes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql, where, message",
    [
        (cq("RESAMPLE EVERY 2147483648d"), "2147", "longer than 36500d (100 years)"),
        (cq("RESAMPLE EVERY 2147483648m"), "2147", "longer than 36500d (100 years)"),
        (cq("RESAMPLE EVERY 1m BOUNDARY 99999999999999999999"), "9999", "is outside the times the engine takes"),
        (cq("RESAMPLE EVERY 1m BOUNDARY 9999-12-31T23:59:59"), "9999", "is outside the times the engine takes"),
        (cq("RESAMPLE EVERY 1" + "0" * 5000 + "s"), "1000", "more than 30 digits"),
        (
            "CREATE RULE r INTO s AS SELECT count(*) AS c FROM st GROUP BY TUMBLINGWINDOW(dd, 2147483648)",
            "2147",
            "positive integer below 2147483648",
        ),
        (
            "CREATE RULE r INTO s AS SELECT count(*) AS c FROM st GROUP BY TUMBLINGWINDOW(dd, 2147483647)",
            "2147",
            "longer than 36500d",
        ),
        (
            "CREATE RULE r INTO s AS SELECT count(*) AS c FROM st GROUP BY TUMBLINGWINDOW(,dd 1)",
            "(,",
            "TUMBLINGWINDOW has an empty argument",
        ),
        (cq(select="max(" + "(" * 500 + "temperature" + ")" * 500 + ") AS m"), "", "nested deeper than 20 levels"),
        (
            "CREATE STREAM s1 INTERVAL(99999999999d) SLIDING(1m) FROM meters INTO o AS SELECT _twstart, avg(c) AS a "
            "FROM %%trows",
            "9999",
            "longer than 36500d",
        ),
    ],
)
def test_extreme_values_are_parse_errors(sql, where, message):
    assert_parse_error(sql, where, message)


def test_one_bad_file_never_takes_the_others_down(project, capsys):
    (project / "sql" / "bad.sql").write_text(
        "\n" + cq("RESAMPLE EVERY 2147483648d").replace("c1", "c2").replace("c1_out", "c2_out") + ";\n"
    )
    catalog = load_catalog(project / "sql")
    assert [d.name for d in catalog.definitions] == ["c1"]
    (error,) = catalog.errors
    assert (error.file, error.line, error.col) == (str(project / "sql" / "bad.sql"), 2, 29)
    assert error.detail.startswith("EVERY interval: '2147483648d' is longer") and error.names == ("c2",)
    code, out, err = run(capsys, "validate")
    assert code == 1 and "c1" in out and err.startswith(f"{project}/sql/bad.sql:2:29: EVERY interval")
    assert "Traceback" not in err


def test_dagster_placeholder_uses_the_structured_error(project):
    import dagster as dg

    from dagster_defs.definitions import error_placeholder

    bad = "CREATE CQ c2 BEGIN SELECT max(nope) AS m INTO o2 FROM ln GROUP BY (1m) END"
    (project / "sql" / "bad.sql").write_text(bad)
    (error,) = load_catalog(project / "sql").errors
    spec = error_placeholder(error)
    assert isinstance(spec, dg.AssetSpec) and spec.key.path[0] == "cq_errors"
    assert spec.metadata["cq/file"] == str(project / "sql" / "bad.sql")
    assert (spec.metadata["cq/line"], spec.metadata["cq/col"]) == (1, 31)  # at the column
    assert "has no column 'nope'" in spec.metadata["cq/message"]


def test_run_at_an_absurd_time_is_a_clean_error(project, capsys):
    code, _, err = run(capsys, "run", "c1", "--at", "99999999999999999999")
    assert code == 1 and err.startswith("cq: error: --at: '99999999999999999999' as epoch milliseconds is outside")


def test_times_from_users_are_bounded_but_data_and_engine_state_are_not():
    from cq_engine.times import UTC, parse_time

    with pytest.raises(CQError, match="outside the times the engine takes"):
        parse_time("1850-01-01", tz=UTC, what="--at")
    assert parse_time("1850-01-01", tz=UTC, bounded=False).year == 1850  # an ingested value, a cursor
    with pytest.raises(CQError, match="outside the dates Python holds"):
        parse_time("99999999999999999999", tz=UTC, bounded=False)


def test_plan_with_the_longest_every_stays_in_range(project, capsys):
    (project / "sql" / "cq.sql").write_text(cq("RESAMPLE EVERY 36500d"))
    code, out, err = run(capsys, "plan", "c1", "--from", "2199-12-31T00:00:00", "--count", "2")
    assert code == 0, err
    assert out.splitlines()[0].split() == ["fire_time", "range_start", "range_end"] and "Traceback" not in err


def test_an_unclosed_quote_is_reported_where_it_opens():
    sql = "CREATE TABLE t (ts TIMESTAMP, x STRING);\n"
    sql += "CREATE CQ c BEGIN SELECT max(x) AS m INTO o FROM t WHERE x = 'abc\nEND"
    assert error_of(sql) == "x.sql:2:62: unclosed ': the text runs to the end of the file without its closing quote"


# -- item 6: one file sees the others' tables; a removed definition says why ----------------------


def test_validate_one_file_checks_columns_against_the_sql_dir(project, capsys):
    (project / "sql" / "one.sql").write_text(
        "CREATE CQ bad_col BEGIN SELECT max(humidity) AS m INTO o2 FROM ln GROUP BY (1m) END;"
    )
    code, _, err = run(capsys, "validate", str(project / "sql" / "one.sql"))
    assert code == 1 and "'bad_col': table 'ln' has no column 'humidity'" in err
    code, _, err = run(capsys, "run", "bad_col", "--at", "2021-05-11T22:18:00")
    assert code == 1 and err.startswith("cq: error: 'bad_col' did not load: ") and "no column 'humidity'" in err
    (project / "sql" / "one.sql").write_text(
        "CREATE CQ broken BEGIN SELECT max(temperature) AS m INTO o2 FROM ln GROPU BY (1m) END;"
    )
    catalog = load_catalog(project / "sql")
    with pytest.raises(CQError, match=r"'broken' did not load: .*one.sql:1:.*did you mean GROUP\?"):
        require_definition(catalog, "broken", sql_dir="sql")


# -- issue 15 item 4: a misspelled keyword --------------------------------------------------------


def test_misspelled_keyword_is_reported_where_it_is_with_a_suggestion():
    sql = (
        "CREATE CONTINUOUS QUERY typo\nRESAMPLE EVERY 20s\nBEGIN\n  SELECT max_value(temperature)\n"
        "  INTO typo_out(temperature_max)\n  FROM ln\n  GROPU BY(10s), device\nEND;"
    )
    assert error_of(sql) == "x.sql:7:3: unexpected 'GROPU' after 'ln' (did you mean GROUP?)"
    assert "found 'PARTITON' (did you mean PARTITION?)" in error_of(
        "CREATE STREAM s1 INTERVAL(1m) SLIDING(1m) FROM meters PARTITON BY tbname INTO o AS SELECT _twstart, "
        "avg(c) AS a FROM %%trows"
    )
    assert error_of("CREATE RULE r INTO s AS SELECT count(*) AS c FROM st\nGROPU BY TUMBLINGWINDOW(ss, 10)").startswith(
        "x.sql:2:1: FROM takes one stream, then WHERE, GROUP BY or HAVING, found 'GROPU' (did you mean GROUP?)"
    )


# -- validation runs no user code ----------------------------------------------------------------

PWN = """from pathlib import Path
Path(__file__).with_name("pwned").write_text("ran")
from cq_engine.triggers import Trigger
class P(Trigger):
    pass
"""


def test_validate_imports_no_trigger_module(project, capsys, monkeypatch):
    (project / "pwn.py").write_text(PWN)  # next to sql/: the default trigger path
    (project / "sql" / "trig.sql").write_text("CREATE TRIGGER t BEFORE INSERT ON ln AS 'pwn:P';")
    code, out, err = run(capsys, "validate")
    assert code == 0, err
    assert "trigger t" in out and not (project / "pwned").exists()
    # Running it (here: --check-triggers, which says it runs the trigger's code) imports it.
    code, _, err = run(capsys, "validate", "--check-triggers")
    assert code == 0, err
    assert (project / "pwned").read_text() == "ran"


def test_trigger_modules_come_from_the_trigger_path_not_the_current_directory(project, capsys, monkeypatch):
    from cq_engine.triggers.runtime import load_class

    elsewhere = project / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "pwn_cwd.py").write_text(PWN)
    monkeypatch.chdir(elsewhere)
    monkeypatch.syspath_prepend("")  # as `python -c` or `python -m` would put the current directory
    (project / "sql" / "trig.sql").write_text("CREATE TRIGGER t BEFORE INSERT ON ln AS 'pwn_cwd:P';")
    code, _, err = run(capsys, "validate")
    assert code == 1 and "no module 'pwn_cwd' in the trigger path" in err and "CQ_TRIGGER_PATH" in err
    settings = Settings(sql_dir=str(project / "sql"), trigger_path="")
    (trigger,) = load_catalog(project / "sql").triggers
    with pytest.raises(CQError, match="no module 'pwn_cwd'"):
        load_class(trigger, settings=settings)
    assert not (elsewhere / "pwned").exists()
    monkeypatch.setenv("CQ_TRIGGER_PATH", str(elsewhere))
    code, _, err = run(capsys, "validate")
    assert code == 0, err
    assert not (elsewhere / "pwned").exists()


# -- SQL that reaches outside its data ------------------------------------------------------------


@pytest.mark.parametrize(
    "sql, where, message",
    [
        (
            cq(select="max(temperature) AS m, reflect('java.lang.System', 'getenv', 'HOME') AS h"),
            "reflect",
            "reflect()",
        ),
        (
            cq(select="max(java_method('org.apache.spark.util.Utils', 'createDirectory', '/tmp', 'x')) AS m"),
            "java_method",
            "java_method()",
        ),
        (cq(select="max(TRY_REFLECT('java.lang.System', 'getenv', 'HOME')) AS m"), "TRY_REFLECT", "TRY_REFLECT()"),
        (cq(select="max(temperature) AS m, input_file_name() AS f"), "input_file_name", "input_file_name()"),
        (
            "CREATE CQ c1 BEGIN SELECT max(temperature) AS m INTO o FROM ln WHERE device IN (SELECT value FROM other) "
            "GROUP BY (1m) END",
            "",
            "subqueries are not supported",
        ),
        (
            "CREATE STREAM s1 INTERVAL(1m) SLIDING(1m) FROM meters INTO o AS SELECT _twstart, "
            "max(reflect('a', 'b')) AS a "
            "FROM %%trows",
            "reflect",
            "reflect()",
        ),
        (
            "CREATE RULE r INTO s AS SELECT count(*) AS c, java_method('a', 'b') AS j FROM st "
            "GROUP BY TUMBLINGWINDOW(ss, 10)",
            "java_method",
            "java_method()",
        ),
    ],
)
def test_definitions_may_not_reach_the_jvm_or_files(sql, where, message):
    text = error_of(sql)
    assert text.startswith(place(sql, where)) and message in text and "not " in text


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT OVERWRITE DIRECTORY '/tmp/elsewhere' USING parquet SELECT 1",
        "CREATE TABLE t (a INT) USING parquet LOCATION '/tmp/elsewhere'",
        "SELECT * FROM text.`/etc/passwd`",
        "SELECT * FROM parquet.`/tmp/x`",
        "ADD JAR /tmp/evil.jar",
        "SELECT reflect('java.lang.System', 'getenv', 'HOME')",
        "SELECT * FROM read_files('/etc')",
        "SELECT 1; DROP TABLE ln",
        "DROP TABLE ln",
        "WITH x AS (SELECT java_method('a', 'b') AS v) SELECT * FROM x",
    ],
)
def test_cq_query_is_read_only_by_default(project, capsys, sql):
    code, _, err = run(capsys, "query", sql)
    assert code == 1 and err.startswith("cq: error: query: ") and "--allow-writes" in err
    assert len(err.strip().splitlines()) == 1 and not (project / "wh").exists()


def test_read_only_queries_pass_the_check():
    for sql in (
        "SELECT * FROM ln",
        "WITH a AS (SELECT device FROM ln) SELECT count(*) FROM a",
        "SELECT device FROM ln UNION ALL SELECT device FROM cq1_out",
        "SELECT * FROM range(3)",
        "SELECT definition, status FROM cq_firings ORDER BY started_at",
    ):
        check_read_only(sql)


def test_dagster_code_location_survives_every_crasher(project):
    import dagster as dg

    from dagster_defs import build_definitions

    crashers = {
        "every.sql": cq("RESAMPLE EVERY 2147483648d").replace("c1", "x1"),
        "minutes.sql": cq("RESAMPLE EVERY 2147483648m").replace("c1", "x2"),
        "boundary.sql": cq("RESAMPLE EVERY 1m BOUNDARY 99999999999999999999").replace("c1", "x3"),
        "deep.sql": cq(select="max(" + "(" * 500 + "temperature" + ")" * 500 + ") AS m").replace("c1", "x4"),
        "window.sql": "CREATE RULE x5 INTO o5 AS SELECT count(*) AS c FROM ln GROUP BY TUMBLINGWINDOW(,dd 1)",
        "nul.sql": 'CREATE TABLE "a\x00b" (ts TIMESTAMP, v DOUBLE)',
    }
    for name, sql in crashers.items():
        (project / "sql" / name).write_text(sql)
    settings = Settings(sql_dir=str(project / "sql"), warehouse=str(project / "wh"), home=str(project / ".cq"))
    defs = build_definitions(settings=settings)
    errors = [a for a in defs.assets if isinstance(a, dg.AssetSpec) and a.key.path[0] == "cq_errors"]
    assert sorted(Path(e.metadata["cq/file"]).name for e in errors) == sorted(crashers)
    # c1 still loads: its switch, and its sink in the shared job.
    assert defs.resolve_schedule_def("c1_ticks") is not None
    assert dg.AssetKey("c1_out") in defs.resolve_job_def("cq_firings_job").asset_layer.executable_asset_keys


R = "reflect('java.lang.System', 'getenv', 'HOME')"


@pytest.mark.parametrize(
    "sql",
    [
        f"CREATE STREAM s1 INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname OPTIONS(PRE_FILTER({R} = 'x')) "
        "INTO o AS SELECT _twstart, avg(current) AS c FROM %%trows",
        f"CREATE STREAM s1 EVENT_WINDOW(START WITH {R} = 'a' END WITH current > 9) FROM meters PARTITION BY tbname "
        "INTO o AS SELECT _twstart, avg(current) AS c FROM %%trows",
        f"CREATE STREAM s1 STATE_WINDOW({R}) FROM meters PARTITION BY tbname INTO o AS SELECT _twstart, "
        "avg(current) AS c FROM %%trows",
        f"CREATE STREAM s1 INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname INTO o "
        f"OUTPUT_SUBTABLE(CONCAT('a', {R})) AS SELECT _twstart, avg(current) AS c FROM %%trows",
        f"CREATE STREAM s2 INTO o AS SELECT _wstart, count(*) c FROM meters PARTITION BY {R} AS cc INTERVAL(10s)",
        f"CREATE RULE r INTO s AS SELECT count(*) AS c FROM st GROUP BY SLIDINGWINDOW(ss, 10) FILTER(WHERE {R} = 'x')",
        f"CREATE RULE r INTO s AS SELECT count(*) AS c FROM st GROUP BY SLIDINGWINDOW(ss, 10) OVER(WHEN {R} = 'x')",
        f"CREATE CQ c1 RESAMPLE EVERY 1m BEGIN SELECT max(temperature) AS m INTO s FROM ln GROUP BY (1m), device "
        f"HAVING max({R}) > 1 END",
    ],
)
def test_every_clause_of_every_dialect_is_checked(sql):
    assert error_of(sql).startswith(place(sql, "reflect") + " reflect() reaches outside the data")


def test_query_table_names():
    from cq_engine.parse.safety import table_names

    assert table_names("WITH x AS (SELECT * FROM Ln) SELECT * FROM x JOIN cq1_out ON 1 = 1") == {"ln", "cq1_out"}
    assert table_names("SELECT * FROM range(3)") == set()
    assert table_names("SELECT definition FROM cq_firings") == {"cq_firings"}
    assert table_names("SHOW TABLES") is None  # not parsed into a tree: every table is registered
