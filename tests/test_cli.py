"""The `cq` command: thin calls into the library, clear one-line errors, non-zero exits, nothing written."""

import json
import shutil
from pathlib import Path

import pytest
from deltalake import DeltaTable

from cq_engine.cli.main import main

DATA = Path(__file__).parent / "data"


@pytest.fixture
def project(tmp_path, monkeypatch, spark):
    (tmp_path / "sql").mkdir()
    shutil.copy(DATA / "seed004.sql", tmp_path / "sql")
    for var, value in {
        "CQ_SQL_DIR": tmp_path / "sql",
        "CQ_WAREHOUSE": tmp_path / "wh",
        "CQ_HOME": tmp_path / ".cq",
        "CQ_TIMEZONE": "Asia/Shanghai",
    }.items():
        monkeypatch.setenv(var, str(value))
    monkeypatch.delenv("CQ_SPARK_REMOTE", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def cq(capsys, *args) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_validate_lists_definitions_and_reports_errors(project, capsys):
    code, out, _ = cq(capsys, "validate")
    assert code == 0 and "table  ln" in out and all(f"cq     cq{i}" in out for i in range(1, 6))
    (project / "sql" / "bad.sql").write_text(
        "CREATE CQ broken\nBEGIN SELECT max(x) AS m INTO o FROM ln GROUP BY ([0, 1), 1s) END;"
    )
    code, out, err = cq(capsys, "validate")
    assert code == 1 and "cq     cq1" in out
    assert (
        err.strip()
        == f"{project}/sql/bad.sql:2:51: GROUP BY in a continuous query takes no [start, end) range: each firing supplies its own time range"
    )


def test_plan_json(project, capsys):
    code, out, _ = cq(capsys, "plan", "cq4", "--from", "2021-05-11T22:18:30", "--count", "2", "--json")
    assert code == 0
    assert json.loads(out) == [
        {
            "fire_time": "2021-05-11T14:18:40+00:00",
            "range_start": "2021-05-11T14:18:00+00:00",
            "range_end": "2021-05-11T14:18:20+00:00",
        },
        {
            "fire_time": "2021-05-11T14:19:00+00:00",
            "range_start": "2021-05-11T14:18:20+00:00",
            "range_end": "2021-05-11T14:18:40+00:00",
        },
    ]
    code, out, _ = cq(capsys, "plan", "cq4", "--from", "1620742710000", "--count", "1")
    assert code == 0 and "2021-05-11T14:18:40+00:00" in out


def test_ingest_run_query_recalculate_show(project, capsys):
    code, out, _ = cq(capsys, "ingest", "ln", str(DATA / "ln.csv"))
    assert code == 0 and "appended 36 rows" in out
    code, out, _ = cq(capsys, "run", "cq1", "--at", "2021-05-11T22:18:40")
    assert code == 0 and "8 rows -> cq1_out v1" in out
    # The same firing on the same source version: Delta's idempotent write skips it, and the line says so.
    code, out, _ = cq(capsys, "run", "cq1", "--at", "2021-05-11T22:18:40")
    assert code == 0 and "nothing written: this firing was already committed from ln v1, so cq1_out stays at v1" in out
    code, out, _ = cq(
        capsys, "query", "SELECT device, temperature_max FROM cq1_out WHERE device LIKE '%wf01.wt01' ORDER BY time"
    )
    assert code == 0 and "181.0" in out and "180.0" in out and "(2 rows)" in out
    code, out, err = cq(capsys, "recalculate", "cq1", "--from", "2021-05-11T22:18:00", "--to", "2021-05-11T22:19:00")
    assert code == 0 and "recalculated" in out and "1/1 chunks" in err
    code, out, _ = cq(capsys, "query", "SELECT count(*) AS n FROM cq1_out")
    assert "\n20\n" in out  # windows 22:18:10..22:18:50 (22:18:00 holds no data) x 4 devices
    code, out, _ = cq(capsys, "show")
    assert code == 0 and "cq1" in out and "succeeded" in out
    cq1 = next(line for line in out.splitlines() if line.startswith("cq1 "))
    # The whole trigger, and the recalculation's range (not its kind) in the time column.
    assert "every=20s range=[-" in cq1, cq1
    assert "recalculate  [2021-05-11T14:18:00+00:00, 2021-05-11T14:19:00+00:00)" in cq1, cq1
    code, out, _ = cq(capsys, "query", "SELECT definition, kind, status FROM cq_firings ORDER BY started_at")
    assert "firing" in out and "recalculate" in out


def test_query_formats(project, capsys):
    """`--format csv` (a header, NULL empty, timestamps ISO-8601) and `--format json` (one object per
    line, keys in column order) hold exactly what the table shows."""
    assert cq(capsys, "ingest", "ln", str(DATA / "ln.csv"))[0] == 0
    sql = (
        "SELECT time, device, temperature, CAST(NULL AS DOUBLE) AS none, 'a,\"b\"' AS text, "
        "CAST('NaN' AS DOUBLE) AS nan FROM ln WHERE device LIKE '%wf01.wt01' ORDER BY time LIMIT 2"
    )
    code, out, err = cq(capsys, "query", sql, "--format", "csv")
    assert code == 0, err
    assert out.splitlines()[0] == "time,device,temperature,none,text,nan"
    first = out.splitlines()[1]
    assert (
        first.startswith("2021-05-11T14:18:14.598")
        and ",root.ln.wf01.wt01," in first
        and first.endswith(',,"a,""b""",nan')
    )
    assert len(out.splitlines()) == 3
    code, out, err = cq(capsys, "query", sql, "--format", "json")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 2 and list(rows[0]) == ["time", "device", "temperature", "none", "text", "nan"]
    assert rows[0]["time"].startswith("2021-05-11T14:18:14.598") and rows[0]["device"] == "root.ln.wf01.wt01"
    assert isinstance(rows[0]["temperature"], float) and rows[0]["none"] is None
    assert rows[0]["text"] == 'a,"b"' and rows[0]["nan"] == "NaN"
    code, out, _ = cq(capsys, "query", sql)  # the default: the table, as before
    assert code == 0 and out.splitlines()[0].split() == ["time", "device", "temperature", "none", "text", "nan"]
    assert "(2 rows)" in out and "NULL" in out
    code, _, err = cq(capsys, "query", sql, "--format", "xml")
    assert code == 2 and "invalid choice: 'xml'" in err


@pytest.mark.parametrize(
    "args,message",
    [
        (["run", "cq1", "--at", "yesterday"], "--at: 'yesterday' is not a time"),
        (["run", "cq1", "--at", "2021-05-11T22:18:45"], "is not a firing time of 'cq1'"),
        (["run", "nope", "--at", "2021-05-11T22:18:40"], "no definition named 'nope'"),
        (["plan", "cq1", "--from", "2021-13-01"], "--from: '2021-13-01' is not a time"),
        (["recalculate", "cq1", "--from", "2021-05-11T22:19:00", "--to", "2021-05-11T22:18:00"], "must be after"),
        (["query", "SELECT nope FROM nowhere"], "query failed"),
    ],
)
def test_errors_are_one_line_and_exit_non_zero(project, capsys, args, message):
    code, _out, err = cq(capsys, *args)
    assert code == 1 and message in err and err.startswith("cq: error: ") and len(err.strip().splitlines()) == 1


def test_ingest_rejects_bad_values_and_writes_nothing(project, capsys):
    bad = project / "bad.csv"
    bad.write_text("time,device,temperature\n2021-05-11T22:18:14+08:00,d1,1.5\n2021-05-11T22:18:15+08:00,d1,hot\n")
    code, _, err = cq(capsys, "ingest", "ln", str(bad))
    assert code == 1 and "'ln'" in err and "temperature" in err and "hot" in err
    table = DeltaTable(str(project / "wh" / "ln"))
    assert table.version() == 0  # created empty from its declaration, nothing appended
    code, _, err = cq(capsys, "ingest", "ln", str(project / "missing.csv"))
    assert code == 1 and "missing.csv" in err


def own_project(tmp_path, monkeypatch, sql: str):
    """A project of its own: ``sql`` in sql/defs.sql, the CQ_* variables pointing at it; its Settings."""
    from cq_engine.config import Settings

    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "defs.sql").write_text(sql)
    env = {"CQ_SQL_DIR": tmp_path / "sql", "CQ_WAREHOUSE": tmp_path / "wh", "CQ_HOME": tmp_path / ".cq"}
    for var, value in env.items():
        monkeypatch.setenv(var, str(value))
    monkeypatch.delenv("CQ_SPARK_REMOTE", raising=False)
    monkeypatch.chdir(tmp_path)
    return Settings(sql_dir=str(env["CQ_SQL_DIR"]), warehouse=str(env["CQ_WAREHOUSE"]), home=str(env["CQ_HOME"]))


