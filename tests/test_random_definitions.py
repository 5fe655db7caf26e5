"""One rule for every dialect (docs/dialects/index.md, Functions): a definition the catalog accepts runs, or it is refused
when it loads with ``file:line:col``. Seeded random definitions of the three dialects, built from the
forms users write (TDengine's and IoTDB's functions, eKuiper's windows, misspellings, functions the
engine refuses, columns outside aggregates), each loaded and every accepted one run once over small
tables; any exception other than the engine's own error naming the definition fails the test."""

from __future__ import annotations

import random
import re
import traceback
from datetime import UTC, datetime, timedelta

import pyarrow as pa

from cq_engine.config import Settings
from cq_engine.engine import Engine
from cq_engine.errors import CQError, RunError
from cq_engine.model import ContinuousQuery
from cq_engine.streams.sensor import evaluate_stream

SEED = 20261126
PER_DIALECT = 12
TD_STREAMS = 24  # the new form's query takes many clauses: more of them
TD_JOIN_STREAMS = 8  # and joins, which the clauses above seldom meet
T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
TABLES = (
    "CREATE TABLE meters (ts TIMESTAMP, current DOUBLE, voltage INT, status INT) TAGS (location STRING);\n"
    "CREATE TABLE src (ts TIMESTAMP, device STRING, v DOUBLE, w INT);\n"
    'CREATE STREAM demo (ID STRING, temperature FLOAT, revenue FLOAT, ts BIGINT) WITH (TIMESTAMP="ts");\n'
)

TD_TRIGGERS = [
    ("INTERVAL(10s) SLIDING(10s)", False),
    ("INTERVAL(20s) SLIDING(10s)", False),
    ("SESSION(ts, 5s)", True),
    ("STATE_WINDOW(status)", True),
    ("EVENT_WINDOW(START WITH voltage > 225 END WITH voltage < 215)", True),
    ("COUNT_WINDOW(3)", True),
]
TD_AGGREGATES = [
    "count(*)", "avg(current)", "sum(voltage)", "max(current)", "min(voltage)", "spread(current)", "twa(current)",
    "elapsed(ts)", "elapsed(ts, 1s)", "irate(current)", "first(current)", "last(voltage)", "last_row(current)",
    "apercentile(current, 50)", "percentile(current, 90)", "percentile(current, 10, 50)", "mode(voltage)",
    "stddev(current)", "std(current)", "leastsquares(current, 1, 1)", "hyperloglog(voltage)",
    "count(distinct voltage)", "cast(avg(current) AS VARCHAR(12))", "round(avg(current), 2)", "abs(min(current))",
    "log(max(current), 2)", "ifnull(last(current), 0)", "if(max(voltage) > 225, 1, 0)",
    "concat_ws('-', 'n', cast(count(*) AS NCHAR(6)))", "variance(current)", "_twrownum", "_twduration", "_twend",
    "to_iso8601(_twstart)", "timetruncate(_twstart, 1m)", "now()", "today()",
    "spred(current)", "diff(current)", "derivative(current, 1s, 0)", "current", "top(current, 2)",
    "CASE WHEN max(current) > 10 THEN 'hi' WHEN count(current) = 0 THEN NULL ELSE 'lo' END", "status",
]  # fmt: skip
TD_ROW_ITEMS = [
    "current", "voltage * 2", "to_iso8601(ts)", "cast(voltage AS BIGINT)", "timetruncate(ts, 1s)", "ts",
    "cast(ts AS BIGINT)", "concat_ws(':', tbname, cast(status AS VARCHAR(4)))", "now()", "csum(current)",
    "CASE status WHEN 0 THEN 'idle' ELSE 'on' END", "status",
    # TDengine's multi-row functions (a selection alone among them: the others are refused at load)
    "diff(current)", "diff(voltage, 2)", "diff(ts)", "mavg(current, 2)", "derivative(current, 1s, 1)",
    "statecount(voltage, 'GT', 220)", "stateduration(current, 'LE', 10, 1s)", "top(current, 2)",
    "bottom(voltage, 1)", "tail(current, 2)", "unique(status)", "sample(current, 2)",
    "histogram(current, 'user_input', '[0, 10, 20]', 0)", "csum(location)",
]  # fmt: skip
IOTDB_ITEMS = [
    "count(v)", "avg(v)", "sum(w)", "max_value(v)", "min_value(w)", "first_value(v)", "last_value(v)",
    "extreme(v)", "max_time(v)", "min_time(v)", "stddev(v)", "percentile(v, 0.5)", "median(v)", "avg(v) + 1",
    "round(avg(v), 2)", "spread(v)", "mode(w)", "count_if(v > 10)", "time_duration(v)",
]  # fmt: skip
EK_ITEMS = [
    "count(*)", "avg(temperature)", "max(revenue)", "min(temperature)", "sum(revenue)", "window_start()",
    "window_end()", "collect(*)", "deduplicate(ID, true)", "last_value(temperature, true)", "stddev(temperature)",
    "temperature", "round(avg(revenue), 1)",
]  # fmt: skip
EK_WINDOWS = [
    "TUMBLINGWINDOW(ss, 10)", "HOPPINGWINDOW(ss, 20, 10)", "SESSIONWINDOW(ss, 30, 5)", "COUNTWINDOW(3)",
    "SLIDINGWINDOW(ss, 10)",
]  # fmt: skip


