"""CREATE STREAM (seed 000, seed 002): both forms, every trigger, option, placeholder rule and rejection."""

from datetime import UTC, datetime, timedelta

import pytest

from cq_engine.catalog import load_catalog, referenced_columns
from cq_engine.errors import ParseError
from cq_engine.model import (
    CountTrigger,
    EventTrigger,
    Notify,
    OrderKey,
    PeriodTrigger,
    SelectItem,
    SessionTrigger,
    SlidingTrigger,
    StateTrigger,
    Stream,
    StreamOptions,
    SubWindows,
    TagDecl,
    joined_column,
)
from cq_engine.parse import parse_text

S, M, MS = timedelta(seconds=1), timedelta(minutes=1), timedelta(milliseconds=1)


def stream(sql: str) -> Stream:
    (stmt,) = parse_text(sql, file="t.sql")
    assert isinstance(stmt, Stream)
    return stmt


def error(sql: str) -> str:
    with pytest.raises(ParseError) as info:
        parse_text(sql, file="t.sql")
    return str(info.value)


def at(sql: str, needle: str, nth: int = 1) -> str:
    """``line:col`` of the nth occurrence of ``needle`` in ``sql``."""
    offset = -1
    for _ in range(nth):
        offset = sql.index(needle, offset + 1)
    line = sql.count("\n", 0, offset) + 1
    return f"{line}:{offset - (sql.rfind(chr(10), 0, offset) + 1) + 1}"


def names(s: Stream) -> list[str]:
    return [i.name for i in s.select]


# --- seed examples ------------------------------------------------------------------------------------


def test_seed_avg_vol_s_old_form_interval_sliding():
    s = stream(
        "CREATE STREAM avg_vol_s INTO avg_vol AS\n"
        "SELECT _wstart, count(*), avg(voltage) FROM power.meters PARTITION BY tbname INTERVAL(1m) SLIDING(30s);"
    )
    assert (s.name, s.form, s.trigger_table, s.source, s.sink) == ("avg_vol_s", "old", "meters", "meters", "avg_vol")
    assert s.trigger == SlidingTrigger(sliding=30 * S, interval=M)
    assert s.partition_by == ("tbname",) and s.key_bound == "start"
    assert s.select == (
        SelectItem("__cq_twstart", "_wstart", False),
        SelectItem("COUNT(*)", "count", True),
        SelectItem("AVG(voltage)", "avg_voltage", True),
    )
    assert s.time_column == "_wstart"
    # Old-form defaults: WINDOW_CLOSE, IGNORE EXPIRED 1, IGNORE UPDATE 1 (seed 000), FILL_HISTORY 0.
    assert s.options == StreamOptions(ignore_disorder=True)
    assert s.sql.startswith("CREATE STREAM avg_vol_s INTO avg_vol AS SELECT _wstart")
    assert (s.location.line, s.location.col) == (1, 1)


def test_seed_streams0_event_window():
    s = stream(
        "CREATE STREAM streams0 INTO streamt0 AS\nSELECT _wstart, count(*), avg(voltage) from meters "
        "PARTITION BY tbname EVENT_WINDOW START WITH voltage < 0 END WITH voltage > 9;"
    )
    assert s.trigger == EventTrigger(start="voltage < 0", end="voltage > 9")


def test_seed_streams1_count_window_with_old_options():
    s = stream(
        "CREATE STREAM streams1 IGNORE EXPIRED 1 WATERMARK 100s INTO streamt1 AS\n"
        "SELECT _wstart, count(*), avg(voltage) from meters PARTITION BY tbname COUNT_WINDOW(10);"
    )
    assert s.trigger == CountTrigger(count=10, slide=10)
    assert s.options.watermark == 100 * S and s.options.ignore_disorder


DESIGN_EXAMPLE = """CREATE STREAM IF NOT EXISTS s_avg INTERVAL(1m) SLIDING(30s) FROM meters PARTITION BY tbname
  OPTIONS(WATERMARK(10s) | FILL_HISTORY | MAX_DELAY(1m))
  NOTIFY('ws://localhost:8080/notify') ON (WINDOW_CLOSE)
  INTO avg_vol OUTPUT_SUBTABLE(CONCAT('avg_', tbname)) TAGS (loc VARCHAR(64) AS location)
  AS SELECT _twstart, avg(voltage) FROM %%trows;"""


def test_design_example_parses_completely():
    s = stream(DESIGN_EXAMPLE)
    assert (
        s.if_not_exists and s.form == "new" and (s.trigger_table, s.source, s.sink) == ("meters", "meters", "avg_vol")
    )
    assert (s.reads, s.partition_by, s.partition_exprs) == ("trows", ("tbname",), ())
    assert s.options == StreamOptions(watermark=10 * S, fill_history=True, max_delay=M, trigger_mode="max_delay")
    assert s.notify == Notify(urls=("ws://localhost:8080/notify",), events=("WINDOW_CLOSE",))
    assert s.output_subtable == "CONCAT('avg_', tbname)"
    assert s.tags == (TagDecl(name="loc", type="string", expression="location"),)
    assert names(s) == ["_twstart", "avg_voltage"]


SEED_NOTIFY = """CREATE STREAM avg_current_stream FILL_HISTORY 1
    AS SELECT _wstart, _wend, AVG(current) FROM meters
    INTERVAL (1m)
    NOTIFY ('ws://localhost:8080/notify', 'wss://192.168.1.1:8080/notify?key=foo')
    ON ('WINDOW_OPEN', 'WINDOW_CLOSE')
    NOTIFY_HISTORY 0
    ON_FAILURE PAUSE"""


def test_seed_notification_only_old_form_has_no_sink():
    s = stream(SEED_NOTIFY)
    assert (s.sink, s.trigger_table, s.source, s.reads, s.form) == (None, "meters", "meters", "trows", "old")
    assert s.options.fill_history and names(s) == ["_wstart", "_wend", "avg_current"]
    assert s.notify == Notify(
        urls=("ws://localhost:8080/notify", "wss://192.168.1.1:8080/notify?key=foo"),
        events=("WINDOW_OPEN", "WINDOW_CLOSE"),
        history=False,
        on_failure="pause",
    )


def test_new_form_without_into_notifies_its_results():
    s = stream(
        "CREATE STREAM s STATE_WINDOW(st) FROM t OPTIONS(CALC_NOTIFY_ONLY) "
        'NOTIFY("ws://h:8080") ON (WINDOW_OPEN|WINDOW_CLOSE) AS SELECT _twstart, count(*) AS c FROM %%trows'
    )
    assert (s.sink, s.source, s.reads) == (None, "t", "trows")
    assert s.options == StreamOptions(calc_notify_only=True)
    assert s.notify == Notify(urls=("ws://h:8080",), events=("WINDOW_OPEN", "WINDOW_CLOSE"))
    assert s.select == (SelectItem("__cq_twstart", "_twstart", False), SelectItem("COUNT(*)", "c", True))


def test_new_form_notify_without_query_sends_trigger_events_only():
    s = stream("CREATE STREAM s SESSION(ts, 1s) FROM t NOTIFY('ws://h:1') ON (WINDOW_OPEN)")
    assert (s.sink, s.select, s.source, s.trigger_table) == (None, (), None, "t")
    assert s.notify == Notify(urls=("ws://h:1",), events=("WINDOW_OPEN",))


def test_calc_notify_only_with_into_keeps_the_sink():
    s = stream(
        "CREATE STREAM s SESSION(ts, 1s) FROM t OPTIONS(CALC_NOTIFY_ONLY) NOTIFY('ws://h:1') ON (WINDOW_CLOSE) "
        "INTO o AS SELECT _twstart, count(*) AS c FROM %%trows"
    )
    assert (s.sink, s.options.calc_notify_only, s.notify.events) == ("o", True, ("WINDOW_CLOSE",))


def test_force_output_and_delete_output_table_options():
    s = stream(
        "CREATE STREAM s SESSION(ts, 1s) FROM meters PARTITION BY tbname "
        "OPTIONS(FORCE_OUTPUT | LOW_LATENCY_CALC | DELETE_OUTPUT_TABLE) INTO o AS SELECT _twstart, count(*) AS c "
        "FROM %%trows"
    )
    assert s.options == StreamOptions(force_output=True, low_latency_calc=True, delete_output_table=True)
    assert (s.partition_by, s.sink) == (("tbname",), "o")


def test_new_form_output_subtable_and_tags_use_partition_placeholders():
    s = stream(
        "CREATE STREAM s INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname, location INTO o "
        "OUTPUT_SUBTABLE(CONCAT('out_', %%tbname, '_', %%2)) "
        "TAGS (loc VARCHAR(64) COMMENT 'where' AS %%2, src VARCHAR(192) AS upper(%%1), g INT AS groupid) "
        "AS SELECT _twstart, avg(voltage) AS v FROM %%trows"
    )
    assert s.output_subtable == "CONCAT('out_', __cq_p1, '_', __cq_p2)"
    assert s.tags == (
        TagDecl("loc", "string", expression="__cq_p2", comment="where"),
        TagDecl("src", "string", expression="UPPER(__cq_p1)"),
        TagDecl("g", "int", expression="groupid"),
    )


def test_old_form_subtable_with_partition_alias_seed_002():
    s = stream(
        "CREATE STREAM avg_vol_s INTO avg_vol SUBTABLE(CONCAT('new-', tname)) AS SELECT _wstart, count(*), "
        "avg(voltage) FROM meters PARTITION BY tbname tname INTERVAL(1m);"
    )
    assert (s.partition_by, s.partition_exprs, s.reads) == (("tname",), (("tname", "tbname"),), "trows")
    assert s.output_subtable == "CONCAT('new-', tname)" and s.tags == ()
    assert names(s) == ["_wstart", "count", "avg_voltage"]


def test_old_form_tags_take_the_partition_expression_seed_000():
    s = stream(
        "CREATE STREAM streams2 trigger at_once INTO st1 TAGS(cc varchar(100)) as select _wstart, count(*) c1 "
        'from st partition by concat("tag-", tbname) as cc interval(10s);'
    )
    assert (s.partition_by, s.partition_exprs) == (("cc",), (("cc", "CONCAT('tag-', tbname)"),))
    assert s.tags == (TagDecl("cc", "string", expression="cc"),)
    assert s.options.trigger_mode == "at_once" and names(s) == ["_wstart", "c1"]


