"""IoTDB-style triggers (seed 004): parsing, patterns, BEFORE INSERT in the ingest path, AFTER INSERT
through the Dagster sensor on a real instance, over real Delta tables; the CLI's `cq triggers` and
`cq drop`. The trigger classes below are loaded by the engine as 'test_triggers:<Class>'."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from typing import ClassVar

import dagster as dg
import pyarrow as pa
import pytest
from conftest import STORAGES
from deltalake import DeltaTable

from cq_engine.catalog import load_catalog
from cq_engine.cli.main import main
from cq_engine.config import Settings
from cq_engine.engine import Engine
from cq_engine.errors import ParseError
from cq_engine.ingest import ingest
from cq_engine.parse import parse_text
from cq_engine.triggers import FailureStrategy, Trigger, TriggerError, batch_info
from cq_engine.triggers import runtime as rt
from dagster_defs import build_definitions

T0 = datetime(2024, 1, 1, tzinfo=UTC)
NOW = datetime(2024, 6, 1, tzinfo=UTC)
TABLES = """
CREATE TABLE readings (ts TIMESTAMP, device STRING, value DOUBLE);
CREATE TABLE readings_b (ts TIMESTAMP, device STRING, value DOUBLE);
CREATE TABLE other (ts TIMESTAMP, device STRING, value DOUBLE);
"""


# -- trigger classes the tests' .sql files name ------------------------------------------------------
class Recorder(Trigger):
    """Records every batch (and restore) per trigger name; fails on a value equal to "fail_on"."""

    seen: ClassVar[dict[str, list]] = {}
    restores: ClassVar[dict[str, int]] = {}
    failing = True  # tests switch it off to let a retried batch through

    def on_create(self, attributes):
        self.name = attributes.name
        self.fail_on = attributes.float("fail_on", float("nan"))
        self.failure_strategy = FailureStrategy[attributes.string("strategy", "OPTIMISTIC")]

    def restore(self):
        Recorder.restores[self.name] = Recorder.restores.get(self.name, 0) + 1

    def fire(self, batch):
        info = batch_info(batch)
        Recorder.seen.setdefault(self.name, []).append((info.table, info.event, info.version, rows(batch)))
        return not (Recorder.failing and self.fail_on in batch.column("value").to_pylist())


@pytest.fixture(autouse=True)
def fresh_process():
    """Each test starts like a new process: no trigger instance, nothing recorded."""
    rt.forget_instances()
    Recorder.seen, Recorder.restores, Recorder.failing = {}, {}, True
    yield
    rt.forget_instances()


def rows(batch: pa.Table) -> list[tuple]:
    return [(r["ts"], r["device"], r["value"]) for r in batch.to_pylist()]


def batch(n: int, *, start: int = 0, value: float = 1.0) -> pa.Table:
    ts = [T0 + timedelta(seconds=start + i) for i in range(n)]
    return pa.table(
        {
            "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
            "device": [f"d{i % 2}" for i in range(n)],
            "value": [value + i for i in range(n)],
        }
    )


def project(tmp_path, sql: str, **options) -> Engine:
    (tmp_path / "sql").mkdir(exist_ok=True)
    (tmp_path / "sql" / "tables.sql").write_text(TABLES)
    (tmp_path / "sql" / "triggers.sql").write_text(sql)
    settings = Settings(
        sql_dir=str(tmp_path / "sql"), warehouse=str(tmp_path / "wh"), home=str(tmp_path / ".cq"), **options
    )
    engine = Engine(settings=settings)
    assert not engine.catalog.errors, engine.catalog.errors
    engine.ensure_tables()
    return engine


def version(engine: Engine, table: str) -> int:
    return DeltaTable(engine.storage.uri(table)).version()


def table_rows(engine: Engine, table: str) -> list[tuple]:
    return sorted(rows(pa.table(DeltaTable(engine.storage.uri(table)).scan())))


# -- parsing and the catalog ---------------------------------------------------------------------------
def test_create_trigger_parses_every_clause():
    stmt, plain = parse_text(
        "CREATE STATEFUL TRIGGER t1 AFTER INSERT ON sens** AS 'pkg.alerts.Alert'\n"
        "WITH (\"limit\" = \"100\", 'name' = 'x', level = -1.5);\n"
        "create trigger t2 before insert on meters as 'm:K'",
        file="t.sql",
    )
    assert (stmt.name, stmt.stateful, stmt.event, stmt.pattern, stmt.target) == (
        "t1",
        True,
        "after",
        "sens*",
        "pkg.alerts:Alert",
    )
    assert stmt.attributes == (("limit", "100"), ("name", "x"), ("level", "-1.5"))
    assert str(stmt.location) == "t.sql:1:1"
    assert (plain.stateful, plain.event, plain.pattern, plain.target, str(plain.location)) == (
        False,
        "before",
        "meters",
        "m:K",
        "t.sql:3:1",
    )


@pytest.mark.parametrize(
    "sql, message",
    [
        (
            "CREATE TRIGGER t BEFORE DELETE ON x AS 'm:K'",
            "1:25: only INSERT events can fire a trigger: expected INSERT, found 'DELETE'",
        ),
        (
            "CREATE TRIGGER t DURING INSERT ON x AS 'm:K'",
            "1:18: expected BEFORE INSERT or AFTER INSERT, found 'DURING'",
        ),
        ("CREATE TRIGGER t AFTER INSERT ON root.sg.* AS 'm:K'", "1:34: bad table pattern 'root.sg.*'"),
        ("CREATE TRIGGER t AFTER INSERT ON x AS m", "1:39: expected the trigger class as a string"),
        ("CREATE TRIGGER t AFTER INSERT ON x AS 'no class'", "1:39: bad trigger class 'no class'"),
        ("CREATE TRIGGER t AFTER INSERT ON x AS 'm:K' USING URI 'http://jar'", "1:45: USING URI is not supported"),
        ('CREATE TRIGGER t AFTER INSERT ON x AS \'m:K\' WITH ("a" = 1, "a" = 2)', "1:60: attribute 'a' is given twice"),
        ("CREATE TRIGGER t AFTER INSERT ON x AS 'm:K' WITH (\"a\" 1)", "expected '=' after attribute 'a'"),
        ("DROP TRIGGER t", "1:1: DROP TRIGGER is a command, not a definition: use `cq drop NAME`"),
        ("SHOW TRIGGERS", "1:1: SHOW TRIGGERS is a command, not a definition: use `cq triggers`"),
    ],
)
def test_create_trigger_errors_point_at_the_text(sql, message):
    with pytest.raises(ParseError) as err:
        parse_text(sql, file="t.sql")
    assert message in str(err.value) and str(err.value).startswith("t.sql:1:")


def test_trigger_names_are_unique_among_triggers_and_definitions(tmp_path):
    (tmp_path / "a.sql").write_text("CREATE TRIGGER watch AFTER INSERT ON x AS 'm:K';")
    (tmp_path / "b.sql").write_text("CREATE TRIGGER Watch BEFORE INSERT ON y AS 'm:K';")
    (tmp_path / "c.sql").write_text(
        "CREATE CQ watch RESAMPLE EVERY 1m BEGIN SELECT max(v) AS m INTO o FROM x GROUP BY (1m) END;"
    )
    catalog = load_catalog(tmp_path)
    assert [t.name for t in catalog.triggers] == ["watch"] and not catalog.definitions
    errors = tuple(map(str, catalog.errors))
    assert errors == (
        f"{tmp_path}/b.sql:1:1: 'Watch' is defined twice (first at {tmp_path}/a.sql:1:1): "
        "trigger names are unique among triggers and definitions",
        f"{tmp_path}/c.sql:1:1: 'watch' is defined twice (first at {tmp_path}/a.sql:1:1): "
        "trigger names are unique among triggers and definitions",
    )


def test_patterns_match_whole_names_with_star_wildcards():
    assert rt.matches("sensors", "Sensors") and not rt.matches("sensors", "sensors_1m")
    assert rt.matches("sens*", "sensors") and rt.matches("sens*", "sens") and not rt.matches("sens*", "my_sensors")
    assert rt.matches("*_1m", "sensors_1m") and not rt.matches("*_1m", "sensors_1m_old")
    assert rt.matches("a*b*c", "a_x_b_y_c") and not rt.matches("a*b*c", "a_c")
    assert rt.matches("*", "anything") and not rt.matches("x.y", "xay")  # no regex leaks through
    triggers = parse_text(
        "CREATE TRIGGER b BEFORE INSERT ON read* AS 'm:K'; CREATE TRIGGER a BEFORE INSERT ON "
        "readings AS 'm:K'; CREATE TRIGGER c AFTER INSERT ON * AS 'm:K'"
    )
    assert [t.name for t in rt.matching(triggers, table="readings", event="before")] == ["a", "b"]
    assert [t.name for t in rt.matching(triggers, table="readings_b", event="before")] == ["b"]
    assert [t.name for t in rt.matching(triggers, table="other", event="after")] == ["c"]


# -- BEFORE INSERT -----------------------------------------------------------------------------------
GUARD = """CREATE TRIGGER a_guard BEFORE INSERT ON readings* AS 'examples.triggers.guard:RangeGuard'
  WITH ("column" = "value", "min" = "0", "max" = "100"{strategy});