def _items(rng: random.Random, pool: list[str], *, least: int = 1, most: int = 4) -> list[str]:
    chosen = rng.sample(pool, rng.randint(least, most))
    return [f"{item} AS c{i}" if rng.random() < 0.7 else item for i, item in enumerate(chosen)]


def _tdengine(rng: random.Random, name: str) -> str:
    trigger, data_shaped = rng.choice(TD_TRIGGERS)
    partition = " PARTITION BY tbname" if data_shaped or rng.random() < 0.5 else ""
    pool = TD_AGGREGATES if rng.random() < 0.75 else TD_ROW_ITEMS
    items = _items(rng, pool + (["%%1", "tbname"] if partition else []))
    where = rng.choice(["", "", " WHERE current > 9", " WHERE voltage IS NOT NULL"])
    if rng.random() < 0.3:  # the old form: the window clause ends the query, placeholders _wstart...
        window = trigger.replace("EVENT_WINDOW(", "EVENT_WINDOW ").replace("215)", "215")  # no parentheses there
        items = [i.replace("_tw", "_w") for i in items]
        return (
            f"CREATE STREAM {name} INTO {name}_out AS SELECT _wstart, {', '.join(items)} FROM meters"
            f"{where}{partition} {window};"
        )
    if rng.random() < 0.08:  # INTERP's time points (data-shaped triggers without RANGE: refused at load)
        fill = rng.choice(["", " FILL(LINEAR)", " FILL(PREV)", " FILL(NEXT)", " FILL(NULL)", " FILL(VALUE, 0)"])
        rng_range = rng.choice(["", " RANGE(_twstart, _twstart + 8s)"])
        return (
            f"CREATE STREAM {name} {trigger} FROM meters{partition} INTO {name}_out AS SELECT _irowts, "
            f"interp(current) AS c FROM %%trows{where}{rng_range} EVERY(2s){fill};"
        )
    first = "_twstart"
    if pool is TD_ROW_ITEMS and rng.random() < 0.5:  # a row's own time as the sink's time column
        first = "ts"
        items = [i for i in items if i not in ("ts", "ts AS c0")] or ["current"]
    rows = "%%trows"
    if rng.random() < 0.25:  # a subquery in FROM giving the columns the query may name
        rows = f"(SELECT ts, tbname, location, status, current, voltage FROM %%trows{where}) AS q"
    head = f"CREATE STREAM {name} {trigger} FROM meters{partition} INTO {name}_out AS "
    if rng.random() < 0.15:  # the trigger rows joined with a table, every column naming its side
        return head + _td_join(rng, where.replace("WHERE ", "WHERE m."))
    window = ""
    if pool is TD_AGGREGATES and rng.random() < 0.25:  # the query's own sub-windows, their start first
        window = rng.choice(
            [
                " INTERVAL(5s)",
                " INTERVAL(10s) SLIDING(5s)",
                " INTERVAL(4s, 1s)",
                " INTERVAL(5s) FILL(PREV)",
                " INTERVAL(2s) FILL(LINEAR)",
                " SESSION(ts, 3s)",
                " STATE_WINDOW(status)",
                " STATE_WINDOW(status) TRUE_FOR(2s)",
                " EVENT_WINDOW START WITH voltage > 225 END WITH voltage < 215",
                " COUNT_WINDOW(2)",
                " COUNT_WINDOW(3, 2)",
            ]
        )
        first = rng.choice(["_wstart", "_twstart"])
    tail = _td_tail(rng, aggregated=pool is TD_AGGREGATES, window=window)
    query = f"SELECT {first}, {', '.join(items)} FROM {rows}{where}{tail}"
    if rng.random() < 0.2:  # UNION ALL with a query of the table (a query in parentheses keeps its LIMIT)
        other = f"SELECT {first}, {', '.join(items)} FROM meters WHERE ts >= _twstart AND ts < _twend"
        return f"{head}({query}) UNION ALL {other};"
    return f"{head}{query};"


