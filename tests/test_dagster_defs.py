"""The Dagster code location on a real ephemeral instance: schedules, tick sensors, DISCARD, runs."""

import logging
import shutil
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.test_utils import create_run_for_test
from deltalake import DeltaTable

from cq_engine.config import Settings
from cq_engine.lastgood import LastGood
from cq_engine.schedule.ticks import parse_tick_cursor
from cq_engine.times import iso
from dagster_defs import CQTranslator, build_definitions, due_firings

DATA = Path(__file__).parent / "data"
NOW = datetime(2021, 5, 11, 14, 30, tzinfo=UTC)

SQL = """
CREATE CQ every_minute RESAMPLE EVERY 1m TIMEOUT POLICY DISCARD BEGIN
  SELECT max_value(temperature) AS m INTO ln_1m FROM ln GROUP BY (1m), device END;
CREATE CQ fast RESAMPLE EVERY 20s BEGIN SELECT max_value(temperature) AS m INTO ln_fast FROM ln GROUP BY (10s), device END;
CREATE CQ fast_discard RESAMPLE EVERY 20s TIMEOUT POLICY DISCARD BEGIN
  SELECT max_value(temperature) AS m INTO ln_fast2 FROM ln GROUP BY (10s), device END;
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("dagster_defs")
    (root / "sql").mkdir()
    shutil.copy(DATA / "seed004.sql", root / "sql" / "seed004.sql")
    (root / "sql" / "more.sql").write_text(SQL)
    (root / "sql" / "broken.sql").write_text(
        "CREATE CQ broken RESAMPLE EVERY 1s\nBEGIN SELECT x AS y INTO z FROM ln WHERE time > 1 END;"
    )
    settings = Settings(
        sql_dir=str(root / "sql"), warehouse=str(root / "wh"), home=str(root / ".cq"), timezone="Asia/Shanghai"
    )
    return settings, build_definitions(settings=settings, now=NOW, run_model="per_firing")


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


def test_every_definition_gets_jobs_and_a_schedule_or_sensor(project):
    _, defs = project
    names = {j.name for j in defs.jobs}
    assert {"cq1_job", "cq1_recalculate", "every_minute_job", "fast_job"} <= names
    schedules = {s.name: s for s in defs.schedules}
    sensors = {s.name for s in defs.sensors}
    # cron can express EVERY 1m; 20s is sub-minute, so a tick sensor runs those
    assert schedules["every_minute_schedule"].cron_schedule == "* * * * *"
    assert {"fast_ticks", "cq1_ticks"} <= sensors


def test_bad_file_is_a_visible_placeholder_and_others_load(project):
    settings, defs = project
    specs = [s for a in defs.assets if isinstance(a, dg.AssetSpec) for s in [a] if s.key.path[0] == "cq_errors"]
    assert len(specs) == 1
    assert f"{settings.sql_dir}/broken.sql:2:" in specs[0].description and "time filter" in specs[0].description
    assert defs.resolve_job_def("cq5_job") is not None


def test_schedule_tick_tags_and_run_key(project, instance):
    _, defs = project
    schedule = defs.resolve_schedule_def("every_minute_schedule")
    tick = datetime(2021, 5, 11, 22, 20, tzinfo=timezone(timedelta(hours=8)))
    with dg.build_schedule_context(instance=instance, scheduled_execution_time=tick) as ctx:
        (request,) = schedule.evaluate_tick(ctx).run_requests
    assert request.run_key == "every_minute@2021-05-11T14:20:00+00:00"
    assert request.tags["cq/name"] == "every_minute"
    assert (request.tags["cq/fire_time"], request.tags["cq/range_start"], request.tags["cq/range_end"]) == (
        "2021-05-11T14:20:00+00:00",
        "2021-05-11T14:19:00+00:00",
        "2021-05-11T14:20:00+00:00",
    )


def test_discard_schedule_skips_while_a_run_is_in_flight(project, instance):
    _, defs = project
    schedule = defs.resolve_schedule_def("every_minute_schedule")
    create_run_for_test(
        instance, job_name="every_minute_job", status=dg.DagsterRunStatus.STARTED, tags={"cq/name": "every_minute"}
    )
    with dg.build_schedule_context(instance=instance, scheduled_execution_time=NOW) as ctx:
        result = schedule.evaluate_tick(ctx)
    assert not result.run_requests and "DISCARD" in result.skip_message


def test_tick_sensor_blocked_requests_every_due_firing_in_order(project, instance):
    _, defs = project
    sensor = defs.resolve_sensor_def("fast_ticks")
    due = due_firings(_definition(project, "fast"), cursor=None, now=NOW + timedelta(seconds=5))
    assert due == [NOW]
    due = due_firings(_definition(project, "fast"), cursor="2021-05-11T14:29:00+00:00", now=NOW + timedelta(seconds=5))
    assert due == [NOW - timedelta(seconds=40), NOW - timedelta(seconds=20), NOW]
    cursor = (datetime.now(UTC) - timedelta(seconds=61)).isoformat()
    with dg.build_sensor_context(instance=instance, cursor=cursor) as ctx:
        result = sensor.evaluate_tick(ctx)
    fires = [r.tags["cq/fire_time"] for r in result.run_requests]
    assert len(fires) >= 3 and fires == sorted(fires)
    assert len({r.run_key for r in result.run_requests}) == len(fires)
    assert iso(parse_tick_cursor(result.cursor)) == fires[-1]  # read back, an old bare-ISO cursor went in


def test_tick_sensor_discard_skips_and_catches_up_with_the_latest(project, instance):
    _, defs = project
    sensor = defs.resolve_sensor_def("fast_discard_ticks")
    cursor = (datetime.now(UTC) - timedelta(seconds=61)).isoformat()
    with dg.build_sensor_context(instance=instance, cursor=cursor) as ctx:
        (only,) = sensor.evaluate_tick(ctx).run_requests  # behind by 3 firings: runs just the latest
    create_run_for_test(
        instance, job_name="fast_discard_job", status=dg.DagsterRunStatus.STARTING, tags={"cq/name": "fast_discard"}
    )
    with dg.build_sensor_context(instance=instance, cursor=cursor) as ctx:
        result = sensor.evaluate_tick(ctx)
    assert not result.run_requests and "DISCARD" in result.skip_message
    assert iso(parse_tick_cursor(result.cursor)) >= only.tags["cq/fire_time"]


def test_firing_job_runs_on_spark_and_reports_the_materialization(project, instance, spark):
    settings, defs = project
    from cq_engine.engine import Engine

    Engine(settings=settings, spark_session=spark).ingest("ln", str(DATA / "ln.csv"))
    job = defs.resolve_job_def("cq1_job")
    tags = {"cq/name": "cq1", "cq/fire_time": "2021-05-11T14:18:40+00:00"}
    result = job.execute_in_process(instance=instance, tags=tags)
    assert result.success
    # No Connect server runs under the project's CQ_HOME: the run's in-process session is a fallback,
    # and its log says so once, as a warning naming where the server was looked for.
    said = [
        e for e in instance.all_logs(result.run_id) if "starts an in-process Spark session" in (e.user_message or "")
    ]
    assert [e.level for e in said] == [logging.WARNING], said
    assert f"CQ_HOME={Path(settings.home).resolve()}/spark" in said[0].user_message
    (mat,) = result.asset_materializations_for_node("cq_cq1")
    assert mat.metadata["cq/rows_written"].value == 8
    assert mat.metadata["cq/range_start"].value == "2021-05-11T14:18:20+00:00"
    assert mat.metadata["cq/source_versions"].value == {"ln": 1}
    assert "cq/notified" not in mat.metadata  # only streams notify
    # A firing that still fails after the storage's conflict retries is retried by Dagster.
    (node,) = job.graph.node_defs
    assert node.retry_policy is not None and node.retry_policy.max_retries >= 1
    assert DeltaTable(settings.table_uri("cq1_out")).version() == mat.metadata["cq/sink_version"].value
    recalc = defs.resolve_job_def("cq1_recalculate").execute_in_process(
        instance=instance,
        run_config={
            "ops": {
                "cq_cq1": {
                    "config": {"recalculate_from": "2021-05-11T22:18:00", "recalculate_to": "2021-05-11T22:19:00"}
                }
            }
        },
    )
    assert recalc.success
    (mat,) = recalc.asset_materializations_for_node("cq_cq1")
    assert mat.metadata["cq/kind"].value == "recalculate" and mat.metadata["cq/rows_written"].value == 20


def test_an_in_process_session_chosen_on_purpose_is_not_warned_about(tmp_path):
    from dagster_defs.resource import pyspark_resource

    chosen = pyspark_resource(Settings(home=str(tmp_path), spark_master="local[2]"))
    assert chosen.spark_config["spark.master"] == "local[2]" and chosen.in_process_notice == ""
    fallback = pyspark_resource(Settings(home=str(tmp_path)))
    assert fallback.spark_config["spark.master"] == "local[*]" and "`cq spark start`" in fallback.in_process_notice


def test_a_run_started_by_a_code_server_holding_a_connect_session_opens_its_classic_session(tmp_path):
    """A run is a child of the code server, whose cq_streams sensor holds a Connect session: the
    pyspark mode variables it inherits must not turn its in-process session into a demand for a
    Connect URL (while the Connect server was down every run failed with CONNECT_URL_NOT_SET)."""
    import os
    import subprocess
    import sys

    code = (
        "import dagster as dg\n"
        "from cq_engine.config import Settings\n"
        "from dagster_defs.resource import pyspark_resource\n"
        f"r = pyspark_resource(Settings(home={str(tmp_path)!r}, spark_master='local[1]'))\n"
        "r.setup_for_execution(dg.build_init_resource_context())\n"
        "print(type(r.spark_session).__module__, r.spark_session.range(3).count())\n"
    )
    env = {**os.environ, "SPARK_CONNECT_MODE_ENABLED": "1", "SPARK_REMOTE": "sc://localhost:1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["pyspark.sql.session", "3"], out.stdout


def test_translator_subclass_changes_keys_and_groups(project):
    settings, _ = project

    class Prefixed(CQTranslator):
        def get_asset_key(self, table):
            return dg.AssetKey(["lake", table])

        def get_group_name(self, definition):
            return "iot"

    defs = build_definitions(settings=settings, translator=Prefixed(), now=NOW)
    keys = {k.to_user_string() for a in defs.assets if isinstance(a, dg.AssetsDefinition) for k in a.keys}
    assert "lake/cq1_out" in keys
    (a,) = [a for a in defs.assets if isinstance(a, dg.AssetsDefinition) and dg.AssetKey(["lake", "cq1_out"]) in a.keys]
    assert a.group_names_by_key[dg.AssetKey(["lake", "cq1_out"])] == "iot"


def _definition(project, name):
    settings, _ = project
    from cq_engine.catalog import load_catalog, parse_options

    return load_catalog(settings.sql_dir, options=parse_options(settings)).definition(name)


# -- streams: sensors over the trigger table's Delta versions, PERIOD schedules -------------------

STREAMS_SQL = """
CREATE STREAM s_int INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname OPTIONS(WATERMARK(2s))
  INTO s_int_out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;