def test_tick_over_empty_declared_tables_creates_them(tmp_path, monkeypatch, capsys):
    """A stream's or rule's declared trigger table is created on the first tick, as a continuous
    query's declared source is; a trigger's declared table likewise on its first delivery."""
    own_project(
        tmp_path,
        monkeypatch,
        "CREATE TABLE IF NOT EXISTS src (ts TIMESTAMP, v DOUBLE);\n"
        "CREATE STREAM s INTERVAL(1m) SLIDING(1m) FROM src INTO s_out AS SELECT _twstart, count(*) AS n "
        "FROM %%trows;\n"
        'CREATE STREAM demo (ID STRING, v DOUBLE, ts BIGINT) WITH (DATASOURCE="demo", FORMAT="json", '
        'KEY="ts", TIMESTAMP="ts");\n'
        "CREATE RULE r INTO r_out AS SELECT count(*) AS n FROM demo GROUP BY TUMBLINGWINDOW(ss, 10);\n",
    )
    for name, table in (("s", "src"), ("r", "demo")):
        code, out, err = cq(capsys, "tick", name)
        assert code == 0 and out.startswith(f"{name}: ") and not err, (out, err)
        assert DeltaTable.is_deltatable(str(tmp_path / "wh" / table))
        code, out, err = cq(capsys, "tick", name)  # and ticks cleanly again
        assert code == 0 and "does not exist" not in out + err


