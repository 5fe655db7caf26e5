"""A ``.sql`` file that stops loading keeps its definitions at their last good version (docs/dagster/
cq-dev.md, *Editing definitions while they run*): in the catalog, in `cq validate`'s report, in the Dagster code location
(switches, sinks, a named error asset) and in the ``cq_streams`` sensor's cursor."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pytest
from conftest import sql_project

from cq_engine.catalog import load_catalog, settings_catalog
from cq_engine.cli.main import main
from cq_engine.config import Settings
from cq_engine.lastgood import LastGood
from dagster_defs import build_definitions

TABLE = "CREATE TABLE IF NOT EXISTS sensors (ts TIMESTAMP, device STRING, temperature DOUBLE);\n"
MINE = """CREATE CQ m_a RESAMPLE EVERY 5s BEGIN
  SELECT max_value(temperature) AS m INTO m_a_out FROM sensors GROUP BY (5s), device END;
CREATE CQ m_b RESAMPLE EVERY 10s BEGIN
  SELECT count(temperature) AS n INTO m_b_out FROM sensors GROUP BY (10s), device END;
CREATE STREAM m_s INTERVAL(5s) SLIDING(5s) FROM sensors INTO m_s_out AS SELECT _twstart, count(*) AS n FROM %%trows;
"""
TYPO = "CREATE CQ m_c RESAMPLE EVERY 5s BEGIN\n  SELECT count(temperature) AS n INTO m_c_out FROM sensors GROPU BY (5s) END;\n"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def project(tmp_path, monkeypatch) -> Settings:
    return sql_project(tmp_path, monkeypatch, {"sensors.sql": TABLE, "mine.sql": MINE})


def _break(settings: Settings) -> Path:
    mine = Path(settings.sql_dir) / "mine.sql"
    mine.write_text(MINE + TYPO)
    return mine


def test_a_file_that_stops_loading_keeps_its_last_good_definitions(project):
    first = settings_catalog(project)
    assert [d.name for d in first.definitions] == ["m_a", "m_b", "m_s"] and not first.errors
    mine = _break(project)
    catalog = settings_catalog(project)
    # The same definitions, as they were (their SQL and so their code version unchanged).
    assert catalog.definitions == first.definitions
    (error,) = catalog.errors
    assert (error.file, error.line) == (str(mine), 7) and "GROPU" in error.detail
    assert error.kept == ("m_a", "m_b", "m_s") and error.names == ()
    assert "m_a, m_b, m_s keep running at the file's last good version (" in error.consequence()
    # Without its record (a fresh CQ_HOME, or a plain load) the file is out, as before.
    plain = load_catalog(project.sql_dir)
    assert [d.name for d in plain.definitions] == [] and plain.errors[0].names == ("m_a", "m_b", "m_s", "m_c")
    # Fixed, the file's current version loads and becomes its last good one.
    mine.write_text(MINE.replace("EVERY 10s", "EVERY 20s") + TYPO.replace("GROPU", "GROUP"))
    fixed = settings_catalog(project)
    assert [d.name for d in fixed.definitions] == ["m_a", "m_b", "m_s", "m_c"] and not fixed.errors
    mine.write_text("garbage")
    kept = settings_catalog(project)
    assert [d.name for d in kept.definitions] == ["m_a", "m_b", "m_s", "m_c"]
    assert kept.definition("m_b").resample.every.total_seconds() == 20
    mine.unlink()  # a file removed takes its definitions with it
    assert [d.name for d in settings_catalog(project).definitions] == []


def test_validate_reports_what_a_running_stack_keeps_and_records_nothing(project, capsys):
    settings_catalog(project)  # what the running stack loaded
    _break(project)
    store = LastGood(project.home)
    before = store.path(Path(project.sql_dir) / "mine.sql").read_text()
    assert main(["validate"]) == 1
    err = capsys.readouterr().err
    assert "mine.sql:7:" in err and "GROPU" in err
    assert "(m_a, m_b, m_s keep running at the file's last good version" in err
    (Path(project.sql_dir) / "mine.sql").write_text(MINE + TYPO.replace("GROPU", "GROUP"))
    assert main(["validate"]) == 0
    assert store.path(Path(project.sql_dir) / "mine.sql").read_text() == before  # validate never records


def test_the_code_location_keeps_the_switches_and_names_the_error(project):
    built = build_definitions(settings=project, now=NOW)
    _break(project)
    defs = build_definitions(settings=project, now=NOW)
    for name in ("m_a", "m_b"):
        assert defs.resolve_schedule_def(f"{name}_ticks") is not None  # their switches stay
    assert defs.resolve_sensor_def("m_s_ticks") is not None and defs.resolve_sensor_def("cq_streams") is not None
    keys = {k.to_user_string() for a in defs.assets if isinstance(a, dg.AssetsDefinition) for k in a.keys}
    old = {k.to_user_string() for a in built.assets if isinstance(a, dg.AssetsDefinition) for k in a.keys}
    assert {"m_a_out", "m_b_out", "m_s_out"} <= keys and keys == old
    (spec,) = [a for a in defs.assets if isinstance(a, dg.AssetSpec) and a.key.path[0] == "cq_errors"]
    assert spec.key.path == ["cq_errors", "mine_sql_load_error"]
    assert spec.description.startswith(f"This definition file failed to load:\n\n    {project.sql_dir}/mine.sql:7:")
    assert "m_a, m_b, m_s keep running at the file's last good version" in spec.description
    assert "```" not in spec.description and "**" not in spec.description  # reads the same rendered or not
    assert spec.metadata["cq/kept"] == "m_a, m_b, m_s"


def test_a_stream_a_load_error_took_out_keeps_its_cursor_in_the_sensor(project, tmp_path):
    from cq_engine.engine import Engine
    from cq_engine.streams import rounds

    (Path(project.sql_dir) / "other.sql").write_text(
        "CREATE STREAM o_s INTERVAL(5s) SLIDING(5s) FROM sensors INTO o_s_out AS SELECT _twstart, count(*) AS n FROM %%trows;\n"
    )
    Engine(settings=project).ensure_tables("sensors")
    defs = build_definitions(settings=project, now=NOW)
    with dg.instance_for_test() as instance:
        with dg.build_sensor_context(instance=instance) as ctx:
            cursor = defs.resolve_sensor_def("cq_streams").evaluate_tick(ctx).cursor
        assert {"m_s", "o_s"} <= rounds.load_cursor(cursor).streams.keys()
        # The file breaks where no last good version of it is kept (another CQ_HOME): m_s is out of the
        # location, but its place in the sensor's cursor stays for when it loads again.
        _break(project)
        elsewhere = Settings(**{**project.__dict__, "home": str(tmp_path / "other_home")})
        broken = build_definitions(settings=elsewhere, now=NOW)
        assert "m_s_ticks" not in {s.name for s in broken.sensors}
        with dg.build_sensor_context(instance=instance, cursor=cursor) as ctx:
            after = broken.resolve_sensor_def("cq_streams").evaluate_tick(ctx).cursor
        assert rounds.load_cursor(after).streams["m_s"].cursor == rounds.load_cursor(cursor).streams["m_s"].cursor