CREATE TRIGGER b_record BEFORE INSERT ON readings AS 'test_triggers:Recorder';
"""


@pytest.mark.parametrize("storage", list(STORAGES))
def test_pessimistic_before_trigger_rejects_the_batch_and_nothing_is_written(tmp_path, storage):
    engine = project(tmp_path, GUARD.format(strategy=""), **STORAGES[storage])
    first = ingest(table="readings", data=batch(3), engine=engine, now=NOW)
    assert (first.rows, first.trigger_failures) == (3, ())
    before = version(engine, "readings")
    with pytest.raises(TriggerError) as err:
        ingest(table="readings", data=batch(3, start=10, value=99.5), engine=engine, now=NOW)  # 99.5, 100.5, 101.5
    assert str(err.value) == (
        f"{tmp_path}/sql/triggers.sql:1:1: trigger 'a_guard' failed on 3 rows for table 'readings': ValueError: "
        "column 'value': value 100.5 in row 2 is outside [0, 100]; it is PESSIMISTIC, so nothing was written"
    )
    assert version(engine, "readings") == before and len(table_rows(engine, "readings")) == 3
    # The later trigger never saw the refused batch (PESSIMISTIC stops the pipeline); it saw the first.
    assert [(t, e, v, len(r)) for t, e, v, r in Recorder.seen["b_record"]] == [("readings", "before", None, 3)]


def test_pessimistic_rejection_through_cq_ingest(tmp_path, monkeypatch, capsys):
    engine = project(tmp_path, GUARD.format(strategy=""))
    (tmp_path / "bad.csv").write_text("ts,device,value\n2024-01-01T00:00:00Z,d1,5\n2024-01-01T00:00:01Z,d1,-3\n")
    for var, value in {
        "CQ_SQL_DIR": engine.settings.sql_dir,
        "CQ_WAREHOUSE": engine.settings.warehouse,
        "CQ_HOME": engine.settings.home,
        "CQ_CONFIG": str(tmp_path / "none.toml"),
    }.items():
        monkeypatch.setenv(var, value)
    before = version(engine, "readings")
    assert main(["ingest", "readings", str(tmp_path / "bad.csv")]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"cq: error: {tmp_path}/sql/triggers.sql:1:1: trigger 'a_guard' failed on 2 rows for table "
        "'readings': ValueError: column 'value': value -3.0 in row 2 is outside [0, 100]; it is "
        "PESSIMISTIC, so nothing was written\n"
    )
    assert version(engine, "readings") == before


def test_optimistic_before_trigger_logs_and_the_rows_are_written(tmp_path, caplog):
    engine = project(tmp_path, GUARD.format(strategy=', "failure_strategy" = "OPTIMISTIC"'))
    result = ingest(table="readings", data=batch(2, value=150), engine=engine, now=NOW)
    assert result.rows == 2 and result.version == version(engine, "readings")
    assert result.trigger_failures == (
        f"{tmp_path}/sql/triggers.sql:1:1: trigger 'a_guard' failed on 2 rows for table 'readings': ValueError: "
        "column 'value': value 150.0 in row 1 is outside [0, 100]",
    )
    assert "OPTIMISTIC, so the rows are written" in caplog.text
    assert table_rows(engine, "readings") == rows(batch(2, value=150))
    assert [len(r) for _, _, _, r in Recorder.seen["b_record"]] == [2]  # later triggers still fire
    # A table the patterns do not match fires nothing.
    ingest(table="other", data=batch(1, value=500), engine=engine, now=NOW)
    assert len(Recorder.seen["b_record"]) == 1


def test_a_trigger_that_cannot_be_created_blocks_the_write_with_its_location(tmp_path):
    engine = project(
        tmp_path,
        "CREATE TRIGGER nope BEFORE INSERT ON readings AS 'no_such_module:K';\n"
        "CREATE TRIGGER bad BEFORE INSERT ON other AS 'examples.triggers.guard:RangeGuard';",
    )
    with pytest.raises(TriggerError, match=r"triggers.sql:1:1: trigger 'nope': no module 'no_such_module'"):
        ingest(table="readings", data=batch(1), engine=engine, now=NOW)
    with pytest.raises(TriggerError, match=r"triggers.sql:2:1: trigger 'bad': needs the attribute 'column'"):
        ingest(table="other", data=batch(1), engine=engine, now=NOW)
    assert version(engine, "readings") == version(engine, "other") == 0


# -- AFTER INSERT through the Dagster sensor ---------------------------------------------------------
RECORD_AFTER = """CREATE STATEFUL TRIGGER rec AFTER INSERT ON readings* AS 'test_triggers:Recorder'
  WITH ("fail_on" = "666", "strategy" = "{strategy}");