def test_old_form_partition_items_and_tag_matching():
    base = (
        "CREATE STREAM s INTO o {tags} AS SELECT _wstart, count(*) AS c FROM meters "
        "PARTITION BY tbname, location, groupid % 2 AS parity INTERVAL(1m)"
    )
    s = stream(base.format(tags=""))
    assert s.partition_by == ("tbname", "location", "parity")
    assert s.partition_exprs == (("parity", "groupid % 2"),)
    # every tag named after an item: matched by name, in the tags' order
    s = stream(base.format(tags="TAGS (PARITY INT, Location VARCHAR(64))"))
    assert s.tags == (
        TagDecl("PARITY", "int", expression="parity"),
        TagDecl("Location", "string", expression="location"),
    )
    # otherwise by position when the counts match
    s = stream(base.format(tags="TAGS (a VARCHAR(192), b VARCHAR(64) COMMENT 'x', c INT)"))
    assert s.tags == (
        TagDecl("a", "string", expression="tbname"),
        TagDecl("b", "string", expression="location", comment="x"),
        TagDecl("c", "int", expression="parity"),
    )


def test_old_form_column_list_tags_and_subtable_together():
    s = stream(
        "CREATE STREAM s INTO o (ts, c) TAGS (cc VARCHAR(100) COMMENT 'x', g INT) SUBTABLE(CONCAT('a', tname)) "
        "AS SELECT _wstart, count(*) FROM meters PARTITION BY tbname tname, groupid INTERVAL(1m)"
    )
    assert s.sink_columns == ("ts", "c") and names(s) == ["ts", "c"]
    assert s.tags == (
        TagDecl("cc", "string", expression="tname", comment="x"),
        TagDecl("g", "int", expression="groupid"),
    )
    assert s.output_subtable == "CONCAT('a', tname)"
    assert (s.partition_by, s.partition_exprs) == (("tname", "groupid"), (("tname", "tbname"),))


def test_window_trigger_reads_another_table():
    s = stream(
        "CREATE STREAM s INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname, location INTO o AS "
        "SELECT _twstart, avg(current) AS a, %%2, %%tbname FROM db.other "
        "WHERE ts >= _twstart AND ts < _twend AND tbname = %%tbname"
    )
    assert (s.reads, s.source, s.trigger_table) == ("table", "other", "meters")
    assert s.where == "ts >= __cq_twstart AND ts < __cq_twend AND tbname = __cq_p1"
    assert [(i.name, i.expression) for i in s.select] == [
        ("_twstart", "__cq_twstart"),
        ("a", "AVG(current)"),
        ("location", "__cq_p2"),
        ("tbname", "__cq_p1"),
    ]


def test_from_tbname_reads_each_groups_own_table():
    s = stream(
        "CREATE STREAM s COUNT_WINDOW(5) FROM meters PARTITION BY location, TBNAME INTO o AS "
        "SELECT _twstart, count(*) AS c FROM %%tbname WHERE ts >= _twstart"
    )
    assert (s.reads, s.source, s.trigger_table, s.partition_by) == (
        "tbname",
        "meters",
        "meters",
        ("location", "TBNAME"),
    )
    assert s.where == "ts >= __cq_twstart"


@pytest.mark.parametrize(
    "query,reads,source",
    [("FROM %%trows", "trows", "t"), ("FROM db.other", "table", "other"), ("FROM %%tbname", "tbname", "t")],
)
def test_period_and_sliding_reads(query, reads, source):
    for trigger, first in (("PERIOD(1h) FROM t", "_tlocaltime"), ("SLIDING(1h) FROM t", "_tprev_ts")):
        s = stream(f"CREATE STREAM s {trigger} PARTITION BY tbname INTO o AS SELECT {first}, count(*) AS c {query}")
        assert (s.reads, s.source, s.trigger_table) == (reads, source, "t"), trigger


def test_notify_on_is_optional_for_sliding_and_period_only():
    for trigger, first in (("PERIOD(1m) FROM t", "_tlocaltime"), ("SLIDING(1m) FROM t", "_tprev_ts")):
        s = stream(f"CREATE STREAM s {trigger} NOTIFY('ws://h:1') AS SELECT {first}, count(*) AS c FROM %%trows")
        assert s.notify == Notify(urls=("ws://h:1",), events=("WINDOW_CLOSE",)) and s.sink is None, trigger
    s = stream("CREATE STREAM s PERIOD(1m) NOTIFY('ws://h:1') ON (WINDOW_OPEN)")
    assert s.notify.events == ("WINDOW_OPEN",)
    sql = "CREATE STREAM s COUNT_WINDOW(5) FROM t NOTIFY('ws://h:1') AS SELECT _twstart, count(*) AS c FROM %%trows"
    assert error(sql) == (
        f"t.sql:{at(sql, 'NOTIFY')}: NOTIFY needs ON (WINDOW_OPEN|WINDOW_CLOSE) with the COUNT_WINDOW trigger"
    )


def test_double_quoted_text_is_a_string_in_stream_expressions():
    s = stream(
        'CREATE STREAM s SESSION(ts, 1s) FROM t OPTIONS(PRE_FILTER(loc <> "x")) INTO o AS '
        'SELECT _twstart, concat("a", v) AS c FROM %%trows WHERE loc = "b"'
    )
    assert (s.options.pre_filter, s.select[1].expression, s.where) == ("loc <> 'x'", "CONCAT('a', v)", "loc = 'b'")


# --- new-form triggers ------------------------------------------------------------------------------


def test_new_form_every_trigger():
    base = "INTO o AS SELECT {first}, count(*) AS c FROM %%trows"
    cases = [
        (
            "PERIOD(5h30m, 1s) FROM t",
            "_tlocaltime",
            PeriodTrigger(period=timedelta(hours=5, minutes=30), offset=S),
            "tick",
        ),
        (
            "INTERVAL(1m, 10s) SLIDING(30s, 5s) FROM t",
            "_twend",
            SlidingTrigger(sliding=30 * S, interval=M, interval_offset=10 * S),
            "end",
        ),
        (
            "SLIDING(1h, 10a) FROM t",
            "_tprev_ts",
            SlidingTrigger(sliding=timedelta(hours=1), sliding_offset=10 * MS),
            "start",
        ),
        ("SLIDING(1h) FROM t", "_tcurrent_ts", SlidingTrigger(sliding=timedelta(hours=1)), "end"),
        ("SESSION(ts, 10s) FROM t", "_twstart", SessionTrigger(gap=10 * S, ts_column="ts"), "start"),
        (
            "STATE_WINDOW(status) TRUE_FOR(5s) FROM t",
            "_twstart",
            StateTrigger(column="status", true_for=5 * S),
            "start",
        ),
        (
            "EVENT_WINDOW(START WITH v < 0 END WITH CASE WHEN v > 9 THEN 1 END = 1) TRUE_FOR(1m) FROM t",
            "_twstart",
            EventTrigger(start="v < 0", end="CASE WHEN v > 9 THEN 1 END = 1", true_for=M),
            "start",
        ),
        ("COUNT_WINDOW(10) FROM t", "_twstart", CountTrigger(count=10, slide=10), "start"),
        ("COUNT_WINDOW(10, 2, a, b) FROM t", "_twstart", CountTrigger(count=10, slide=2, columns=("a", "b")), "start"),
        ("COUNT_WINDOW(10, a) FROM t", "_twstart", CountTrigger(count=10, slide=10, columns=("a",)), "start"),
    ]
    for trigger, first, expected, bound in cases:
        s = stream(f"CREATE STREAM db.s {trigger} " + base.format(first=first))
        assert (s.name, s.trigger, s.key_bound, s.trigger_table, s.source) == ("s", expected, bound, "t", "t"), trigger


def test_period_reads_a_table_or_trows():
    s = stream(
        "CREATE STREAM p PERIOD(1d) INTO db.o AS SELECT _tlocaltime, _tprev_localtime, _tnext_localtime, "
        "count(*) AS c FROM db.other WHERE v > 1"
    )
    assert (s.trigger_table, s.source, s.sink, s.where) == (None, "other", "o", "v > 1")
    assert [i.expression for i in s.select][:3] == ["__cq_tlocaltime", "__cq_tprev_localtime", "__cq_tnext_localtime"]


def test_sliding_offset_has_no_effect_with_interval():
    assert stream(
        "CREATE STREAM s INTERVAL(1m) SLIDING(1m, 5s) FROM t INTO o AS SELECT _twstart, 1 AS x FROM %%trows"
    ).trigger.sliding_offset == timedelta(0)


# --- old-form windows and options --------------------------------------------------------------------

OLD = "CREATE STREAM s {opts} INTO o AS SELECT {first}, count(*) AS c FROM meters PARTITION BY tbname {window}"


@pytest.mark.parametrize(
    "window,first,expected,bound",
    [
        ("INTERVAL(1m)", "_wstart", SlidingTrigger(sliding=M, interval=M), "start"),
        (
            "INTERVAL(1m, 10s) SLIDING(30s)",
            "_wend",
            SlidingTrigger(sliding=30 * S, interval=M, interval_offset=10 * S),
            "end",
        ),
        ("SESSION(ts, 10s)", "_wstart", SessionTrigger(gap=10 * S, ts_column="ts"), "start"),
        ("STATE_WINDOW(status)", "_wstart", StateTrigger(column="status"), "start"),
        ("EVENT_WINDOW START WITH v < 0 END WITH v > 9", "_wstart", EventTrigger(start="v < 0", end="v > 9"), "start"),
        ("COUNT_WINDOW(10, 5)", "_wstart", CountTrigger(count=10, slide=5), "start"),
    ],
)
def test_old_form_every_window(window, first, expected, bound):
    s = stream(OLD.format(opts="", first=first, window=window))
    assert (s.trigger, s.key_bound, s.form) == (expected, bound, "old")