def test_tick_several_names_and_all(tmp_path, monkeypatch, capsys):
    """`cq tick A B` ticks each in order (one engine); a name that fails is a `cq: error:` line, the
    others still tick, and the exit is 1; `--all` ticks every definition."""
    own_project(
        tmp_path,
        monkeypatch,
        "CREATE TABLE IF NOT EXISTS src (ts TIMESTAMP, v DOUBLE);\n"
        "CREATE STREAM s INTERVAL(1m) SLIDING(1m) FROM src INTO s_out AS SELECT _twstart, count(*) AS n "
        "FROM %%trows;\n"
        "CREATE STREAM s2 INTERVAL(1m) SLIDING(1m) FROM src INTO s2_out AS SELECT _twstart, count(*) AS n "
        "FROM %%trows;\n",
    )
    code, out, err = cq(capsys, "tick", "s2", "s")
    assert code == 0 and not err, err
    assert [line.split(":")[0] for line in out.splitlines()] == ["s2", "s"], out
    code, out, err = cq(capsys, "tick", "s", "nope", "s2")
    assert code == 1 and [line.split(":")[0] for line in out.splitlines()] == ["s", "s2"], out
    assert err.startswith("cq: error: ") and "'nope'" in err and len(err.strip().splitlines()) == 1, err
    code, out, err = cq(capsys, "tick", "--all")
    assert code == 0 and sorted(line.split(":")[0] for line in out.splitlines()) == ["s", "s2"], (out, err)
    for args in ((), ("--all", "s")):
        code, _, err = cq(capsys, "tick", *args)
        assert code == 1 and err.strip() == "cq: error: name the definitions to tick, or pass --all (not both)"
    assert cq(capsys, "tick", "nope")[0] == 1  # one name: its error, as before


def test_trigger_creates_its_declared_table(tmp_path, monkeypatch):
    from datetime import UTC, datetime

    from cq_engine.engine import Engine
    from cq_engine.triggers.after import deliver_after

    engine = Engine(
        settings=own_project(
            tmp_path,
            monkeypatch,
            "CREATE TABLE IF NOT EXISTS src (ts TIMESTAMP, v DOUBLE);\n"
            "CREATE STATEFUL TRIGGER t AFTER INSERT ON src AS 'examples.triggers.journal:Journal' "
            f'WITH ("path" = "{tmp_path / "journal.jsonl"}");\n',
        )
    )
    (trigger,) = engine.catalog.triggers
    delivery = deliver_after(trigger, ctx=engine.ctx, cursor=None, now=datetime.now(UTC))
    assert "watching src from src@v0" in delivery.reason