"""


class Sensor:
    """The trigger's sensor from the code location, evaluated on a real Dagster instance; the cursor is
    kept as the daemon keeps it (only what an evaluation returns)."""

    def __init__(self, engine: Engine, name: str, instance):
        defs = build_definitions(settings=engine.settings, now=NOW)
        self.sensor = defs.resolve_sensor_def(f"{name}_trigger")
        self.instance, self.cursor = instance, None

    def tick(self):
        context = dg.build_sensor_context(instance=self.instance, cursor=self.cursor)
        result = self.sensor.evaluate_tick(context)
        assert not result.run_requests
        self.cursor = result.cursor
        return result.skip_message


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


@pytest.mark.parametrize("storage", list(STORAGES))
def test_after_trigger_gets_each_committed_version_once_in_order(tmp_path, instance, storage):
    engine = project(tmp_path, RECORD_AFTER.format(strategy="OPTIMISTIC"), **STORAGES[storage])
    ingest(table="readings", data=batch(2), engine=engine, now=NOW)  # before the trigger exists: not seen
    sensor = Sensor(engine, "rec", instance)
    assert sensor.tick().startswith("rec: created; watching readings* from ")
    assert Recorder.seen == {}
    written = []
    for i, n in enumerate((3, 1, 4)):
        data = batch(n, start=100 * (i + 1))
        written.append((ingest(table="readings", data=data, engine=engine, now=NOW).version, rows(data)))
    DeltaTable(engine.storage.uri("readings")).delete("value = 2.0")  # rewrites files, inserts nothing
    b = ingest(table="readings_b", data=batch(2, start=900), engine=engine, now=NOW)
    ingest(table="other", data=batch(2), engine=engine, now=NOW)  # not matched by readings*
    message = sensor.tick()
    seen = Recorder.seen["rec"]
    assert [(t, e, v, r) for t, e, v, r in seen if t == "readings"] == [("readings", "after", v, r) for v, r in written]
    assert [(t, v, len(r)) for t, _, v, r in seen if t != "readings"] == [("readings_b", b.version, 2)]
    assert message.startswith("rec: fired on ") and "readings v2..v4 (3 versions, 8 rows)" in message
    cursor = json.loads(sensor.cursor)["tables"]
    assert cursor == {"readings": version(engine, "readings"), "readings_b": b.version}
    assert sensor.tick() == "rec: no new rows in readings*" and len(Recorder.seen["rec"]) == 4


def test_after_trigger_resumes_after_a_restart_without_redelivery(tmp_path, instance):
    engine = project(tmp_path, RECORD_AFTER.format(strategy="OPTIMISTIC"))
    sensor = Sensor(engine, "rec", instance)
    sensor.tick()
    v1 = ingest(table="readings", data=batch(1), engine=engine, now=NOW).version
    stale = sensor.cursor  # the daemon died before it could store the next cursor
    sensor.tick()
    assert [v for _, _, v, _ in Recorder.seen["rec"]] == [v1] and Recorder.restores == {}
    rt.forget_instances()  # a new process: a new instance, restore()d as the trigger is STATEFUL
    v2 = ingest(table="readings", data=batch(2, start=50), engine=engine, now=NOW).version
    sensor.cursor = stale
    sensor.tick()
    assert Recorder.restores == {"rec": 1}
    assert [v for _, _, v, _ in Recorder.seen["rec"]] == [v1, v2]  # v1 not again: delivered.json is ahead


@pytest.mark.parametrize("strategy", ["PESSIMISTIC", "OPTIMISTIC"])
def test_after_trigger_failure_strategies(tmp_path, instance, strategy):
    engine = project(tmp_path, RECORD_AFTER.format(strategy=strategy))
    sensor = Sensor(engine, "rec", instance)
    sensor.tick()
    v = [
        ingest(table="readings", data=batch(1, start=i, value=x), engine=engine, now=NOW).version
        for i, x in enumerate((1, 666, 3))
    ]
    message = sensor.tick()
    tried = [ver for _, _, ver, _ in Recorder.seen["rec"]]
    if strategy == "OPTIMISTIC":  # logged, and delivery goes on
        assert tried == v and json.loads(sensor.cursor)["tables"]["readings"] == v[2]
        assert message.startswith(f"rec: fired on readings v{v[0]}..v{v[2]} (2 versions, 2 rows); 1 failed")
        return
    assert tried == v[:2] and json.loads(sensor.cursor)["tables"]["readings"] == v[0]
    assert message == (
        f"{tmp_path}/sql/triggers.sql:1:1: trigger 'rec' failed on version {v[1]} of table 'readings' "
        "(1 rows): fire() returned False; PESSIMISTIC: delivery stops here and retries this version "
        "next time"
    )
    sensor.tick()  # retried, still failing: the cursor stays
    assert [ver for _, _, ver, _ in Recorder.seen["rec"]] == [*v[:2], v[1]]
    Recorder.failing = False
    sensor.tick()
    assert [ver for _, _, ver, _ in Recorder.seen["rec"]] == [*v[:2], v[1], v[1], v[2]]
    assert json.loads(sensor.cursor)["tables"]["readings"] == v[2]


def test_stateful_instance_fires_one_batch_at_a_time(tmp_path):
    engine = project(tmp_path, "CREATE STATEFUL TRIGGER one BEFORE INSERT ON readings AS 'test_triggers:Recorder'")
    threads = [
        threading.Thread(
            target=ingest, kwargs={"table": "readings", "data": batch(1, start=i), "engine": engine, "now": NOW}
        )
        for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(Recorder.seen["one"]) == 4 and len(table_rows(engine, "readings")) == 4


def test_alert_example_raises_alerts_on_threshold_changes_exactly_once(tmp_path, instance):
    engine = project(
        tmp_path,
        "CREATE STATEFUL TRIGGER alarm AFTER INSERT ON readings AS "
        '\'examples.triggers.alert:ThresholdAlert\' WITH ("warning" = "50", '
        '"critical" = "100", "labels" = "device");',
    )
    sensor = Sensor(engine, "alarm", instance)
    sensor.tick()

    def feed(*values, start):
        data = pa.table(
            {
                "ts": pa.array(
                    [T0 + timedelta(seconds=start + i) for i in range(len(values))], pa.timestamp("us", tz="UTC")
                ),
                "device": ["d1"] * len(values),
                "value": list(values),
            }
        )
        return ingest(table="readings", data=data, engine=engine, now=NOW).version

    v1 = feed(10, 60, 70, 120, start=0)  # warning, then critical (70 stays warning: no new alert)
    sensor.tick()
    alerts_uri = f"{engine.settings.warehouse}/alerts"

    def alerts():
        return sorted(
            (r["ts"], r["severity"], r["value"], r["version"])
            for r in pa.table(DeltaTable(alerts_uri).scan()).to_pylist()
        )

    assert alerts() == [
        (T0 + timedelta(seconds=1), "warning", 60.0, v1),
        (T0 + timedelta(seconds=3), "critical", 120.0, v1),
    ]
    # A restarted process restores the state (critical) from the alerts table: 130 raises nothing new.
    rt.forget_instances()
    stale = sensor.cursor
    v2 = feed(130, 20, start=10)
    sensor.tick()
    assert alerts()[2:] == [(T0 + timedelta(seconds=11), "resolved", 20.0, v2)]
    # Redelivery after a crash (engine progress lost, the daemon's cursor behind): no duplicate alert.
    rt.forget_instances()
    (rt.state_dir(engine.settings, "alarm") / "delivered.json").unlink()
    sensor.cursor = stale
    sensor.tick()
    assert len(alerts()) == 3


# -- CLI: cq validate, cq triggers, cq drop ---------------------------------------------------------
def test_cli_triggers_validate_and_drop(tmp_path, monkeypatch, capsys, instance):
    journal = tmp_path / "journal.jsonl"
    engine = project(
        tmp_path,
        f"CREATE STATEFUL TRIGGER jot AFTER INSERT ON readings AS "
        f'\'examples.triggers.journal:Journal\' WITH ("path" = "{journal}");\n'
        "CREATE TRIGGER guard BEFORE INSERT ON read* AS 'examples.triggers.guard:RangeGuard' "
        'WITH ("column" = "value", "min" = "5", "max" = "1");',
    )
    for var, value in {
        "CQ_SQL_DIR": engine.settings.sql_dir,
        "CQ_WAREHOUSE": engine.settings.warehouse,
        "CQ_HOME": engine.settings.home,
        "CQ_CONFIG": str(tmp_path / "none.toml"),
    }.items():
        monkeypatch.setenv(var, value)
    assert main(["validate"]) == 0  # runs no trigger code: the modules are only looked for
    out, err = capsys.readouterr()
    assert "trigger jot" in out and "AFTER INSERT ON readings AS examples.triggers.journal:Journal  STATEFUL" in out
    assert err == ""
    assert main(["validate", "--check-triggers"]) == 1  # imports the classes and calls validate()
    err = capsys.readouterr().err
    assert err == f"{tmp_path}/sql/triggers.sql:2:1: trigger 'guard': min (5) is above max (1)\n"
    Sensor(engine, "jot", instance).tick()
    assert main(["triggers"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "event", "type", "state", "pattern", "class", "runs", "in", "tables"]
    assert lines[2].split() == [
        "jot",
        "AFTER_INSERT",
        "STATEFUL",
        "ACTIVE",
        "readings",
        "examples.triggers.journal:Journal",
        "sensor",
        "jot_trigger",
        "readings@v0",
    ]
    assert lines[3].split()[:5] == ["guard", "BEFORE_INSERT", "STATELESS", "INACTIVE", "read*"]

    assert main(["drop", "jot"]) == 1
    assert capsys.readouterr().err == (
        f"cq: error: trigger 'jot' is defined at {tmp_path}/sql/triggers.sql:1:1: remove "
        "that statement (or its file), then `cq drop jot` calls its on_drop()\n"
    )
    (tmp_path / "sql" / "triggers.sql").write_text("")
    assert main(["triggers"]) == 0
    assert capsys.readouterr().out.splitlines()[2].split()[:4] == ["jot", "AFTER_INSERT", "STATEFUL", "DROPPING"]
    assert main(["drop", "jot"]) == 0
    assert json.loads(capsys.readouterr().out)["on_drop"] == "called"
    assert [json.loads(line)["event"] for line in journal.read_text().splitlines()] == ["drop"]
    assert not rt.state_dir(engine.settings, "jot").exists()
    assert main(["drop", "jot"]) == 1  # gone: the ordinary `cq drop` answer
    assert "no definition named 'jot'" in capsys.readouterr().err