@pytest.mark.parametrize(
    "opts,expected",
    [
        ("", StreamOptions(ignore_disorder=True)),
        ("TRIGGER AT_ONCE", StreamOptions(ignore_disorder=True, trigger_mode="at_once")),
        ("TRIGGER MAX_DELAY 5s", StreamOptions(ignore_disorder=True, trigger_mode="max_delay", max_delay=5 * S)),
        ("TRIGGER FORCE_WINDOW_CLOSE", StreamOptions(ignore_disorder=True, trigger_mode="force_window_close")),
        (
            "TRIGGER CONTINUOUS_WINDOW_CLOSE",
            StreamOptions(ignore_disorder=True, trigger_mode="continuous_window_close", recalc_every=60 * M),
        ),
        (
            "TRIGGER CONTINUOUS_WINDOW_CLOSE 10m",
            StreamOptions(ignore_disorder=True, trigger_mode="continuous_window_close", recalc_every=10 * M),
        ),
        (
            "FILL_HISTORY 1 ASYNC IGNORE UPDATE 0 IGNORE EXPIRED 0 DELETE_MARK 1d WATERMARK 10s TRIGGER WINDOW_CLOSE",
            StreamOptions(
                fill_history=True,
                delete_recalc=True,
                ignore_disorder=False,
                delete_mark=timedelta(days=1),
                watermark=10 * S,
            ),
        ),
    ],
)
def test_old_form_options(opts, expected):
    assert stream(OLD.format(opts=opts, first="_wstart", window="INTERVAL(1m)")).options == expected


def test_old_form_notify_defaults_and_options():
    base = "CREATE STREAM s INTO o AS SELECT _wstart, count(*) AS c FROM t INTERVAL(1m) NOTIFY ('ws://h:1') ON ('WINDOW_OPEN')"
    assert stream(base).notify == Notify(urls=("ws://h:1",), events=("WINDOW_OPEN",), on_failure="pause")
    assert stream(base + " ON_FAILURE DROP NOTIFY_HISTORY 1").notify == Notify(
        urls=("ws://h:1",), events=("WINDOW_OPEN",), history=True, on_failure="drop"
    )


# --- new-form options ----------------------------------------------------------------------------------

NEW = "CREATE STREAM s {trigger} FROM meters PARTITION BY tbname OPTIONS({opts}) INTO o AS SELECT {first}, 1 AS x FROM %%trows"