def test_tick_reports_ignored_rows_and_the_ledger_keeps_them(tmp_path, monkeypatch, capsys):
    """History without FILL_HISTORY and late rows under IGNORE_DISORDER: `cq tick` says which rows and
    windows were ignored, why, and how to get them computed; the ledger records them (not as runs)."""
    from datetime import UTC, datetime, timedelta

    import pyarrow as pa

    from cq_engine.engine import Engine

    engine = Engine(
        settings=own_project(
            tmp_path,
            monkeypatch,
            "CREATE TABLE IF NOT EXISTS src (ts TIMESTAMP, v DOUBLE);\n"
            "CREATE STREAM s INTERVAL(1m) SLIDING(1m) FROM src OPTIONS(IGNORE_DISORDER) INTO s_out AS "
            "SELECT _twstart, count(*) AS n FROM %%trows;\n",
        )
    )
    engine.ensure_tables()
    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def append(*seconds):
        engine.storage.append(
            "src",
            pa.table(
                {
                    "ts": pa.array([t0 + timedelta(seconds=x) for x in seconds], pa.timestamp("us", tz="UTC")),
                    "v": pa.array([1.0] * len(seconds)),
                }
            ),
        )

    append(0, 10, 70)
    code, out, _ = cq(capsys, "tick", "s")
    assert code == 0 and "s: history: 3 row(s) ignored, event time [2026-01-01T00:00:00" in out
    assert "no FILL_HISTORY" in out and "`cq recalculate s --from 2026-01-01T00:00:00" in out
    append(200)
    cq(capsys, "tick", "s")
    append(20)  # late: its window closed, and IGNORE_DISORDER drops it
    code, out, _ = cq(capsys, "tick", "s")
    assert code == 0 and "s: late: 1 row(s) ignored" in out and "IGNORE_DISORDER" in out, out
    entries = engine.ledger.entries("s")
    assert [(e.kind, e.status) for e in entries if e.kind == "ignored"] == [("ignored", "ignored")] * 2
    assert "late: 1 row(s) ignored" in entries[-1].error
    assert engine.ledger.last("s").kind != "ignored"


def test_query_reads_only_the_tables_it_names(project, capsys):
    # Every view costs a snapshot read: a query registers the tables it names, not the warehouse. A
    # broken table it does not name (a log that does not parse) therefore cannot fail it.
    assert cq(capsys, "ingest", "ln", str(DATA / "ln.csv"))[0] == 0
    broken = project / "wh" / "junk" / "_delta_log"
    broken.mkdir(parents=True)
    (broken / "00000000000000000000.json").write_text("not json\n")
    code, out, err = cq(capsys, "query", "WITH x AS (SELECT device FROM ln) SELECT count(*) AS n FROM x")
    assert code == 0 and "\n36\n" in out, err
    code, _, err = cq(capsys, "query", "SELECT count(*) FROM junk")
    assert code == 1 and "junk" in err


