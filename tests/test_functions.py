"""Function names resolved when a definition loads (cq_engine/parse/functions.py): the dialect's own,
then Spark's built-ins from a static list, which a Spark test keeps equal to the running Spark's; and a
run's foreign exception as one line naming the definition and its file (errors.reported)."""

from __future__ import annotations

import pytest

from cq_engine.errors import CQError, ParseError, RunError, reported
from cq_engine.model import SourceLocation
from cq_engine.parse import parse_text
from cq_engine.parse.spark_functions import SPARK_AGGREGATES, SPARK_FUNCTIONS

STREAM = "CREATE STREAM s INTERVAL(10s) SLIDING(10s) FROM t INTO o AS SELECT _twstart, {items} FROM %%trows;"
CQ = "CREATE CONTINUOUS QUERY cq BEGIN SELECT {items} INTO o FROM src GROUP BY(1m) END;"
RULE = (
    'CREATE STREAM demo (ID STRING, temperature FLOAT, ts BIGINT) WITH (TIMESTAMP="ts");\n'
    "CREATE RULE r INTO o AS SELECT {items} FROM demo GROUP BY TUMBLINGWINDOW(ss, 10);"
)


def _error(sql: str) -> ParseError:
    with pytest.raises(ParseError) as info:
        parse_text(sql, file="f.sql")
    return info.value


@pytest.mark.parametrize(
    ("template", "items", "at", "message"),
    [
        (STREAM, "sum(v), spred(v) AS x", "spred", "unknown function SPRED(): neither a TDengine function"),
        (STREAM, "spred(v)", "spred", "did you mean SPREAD?"),
        (STREAM, "interp(v) AS i", "interp", "INTERP() is not supported in TDengine definitions"),
        (STREAM, "diff(v, 4) AS d", "4)", "DIFF: ignore_option must be between 0 and 3, got 4"),
        (STREAM, "avg(diff(v)) AS d", "diff", "DIFF() gives rows of its own, so it cannot be mixed with aggregates"),
        (STREAM, "top(v, 2) t, diff(v) d", "top", "TOP() chooses the rows of the result, so it cannot be combined"),
        (STREAM, "statecount(v, 'GX', 1) s", "'GX'", "the comparison is one of LT, GT, LE, GE, NE, EQ"),
        (STREAM, "histogram(v, 'user_input', '[3, 1]', 0) h", "'[3, 1]'", "edges must be strictly increasing"),
        (STREAM, "derivative(v, 10a, 0) d", "10a", "DERIVATIVE: the time interval must be at least 1s"),
        *[
            (
                f"CREATE STREAM s INTO o AS SELECT _wstart, {f} FROM t INTERVAL(10s);",
                "",
                f.split("(")[0],
                f"{f.split('(')[0].upper()}() cannot be used in the old form's query",
            )
            for f in ("twa(v)", "diff(v)", "percentile(v, 50)", "unique(v)", "mode(v)", "interp(v)")
        ],
        (STREAM, "elapsed(ts, 1s, 2) AS e", "elapsed", "ELAPSED takes 1 to 2 argument(s), got 3"),
        (STREAM, "elapsed(ts, v) AS e", "v)", "ELAPSED: the time unit must be a duration such as 1s"),
        (STREAM, "percentile(v, 101) AS p", "101", "the percentile p must be between 0 and 100"),
        (STREAM, "first(*) AS f", "first", "FIRST(*) is not supported: name one column"),
        (STREAM, "twa(v * _twduration) AS t", "v * _twd", "TWA: in INTERVAL and SLIDING windows its argument is also"),
        (STREAM, "cast(v AS geometry(10)) AS g", "v AS geometry", "CAST to GEOMETRY(10) is not supported"),
        (STREAM, "ts, avg(v) AS a", "ts,", "column 'ts' is not inside an aggregate"),
        (
            "CREATE STREAM s INTO o AS SELECT _wstart, count(*) FROM t WHERE _wstart > 0 INTERVAL(10s);",
            "",
            "_wstart > 0",
            "cannot be used in the old form's WHERE, which filters rows before windowing",
        ),
        (CQ, "spread(v)", "spread", "unknown function SPREAD(): neither an IoTDB function"),
        (RULE, "ID, deduplicate(ID, true) AS d", "deduplicate", "unknown function DEDUPLICATE(): neither an eKuiper"),
    ],
)
def test_an_unknown_or_misused_function_is_refused_at_it(template, items, at, message):
    sql = template.format(items=items)
    err = _error(sql)
    assert message in err.detail
    line, col = err.line, err.col
    offset = sum(len(x) + 1 for x in sql.split("\n")[: line - 1]) + col - 1
    assert sql[offset:].startswith(at), (sql[offset : offset + 20], at)
    assert str(err).startswith(f"f.sql:{line}:{col}: ")