def test_every_new_form_option():
    s = stream(
        NEW.format(
            trigger="SESSION(ts, 1s)",
            first="_twstart",
            opts=(
                "WATERMARK(10s) | EXPIRED_TIME(1a) | IGNORE_DISORDER | DELETE_RECALC | FILL_HISTORY_FIRST('2024-01-01 08:00:00+08:00')"
                " | LOW_LATENCY_CALC | PRE_FILTER(voltage > 0 AND tbname <> 'x') | MAX_DELAY(1m) | EVENT_TYPE(WINDOW_OPEN|WINDOW_CLOSE)"
            ),
        )
    )
    assert s.options == StreamOptions(
        watermark=10 * S,
        expired_time=MS,
        ignore_disorder=True,
        delete_recalc=True,
        fill_history_first=True,
        history_start=datetime(2024, 1, 1, tzinfo=UTC),
        low_latency_calc=True,
        pre_filter="voltage > 0 AND tbname <> 'x'",
        max_delay=M,
        trigger_mode="max_delay",
        event_types=("WINDOW_OPEN", "WINDOW_CLOSE"),
    )
    assert stream(
        NEW.format(trigger="SESSION(ts, 1s)", first="_twstart", opts="FILL_HISTORY(1704067200000)")
    ).options.history_start == datetime(2024, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("trigger,first", [("SLIDING(1m)", "_tprev_ts"), ("PERIOD(1m)", "_tlocaltime")])
def test_max_delay_and_event_type_are_ignored_for_sliding_and_period(trigger, first):
    s = stream(NEW.format(trigger=trigger, first=first, opts="MAX_DELAY(1m) | EVENT_TYPE(WINDOW_OPEN)"))
    assert (s.options.max_delay, s.options.event_types, s.options.trigger_mode) == (
        None,
        ("WINDOW_CLOSE",),
        "window_close",
    )


def test_new_form_notify_with_where_and_options():
    s = stream(
        "CREATE STREAM s INTERVAL(1m) SLIDING(1m) FROM t NOTIFY('ws://h:1', \"wss://g:2/n?k=v\") "
        "ON (WINDOW_CLOSE) WHERE avg_v > 10 AND c = 1 NOTIFY_OPTIONS(NOTIFY_HISTORY | ON_FAILURE_PAUSE) "
        "INTO o AS SELECT _twstart, avg(v) AS avg_v, count(*) AS c FROM %%trows"
    )
    assert s.notify == Notify(
        urls=("ws://h:1", "wss://g:2/n?k=v"),
        events=("WINDOW_CLOSE",),
        where="avg_v > 10 AND c = 1",
        history=True,
        on_failure="pause",
    )
    s = stream("CREATE STREAM s PERIOD(1m) NOTIFY('ws://h:1')")  # no ON needed, no query: notifications only
    assert s.notify == Notify(urls=("ws://h:1",), events=("WINDOW_CLOSE",)) and s.select == () and s.sink is None
    assert (s.trigger_table, s.source) == (None, None)


# --- placeholders and result columns -----------------------------------------------------------------


def test_placeholders_map_to_engine_columns():
    s = stream(
        "CREATE STREAM s SESSION(ts, 1s) FROM t PARTITION BY tbname, loc INTO o AS SELECT _twstart, "
        "_twend, _twduration, _twrownum, _tgrpid, _tlocaltime, %%1, %%2 AS l, %%tbname AS tb, "
        "concat(%%tbname, '-', %%2) FROM %%trows WHERE %%2 = 'x' AND _twrownum > 1"
    )
    assert [(i.name, i.expression) for i in s.select] == [
        ("_twstart", "__cq_twstart"),
        ("_twend", "__cq_twend"),
        ("_twduration", "__cq_twduration"),
        ("_twrownum", "__cq_twrownum"),
        ("_tgrpid", "__cq_tgrpid"),
        ("_tlocaltime", "__cq_tlocaltime"),
        ("tbname", "__cq_p1"),
        ("l", "__cq_p2"),
        ("tb", "__cq_p1"),
        ("concat_tbname_2", "CONCAT(__cq_p1, '-', __cq_p2)"),
    ]
    assert s.where == "__cq_p2 = 'x' AND __cq_twrownum > 1"
    s = stream(
        "CREATE STREAM s SESSION(ts, 1s) FROM t PARTITION BY loc, tbname INTO o AS SELECT _twstart, "
        "%%2, %%1, %%tbname AS t2 FROM %%trows"
    )
    assert [(i.name, i.expression) for i in s.select][1:] == [
        ("tbname", "__cq_p2"),
        ("loc", "__cq_p1"),
        ("t2", "__cq_p2"),
    ]
    old = stream("CREATE STREAM s INTO o AS SELECT _wstart, _wend, _wduration FROM t INTERVAL(1m)")
    assert [i.expression for i in old.select] == ["__cq_twstart", "__cq_twend", "__cq_twduration"]


def test_result_column_names():
    s = stream(
        "CREATE STREAM s SESSION(ts, 1s) FROM t INTO o AS SELECT _twstart AS ts, count(*), avg(voltage), "
        "Max(a) - MIN(a), avg(v) AS named FROM %%trows"
    )
    assert names(s) == ["ts", "count", "avg_voltage", "max_a_min_a", "named"]
    assert [i.is_aggregate for i in s.select] == [False, True, True, True, True]
    assert s.time_column == "ts"
    s = stream("CREATE STREAM s SESSION(ts, 1s) FROM t INTO o AS SELECT _twstart, voltage, (a + b) * 2 FROM %%trows")
    assert names(s) == ["_twstart", "voltage", "_a_b_2"]
    assert [i.is_aggregate for i in s.select] == [False, False, False]
    s = stream("CREATE STREAM s SESSION(ts, 1s) FROM t INTO o (w, n) AS SELECT _twstart, count(*) FROM %%trows")
    assert (names(s), s.sink_columns) == (["w", "n"], ("w", "n"))


# --- rejections --------------------------------------------------------------------------------------

W = "CREATE STREAM s SESSION(ts, 1s) FROM t INTO o AS SELECT _twstart, {items} FROM %%trows"

REJECTIONS = [
    # (sql, the text the error points at, message fragment)
    ("CREATE STREAM s PERIOD(5a) INTO o AS SELECT _tlocaltime, 1 AS x FROM t", "5a", "between 10a and 3650d"),
    ("CREATE STREAM s PERIOD(3651d) INTO o AS SELECT _tlocaltime, 1 AS x FROM t", "3651d", "between 10a and 3650d"),
    ("CREATE STREAM s PERIOD(1h, 1d) INTO o AS SELECT _tlocaltime, 1 AS x FROM t", "1d", "unknown unit 'd'"),
    (
        "CREATE STREAM s INTERVAL(1m) SLIDING(2m) FROM t INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "2m",
        "SLIDING must not be greater than INTERVAL",
    ),
    (
        "CREATE STREAM s INTERVAL(1m, 1m) SLIDING(1m) FROM t INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "1m)",
        "offset must be smaller",
    ),
    ("CREATE STREAM s INTERVAL(1m) FROM t INTO o AS SELECT _twstart, 1 AS x FROM %%trows", "FROM", "expected SLIDING"),
    (
        "CREATE STREAM s SLIDING(1m, 1d) FROM t INTO o AS SELECT _tprev_ts, 1 AS x FROM %%trows",
        "1d",
        "unknown unit 'd'",
    ),
    ("CREATE STREAM s SESSION(ts, 0s) FROM t INTO o AS SELECT _twstart, 1 AS x FROM %%trows", "0s", "greater than 0"),
    (
        "CREATE STREAM s SESSION(ts) FROM t INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "SESSION",
        "SESSION(ts_column, gap)",
    ),
    (
        "CREATE STREAM s COUNT_WINDOW(1) FROM t INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "1)",
        "between 2 and 2147483647",
    ),
    (
        "CREATE STREAM s COUNT_WINDOW(2147483648) FROM t INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "2147483648",
        "between 2",
    ),
    (
        "CREATE STREAM s COUNT_WINDOW(10, 11) FROM t INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "11",
        "between 1 and 10",
    ),
    (
        "CREATE STREAM s EVENT_WINDOW(START WITH v < 0) FROM t INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "EVENT_WINDOW",
        "END WITH is missing",
    ),
    (
        "CREATE STREAM s STATE_WINDOW(count(v)) FROM t INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "count",
        "aggregates",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "SESSION",
        "needs a trigger table",
    ),
    # options
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t OPTIONS(WATERMARK(1s) | WATERMARK(2s)) INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "WATERMARK(2s)",
        "WATERMARK given twice",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t OPTIONS(FILL_HISTORY | FILL_HISTORY_FIRST) INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "FILL_HISTORY_FIRST",
        "cannot be used with FILL_HISTORY",
    ),
    (
        "CREATE STREAM s PERIOD(1h) OPTIONS(FILL_HISTORY_FIRST) INTO o AS SELECT _tlocaltime, 1 AS x FROM t",
        "FILL_HISTORY_FIRST",
        "PERIOD",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t OPTIONS(EXPIRED_TIME(0a)) INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "0a",
        "greater than 0",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t OPTIONS(BOGUS) INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "BOGUS",
        "unknown stream option 'BOGUS'",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t OPTIONS(IGNORE_DISORDER(1)) INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "(1)",
        "takes no argument",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t OPTIONS(WATERMARK) INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "WATERMARK",
        "needs an argument",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t OPTIONS(FILL_HISTORY('yesterday')) INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "'yesterday'",
        "not a time",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t OPTIONS(EVENT_TYPE(WINDOW_OPEN|WINDOW_OPEN)) INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "WINDOW_OPEN)",
        "given twice",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t OPTIONS(PRE_FILTER(max(v) > 1)) INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "max(v)",
        "aggregates",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t OPTIONS(DELETE_OUTPUT_TABLE) INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "DELETE_OUTPUT_TABLE",
        "needs PARTITION BY tbname",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t OPTIONS(CALC_NOTIFY_ONLY) INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "CALC_NOTIFY_ONLY",
        "needs NOTIFY",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t INTO o OPTIONS(WATERMARK(1s)) AS SELECT _twstart, 1 AS x FROM %%trows",
        "OPTIONS",
        "OPTIONS must come before INTO",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t INTO o FOO AS SELECT _twstart, 1 AS x FROM %%trows",
        "FOO",
        "expected OUTPUT_SUBTABLE",
    ),
    # NOTIFY
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t NOTIFY('ws://h:1') INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "NOTIFY",
        "NOTIFY needs ON",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t NOTIFY('http://h:1') ON (WINDOW_OPEN) INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "'http",
        "websocket URL",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t NOTIFY('ws://h') ON (WINDOW_OPEN) INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "'ws://h'",
        "host and port",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t NOTIFY('ws://h:1') ON (WINDOW_OPEN, WINDOW_CLOSE) INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "WINDOW_OPEN,",
        "separated by '|'",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t NOTIFY('ws://h:1') ON (WINDOW_OPEN) WHERE v > 1 INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "v > 1",
        "result's columns",
    ),
    ("CREATE STREAM s INTO o AS SELECT _wstart, 1 AS x FROM t INTERVAL(1m) NOTIFY ('ws://h:1')", None, "expected ON"),
    # INTO and AS
    ("CREATE STREAM s PERIOD(1m) INTO o", "INTO", "INTO needs AS SELECT"),
    ("CREATE STREAM s PERIOD(1m)", "s PERIOD", "a stream needs INTO table or NOTIFY(...)"),
    (
        "CREATE STREAM db.s SESSION(ts, 1s) FROM t AS SELECT _twstart, 1 AS x FROM %%trows",
        "s SESSION",
        "a stream needs INTO table or NOTIFY(...): without either its results go nowhere",
    ),
    (
        "CREATE STREAM s WATERMARK 1s AS SELECT _wstart, 1 AS x FROM t INTERVAL(1m)",
        "s WATERMARK",
        "a stream needs INTO table or NOTIFY(...)",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t OUTPUT_SUBTABLE(CONCAT('a', x)) AS SELECT _twstart, 1 AS x FROM %%trows",
        "OUTPUT_SUBTABLE",
        "OUTPUT_SUBTABLE needs INTO table",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t TAGS (a INT AS 1) AS SELECT _twstart, 1 AS x FROM %%trows",
        "TAGS",
        "needs INTO",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t INTO o (a, b PRIMARY KEY) AS SELECT _twstart, 1 AS x FROM %%trows",
        "PRIMARY KEY",
        "composite key",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t INTO o (a, a) AS SELECT _twstart, 1 AS x FROM %%trows",
        "a)",
        "listed twice",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t INTO o (a, b) AS SELECT _twstart, 1, 2 FROM %%trows",
        "(a, b)",
        "the column list names 2 columns but SELECT has 3",
    ),
    # the subquery
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t INTO o AS SELECT _twstart, 1 AS x FROM %%tbname",
        "%%tbname",
        "FROM %%tbname (each group's own table) needs PARTITION BY tbname",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t PARTITION BY loc INTO o AS SELECT _twstart, 1 AS x FROM %%tbname",
        "%%tbname",
        "FROM %%tbname (each group's own table) needs PARTITION BY tbname",
    ),
    (
        "CREATE STREAM s PERIOD(1m) PARTITION BY tbname INTO o AS SELECT _tlocaltime, 1 AS x FROM %%tbname",
        "%%tbname",
        "FROM %%tbname needs a trigger table",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t INTO o AS SELECT count(*), _twstart FROM other",
        "count(*),",
        "the first column of a stream's result is the sink's time column",
    ),
    (
        "CREATE STREAM s PERIOD(1m) INTO o AS SELECT _tlocaltime, 1 AS x FROM %%trows",
        "%%trows",
        "needs a trigger table",
    ),
    (W.format(items="x FROM %%trows INTERVAL(1m) --"), "INTERVAL", "its SELECT needs an aggregate"),
    (W.format(items="x FROM %%trows FILL(NULL) --"), "FILL", "FILL needs INTERVAL(...) in the query"),
    (W.format(items="x FROM %%trows PARTITION BY a GROUP BY a --"), "GROUP BY", "PARTITION BY or GROUP BY, not both"),
    (W.format(items="x FROM %%trows GROUP BY x + 1 --"), "x + 1", "GROUP BY in a stream's query takes column names"),
    (W.format(items="x FROM %%trows HAVING x > 1 --"), "x > 1", "HAVING needs an aggregated query or GROUP BY"),
    (W.format(items="x FROM %%trows SLIMIT 1 --"), "SLIMIT", "SLIMIT needs GROUP BY or PARTITION BY"),
    (W.format(items="x FROM %%trows LIMIT 1.5 --"), "1.5", "LIMIT takes whole numbers"),
    (W.format(items="x FROM %%trows LIMIT 1 2 --"), "1 2", "LIMIT takes a row count and optionally OFFSET m"),
    (W.format(items="x FROM %%trows ORDER BY 3 LIMIT 1 --"), "3 LIMIT", "ORDER BY 3: the query has 2 result"),
    (
        "CREATE STREAM s INTERVAL(10s) SLIDING(5s) FROM t INTO o AS SELECT ts, v FROM %%trows",
        "ts, v",
        "a row's own timestamp as the sink's time column needs windows that do not overlap",
    ),
    (
        "CREATE STREAM s INTERVAL(10s) SLIDING(10s) FROM t OPTIONS(FORCE_OUTPUT) INTO o AS SELECT ts, v FROM %%trows",
        "ts, v",
        "FORCE_OUTPUT needs a window placeholder as the first column",
    ),
    # the old form's query stays seed 000's SELECT ... FROM ... [WHERE] [PARTITION BY] window
    ("CREATE STREAM s INTO o AS SELECT _wstart, x FROM t GROUP BY x INTERVAL(1m)", "GROUP BY", "the new form takes it"),
    ("CREATE STREAM s INTO o AS SELECT _wstart, x FROM t INTERVAL(1m) ORDER BY x", "ORDER BY", "is not allowed"),
    ("CREATE STREAM s INTO o AS SELECT _wstart, x FROM t INTERVAL(1m) LIMIT 1", "LIMIT", "LIMIT is not supported"),
    ("CREATE STREAM s INTO o AS SELECT _wstart, count(*) c FROM t INTERVAL(1m) HAVING c > 1", "HAVING", "new form"),
    (W.format(items="x FROM %%trows t2 --"), "t2", "takes no alias"),
    (W.format(items="x FROM a JOIN b --"), "JOIN", "FROM takes one table"),
    (W.format(items="x FROM %%trows WHERE count(*) > 1 --"), "count(*) >", "aggregates are not allowed in WHERE"),
    (W.format(items="x FROM %%trows WHERE x IN (SELECT y FROM z) --"), "y FROM z", "subqueries are not supported"),
    (W.format(items="*"), "*", "SELECT * is not supported"),
    (W.format(items="count(v), count(v)"), "count(v) FROM", "two result columns are named 'count_v'"),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t INTO o AS SELECT DISTINCT _twstart, 1 AS x FROM %%trows",
        "DISTINCT",
        "DISTINCT",
    ),
    # the first column
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t INTO o AS SELECT count(*), _twstart FROM %%trows",
        "count(*),",
        "the first column of a stream's result is the sink's time column: it must be the window start (_twstart)",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t INTO o AS SELECT _twend, 1 AS x FROM %%trows",
        "_twend",
        "for INTERVAL windows",
    ),
    ("CREATE STREAM s INTO o AS SELECT _wend, 1 AS x FROM t SESSION(ts, 1s)", "_wend", "window start (_wstart)"),
    ("CREATE STREAM s SLIDING(1m) FROM t INTO o AS SELECT _tnext_ts, 1 AS x FROM %%trows", "_tnext_ts", "_tprev_ts"),
    ("CREATE STREAM s PERIOD(1m) INTO o AS SELECT _tprev_localtime, 1 AS x FROM t", "_tprev_localtime", "_tlocaltime"),
    (
        "CREATE STREAM s INTERVAL(1m) SLIDING(1m) FROM t INTO o AS SELECT _twstart + 1, 1 AS x FROM %%trows",
        "_twstart + 1",
        "first column",
    ),
    # placeholders
    (W.format(items="_tprev_ts"), "_tprev_ts", "_tprev_ts is a placeholder of SLIDING triggers without INTERVAL"),
    (
        "CREATE STREAM s SLIDING(1m) FROM t INTO o AS SELECT _tprev_ts, _twstart FROM %%trows",
        "_twstart FROM",
        "not of this SLIDING trigger",
    ),
    ("CREATE STREAM s PERIOD(1m) INTO o AS SELECT _tlocaltime, _tcurrent_ts FROM t", "_tcurrent_ts", "PERIOD"),
    ("CREATE STREAM s SESSION(ts, 1s) FROM t INTO o AS SELECT _wstart, 1 AS x FROM %%trows", "_wstart", "use _twstart"),
    (
        "CREATE STREAM s INTO o AS SELECT _twstart, 1 AS x FROM t INTERVAL(1m)",
        "_twstart",
        "the old form offers _wstart",
    ),
    ("CREATE STREAM s INTO o AS SELECT _wstart, _tgrpid FROM t INTERVAL(1m)", "_tgrpid", "new CREATE STREAM form"),
    (
        "CREATE STREAM s INTO o AS SELECT _wstart, %%1 FROM t PARTITION BY a INTERVAL(1m)",
        "%%1",
        "new CREATE STREAM form",
    ),
    ("CREATE STREAM s INTO o AS SELECT _wstart, 1 AS x FROM %%trows INTERVAL(1m)", "%%trows", "new CREATE STREAM form"),
    (W.format(items="%%trows"), "%%trows FROM", "%%trows can only be used in FROM"),
    (W.format(items="%%tbname"), "%%tbname", "%%tbname needs PARTITION BY tbname"),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t PARTITION BY tbname INTO o AS SELECT _twstart, %%2 FROM %%trows",
        "%%2",
        "PARTITION BY names 1 column(s)",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t PARTITION BY tbname INTO o AS SELECT _twstart, %%foo FROM %%trows",
        "%%foo",
        "unknown placeholder",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t OPTIONS(PRE_FILTER(_twstart > 1)) INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "_twstart >",
        "can only be used in SELECT, WHERE and RANGE, not in PRE_FILTER",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t PARTITION BY tbname OPTIONS(PRE_FILTER(%%1 = 'x')) INTO o AS "
        "SELECT _twstart, 1 AS x FROM %%trows",
        "%%1",
        "%%1 can only be used in SELECT, WHERE, TAGS, OUTPUT_SUBTABLE and NOTIFY ... WHERE, not in PRE_FILTER",
    ),
    (
        "CREATE STREAM s STATE_WINDOW(%%tbname) FROM t PARTITION BY tbname INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "%%tbname",
        "FROM, SELECT, WHERE, TAGS, OUTPUT_SUBTABLE and NOTIFY ... WHERE, not in STATE_WINDOW",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t PARTITION BY a INTO o TAGS (g INT AS %%2) AS SELECT _twstart, 1 AS x "
        "FROM %%trows",
        "%%2",
        "%%2 refers to PARTITION BY column 2, but PARTITION BY names 1 column(s)",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t PARTITION BY a INTO o OUTPUT_SUBTABLE(%%tbname) AS SELECT _twstart, 1 AS x "
        "FROM %%trows",
        "%%tbname",
        "%%tbname needs PARTITION BY tbname",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t PARTITION BY a NOTIFY('ws://h:1') ON (WINDOW_CLOSE) WHERE %%trows = 1 "
        "AS SELECT _twstart, 1 AS x FROM %%trows",
        "%%trows =",
        "%%trows can only be used in FROM, not in NOTIFY ... WHERE",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t INTO o TAGS (g INT AS 1, G INT AS 2) AS SELECT _twstart, 1 AS x "
        "FROM %%trows",
        "G INT",
        "tag 'G' is declared twice",
    ),
    (
        "CREATE STREAM s COUNT_WINDOW(5, _twstart) FROM t INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "_twstart)",
        "is a placeholder, not a column",
    ),
    # PARTITION BY
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t PARTITION BY concat(a, b) INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "concat",
        "PARTITION BY takes column names",
    ),
    (
        "CREATE STREAM s SESSION(ts, 1s) FROM t PARTITION BY tbname AS tn INTO o AS SELECT _twstart, 1 AS x FROM %%trows",
        "tbname AS",
        "PARTITION BY takes column names",
    ),
    # the old form's PARTITION BY and TAGS
    (
        'CREATE STREAM s INTO o AS SELECT _wstart, 1 AS x FROM t PARTITION BY tbname, concat("tag-", tbname) '
        "INTERVAL(1m)",
        "concat",
        'give the PARTITION BY expression a name: concat("tag-", tbname) AS name',
    ),
    (
        "CREATE STREAM s INTO o AS SELECT _wstart, 1 AS x FROM t PARTITION BY tbname, upper(loc) tbname INTERVAL(1m)",
        "upper",
        "PARTITION BY names 'tbname' twice",
    ),
    (
        "CREATE STREAM s INTO o AS SELECT _wstart, 1 AS x FROM t PARTITION BY count(v) AS c INTERVAL(1m)",
        "count",
        "aggregates are not allowed in PARTITION BY",
    ),
    (
        "CREATE STREAM s INTO o AS SELECT _wstart, 1 AS x FROM t PARTITION BY _wstart AS w INTERVAL(1m)",
        "_wstart AS",
        "_wstart can only be used in SELECT, WHERE and RANGE, not in PARTITION BY",
    ),
    (
        "CREATE STREAM s INTO o TAGS (a INT, b INT) AS SELECT _wstart, 1 AS x FROM t PARTITION BY tbname INTERVAL(1m)",
        "TAGS",
        "TAGS names 2 tag(s) but PARTITION BY has 1 item(s) (tbname): name the tags after the PARTITION BY",
    ),
    (
        "CREATE STREAM s INTO o TAGS (a INT) AS SELECT _wstart, 1 AS x FROM t INTERVAL(1m)",
        "TAGS",
        "the old form's TAGS take their values from PARTITION BY, and the query has none",
    ),
    # old form
    ("CREATE STREAM s TRIGGER MAX_DELAY 4s INTO o AS SELECT _wstart, 1 AS x FROM t INTERVAL(1m)", "4s", "at least 5s"),
    (
        "CREATE STREAM s TRIGGER FORCE_WINDOW_CLOSE INTO o AS SELECT _wstart, 1 AS x FROM t INTERVAL(1m) SLIDING(30s)",
        "FORCE_WINDOW_CLOSE",
        "a SLIDING different from the INTERVAL",
    ),
    (
        "CREATE STREAM s TRIGGER FORCE_WINDOW_CLOSE INTO o AS SELECT _wstart, 1 AS x FROM t SESSION(ts, 1s)",
        "FORCE_WINDOW_CLOSE",
        "only supports INTERVAL windows",
    ),
    (
        "CREATE STREAM s TRIGGER FORCE_WINDOW_CLOSE FILL_HISTORY 1 INTO o AS SELECT _wstart, 1 AS x FROM t INTERVAL(1m)",
        "FILL_HISTORY",
        "FILL_HISTORY 1 cannot be used with TRIGGER FORCE_WINDOW_CLOSE",
    ),
    (
        "CREATE STREAM s IGNORE EXPIRED 0 TRIGGER FORCE_WINDOW_CLOSE INTO o AS SELECT _wstart, 1 AS x FROM t INTERVAL(1m)",
        "IGNORE EXPIRED",
        "IGNORE EXPIRED 0 cannot be used",
    ),
    (
        "CREATE STREAM s TRIGGER FORCE_WINDOW_CLOSE IGNORE UPDATE 0 INTO o AS SELECT _wstart, 1 AS x FROM t INTERVAL(1m)",
        "IGNORE UPDATE",
        "IGNORE UPDATE 0 cannot be used",
    ),
    (
        "CREATE STREAM s TRIGGER CONTINUOUS_WINDOW_CLOSE INTO o AS SELECT _wstart, 1 AS x FROM t STATE_WINDOW(a)",
        "CONTINUOUS_WINDOW_CLOSE",
        "only supports INTERVAL windows, not STATE_WINDOW",
    ),
    (
        "CREATE STREAM s TRIGGER SOMETIMES INTO o AS SELECT _wstart, 1 AS x FROM t INTERVAL(1m)",
        "SOMETIMES",
        "TRIGGER takes",
    ),
    (
        "CREATE STREAM s WATERMARK 1s WATERMARK 2s INTO o AS SELECT _wstart, 1 AS x FROM t INTERVAL(1m)",
        "WATERMARK 2s",
        "given twice",
    ),
    ("CREATE STREAM s FILL_HISTORY 2 INTO o AS SELECT _wstart, 1 AS x FROM t INTERVAL(1m)", "2 INTO", "takes 0 or 1"),
    ("CREATE STREAM s BOGUS INTO o AS SELECT _wstart, 1 AS x FROM t INTERVAL(1m)", "BOGUS", "expected a trigger"),
    ("CREATE STREAM s INTO o SELECT _wstart, 1 AS x FROM t INTERVAL(1m)", "SELECT", "expected AS"),
    ("CREATE STREAM s INTO o AS SELECT _wstart, 1 AS x FROM t", "SELECT", "a stream needs a window clause"),
    ("CREATE STREAM s INTO o AS SELECT _wstart, 1 AS x FROM t SLIDING(1m)", "SLIDING", "needs INTERVAL"),
    (
        "CREATE STREAM s INTO o AS SELECT _wstart, 1 AS x FROM t INTERVAL(1m) SLIDING(1m, 1s)",
        "SLIDING",
        "SLIDING(sliding)",
    ),
    ("CREATE STREAM s INTO o AS SELECT _wstart, 1 AS x FROM t STATE_WINDOW(a) TRUE_FOR(1s)", "TRUE_FOR", "new form"),
    (
        "CREATE STREAM s INTO o AS SELECT _wstart, 1 AS x FROM t COUNT_WINDOW(10, 2, a)",
        "COUNT_WINDOW",
        "COUNT_WINDOW(count[, sliding])",
    ),
    (
        "CREATE STREAM s INTO o AS SELECT _wstart, 1 AS x FROM t INTERVAL(1m) FILL(prev)",
        "FILL",
        "FILL is not supported",
    ),
    (
        "CREATE STREAM s INTO o AS SELECT _wstart, 1 AS x FROM t INTERVAL(1m) NOTIFY ('ws://h:1') ON ('WINDOW_OPEN') NOTIFY_HISTORY 1 NOTIFY_HISTORY 0",
        "NOTIFY_HISTORY 0",
        "given twice",
    ),
    # commands
    ("DROP STREAM s", "DROP", "use `cq drop`"),
    ("SHOW STREAMS", "SHOW", "use `cq show`"),
    ("START STREAM s", "START", "use `cq start`"),
    ("STOP STREAM s", "STOP", "use `cq stop`"),
    ("PAUSE STREAM IF EXISTS s", "PAUSE", "use `cq pause`"),
    ("RESUME STREAM IGNORE UNTREATED s", "RESUME", "use `cq resume`"),
    ("RECALCULATE STREAM s FROM '2024-01-01'", "RECALCULATE", "use `cq recalculate`"),
    ("CREATE VIEW v", "CREATE", "unknown statement starting with 'CREATE' (expected CREATE CONTINUOUS QUERY"),
]