CREATE STREAM s_cnt COUNT_WINDOW(3) FROM meters PARTITION BY tbname
  INTO s_cnt_out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;
CREATE STREAM s_hist INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname OPTIONS(FILL_HISTORY)
  INTO s_hist_out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;
CREATE STREAM s_first INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname OPTIONS(FILL_HISTORY_FIRST)
  INTO s_first_out AS SELECT _twstart, count(*) AS n FROM %%trows;
CREATE STREAM s_per PERIOD(1m) FROM meters INTO s_per_out AS SELECT _tlocaltime, count(*) AS n FROM %%trows;
CREATE STREAM s_missing INTERVAL(10s) SLIDING(10s) FROM nowhere INTO s_missing_out AS SELECT _twstart, count(*) AS n FROM %%trows;
CREATE STREAM s_notify INTERVAL(10s) SLIDING(10s) FROM meters NOTIFY('ws://127.0.0.1:9/n') ON (WINDOW_CLOSE)
  AS SELECT _twstart, count(*) AS n FROM %%trows;
"""
STREAM_NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)  # streams_util.NOW


@pytest.fixture
def streams(tmp_path, spark):
    """A fresh warehouse with ``meters`` (streams_util.Bench) and the definitions built from it."""
    from streams_util import Bench

    bench = Bench(tmp_path, spark, STREAMS_SQL)
    return bench, build_definitions(settings=bench.settings, now=STREAM_NOW, run_model="per_firing")


class _StreamTick:
    """One evaluation of the shared ``cq_streams`` sensor, seen from one stream: ``cursor`` the
    sensor's (the map), ``stream_cursor`` the stream's ``StreamCursor`` JSON, ``works`` the works
    of the stream its run request holds (no Connect server here: every work goes to a run)."""

    def __init__(self, result, name: str):
        from cq_engine.streams import rounds
        from cq_engine.streams.timing import StreamWork

        self.result, self.cursor, self.skip_message = result, result.cursor, result.skip_message or ""
        state = rounds.load_cursor(result.cursor).streams.get(name) if result.cursor else None
        self.stream_cursor = state.cursor if state else None
        self.run_requests, self.works = [], []
        for request in result.run_requests:
            works = request.run_config["ops"]["cq_streams"]["config"]["works"]
            if name in works:
                self.run_requests.append(request)
                self.works = [StreamWork.from_json(w) for w in works[name]]


def _tick_sensor(defs, instance, name: str, cursor):
    """Evaluate ``cq_streams`` from ``cursor`` (the runs it requested before taken as done)."""
    from cq_engine.streams import rounds

    if cursor:
        state = rounds.load_cursor(cursor)
        for s in state.streams.values():
            s.key, s.backlog, s.since = None, [], 0.0
        cursor = state.to_json()
    with dg.build_sensor_context(instance=instance, cursor=cursor) as ctx:
        return _StreamTick(defs.resolve_sensor_def("cq_streams").evaluate_tick(ctx), name)


def _run_works(defs, instance, name: str, tick: _StreamTick) -> list[dict]:
    """Execute the stream's works of ``tick`` in ``cq_streams_job`` (its sink selected); the
    metadata of each materialization."""
    result = defs.resolve_job_def("cq_streams_job").execute_in_process(
        instance=instance,
        run_config={"ops": {"cq_streams": {"config": {"works": {name: [w.to_json() for w in tick.works]}}}}},
        asset_selection=[dg.AssetKey(_sink_of(defs, name))],
    )
    assert result.success
    return [{k: v.value for k, v in m.metadata.items()} for m in result.asset_materializations_for_node("cq_streams")]


def _sink_of(defs, name: str) -> str:
    for asset in defs.assets:
        if isinstance(asset, dg.AssetsDefinition) and asset.node_def.name == "cq_streams":
            for spec in asset.specs:
                if spec.metadata.get("cq/definition") == name:
                    return spec.key.path[0]
    raise AssertionError(name)


def _windows(rows: list[dict], *, width: int, until: datetime, members=None) -> list[tuple]:
    """Independent computation: (tbname, window start, count, round(avg current, 6)) of every
    ``width``-second window (epoch-aligned) ending at or before ``until``."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        start = datetime.fromtimestamp(r["ts"].timestamp() // width * width, UTC)
        if start + timedelta(seconds=width) <= until and (members is None or r["tbname"] in members):
            groups.setdefault((r["tbname"], start), []).append(r["current"])
    return sorted((g, s, len(v), round(sum(v) / len(v), 6)) for (g, s), v in groups.items())