TD_JOINS = [
    "JOIN meters o ON m.ts = o.ts AND m.status = o.status",
    "LEFT JOIN meters o ON m.ts = o.ts",
    "LEFT ASOF JOIN meters o",
    "LEFT ASOF JOIN meters o ON m.ts > o.ts AND m.status = o.status JLIMIT 2",
    "LEFT ASOF JOIN meters o ON o.ts >= m.ts JLIMIT 3",
    "LEFT ASOF JOIN meters o ON m.ts = o.ts",
    "LEFT WINDOW JOIN meters o WINDOW_OFFSET(-2s, 2s)",
    "LEFT WINDOW JOIN meters o ON m.status = o.status WINDOW_OFFSET(0s, 5s) JLIMIT 2",
    "LEFT WINDOW JOIN meters o WINDOW_OFFSET(-1s, 1s) JLIMIT 0",
]
TD_JOIN_AGGREGATES = [
    "count(o.current)",
    "avg(o.current)",
    "max(o.voltage)",
    "last(o.ts)",
    "sum(m.voltage)",
    "m.current",
]
TD_JOIN_ROWS = ["m.current", "o.current", "o.ts", "m.voltage - o.voltage", "o.status", "m.tbname"]


def _td_join(rng: random.Random, where: str) -> str:
    """A query over ``%%trows m`` joined with a table (docs/dialects/tdengine.md, Joins)."""
    join = rng.choice(TD_JOINS)
    aggregated = rng.random() < 0.6
    items = _items(rng, TD_JOIN_AGGREGATES if aggregated else TD_JOIN_ROWS, most=3)
    row_time = not aggregated or "WINDOW" in join  # one trigger row per result row: its time may lead
    first = "m.ts" if row_time and rng.random() < 0.6 else "_twstart"
    having = " HAVING count(o.current) > 0" if aggregated and rng.random() < 0.3 else ""
    return f"SELECT {first}, {', '.join(items)} FROM %%trows m {join}{where}{having};"


def _tdengine_join(rng: random.Random, name: str) -> str:
    trigger, data_shaped = rng.choice(TD_TRIGGERS)
    partition = " PARTITION BY tbname" if data_shaped or rng.random() < 0.5 else ""
    where = rng.choice(["", " WHERE m.current > 9", " WHERE m.voltage IS NOT NULL"])
    return f"CREATE STREAM {name} {trigger} FROM meters{partition} INTO {name}_out AS {_td_join(rng, where)}"


def _td_tail(rng: random.Random, *, aggregated: bool, window: str = "") -> str:
    """The new form's clauses after WHERE (docs/dialects/tdengine.md, A stream's query)."""
    group = rng.choice(["", "", " GROUP BY status", " PARTITION BY status", " GROUP BY location, status"])
    having = rng.choice(["", " HAVING count(*) > 1", " HAVING max(current) > 10"]) if aggregated or group else ""
    order = rng.choice(["", " ORDER BY 2 DESC", " ORDER BY current NULLS LAST, ts"])
    limit = rng.choice(["", " LIMIT 2", " LIMIT 1 OFFSET 1"]) if rng.random() < 0.6 else ""
    slimit = " SLIMIT 1" if group and rng.random() < 0.3 else ""
    return f"{group}{window}{having}{order}{slimit}{limit}"


def _iotdb(rng: random.Random, name: str) -> str:
    keys = ", device" if rng.random() < 0.5 else ""
    having = rng.choice(["", "", " HAVING count(v) > 1"])
    items = _items(rng, IOTDB_ITEMS)
    return (
        f"CREATE CONTINUOUS QUERY {name} BEGIN SELECT {', '.join(items)} INTO {name}_out FROM src "
        f"GROUP BY(10s){keys}{having} END;"
    )


def _ekuiper(rng: random.Random, name: str) -> str:
    key = "ID, " if rng.random() < 0.5 else ""
    items = (["ID"] if key and rng.random() < 0.5 else []) + _items(rng, EK_ITEMS)
    return (
        f"CREATE RULE {name} INTO {name}_out AS SELECT {', '.join(items)} FROM demo "
        f"GROUP BY {key}{rng.choice(EK_WINDOWS)};"
    )