@pytest.mark.parametrize("sql,needle,fragment", REJECTIONS)
def test_rejections_name_file_line_col(sql, needle, fragment):
    message = error(sql)
    where = at(sql, needle) if needle is not None else f"1:{len(sql) + 1}"
    assert message.startswith(f"t.sql:{where}: "), message
    assert fragment in message, message


def test_errors_on_later_lines_point_there():
    sql = "CREATE STREAM s\n  SESSION(ts, 1s) FROM t\n  INTO o\n  AS SELECT _twstart,\n         _tprev_ts FROM %%trows"
    assert error(sql).startswith("t.sql:5:10: _tprev_ts is a placeholder")
    sql = "CREATE STREAM s INTO o AS\n  SELECT _wstart, 1 AS x\n  FROM t\n  INTERVAL(1m) SLIDING(2m)"
    assert error(sql).startswith("t.sql:4:24: SLIDING must not be greater")


# --- tables and the catalog --------------------------------------------------------------------------


def test_super_table_gets_an_implicit_tbname_tag_unless_it_declares_one():
    (t,) = parse_text("CREATE TABLE m (ts TIMESTAMP, v DOUBLE) TAGS (loc STRING)")
    assert [(c.name, c.is_tag) for c in t.columns] == [("ts", False), ("v", False), ("tbname", True), ("loc", True)]
    (t,) = parse_text("CREATE TABLE m (ts TIMESTAMP, v DOUBLE) TAGS (TBNAME VARCHAR(192), loc STRING)")
    assert [c.name for c in t.columns] == ["ts", "v", "TBNAME", "loc"]
    (t,) = parse_text("CREATE TABLE plain (ts TIMESTAMP PRIMARY KEY, v DOUBLE)")
    assert [c.name for c in t.columns] == ["ts", "v"] and t.time_column == "ts"