def _summary(rows: list[dict]) -> list[tuple]:
    return sorted((r["tbname"], r["_twstart"], r["n"], round(r["c"], 6)) for r in rows)


def _run(defs, instance, name: str, request: dg.RunRequest):
    result = defs.resolve_job_def(f"{name}_job").execute_in_process(instance=instance, tags=request.tags)
    assert result.success
    (mat,) = result.asset_materializations_for_node(f"cq_{name}")
    return {k: v.value for k, v in mat.metadata.items()}


def test_streams_get_a_sensor_or_a_schedule_with_their_job(streams):
    _, defs = streams
    shared = defs.resolve_sensor_def("cq_streams")  # every window-triggered stream: one sensor, one job
    assert shared.job_name == "cq_streams_job" and shared.minimum_interval_seconds == 1
    for name in ("s_int", "s_cnt", "s_hist", "s_first"):
        switch = defs.resolve_sensor_def(f"{name}_ticks")  # its on/off switch
        assert "ON/OFF SWITCH of" in switch.description and "Stopped leaves it out" in switch.description
        assert f"{name}_job" not in {j.name for j in defs.jobs}  # no per-stream job selecting out of the shared asset
    schedule = defs.resolve_schedule_def("s_per_schedule")
    assert schedule.job_name == "s_per_job" and schedule.cron_schedule == "* * * * *"
    assert "s_per_ticks" not in {s.name for s in defs.sensors}
    keys = {k.to_user_string() for a in defs.assets if isinstance(a, dg.AssetsDefinition) for k in a.keys}
    sources = {a.key.to_user_string() for a in defs.assets if isinstance(a, dg.AssetSpec)}
    assert {"s_int_out", "s_cnt_out", "s_per_out", "s_notify_notifications"} <= keys and {
        "meters",
        "nowhere",
    } <= sources
    assert _sink_of(defs, "s_notify") == "s_notify_notifications"