@pytest.mark.parametrize(
    ("sql", "interpolated"),
    [
        (STREAM.format(items="twa(v) a, twa(v) b, twa(v * 2) c"), ("v", "v * 2")),
        ("CREATE STREAM s SLIDING(10s) FROM t INTO o AS SELECT _tcurrent_ts, twa(v) a FROM %%trows;", ("v",)),
        ("CREATE STREAM s SESSION(ts, 5s) FROM t INTO o AS SELECT _twstart, twa(v) a FROM %%trows;", ()),
        ("CREATE STREAM s COUNT_WINDOW(3) FROM t INTO o AS SELECT _twstart, twa(v) a FROM %%trows;", ()),
        ("CREATE STREAM s PERIOD(10s) INTO o AS SELECT _tlocaltime, twa(v) a FROM t;", ()),
        (
            "CREATE STREAM s INTERVAL(10s) SLIDING(10s) FROM t INTO o AS SELECT _twstart, twa(v) a FROM t2 "
            "WHERE ts >= _twstart AND ts < _twend;",
            (),
        ),
    ],
)
def test_twa_is_interpolated_at_the_bounds_of_time_windows_over_trows(sql, interpolated):
    (stream,) = parse_text(sql, file="f.sql")
    assert stream.interpolated == interpolated
    twa = stream.select[1].expression
    assert ("__cq_twa_" in twa) == bool(interpolated)


def test_accepted_forms_resolve():
    for template, items in [
        (STREAM, "count(*) n, count(distinct v) d, twa(v) tw, spread(v) + 1 s, last(v) * 2 l"),
        (STREAM, "percentile_approx(v, 0.5) p, median(v) m, approx_count_distinct(v) h, mode(v) md"),
        (STREAM, "timetruncate(_twstart, 1d) t, to_iso8601(_twstart) i, _twstart + 10a e, count(*) n"),
        (CQ, "max_value(v), first_value(v), count(v), percentile(v, 0.5)"),
        (RULE, "ID, avg(temperature) AS a, window_start() AS ws"),
    ]:
        statements = parse_text(template.format(items=items), file="f.sql")
        assert statements


def test_anonymous_spark_aggregates_make_a_query_aggregated():
    (s,) = parse_text(STREAM.format(items="percentile(v, 50) p, median(v) m"), file="f.sql")
    assert [i.is_aggregate for i in s.select] == [False, True, True]


def test_a_foreign_exception_becomes_one_line_naming_the_definition_and_its_file():
    where = SourceLocation("sql/a.sql", 3, 1)
    with pytest.raises(RunError) as info, reported("s", where):
        raise ValueError("[UNRESOLVED_ROUTINE] Cannot resolve routine `X`\nJVM stacktrace:\n\tat ...")
    assert str(info.value) == "s (sql/a.sql:3:1): ValueError: [UNRESOLVED_ROUTINE] Cannot resolve routine `X`"
    assert isinstance(info.value.__cause__, ValueError)  # the trace stays for the run log
    with pytest.raises(CQError, match=r"^own$"), reported("s", where):  # the engine's own pass as they are
        raise CQError("own")


def test_the_static_list_is_the_running_sparks(spark):
    names = {r[0] for r in spark.sql("SHOW FUNCTIONS").collect() if r[0].replace("_", "a").isalnum()}
    assert names == SPARK_FUNCTIONS
    aggregates = set()
    for f in spark.catalog.listFunctions():
        cls = f.className or ""
        if f.name in names and (".aggregate." in cls or "Aggregate" in cls) and "ArrayAggregate" not in cls:
            aggregates.add(f.name)
    assert aggregates == SPARK_AGGREGATES


def test_the_cli_prints_one_line_for_any_exception(monkeypatch, capsys):
    from cq_engine.cli import main as cli

    def broken(args, settings):
        raise RuntimeError("boom\n\tat org.apache.spark.Something")

    monkeypatch.setattr(cli, "_validate", broken)
    monkeypatch.delenv("CQ_DEBUG", raising=False)
    assert cli.main(["validate"]) == 1
    assert capsys.readouterr().err == "cq: error: internal error: RuntimeError: boom\n"
    monkeypatch.setenv("CQ_DEBUG", "1")  # the trace, after the line
    assert cli.main(["validate"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("cq: error: internal error: RuntimeError: boom\nTraceback (most recent call last):")


def test_calendar_functions_use_cq_timezone():
    from zoneinfo import ZoneInfo

    from cq_engine.parse.options import ParseOptions

    items = "today() t, timetruncate(_twstart, 1d) d, timetruncate(_twstart, 1d, 0) u, to_iso8601(_twstart) i"
    (s,) = parse_text(STREAM.format(items=items), options=ParseOptions(tz=ZoneInfo("Asia/Shanghai")))
    today, day, utc_day, iso = (i.expression for i in s.select[1:])
    assert "'Asia/Shanghai'" in today and "'Asia/Shanghai'" in day and "'Asia/Shanghai'" in iso
    assert "Asia/Shanghai" not in utc_day  # use_current_timezone 0: the UTC day