TABLES = """CREATE TABLE meters (ts TIMESTAMP, current FLOAT, voltage INT) TAGS (location VARCHAR(64), groupid INT);
CREATE TABLE plain (ts TIMESTAMP, v DOUBLE, st INT);
"""


def test_catalog_checks_streams(tmp_path):
    (tmp_path / "a.sql").write_text(
        TABLES
        + """
CREATE STREAM good INTERVAL(1m) SLIDING(30s) FROM meters PARTITION BY tbname, location
  OPTIONS(PRE_FILTER(current > 0)) INTO good_out AS SELECT _twstart, avg(voltage), %%2 FROM %%trows;
CREATE STREAM old_good INTO old_out AS SELECT _wstart, count(*) FROM meters PARTITION BY tbname SESSION(ts, 10s);
CREATE STREAM per PERIOD(1h) FROM meters INTO per_out AS SELECT _tlocaltime, sum(v) FROM plain;
CREATE STREAM st STATE_WINDOW(st) FROM plain INTO st_out AS SELECT _twstart, count(*) FROM %%trows;
"""
    )
    bad = {
        "b": (
            "CREATE STREAM no_tbname EVENT_WINDOW(START WITH voltage < 0 END WITH voltage > 9) FROM meters INTO o_b "
            "AS SELECT _twstart, count(*) FROM %%trows",
            "EVENT_WINDOW on super table 'meters' needs PARTITION BY tbname",
        ),
        "c": (
            "CREATE STREAM old_count INTO o_c AS SELECT _wstart, count(*) FROM meters PARTITION BY location COUNT_WINDOW(5)",
            "COUNT_WINDOW on super table 'meters' needs PARTITION BY tbname",
        ),
        "d": (
            "CREATE STREAM bad_ts SESSION(current, 10s) FROM meters PARTITION BY tbname INTO o_d AS SELECT _twstart, "
            "count(*) FROM %%trows",
            "SESSION(current, ...) must name the time column 'ts'",
        ),
        "e": (
            "CREATE STREAM bad_part SLIDING(1m) FROM meters PARTITION BY voltage INTO o_e AS SELECT _tprev_ts, "
            "count(*) FROM %%trows",
            "PARTITION BY may only name tbname and tag columns of 'meters'",
        ),
        "f": (
            "CREATE STREAM bad_col STATE_WINDOW(nope) FROM plain INTO o_f AS SELECT _twstart, count(*) FROM %%trows",
            "table 'plain' has no column 'nope'",
        ),
        "g": (
            "CREATE STREAM bad_pre PERIOD(1h) FROM meters OPTIONS(PRE_FILTER(humidity > 1)) INTO o_g AS SELECT "
            "_tlocaltime, sum(v) FROM plain",
            "table 'meters' has no column 'humidity'",
        ),
        "h": (
            "CREATE STREAM bad_src PERIOD(1h) INTO o_h AS SELECT _tlocaltime, sum(zzz) FROM plain",
            "table 'plain' has no column 'zzz'",
        ),
        "i": (
            "CREATE CQ same_sink BEGIN SELECT max(v) AS m INTO good_out FROM plain GROUP BY (1s) END",
            "'same_sink' writes table 'good_out', which 'good' already writes",
        ),
        "j": (
            "CREATE STREAM self_write SESSION(ts, 1s) FROM plain INTO plain AS SELECT _twstart, count(*) FROM %%trows",
            "reads and writes the same table 'plain'",
        ),
        "k": (
            "CREATE STREAM good INTO o_k AS SELECT _wstart, count(*) FROM plain INTERVAL(1s)",
            "'good' is defined twice",
        ),
        "l": (
            "CREATE STREAM old_part INTO o_l AS SELECT _wstart, count(*) FROM plain PARTITION BY nothere INTERVAL(1m)",
            "table 'plain' has no column 'nothere'",
        ),
    }
    for name, (sql, _) in bad.items():
        (tmp_path / f"{name}.sql").write_text(sql + ";")
    catalog = load_catalog(tmp_path)
    assert [d.name for d in catalog.definitions] == ["good", "old_good", "per", "st"]
    assert len(catalog.errors) == len(bad)
    for error_text, (name, (sql, fragment)) in zip(map(str, catalog.errors), sorted(bad.items())):
        # at the statement, or at the column a table lacks
        at = error_text.split(": ")[0]
        want = f"{tmp_path}/{name}.sql:1:1"
        if "has no column" in fragment:
            want = f"{tmp_path}/{name}.sql:1:{sql.index(fragment.split(chr(39))[-2]) + 1}"
        assert at == want and fragment in error_text, error_text
    good = catalog.definition("good")
    assert referenced_columns(good) == {"voltage", "current", "tbname", "location"}


def test_streams_and_queries_share_sinks_across_files(tmp_path):
    (tmp_path / "a.sql").write_text("CREATE STREAM s1 INTO shared AS SELECT _wstart, count(*) FROM src INTERVAL(1m);")
    (tmp_path / "b.sql").write_text(
        "CREATE STREAM s2 SESSION(ts, 1s) FROM src INTO shared AS SELECT _twstart, count(*) FROM %%trows;"
    )
    catalog = load_catalog(tmp_path)
    assert [d.name for d in catalog.definitions] == ["s1"]
    assert "give each definition its own sink" in str(catalog.errors[0])


# --- the new form's query: any TDengine query (docs/dialects/tdengine.md, A stream's query) -----------

Q = "CREATE STREAM s INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname INTO o AS "


def test_new_form_query_clauses():
    s = stream(Q + "SELECT _twstart, avg(current) a FROM %%trows HAVING avg(current) > 1")
    assert (s.having, s.key_bound) == ("AVG(current) > 1", "start")
    s = stream(Q + "SELECT _twstart, location, avg(current) a FROM %%trows GROUP BY location HAVING a > 2")
    assert (s.group_by, s.partitions_query, s.having) == (("location",), False, "AVG(current) > 2")
    s = stream(
        Q + "SELECT _twstart, location, avg(current) FROM meters WHERE ts >= _twstart AND ts < _twend "
        "PARTITION BY location"
    )
    assert (s.reads, s.group_by, s.partitions_query) == ("table", ("location",), True)
    s = stream(Q + "SELECT ts, current FROM %%trows ORDER BY current DESC LIMIT 3 OFFSET 1")
    assert (s.key_bound, s.limit, s.offset) == ("row", 3, 1)
    assert s.order_by == (OrderKey("current", descending=True, nulls_first=False),)
    s = stream(
        Q + "SELECT _twstart, status, max(current) m FROM %%trows GROUP BY status "
        "ORDER BY m NULLS LAST, 2 DESC NULLS FIRST SLIMIT 2 SOFFSET 1 LIMIT 1"
    )
    assert s.order_by == (OrderKey("MAX(current)", False, False), OrderKey("status", True, True))
    assert (s.slimit, s.soffset, s.limit) == (2, 1, 1)
    s = stream(Q + "SELECT _twstart, CASE WHEN avg(current) > 1 THEN 'hi' ELSE 'lo' END lvl FROM %%trows")
    assert s.select[1].expression == "CASE WHEN AVG(current) > 1 THEN 'hi' ELSE 'lo' END"
    for first in ("last(ts)", "max(ts)", "first(ts)"):
        assert stream(Q + f"SELECT {first} t, count(*) n FROM %%trows").key_bound == "row"
    # the old form keeps seed 000's subset
    assert "new form takes it" in error("CREATE STREAM s INTO o AS SELECT _wstart, c FROM t GROUP BY c INTERVAL(1m)")