def test_stream_sensor_skips_while_its_trigger_table_is_missing(streams, instance):
    _, defs = streams
    result = _tick_sensor(defs, instance, "s_missing", None)
    assert not result.run_requests and result.stream_cursor is None
    assert "s_missing: trigger table 'nowhere' does not exist (declare it with CREATE TABLE in " in result.skip_message


def test_interval_stream_sensor_cursor_requests_and_job_run(streams, instance):
    from streams_util import T0

    from cq_engine.streams.timing import StreamCursor, work_range
    from cq_engine.times import iso

    bench, defs = streams
    first = _tick_sensor(defs, instance, "s_int", None)  # created on the empty table
    assert not first.run_requests and "s_int: created at version 0" in first.skip_message
    assert StreamCursor.from_json(first.stream_cursor).version == 0
    assert _tick_sensor(defs, instance, "s_int", first.cursor).run_requests == []
    version = bench.append([(s, d, s / 2) for s in range(0, 25, 2) for d in ("d1", "d2")])
    result = _tick_sensor(defs, instance, "s_int", first.cursor)
    (request,) = result.run_requests
    cursor = StreamCursor.from_json(result.stream_cursor)
    assert (cursor.version, cursor.max_event, cursor.closed_until) == (
        version,
        T0 + timedelta(seconds=24),
        T0 + timedelta(seconds=22),
    )
    (work,) = result.works
    assert work.windows == ((T0, T0 + timedelta(seconds=20)),) and work.version == version  # [0, 10s), [10s, 20s)
    assert work.kind == "realtime" and "realtime" in request.tags["cq/work_kind"].split(",")
    assert tuple(iso(x) for x in work_range(bench.engine.stream("s_int"), work, "UTC")) == (
        "2026-11-21T10:00:00+00:00",
        "2026-11-21T10:00:20+00:00",
    )
    assert "dagster/priority" not in request.tags and request.run_key.startswith("cq_streams:")
    assert dg.AssetKey("s_int_out") in request.asset_selection
    again = _tick_sensor(defs, instance, "s_int", result.cursor)  # nothing new since
    assert not again.run_requests and f"s_int: no window closed or changed at version {version}" in again.skip_message

    (meta,) = _run_works(defs, instance, "s_int", result)
    expected = _windows(bench.rows(), width=10, until=T0 + timedelta(seconds=22))
    assert _summary(bench.sink("s_int_out")) == expected
    assert expected[0] == ("d1", T0, 5, 2.0) and len(expected) == 4  # [0, 10s), [10s, 20s) per meter
    assert (meta["cq/kind"], meta["cq/rows_written"], meta["cq/source_versions"]) == (
        "realtime",
        4,
        {"meters": version},
    )
    assert (meta["cq/range_start"], meta["cq/range_end"]) == ("2026-11-21T10:00:00+00:00", "2026-11-21T10:00:20+00:00")
    assert DeltaTable(bench.settings.table_uri("s_int_out")).version() == meta["cq/sink_version"]
    ledger = bench.engine.ledger.entries("s_int")
    assert [(e.kind, e.status, e.rows_written) for e in ledger] == [("realtime", "succeeded", 4)]

    # The next commit closes the next window; the run reads that commit's version.
    version = bench.append([(s, "d1", 1.0) for s in range(26, 36, 2)])
    result = _tick_sensor(defs, instance, "s_int", result.cursor)
    (work,) = result.works
    assert work.windows == ((T0 + timedelta(seconds=20), T0 + timedelta(seconds=30)),)
    _run_works(defs, instance, "s_int", result)
    assert _summary(bench.sink("s_int_out")) == _windows(bench.rows(), width=10, until=T0 + timedelta(seconds=32))