def test_tick_reports_windows_dropped_by_true_for(tmp_path, monkeypatch, capsys, spark):
    """A closed window shorter than TRUE_FOR is dropped inside the run's Spark job; `cq tick`, the run's
    `cq/ignored` metadata and the ledger say how many and why. Later runs do not report it again."""
    from datetime import UTC, datetime, timedelta

    import pyarrow as pa

    from cq_engine.engine import Engine
    from dagster_defs.builders import materialization

    engine = Engine(
        settings=own_project(
            tmp_path,
            monkeypatch,
            "CREATE TABLE IF NOT EXISTS src (ts TIMESTAMP, st INT);\n"
            "CREATE STREAM s STATE_WINDOW(st) TRUE_FOR(10s) FROM src INTO s_out AS "
            "SELECT _twstart, count(*) AS n FROM %%trows;\n",
        ),
        spark_session=spark,
    )
    engine.ensure_tables()
    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def append(*rows):
        engine.storage.append(
            "src",
            pa.table(
                {
                    "ts": pa.array([t0 + timedelta(seconds=x) for x, _ in rows], pa.timestamp("us", tz="UTC")),
                    "st": pa.array([v for _, v in rows], pa.int32()),
                }
            ),
        )

    assert cq(capsys, "tick", "s")[0] == 0  # created on the empty table
    # st=1 lasts 20s (kept), st=2 5s (dropped), st=3 15s (kept), st=4 is open at T = 60s.
    append((0, 1), (5, 1), (20, 1), (25, 2), (30, 2), (40, 3), (55, 3), (60, 4))
    code, out, err = cq(capsys, "tick", "s")
    line = (
        "s: true_for: 1 window(s) of 2 row(s) ignored, windows starting in "
        "[2026-01-01T00:00:25+00:00, 2026-01-01T00:00:25+00:00]: shorter than TRUE_FOR 10s"
    )
    assert code == 0 and line in out, (out, err)
    assert sorted(r["n"] for r in pa.table(DeltaTable(str(tmp_path / "wh" / "s_out")).scan()).to_pylist()) == [2, 3]
    notes = [e for e in engine.ledger.entries("s") if e.kind == "ignored"]
    assert len(notes) == 1 and notes[0].status == "ignored" and line[len("s: ") :] in notes[0].error
    assert notes[0].range_start == t0 + timedelta(seconds=25)
    # The same through the engine (what a Dagster run calls) and into the run's metadata.
    append((70, 5), (72, 5), (80, 6))
    work = engine.stream("s")
    from cq_engine.streams.sensor import evaluate_stream

    cursor = (tmp_path / ".cq" / "ticks" / "s.json").read_text()
    plan = evaluate_stream(engine.ctx, work, cursor=cursor, now=datetime.now(UTC))
    (w,) = plan.works
    result = engine.run_stream("s", w)  # st=4 (0s) and st=5 (2s) closed and dropped, st=6 open
    assert result.ignored and "2 window(s) of 3 row(s) ignored" in result.ignored[0], result.ignored
    meta = materialization(work, result, engine=engine).metadata
    assert meta["cq/ignored"].data == list(result.ignored)
    # Dagster's row count is the sink's (from its Delta log's statistics), the run's rows apart.
    sink_rows = pa.table(DeltaTable(str(tmp_path / "wh" / "s_out")).scan()).num_rows
    assert meta["dagster/row_count"].value == sink_rows and meta["cq/rows_written"].value == result.rows_written
    assert {c.name for c in meta["dagster/column_schema"].columns} == set(
        pa.schema(DeltaTable(str(tmp_path / "wh" / "s_out")).schema().to_arrow()).names
    )
    (tmp_path / ".cq" / "ticks" / "s.json").write_text(plan.cursor.to_json())
    append((95, 6))  # nothing closes: nothing reported
    code, out, _ = cq(capsys, "tick", "s")
    assert code == 0 and "true_for" not in out and "1 window(s)" not in out, out


def test_validate_and_show_give_ekuiper_rules_their_own_options(tmp_path, monkeypatch, capsys):
    # TIMEOUT POLICY BLOCKED is IoTDB's word; an eKuiper rule shows its lateTolerance option instead.
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "r.sql").write_text(
        'CREATE STREAM demo (ID STRING, v FLOAT, ts BIGINT) WITH (DATASOURCE="demo", TIMESTAMP="ts");\n'
        "CREATE RULE strict INTO strict_out WITH (lateTolerance = 2000) AS SELECT count(*) AS n FROM demo "
        "GROUP BY TUMBLINGWINDOW(ss, 10);\n"
        "CREATE RULE lenient INTO lenient_out AS SELECT count(*) AS n FROM demo GROUP BY TUMBLINGWINDOW(ss, 10);\n"
    )
    for var, value in {
        "CQ_SQL_DIR": tmp_path / "sql",
        "CQ_WAREHOUSE": tmp_path / "wh",
        "CQ_HOME": tmp_path / ".cq",
    }.items():
        monkeypatch.setenv(var, str(value))
    for command in ("validate", "show"):
        code, out, _ = cq(capsys, command)
        assert code == 0 and "BLOCKED" not in out, out
        strict = next(line for line in out.splitlines() if " strict " in f" {line} ")
        lenient = next(line for line in out.splitlines() if " lenient " in f" {line} ")
        assert "lateTolerance=2s" in strict and "lateTolerance=none (late rows recomputed)" in lenient, out
