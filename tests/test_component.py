"""cq-engine as a Dagster Component (dagster_defs.component.CQComponent): a small dg project whose
``defs.yaml`` names the component, loaded the way ``dg`` and ``dagster`` load a project's defs folder
(``dg.load_from_defs_folder``: pyproject.toml's ``[tool.dg]``, the defs module, each ``defs.yaml``)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import dagster as dg
import pytest

SQL = """
CREATE TABLE IF NOT EXISTS sensors (ts TIMESTAMP, device STRING, temperature DOUBLE);
-- cq: freshness_grace 10m
CREATE CQ per_minute RESAMPLE EVERY 1m BEGIN
  SELECT max_value(temperature) AS m INTO per_minute_out FROM sensors GROUP BY (1m), device
END;
CREATE TABLE IF NOT EXISTS meters (ts TIMESTAMP, current DOUBLE) TAGS (location STRING);
CREATE STREAM meter_30s INTERVAL(30s) SLIDING(30s) FROM meters PARTITION BY tbname
  INTO meter_30s_out AS SELECT _twstart, count(*) AS n FROM %%trows;
"""


def _project(root: Path, name: str, attributes: str) -> Path:
    """A dg project ``name`` under ``root``: pyproject.toml, src/<name>/defs/cq_engine/defs.yaml, sql/."""
    (root / "sql").mkdir(parents=True)
    (root / "sql" / "defs.sql").write_text(SQL)
    (root / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "0.1"\n\n'
        f'[tool.dg]\ndirectory_type = "project"\n\n[tool.dg.project]\nroot_module = "{name}"\n'
    )
    package = root / "src" / name
    (package / "defs" / "cq_engine").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "defs" / "__init__.py").write_text("")
    (package / "defs" / "cq_engine" / "defs.yaml").write_text(
        "type: dagster_defs.component.CQComponent\nattributes:\n" + textwrap.indent(attributes, "  ")
    )
    return root


def _load(root: Path, name: str) -> dg.Definitions:
    sys.path.insert(0, str(root / "src"))
    try:
        return dg.load_from_defs_folder(path_within_project=root)
    finally:
        sys.path.remove(str(root / "src"))
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[module]


def test_a_defs_yaml_adds_the_definitions_assets_sensors_and_jobs(tmp_path, monkeypatch):
    monkeypatch.setenv("CQ_CONFIG", str(tmp_path / "no-cq.toml"))
    monkeypatch.delenv("CQ_TRANSLATOR", raising=False)
    root = _project(
        tmp_path / "proj",
        "cq_component_proj",
        'sql_dir: "{{ context.project_root }}/sql"\nwarehouse: ../../../../warehouse\ntimezone: Asia/Shanghai\n'
        "translator: renamed_translator:Renamed\n",
    )
    defs = _load(root, "cq_component_proj")
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    # The translator named in defs.yaml renames the per-definition switches: a continuous query's is a
    # schedule, a stream's a sensor (it holds the cursor `cq start --ignore-untreated` hands over).
    assert keys == {"per_minute_out", "meter_30s_out", "sensors", "meters"}
    assert {s.name for s in defs.sensors} == {"cq_firings", "cq_streams", "cq_health", "meter_30s_switch"}
    assert {s.name for s in defs.schedules} == {"per_minute_switch", "cq_maintenance"}
    assert {"cq_firings_job", "cq_streams_job"} <= {j.name for j in defs.resolve_all_job_defs()}
    # The attributes reach the engine's resource (relative paths from the defs.yaml's folder) ...
    resource = defs.resources["cq_engine"]
    assert (resource.sql_dir, resource.timezone) == (str(root / "sql"), "Asia/Shanghai")
    assert resource.warehouse == str(root / "warehouse")
    # ... and the health: the sink's freshness (its directive's 10m grace), its check, its location.
    sink = graph.get(dg.AssetKey("per_minute_out"))
    assert sink.freshness_policy.fail_window.to_timedelta().total_seconds() == 60 + 25 + 600
    assert sink.metadata["dagster/uri"] == str(root / "warehouse" / "per_minute_out")
    assert {c.name for c in graph.asset_check_keys} == {"cq_completeness"} and len(graph.asset_check_keys) == 2
    source = graph.get(dg.AssetKey("sensors"))
    assert [c.name for c in source.metadata["dagster/column_schema"].columns] == ["ts", "device", "temperature"]


def test_a_bad_attribute_fails_the_load_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("CQ_CONFIG", str(tmp_path / "no-cq.toml"))
    root = _project(tmp_path / "proj", "cq_component_bad", "sql_dir: sql\nwarehouse: wh\ntimezone: Mars/Olympus\n")
    with pytest.raises(Exception, match=r"defs\.yaml") as exc:  # Dagster names the component's file ...
        _load(root, "cq_component_bad")
    cause = exc.value.__cause__ or exc.value.__context__
    assert "CQ_TIMEZONE: unknown time zone 'Mars/Olympus'" in str(cause)  # ... and ours the attribute