def test_count_window_stream_keeps_its_frontier_between_job_runs(streams, instance):
    from streams_util import T0

    from cq_engine.times import iso

    bench, defs = streams
    cursor = _tick_sensor(defs, instance, "s_cnt", None).cursor
    bench.append([(s, d, float(s)) for s in range(7) for d in ("d1", "d2")])
    result = _tick_sensor(defs, instance, "s_cnt", cursor)
    (work,) = result.works
    assert work.close_until == T0 + timedelta(seconds=6) and not work.windows and work.kind == "realtime"
    (meta,) = _run_works(defs, instance, "s_cnt", result)
    # Shown as the half-open range it is: from the first row (a stream created on an empty table), not 1970
    assert (meta["cq/range_start"], meta["cq/range_end"]) == (
        "2026-11-21T10:00:00+00:00",
        "2026-11-21T10:00:06+00:00",
    )
    # Windows of 3 rows per meter: [0, 1, 2] and [3, 4, 5] closed; [6] stays open.
    assert _summary(bench.sink("s_cnt_out")) == [
        (d, T0 + timedelta(seconds=k), 3, float(k + 1)) for d in ("d1", "d2") for k in (0, 3)
    ]
    assert meta["cq/rows_written"] == 4
    assert not _tick_sensor(defs, instance, "s_cnt", result.cursor).works
    bench.append([(s, "d1", float(s)) for s in (7, 8, 9)])
    result = _tick_sensor(defs, instance, "s_cnt", result.cursor)
    (meta,) = _run_works(defs, instance, "s_cnt", result)
    assert meta["cq/rows_written"] == 1  # [6, 7, 8] of d1, from the frontier the first run left
    # From the watermark the run starts after (6 s; its frontier is 6 s + 1 us) to the one it closes by
    shown = (T0 + timedelta(seconds=6), T0 + timedelta(seconds=9))
    assert (meta["cq/range_start"], meta["cq/range_end"]) == tuple(iso(x) for x in shown)
    last = bench.engine.ledger.last("s_cnt")
    assert (last.range_start, last.range_end) == shown
    assert _summary(bench.sink("s_cnt_out"))[:3] == [
        ("d1", T0 + timedelta(seconds=k), 3, float(k + 1)) for k in (0, 3, 6)
    ]