def test_a_row_time_first_column_must_be_a_timestamp_column(tmp_path):
    (tmp_path / "m.sql").write_text("CREATE TABLE m (ts TIMESTAMP, t2 TIMESTAMP, v DOUBLE);")
    (tmp_path / "good.sql").write_text(
        "CREATE STREAM good INTERVAL(10s) SLIDING(10s) FROM m INTO o1 AS SELECT t2, v FROM %%trows;"
    )
    (tmp_path / "bad.sql").write_text(
        "CREATE STREAM bad INTERVAL(10s) SLIDING(10s) FROM m INTO o2 AS SELECT v, t2 FROM %%trows;"
    )
    catalog = load_catalog(tmp_path)
    assert [d.name for d in catalog.definitions] == ["good"]
    (err,) = catalog.errors
    assert f"{tmp_path}/bad.sql:1:71: " in str(err) and "'v' of table 'm' is DOUBLE, not TIMESTAMP" in str(err)


def test_subqueries_in_from_and_union_all():
    s = stream(Q + "SELECT _twstart, max(g.a) m FROM (SELECT status, avg(current) a FROM %%trows GROUP BY status) AS g")
    assert (s.reads, s.source, s.select[1].expression) == ("query", "meters", "MAX(a)")
    inner = s.subquery
    assert inner is not None and (inner.reads, inner.group_by, inner.sink, inner.tags) == (
        "trows",
        ("status",),
        "o",
        (),
    )
    assert inner.trigger == s.trigger and inner.partition_by == s.partition_by and inner.output_subtable is None
    s = stream(
        Q + "SELECT _twstart, count(*) n FROM %%trows "
        "UNION ALL SELECT _twstart, count(*) FROM other WHERE ts >= _twstart AND ts < _twend "
        "UNION ALL SELECT _twstart, max(v) FROM (SELECT current v FROM %%tbname)"
    )
    assert [q.reads for q in (s, *s.union)] == ["trows", "table", "query"]
    assert [q.source for q in s.leaves] == ["meters", "other", "meters"] and s.composed
    assert s.union[1].subquery is not None and s.union[1].subquery.reads == "tbname"
    # a subquery that is a UNION ALL, and a row's own time through it
    s = stream(Q + "SELECT ts, c FROM (SELECT ts, current c FROM %%trows UNION ALL SELECT ts, voltage FROM t2) LIMIT 1")
    assert s.key_bound == "row" and s.subquery is not None and s.subquery.union[0].source == "t2"
    # a query of a UNION ALL in parentheses takes its own ORDER BY / LIMIT
    s = stream(
        Q + "(SELECT ts, current FROM %%trows ORDER BY current LIMIT 1) UNION ALL SELECT ts, voltage FROM %%trows"
    )
    assert (s.limit, s.union[0].limit, len(s.union)) == (1, None, 1)


QS = "CREATE STREAM s INTERVAL(10s) SLIDING(10s) FROM t PARTITION BY tbname INTO o AS SELECT _twstart, "


def test_interval_inside_the_query():
    s = stream(
        Q + "SELECT _wstart, _wend, _wduration d, avg(current) a FROM %%trows PARTITION BY status "
        "INTERVAL(10s, 2s) SLIDING(5s) HAVING count(*) > 1"
    )
    assert s.sub_windows == SubWindows(timedelta(seconds=10), timedelta(seconds=5), timedelta(seconds=2))
    assert (s.key_bound, s.group_by, s.partitions_query, s.composed) == ("row", ("status",), True, True)
    assert [i.expression for i in s.select[:3]] == [
        "__cq_sw_start",
        "TIMESTAMP_MICROS(UNIX_MICROS(__cq_sw_start) + 10000000)",
        "10000",
    ]
    s = stream(Q + "SELECT _wstart, count(*) n, max(current) FROM %%trows INTERVAL(5s) FILL(VALUE, 0, -1.5)")
    assert s.sub_windows is not None and (s.sub_windows.fill, s.sub_windows.fill_values) == ("value", ("0", "-1.5"))
    s = stream(Q + "SELECT _twstart, max(current) FROM %%trows INTERVAL(1s)")
    assert s.key_bound == "start" and s.sub_windows is not None
    # the old form's window clause is its trigger, as before
    old = stream("CREATE STREAM s INTO o AS SELECT _wstart, count(*) c FROM t INTERVAL(1m)")
    assert old.sub_windows is None and old.select[0].expression == "__cq_twstart"


def test_joins_of_the_trigger_rows():
    s = stream(
        Q + "SELECT m.ts, m.current, l.cap FROM %%trows AS m LEFT OUTER JOIN limits AS l ON m.status = l.status "
        "JOIN other ON other.ts = m.ts WHERE l.cap IS NULL OR m.current > l.cap"
    )
    assert s.key_bound == "row" and [i.name for i in s.select] == ["ts", "current", "cap"]
    assert [(j.table, j.kind, j.on) for j in s.joins] == [
        ("limits", "left", "__cq_j0_status = __cq_j1_status"),
        ("other", "inner", "__cq_j2_ts = __cq_j0_ts"),
    ]
    assert s.where == "__cq_j1_cap IS NULL OR __cq_j0_current > __cq_j1_cap" and s.composed
    s = stream(
        Q + "SELECT _twstart, l.cap, count(*) n FROM %%trows m JOIN limits l ON m.status = l.status GROUP BY l.cap"
    )
    assert s.group_by == ("__cq_j1_cap",) and s.select[1].expression == "__cq_j1_cap"