def _fill(engine: Engine) -> None:
    secs = [0, 2, 3, 7, 8, 15, 30, 31, 32, 33, 41, 50, 58]
    meters = {
        "ts": pa.array([T0 + timedelta(seconds=s) for s in secs * 2], pa.timestamp("us", tz="UTC")),
        "tbname": pa.array(["d1"] * len(secs) + ["d2"] * len(secs)),
        "current": pa.array([None if s % 5 == 2 else 8.0 + s % 9 for s in secs * 2], pa.float64()),
        "voltage": pa.array([210 + (s * 7) % 20 for s in secs * 2], pa.int32()),
        "status": pa.array([s // 10 for s in secs * 2], pa.int32()),
        "location": pa.array(["north"] * len(secs) + ["south"] * len(secs)),
    }
    engine.storage.append("meters", pa.table(meters))
    src = {
        "ts": pa.array([T0 + timedelta(seconds=s) for s in secs], pa.timestamp("us", tz="UTC")),
        "device": pa.array(["a" if s % 2 else "b" for s in secs]),
        "v": pa.array([None if s == 7 else float(s) for s in secs], pa.float64()),
        "w": pa.array([s % 4 for s in secs], pa.int32()),
    }
    engine.storage.append("src", pa.table(src))
    demo = {
        "ID": pa.array(["x" if s % 3 else "y" for s in secs]),
        "temperature": pa.array([20.0 + s % 6 for s in secs], pa.float32()),
        "revenue": pa.array([None if s == 3 else float(s * 10) for s in secs], pa.float32()),
        "ts": pa.array([T0 + timedelta(seconds=s) for s in secs], pa.timestamp("us", tz="UTC")),
    }
    engine.storage.append("demo", pa.table(demo))


def test_every_accepted_definition_runs_or_is_refused_at_load(tmp_path, spark):
    rng = random.Random(SEED)
    sql = tmp_path / "sql"
    sql.mkdir()
    (sql / "tables.sql").write_text(TABLES)
    made = {}
    counts = {"td": TD_STREAMS, "tdj": TD_JOIN_STREAMS}
    for dialect, build in (("td", _tdengine), ("tdj", _tdengine_join), ("iot", _iotdb), ("ek", _ekuiper)):
        for i in range(counts.get(dialect, PER_DIALECT)):
            name = f"{dialect}{i}"
            made[name] = build(rng, name)
            (sql / f"{name}.sql").write_text(made[name] + "\n")
    settings = Settings(sql_dir=str(sql), warehouse=str(tmp_path / "wh"), home=str(tmp_path / ".cq"))
    engine = Engine(settings=settings, spark_session=spark)
    located = re.compile(r"^\S+\.sql:\d+:\d+: \S")
    for err in engine.catalog.errors:  # refused at load, at a place in its file
        assert located.match(str(err)), str(err)
    accepted = {d.name: d for d in engine.catalog.definitions}
    refused = set(made) - set(accepted)
    for dialect in ("td", "iot", "ek"):  # the generator makes both kinds in every dialect
        assert any(n.startswith(dialect) for n in accepted) and any(n.startswith(dialect) for n in refused)
    engine.ensure_tables()
    cursors = {}
    for name, d in accepted.items():
        if not isinstance(d, ContinuousQuery):  # streams start on the empty tables, so the rows are new
            cursors[name] = evaluate_stream(engine.ctx, d, cursor=None, now=NOW).cursor.to_json()
    _fill(engine)
    failures, wrote = [], 0
    for name, d in accepted.items():
        try:
            if isinstance(d, ContinuousQuery):
                wrote += engine.run_firing(name, T0 + timedelta(minutes=1)).rows_written
                continue
            for work in evaluate_stream(engine.ctx, d, cursor=cursors[name], now=NOW).works:
                wrote += engine.run_stream(name, work).rows_written
        except CQError as exc:  # the engine's own error: it must say which definition, and where
            if isinstance(exc, RunError) and not (name in str(exc) and f"{name}.sql" in str(exc)):
                failures.append(f"{made[name]}\n  unlocated: {exc}")
        except Exception:
            failures.append(f"{made[name]}\n{traceback.format_exc()}")
    assert not failures, "\n\n".join(failures)
    assert wrote > 0