def test_fill_history_requests_carry_the_priority_tag_unless_history_first(streams, instance, monkeypatch):
    from streams_util import T0

    from cq_engine.streams import sensor as stream_sensor

    monkeypatch.setattr(stream_sensor, "HISTORY_CHUNK_ROWS", 20)
    bench, defs = streams
    bench.append([(s, d, float(s % 4)) for s in range(0, 30) for d in ("d1", "d2")])  # before the streams start
    tick = _tick_sensor(defs, instance, "s_hist", None)
    (request,) = tick.run_requests  # one run for the evaluation: s_hist's chunks and s_first's
    history = tick.works
    assert len(history) == 3 and {w.kind for w in history} == {"history"}
    assert len({w.to_json() for w in history}) == 3
    first = _StreamTick(tick.result, "s_first").works
    assert first and {w.kind for w in first} == {"history"}
    # Low priority unless a stream in it fills its history first (s_first does).
    assert "dagster/priority" not in request.tags and request.tags["cq/work_kind"] == "history"
    metas = _run_works(defs, instance, "s_hist", tick)
    assert {m["cq/kind"] for m in metas} == {"history"} and len(metas) == 3
    # Windows closed by the watermark (0 s): everything before the last row's window.
    assert _summary(bench.sink("s_hist_out")) == _windows(bench.rows(), width=10, until=T0 + timedelta(seconds=29))
    assert len(bench.sink("s_hist_out")) == 4