@pytest.mark.parametrize(
    "sql, needle, fragment",
    [
        (QS + "count(*) n FROM %%trows m JOIN l ON m.s = l.s WHERE v > 1", "v > 1", "names its table: alias.v"),
        (QS + "count(*) n FROM %%trows m JOIN l ON m.s = x.q", "q", "'x' is not a table of this query"),
        (QS + "count(*) n FROM %%trows m RIGHT JOIN l ON m.s = l.s", "RIGHT", "belong to no trigger window"),
        (QS + "count(*) n FROM %%trows m FULL JOIN l ON m.s = l.s", "FULL", "belong to no trigger window"),
        (QS + "count(*) n FROM %%trows m LEFT ASOF JOIN l ON m.ts >= l.ts JLIMIT 2000", "2000", "from 0 to 1024"),
        (QS + "count(*) n FROM %%trows m LEFT ASOF JOIN l ON m.ts >= l.ts JLIMIT", "JLIMIT", "from 0 to 1024"),
        (QS + "count(*) n FROM %%trows m JOIN l ON m.ts = l.ts JLIMIT 2", "JLIMIT", "belongs to LEFT ASOF and"),
        (QS + "count(*) n FROM %%trows m ASOF JOIN l ON m.ts >= l.ts", "ASOF", "write LEFT ASOF JOIN"),
        (QS + "count(*) n FROM %%trows m LEFT ASOF JOIN l ON m.v > 1", "v > 1", "compares a column of each table"),
        (QS + "count(*) n FROM %%trows m LEFT WINDOW JOIN l ", "l", "needs WINDOW_OFFSET(start, end)"),
        (
            QS + "count(*) n FROM %%trows m LEFT WINDOW JOIN l WINDOW_OFFSET(1s, -1s)",
            "1s,",
            "start must not be after its end",
        ),
        (QS + "count(*) n FROM %%trows m LEFT WINDOW JOIN l WINDOW_OFFSET(-1s)", "WINDOW_OFFSET", "takes two offsets"),
        (QS + "count(*) n FROM %%trows m LEFT WINDOW JOIN l WINDOW_OFFSET(-1x, 1s)", "1x", "unknown unit 'x'"),
        (QS + "count(*) n FROM %%trows m LEFT WINDOW JOIN l WINDOW_OFFSET(-1n, 1s)", "1n", "unknown unit 'n'"),
        (
            QS + "count(*) n FROM %%trows m LEFT WINDOW JOIN l ON m.ts > l.ts WINDOW_OFFSET(-1s, 1s)",
            "ts > l",
            "ON holds equalities only",
        ),
        (
            QS + "count(*) n FROM %%trows m LEFT WINDOW JOIN l WINDOW_OFFSET(-1s, 1s) JLIMIT 2 x",
            "2 x",
            "from 0 to 1024",
        ),
        (QS + "count(*) n FROM %%trows m WINDOW JOIN l WINDOW_OFFSET(-1s, 1s)", "WINDOW JOIN", "write LEFT WINDOW"),
        (
            QS + "count(*) n FROM %%trows m LEFT WINDOW JOIN l WINDOW_OFFSET(-1s, 1s) GROUP BY m.s",
            "GROUP BY",
            "takes no GROUP BY",
        ),
        (
            QS + "count(*) n FROM %%trows m LEFT WINDOW JOIN l WINDOW_OFFSET(-1s, 1s) INTERVAL(1s)",
            "INTERVAL(1s)",
            "takes no INTERVAL",
        ),
        (
            QS + "count(*) n FROM %%trows m LEFT WINDOW JOIN l WINDOW_OFFSET(-1s, 1s) SLIMIT 1",
            "SLIMIT",
            "SLIMIT needs GROUP BY",
        ),
        (
            QS + "m.v a, l.v b FROM %%trows m LEFT WINDOW JOIN l WINDOW_OFFSET(0s, 1s) HAVING m.v > 1",
            "HAVING",
            "filters its",
        ),
        (QS + "m.v, max(l.v) FROM %%trows m JOIN l ON m.s = l.s", "m.v,", "column 'm.v' is not inside an aggregate"),
        (QS + "l.v, max(l.v) FROM %%trows m LEFT WINDOW JOIN l WINDOW_OFFSET(0s, 1s)", "l.v,", "'l.v' is not inside"),
        (
            QS + "count(*) n FROM %%trows m LEFT WINDOW JOIN l WINDOW_OFFSET(0s, 1s) JOIN k ON m.s = k.s",
            "LEFT WINDOW",
            "the query's only join",
        ),
        (QS + "count(*) n FROM %%trows m JOIN lim", "lim", "JOIN lim needs ON condition"),
        (QS + "count(*) n FROM %%trows m JOIN l m ON m.s = m.s", "m ON", "names two sides of the join"),
        (QS + "count(*) n FROM %%tbname m JOIN l ON m.s = l.s", "%%tbname", "a join reads FROM %%trows alias"),
        (QS + "twa(m.v) FROM %%trows m JOIN l ON m.s = l.s", "twa", "which a join query does not have"),
        (QS + "max(x.v) FROM %%trows", "v)", "'x' is not a table of this query"),
        (QS + "count(*) n FROM %%trows UNION SELECT _twstart, 1 FROM %%trows", "UNION", "write UNION ALL"),
        (
            QS + "count(*) n FROM %%trows SESSION(ts, 1s) FILL(NULL)",
            "FILL",
            "FILL needs INTERVAL(...) in the query, not",
        ),
        (QS + "v, count(*) n FROM %%trows STATE_WINDOW(v + 1)", "v,", "column 'v' is not inside an aggregate"),
        (QS + "v FROM %%trows EVENT_WINDOW START WITH v > 1 END WITH v < 1", "EVENT", "its SELECT needs an aggregate"),
        (QS + "count(*) n FROM %%trows COUNT_WINDOW(3, 1, v)", "COUNT_WINDOW", "COUNT_WINDOW(n, ..., column) inside"),
        (QS + "count(*) n FROM %%trows COUNT_WINDOW(3) GROUP BY v", "GROUP", "COUNT_WINDOW takes PARTITION BY, not"),
        (QS + "count(*) n FROM %%trows SLIDING(5s)", "SLIDING(5s)", "SLIDING needs INTERVAL(...) before it"),
        (QS + "count(*) n FROM %%trows INTERVAL(5s) SLIDING(7s)", "7s", "SLIDING must not be greater"),
        (QS + "count(*) n FROM %%trows INTERVAL(10s) SLIDING(5s) FILL(PREV)", "FILL", "SLIDING smaller than"),
        (QS + "count(*) n FROM %%trows INTERVAL(5s) FILL(NULL_F)", "NULL_F", "FILL(NULL_F) (sub-windows of a window"),
        (QS + "count(*) n FROM %%trows INTERVAL(5s) FILL(SPLINE)", "SPLINE", "expected FILL(NONE | NULL | VALUE"),
        (QS + "count(*) n FROM %%trows INTERVAL(5s) FILL(VALUE)", "VALUE", "FILL(VALUE, v1, ...) takes values"),
        (QS + "count(*) n FROM %%trows INTERVAL(5s) FILL(VALUE, 0,)", "FILL", "FILL(...) has an empty argument"),
        (QS + "count(*) n FROM %%trows INTERVAL(5s) FILL()", "FILL", "FILL(...) has an empty argument"),
        (QS + "count(*) n FROM %%trows INTERVAL(5s) FILL(PREV, 1)", "PREV", "FILL(VALUE, v1, ...) takes values"),
        (QS + "count(*) n FROM %%trows INTERVAL(5s) FILL(VALUE, v)", "v)", "FILL(VALUE, ...) takes constants"),
        (QS + "count(*) n, max(v) FROM %%trows INTERVAL(5s) FILL(VALUE, 0)", "FILL", "1 value(s) for the query's 2"),
        (QS + "count(*) n FROM %%trows INTERVAL(5s) FILL(NULL) HAVING n > 1", "HAVING n", "HAVING with FILL"),
        (
            "CREATE STREAM s SESSION(ts, 5s) FROM t PARTITION BY tbname INTO o AS SELECT _twstart, count(*) n "
            "FROM %%trows INTERVAL(1s) FILL(NULL)",
            "FILL",
            "FILL needs a trigger window of fixed range",
        ),
        (QS + "count(*) n FROM %%trows INTERVAL(5s) GROUP BY v", "GROUP BY", "takes PARTITION BY, not GROUP BY"),
        (QS + "count(*) n FROM %%trows WHERE _wend > 1 INTERVAL(5s)", "_wend >", "only be used in SELECT, HAVING"),
        (QS + "_wend FROM %%trows INTERVAL(5s)", "INTERVAL(5s)", "SELECT needs an aggregate"),
        (QS + "max(b) FROM (SELECT v a FROM %%trows)", "b)", "column 'b' is not a result column of the subquery"),
        (QS + "max(a) FROM (SELECT v a FROM %%trows) x JOIN y", "JOIN", "takes an alias at most"),
        (QS + "max(a) FROM ()", "()", "a subquery in FROM needs a query"),
        (QS + "last(a) FROM (SELECT avg(v) a FROM %%trows)", "SELECT _twstart", "but it aggregates them"),
        (QS + "count(*) n FROM %%trows UNION ALL SELECT _twstart FROM %%trows", "SELECT _twstart FROM", "same number"),
        (QS + "count(*) n FROM %%trows UNION ALL SELECT ts, v FROM %%trows", "SELECT ts", "same kind of first column"),
        (QS + "twa(v) FROM %%trows UNION ALL SELECT _twstart, 1 FROM %%trows", "_twstart, twa", "interpolates"),
        (QS + "count(*) n FROM %%trows UNION ALL", "ALL", "UNION ALL needs a query after it"),
        (QS + "1 a FROM %%trows UNION ALL SELECT _twstart, 2 FROM %%trows LIMIT 1", "LIMIT", "FROM (q1 UNION ALL q2)"),
        (
            "CREATE STREAM s INTERVAL(10s) SLIDING(10s) FROM t PARTITION BY tbname INTO o OUTPUT_SUBTABLE(CONCAT('x', "
            "tbname)) AS SELECT _twstart, 1 a FROM %%trows UNION ALL SELECT _twstart, 2 FROM %%trows",
            "OUTPUT_SUBTABLE",
            "names the trigger group's values as %%n or %%tbname",
        ),
        (
            "CREATE STREAM s INTO o AS SELECT _wstart, count(*) FROM (SELECT v FROM t) INTERVAL(1m)",
            "(SELECT v",
            "table name",
        ),
        ("CREATE STREAM s INTO o AS SELECT _wstart, 1 x FROM t INTERVAL(1m) UNION ALL", "UNION", "not supported"),
    ],
)
def test_composed_queries_refused_at_load(sql, needle, fragment):
    message = error(sql)
    assert message.startswith(f"t.sql:{at(sql, needle)}: "), message
    assert fragment in message, message


def test_each_query_of_a_composed_stream_is_checked_against_its_table(tmp_path):
    (tmp_path / "m.sql").write_text("CREATE TABLE m (ts TIMESTAMP, v DOUBLE);\nCREATE TABLE n (ts TIMESTAMP, w INT);")
    head = "INTERVAL(10s) SLIDING(10s) FROM m INTO"
    (tmp_path / "good.sql").write_text(
        f"CREATE STREAM good {head} o1 AS SELECT ts, x FROM (SELECT ts, v x FROM %%trows "
        "UNION ALL SELECT ts, w FROM n WHERE ts >= _twstart AND ts < _twend);"
    )
    (tmp_path / "bad1.sql").write_text(
        f"CREATE STREAM bad1 {head} o2 AS SELECT _twstart, count(*) c FROM %%trows "
        "UNION ALL SELECT _twstart, count(nope) FROM n WHERE ts >= _twstart AND ts < _twend;"
    )
    (tmp_path / "bad2.sql").write_text(
        f"CREATE STREAM bad2 {head} o3 AS SELECT t, x FROM (SELECT v t, v x FROM %%trows);"
    )
    catalog = load_catalog(tmp_path)
    assert [d.name for d in catalog.definitions] == ["good"]
    bad1, bad2 = sorted(catalog.errors, key=str)
    assert f"{tmp_path}/bad1.sql:1:" in str(bad1) and "table 'n' has no column 'nope'" in str(bad1)
    assert f"{tmp_path}/bad2.sql:1:" in str(bad2) and "'v' of table 'm' is DOUBLE, not TIMESTAMP" in str(bad2)


@pytest.mark.parametrize(
    "join, kind, keys, offsets, limit",
    [
        ("INNER JOIN l ON m.s = l.s", "inner", (), None, None),
        ("JOIN l ON m.s = l.s", "inner", (), None, None),
        ("LEFT OUTER JOIN l ON m.s = l.s", "left", (), None, None),
        ("LEFT ASOF JOIN l", "asof", (), None, 1),
        ("LEFT ASOF JOIN l ON l.ts < m.ts AND m.s = l.s JLIMIT 5", "asof", (("s", "s"),), None, 5),
        ("LEFT WINDOW JOIN l WINDOW_OFFSET(-1s, 500a)", "window", (), (-1_000_000, 500_000), None),
        ("LEFT WINDOW JOIN l x ON m.s = x.s WINDOW_OFFSET(+2s, 1m) JLIMIT 0", "window", (("s", "s"),), (2e6, 6e7), 0),
    ],
)
def test_each_join_kind_is_parsed_with_its_bounds(join, kind, keys, offsets, limit):
    (stream,) = parse_text(QS + f"count(*) n FROM %%trows m {join}", file="t.sql")
    (j,) = stream.joins
    assert (j.kind, j.limit) == (kind, limit)
    assert tuple((joined_column(a)[1], joined_column(b)[1]) for a, b in j.keys) == keys
    us = None if j.offsets is None else tuple(o / timedelta(microseconds=1) for o in j.offsets)
    assert us == offsets
    if kind == "asof" and keys:
        assert j.asof is not None and j.asof[2] == ">"  # l.ts < m.ts is m.ts > l.ts