def test_period_stream_schedule_tick_runs_its_period(streams, instance):
    bench, defs = streams
    schedule = defs.resolve_schedule_def("s_per_schedule")
    ticks = [STREAM_NOW + timedelta(minutes=k) for k in (1, 2)]
    with dg.build_schedule_context(instance=instance, scheduled_execution_time=ticks[0] + timedelta(seconds=1)) as ctx:
        result = schedule.evaluate_tick(ctx)
    assert not result.run_requests and "is not a firing time of s_per" in result.skip_message
    requests = []
    for tick in ticks:
        with dg.build_schedule_context(instance=instance, scheduled_execution_time=tick) as ctx:
            (request,) = schedule.evaluate_tick(ctx).run_requests
        requests.append(request)
    assert [r.tags["cq/fire_time"] for r in requests] == ["2026-11-21T12:01:00+00:00", "2026-11-21T12:02:00+00:00"]
    assert requests[1].tags["cq/range_start"] == "2026-11-21T12:01:00+00:00"
    assert requests[1].run_key == "s_per@2026-11-21T12:02:00+00:00" and requests[1].tags["cq/kind"] == "stream"
    bench.append([(s, "d1", 1.0) for s in range(3)])
    meta = _run(defs, instance, "s_per", requests[0])  # the first tick sets the baseline of %%trows
    assert meta["cq/kind"] == "period" and meta["cq/rows_written"] == 0
    bench.append([(10 + s, "d2", 1.0) for s in range(5)])
    bench.append([(20 + s, "d3", 1.0) for s in range(2)])
    meta = _run(defs, instance, "s_per", requests[1])
    assert (meta["cq/rows_written"], meta["cq/range_start"], meta["cq/range_end"]) == (
        1,
        "2026-11-21T12:01:00+00:00",
        "2026-11-21T12:02:00+00:00",
    )
    assert [(r["_tlocaltime"], r["n"]) for r in bench.sink("s_per_out")] == [(ticks[1], 7)]


def test_ignore_untreated_cursor_never_requests_the_windows_written_while_stopped(streams, instance):
    """What `cq start NAME --ignore-untreated` does to the sensor's cursor (see cli_streams._control)."""
    from streams_util import T0

    from cq_engine.streams import rounds
    from cq_engine.streams.sensor import skip_untreated
    from cq_engine.streams.timing import StreamWork

    bench, defs = streams
    cursor = _tick_sensor(defs, instance, "s_int", None).cursor
    bench.append([(s, "d1", 1.0) for s in range(0, 20)])
    cursor = _tick_sensor(defs, instance, "s_int", cursor).cursor  # closes [0, 10s)
    bench.append([(s, "d1", 2.0) for s in range(30, 60)])  # while stopped: its watermark closes [30s, 50s)
    state = rounds.load_cursor(cursor)  # what the sensor adopts from the switch's cursor
    stream_state = state.streams["s_int"]
    stream_state.cursor = skip_untreated(bench.engine, bench.engine.stream("s_int"), stream_state.cursor)
    bench.append([(s, "d1", 3.0) for s in range(80, 100)])  # after the restart
    (work,) = _tick_sensor(defs, instance, "s_int", state.to_json()).works
    windows = StreamWork.from_json(work.to_json()).windows
    untreated = [(a, b) for a, b in windows if a < T0 + timedelta(seconds=50) and b > T0 + timedelta(seconds=30)]
    assert not untreated, f"requested windows {windows} cover the untreated commit's closed windows"


def test_cq_stop_names_an_unreachable_dagster(streams, monkeypatch, capsys):
    from netutil import free_port

    from cq_engine.cli.main import main

    bench, _ = streams
    for var, value in {
        "CQ_SQL_DIR": bench.settings.sql_dir,
        "CQ_WAREHOUSE": bench.settings.warehouse,
        "CQ_HOME": bench.settings.home,
    }.items():
        monkeypatch.setenv(var, value)
    port = free_port()
    assert main(["stop", "s_int", "--dagster", f"127.0.0.1:{port}"]) == 1
    assert f"cq: error: cannot reach Dagster at http://127.0.0.1:{port}/graphql" in capsys.readouterr().err


def test_stream_sensor_holds_its_cursor_while_pause_notifications_fail(tmp_path, spark, instance):
    """ON_FAILURE PAUSE: the job's run commits but cannot notify; the sensor then skips without moving
    its cursor until a retry delivers, and every event arrives once."""
    from streams_util import Bench
    from ws_recorder import Recorder

    from cq_engine.streams.timing import StreamCursor

    with Recorder() as recorder:
        bench = Bench(
            tmp_path,
            spark,
            f"""CREATE STREAM s_note INTERVAL(10s) SLIDING(10s) FROM meters
            NOTIFY('{recorder.url()}') ON (WINDOW_CLOSE) NOTIFY_OPTIONS(ON_FAILURE_PAUSE)
            INTO s_note_out AS SELECT _twstart, count(*) AS n FROM %%trows;""",
        )
        defs = build_definitions(settings=bench.settings, now=STREAM_NOW)
        cursor = _tick_sensor(defs, instance, "s_note", None).cursor
        recorder.stop()
        bench.append([(s, "d1", 1.0) for s in range(0, 25, 5)])
        result = _tick_sensor(defs, instance, "s_note", cursor)
        assert len(result.run_requests) == 1
        _run_works(defs, instance, "s_note", result)  # sink committed, its 2 closes pending
        assert len(bench.sink("s_note_out")) == 2
        bench.append([(s, "d1", 1.0) for s in range(25, 45, 5)])
        held = _tick_sensor(defs, instance, "s_note", result.cursor)
        assert not held.run_requests and held.stream_cursor == result.stream_cursor  # the cursor does not move
        assert held.skip_message.startswith("s_note paused: notification delivery failing (ws://127.0.0.1:")
        recorder.start()
        resumed = _tick_sensor(defs, instance, "s_note", result.cursor)
        assert len(resumed.run_requests) == 1
        assert StreamCursor.from_json(resumed.stream_cursor).version == 2
        assert [e["windowStart"] for e in recorder.wait_for(1) and recorder.events()] == [1795255200000, 1795255210000]
        _run_works(defs, instance, "s_note", resumed)
        recorder.wait_for(2)
        starts = [e["windowStart"] for e in recorder.events()]
        assert starts == [1795255200000, 1795255210000, 1795255220000, 1795255230000]


# -- the adapter is side-effect free; the translator is configurable -------------------------------
def _files(*roots: Path) -> set[str]:
    return {str(p) for root in roots if root.exists() for p in root.rglob("*")}


def test_importing_and_loading_the_location_writes_nothing(tmp_path):
    """A fresh process imports dagster_defs and dagster_defs.location and loads ``defs`` (a PERIOD
    stream among the definitions): nothing appears under the warehouse, and under CQ_HOME only the
    record of each file's last good version (``cq_engine.lastgood``)."""
    import os
    import subprocess
    import sys

    sql = tmp_path / "sql"
    sql.mkdir()
    shutil.copy(DATA / "seed004.sql", sql / "seed004.sql")
    (sql / "streams.sql").write_text(
        "CREATE TABLE meters (ts TIMESTAMP, current DOUBLE, tbname STRING);\n"
        "CREATE STREAM s_per PERIOD(1m) FROM meters INTO s_per_out AS "
        "SELECT _tlocaltime, count(*) AS n FROM %%trows;\n"
    )
    wh, home = tmp_path / "wh", tmp_path / "home"
    wh.mkdir()
    env = {
        **os.environ,
        "CQ_SQL_DIR": str(sql),
        "CQ_WAREHOUSE": str(wh),
        "CQ_HOME": str(home),
        "CQ_CONFIG": str(tmp_path / "none.toml"),
        "CQ_SPARK_MASTER": "local[1]",
    }
    code = (
        "import dagster_defs, dagster_defs.location as loc\n"
        "d = loc.defs()\n"
        "d.get_repository_def().load_all_definitions()  # every job resolved, as the code server does\n"
        "assert d.resolve_job_def('cq_firings_job') and d.resolve_schedule_def('s_per_ticks')\n"
        "print('loaded')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and "loaded" in out.stdout, out.stderr[-3000:]
    written = _files(wh, home)
    assert written == {str(home / "catalog")} | {str(LastGood(home).path(f)) for f in sql.glob("*.sql")}, sorted(
        written
    )
