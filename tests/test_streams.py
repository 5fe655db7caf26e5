"""Streams end to end: a .sql file → the sensor over Delta versions → one Spark job per run → the sink,
asserted after every tick against reference computations over the table's rows."""

import json
import random
from pathlib import Path

import pytest
import window_reference as ref
from streams_util import NOW, T0, Bench, M, S, reference, sink_summary, us

from cq_engine.cli.main import main
from cq_engine.errors import CQError
from cq_engine.streams import sensor as stream_sensor

# Storage-sensitive: a representative subset runs on Spark's Delta connector and on delta-rs with the
# same expectations (on_both_storages); the rest on delta-rs only, to keep the suite's time.
BOTH = pytest.mark.usefixtures("on_both_storages")

INTERVAL_SQL = """
CREATE STREAM s_int INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname OPTIONS(WATERMARK(10s) | DELETE_RECALC)
  INTO s_int_out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;
"""
MINUTE = 60_000_000


def interval_ref(bench, until, *, interval=MINUTE, sliding=MINUTE, **kw):
    return reference(
        bench.rows(), ref.interval_windows, interval=interval, sliding=sliding, offset=0, until=us(until), **kw
    )


@BOTH
def test_interval_stream_closes_by_watermark_recomputes_late_rows_and_deletes(tmp_path, spark):
    b = Bench(tmp_path, spark, INTERVAL_SQL)
    assert b.tick("s_int").works == ()  # created on an empty table
    b.append([(s, d, float(s % 7)) for s in range(0, 55, 5) for d in ("d1", "d2")])
    b.tick("s_int")
    assert b.sink("s_int_out") == []  # T = 40s: nothing closed
    b.append([(s, d, float(s % 5)) for s in range(60, 155, 5) for d in ("d1", "d2")])
    plan = b.tick("s_int")
    assert len(plan.works) == 1
    expected = interval_ref(b, T0 + 140 * S)
    assert sink_summary(b.sink("s_int_out")) == expected and len(expected) == 4  # [0, 1m), [1m, 2m) x 2
    # A late row lands in a closed window: exactly that window is recomputed.
    b.append([(32, "d1", 100.0)])
    plan = b.tick("s_int")
    assert plan.works[0].windows == ((T0, T0 + M),)
    assert sink_summary(b.sink("s_int_out")) == interval_ref(b, T0 + 140 * S)
    assert next(r for r in b.sink("s_int_out") if r["tbname"] == "d1" and r["_twstart"] == T0)["n"] == 12
    # DELETE_RECALC: deleting rows of closed windows recomputes them.
    b.delete("current >= 4 AND ts < '2026-11-21T10:02:00Z'")
    plan = b.tick("s_int")
    assert sink_summary(b.sink("s_int_out")) == interval_ref(b, T0 + 140 * S)
    assert {r["tbname"] for r in b.sink("s_int_out")} == {"d1", "d2"}
    # Running the same work again (a retry) changes nothing: it reads the same snapshot version.
    before = b.sink("s_int_out")
    b.engine.run_stream("s_int", plan.works[0])
    b.engine.run_stream("s_int", plan.works[0])
    assert sink_summary(b.sink("s_int_out")) == sink_summary(before)


@BOTH
def test_old_form_seed_avg_vol_s_ignores_expired_rows_by_default(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        """CREATE STREAM avg_vol_s INTO avg_vol AS
        SELECT _wstart, count(*), avg(voltage) FROM meters PARTITION BY tbname INTERVAL(1m) SLIDING(30s);""",
    )
    b.tick("avg_vol_s")
    b.append([(s, d, 1.0, 200 + s % 11) for s in range(0, 185, 5) for d in ("d1001", "d1002")])
    b.tick("avg_vol_s")
    rows = b.sink("avg_vol")
    assert set(rows[0]) == {"_wstart", "count", "avg_voltage", "tbname", "group_id"}
    # Windows [k*30s, k*30s + 1m) closed by T = 180s: starts -30s .. 120s.
    assert sorted({r["_wstart"] for r in rows}) == [T0 + k * 30 * S for k in range(-1, 5)]
    data = [r for r in b.rows() if r["tbname"] == "d1001"]
    for r in [x for x in rows if x["tbname"] == "d1001"]:
        inside = [x["voltage"] for x in data if r["_wstart"] <= x["ts"] < r["_wstart"] + M]
        assert (r["count"], r["avg_voltage"]) == (len(inside), sum(inside) / len(inside))
    b.append([(10, "d1001", 1.0, 999)])  # IGNORE EXPIRED 1 (the old form's default): not recomputed
    b.tick("avg_vol_s")
    assert b.sink("avg_vol") == rows


def _random_commits(seed: int):
    """Three in-order commits, then one with late rows, for two meters; unique seconds per meter."""
    rng = random.Random(seed)
    times = {d: sorted(rng.sample(range(0, 900), 120)) for d in ("d1", "d2")}
    batches = [[], [], [], []]
    for d, ts in times.items():
        late = set(rng.sample(ts[:60], 8))
        for t in ts:
            row = (t, d, round(rng.uniform(0, 8), 2), rng.randint(-3, 12), rng.choice([0, 0, 1, 1, None]))
            batches[3 if t in late else min(2, t // 300)].append(row)
    return batches


DATA_SHAPED = {
    "session": ("SESSION(ts, 9s)", lambda until: dict(window_fn=ref.session_windows, gap=9_000_000, until=until)),
    "state": (
        "STATE_WINDOW(status) TRUE_FOR(5s)",
        lambda until: dict(window_fn=ref.state_windows, state=lambda r: r["status"], true_for=5_000_000, until=until),
    ),
    "event": (
        "EVENT_WINDOW(START WITH current > 5 END WITH current < 2)",
        lambda until: dict(
            window_fn=ref.event_windows,
            start=lambda r: r["current"] > 5,
            end=lambda r: r["current"] < 2,
            true_for=None,
            until=until,
            open_cols=(),
            close_cols=(),
        ),
    ),
    "count": (
        "COUNT_WINDOW(4, 2)",
        lambda until: dict(window_fn=ref.count_windows, count=4, slide=2, columns=(), until=until),
    ),
}


@pytest.mark.parametrize("kind", sorted(DATA_SHAPED))
def test_data_shaped_streams_match_the_reference_after_every_tick(tmp_path, spark, kind):
    trigger, params = DATA_SHAPED[kind]
    b = Bench(
        tmp_path,
        spark,
        f"""CREATE STREAM s {trigger} FROM meters PARTITION BY tbname
        OPTIONS(WATERMARK(3s) | DELETE_RECALC) INTO s_out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;""",
    )
    b.tick("s")
    for batch in _random_commits(seed=len(kind)):
        b.append(batch)
        b.tick("s")
        until = max(r["ts"] for r in b.rows()) - 3 * S
        kw = params(us(until))
        assert sink_summary(b.sink("s_out")) == reference(b.rows(), kw.pop("window_fn"), **kw), kind
    b.delete("current > 6 AND ts < '2026-11-21T10:05:00Z'")
    b.tick("s")
    kw = params(us(until))
    assert sink_summary(b.sink("s_out")) == reference(b.rows(), kw.pop("window_fn"), **kw), kind
    frontier = tmp_path / "wh" / "_cq" / "streams" / "s" / "frontier"
    assert frontier.is_dir()


@BOTH
def test_seed_streams0_event_and_streams1_count_windows(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        """
        CREATE STREAM streams0 INTO streamt0 AS
          SELECT _wstart, count(*), avg(voltage) from meters PARTITION BY tbname EVENT_WINDOW START WITH voltage < 0 END WITH voltage > 9;
        CREATE STREAM streams1 IGNORE EXPIRED 1 WATERMARK 100s INTO streamt1 AS
          SELECT _wstart, count(*), avg(voltage) from meters PARTITION BY tbname COUNT_WINDOW(10);""",
    )
    b.tick("streams0"), b.tick("streams1")
    voltages = [5, -1, 3, 4, 10, 2, -2, 11, 0, -5, 1, 1]
    b.append([(i, "d1001", 1.0, v) for i, v in enumerate(voltages)] + [(200 + i, "d1001", 1.0, 1) for i in range(12)])
    b.tick("streams0"), b.tick("streams1")
    # Event windows: [-1, 3, 4, 10] and [-2, 11]; the one opened by -5 is still open.
    assert [(r["_wstart"], r["count"], r["avg_voltage"]) for r in b.sink("streamt0")] == [
        (T0 + 1 * S, 4, 4.0),
        (T0 + 6 * S, 2, 4.5),
    ]
    # Count windows of 10 rows, closed once the 10th row is at or before T = 211s - 100s.
    assert [(r["_wstart"], r["count"]) for r in b.sink("streamt1")] == [(T0, 10)]


def test_max_delay_writes_partial_results_of_open_windows(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        """CREATE STREAM s INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname
        OPTIONS(WATERMARK(30s) | MAX_DELAY(10s)) INTO out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;""",
    )
    b.tick("s", NOW)
    b.append([(s, "d1", 1.0) for s in range(0, 85, 5)])
    b.tick("s", NOW + 5 * S)  # T = 50s, MAX_DELAY not yet due
    assert b.sink("out") == []
    b.tick("s", NOW + 11 * S)
    assert [(r["_twstart"], r["n"]) for r in b.sink("out")] == [(T0, 12), (T0 + M, 5)]  # partial results
    b.append([(s, "d1", 2.0) for s in range(85, 105, 5)])
    b.tick("s", NOW + 15 * S)  # T = 70s closes [0, 1m); MAX_DELAY not due again
    assert [(r["_twstart"], r["n"]) for r in b.sink("out")] == [(T0, 12), (T0 + M, 5)]
    b.tick("s", NOW + 30 * S)
    assert [(r["_twstart"], r["n"]) for r in b.sink("out")] == [(T0, 12), (T0 + M, 9)]


@pytest.mark.parametrize("option", ["FILL_HISTORY", "FILL_HISTORY_FIRST", "FILL_HISTORY('2026-11-21T10:02:00Z')"])
def test_fill_history_computes_existing_data_in_chunks(tmp_path, spark, monkeypatch, option):
    monkeypatch.setattr(stream_sensor, "HISTORY_CHUNK_ROWS", 20)
    b = Bench(
        tmp_path,
        spark,
        f"""CREATE STREAM s INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname
        OPTIONS({option}) INTO out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;""",
    )
    b.append([(s, d, float(s % 3)) for s in range(0, 300, 10) for d in ("d1", "d2")])
    plan = b.tick("s")
    assert len(plan.works) == 3 and {w.kind for w in plan.works} == {"history"}
    expected = interval_ref(b, T0 + 290 * S)
    if "(" in option:
        expected = [e for e in expected if e[1] >= T0 + 2 * M]
    assert sink_summary(b.sink("out")) == expected


def test_without_fill_history_existing_data_is_not_computed(tmp_path, spark):
    # TDengine computes only what arrives after the stream's creation: the windows open then ([4m, 5m)
    # for d1 and d2) count only the rows written later, and one holding none of them is not written.
    b = Bench(tmp_path, spark, INTERVAL_SQL)
    b.append([(s, "d1", 1.0) for s in range(0, 300, 10)] + [(s, "d2", 1.0) for s in range(250, 280, 10)])
    assert b.tick("s_int").works == ()
    b.append([(295, "d1", 1.0)] + [(s, "d1", 1.0) for s in range(300, 400, 10)])
    b.tick("s_int")
    assert [(r["_twstart"], r["tbname"], r["n"]) for r in b.sink("s_int_out")] == [
        (T0 + 4 * M, "d1", 1),
        (T0 + 5 * M, "d1", 6),
    ]


def test_old_form_at_once_recomputes_open_windows_at_every_commit(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        """CREATE STREAM s TRIGGER AT_ONCE INTO out AS
        SELECT _wstart, count(*) AS n, avg(current) AS c FROM meters PARTITION BY tbname INTERVAL(1m);""",
    )
    b.tick("s")
    b.append([(s, "d1", 1.0) for s in range(0, 70, 10)])
    b.tick("s")
    assert [(r["_wstart"], r["n"]) for r in b.sink("out")] == [(T0, 6), (T0 + M, 1)]
    b.append([(s, "d1", 1.0) for s in range(70, 100, 10)])
    b.tick("s")
    assert [(r["_wstart"], r["n"]) for r in b.sink("out")] == [(T0, 6), (T0 + M, 4)]


def test_force_window_close_closes_windows_by_processing_time(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        """CREATE STREAM s TRIGGER FORCE_WINDOW_CLOSE INTO out AS
        SELECT _wstart, count(*) AS n, avg(current) AS c FROM meters PARTITION BY tbname INTERVAL(1m);""",
    )
    b.tick("s", T0)
    b.append([(s, "d1", 1.0) for s in range(0, 30, 10)])
    b.tick("s", T0 + 40 * S)
    assert b.sink("out") == []
    b.append([(s, "d1", 1.0) for s in range(30, 90, 10)])
    b.tick("s", T0 + 2 * M + S)  # no event time reached 2m, but the clock did
    assert [(r["_wstart"], r["n"]) for r in b.sink("out")] == [(T0, 6), (T0 + M, 3)]
    b.append([(5, "d1", 1.0)])  # computed once: late rows never recompute
    b.tick("s", T0 + 2 * M + 2 * S)
    assert [(r["_wstart"], r["n"]) for r in b.sink("out")] == [(T0, 6), (T0 + M, 3)]


def test_continuous_window_close_recalculates_periodically(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        """CREATE STREAM s TRIGGER CONTINUOUS_WINDOW_CLOSE 10m IGNORE EXPIRED 0 INTO out AS
        SELECT _wstart, count(*) AS n, avg(current) AS c FROM meters PARTITION BY tbname INTERVAL(1m);""",
    )
    b.tick("s", NOW)
    b.append([(s, "d1", 1.0) for s in range(0, 130, 10)])
    b.tick("s", NOW + M)
    assert [(r["_wstart"], r["n"]) for r in b.sink("out")] == [(T0, 6), (T0 + M, 6)]
    b.append([(15, "d1", 1.0)])
    b.tick("s", NOW + 2 * M)  # changed, but the recalculation period has not passed
    assert [r["n"] for r in b.sink("out")] == [6, 6]
    b.tick("s", NOW + 11 * M)
    assert [r["n"] for r in b.sink("out")] == [7, 6]


def test_pre_filter_expired_time_and_window_open(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        """
        CREATE STREAM pre INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname
          OPTIONS(PRE_FILTER(current > 1) | EXPIRED_TIME(1m)) INTO pre_out AS SELECT _twstart, count(*) AS n FROM %%trows;
        CREATE STREAM opened INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname
          OPTIONS(EVENT_TYPE(WINDOW_OPEN)) INTO opened_out AS SELECT _twstart, count(*) AS n FROM %%trows;""",
    )
    b.tick("pre"), b.tick("opened")
    b.append([(s, "d1", float(s % 20 == 0) * 5) for s in range(0, 250, 10)])
    b.tick("pre"), b.tick("opened")
    assert [(r["_twstart"], r["n"]) for r in b.sink("pre_out")] == [(T0 + k * M, 3) for k in range(4)]
    # WINDOW_OPEN: every window is computed when its first rows arrive (here: all of them at once).
    assert [(r["_twstart"], r["n"]) for r in b.sink("opened_out")] == [(T0 + k * M, 6) for k in range(4)] + [
        (T0 + 4 * M, 1)
    ]
    b.append([(5, "d1", 9.0), (200, "d1", 9.0), (260, "d1", 1.0)])  # 5s is older than T - EXPIRED_TIME
    b.tick("pre"), b.tick("opened")
    assert [(r["_twstart"], r["n"]) for r in b.sink("pre_out")] == [(T0 + k * M, 3) for k in range(3)] + [
        (T0 + 3 * M, 4)
    ]
    # No window opened; the late rows (disorder is not ignored) recompute the closed windows they fall in.
    assert [r["n"] for r in b.sink("opened_out")] == [7, 6, 6, 7, 1]


@BOTH
def test_period_stream_reads_the_rows_committed_since_the_previous_tick(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        """
        CREATE STREAM per PERIOD(1m, 5s) FROM meters INTO per_out AS SELECT _tlocaltime, count(*) AS n, _tprev_localtime AS prev FROM %%trows;
        CREATE STREAM whole PERIOD(1m) INTO whole_out AS SELECT _tlocaltime, count(*) AS n FROM meters;""",
    )
    b.append([(s, "d1", 1.0) for s in range(5)])
    tick = NOW + 5 * S
    b.engine.run_period("per", tick)
    assert b.sink("per_out") == []  # the first tick sets the baseline: no rows since a previous tick
    b.append([(10 + s, "d1", 1.0) for s in range(3)])
    b.append([(20 + s, "d2", 1.0) for s in range(2)])
    b.engine.run_period("per", tick + M)
    b.engine.run_period("per", tick + M)  # a retried tick reads the same versions
    assert [(r["_tlocaltime"], r["n"], r["prev"]) for r in b.sink("per_out")] == [(tick + M, 5, tick)]
    with pytest.raises(CQError, match="is not a PERIOD tick of 'per'; next: 2026-11-21T12:01:05"):
        b.engine.run_period("per", NOW + M)
    b.engine.run_period("whole", NOW)
    assert [r["n"] for r in b.sink("whole_out")] == [10]
    with pytest.raises(CQError, match="PERIOD stream: RECALCULATE applies to every other trigger type"):
        b.engine.recalculate("per", start=T0)


@BOTH
def test_a_period_tick_run_by_two_batch_runs_at_once_is_committed_and_recorded_once(tmp_path, spark):
    """Two batch runs holding the same PERIOD tick (a launch that timed out and was retried, a lost
    cursor): the sink's idempotent-write identity lets one commit it; the other skips it
    (``AlreadyCommitted``) and records nothing, as a continuous query's firing is."""
    import queue
    import threading

    from cq_engine.engine import Engine
    from cq_engine.resample.rounds import execute_rounds

    b = Bench(
        tmp_path,
        spark,
        "CREATE STREAM whole PERIOD(1m) INTO whole_out AS SELECT _tlocaltime, count(*) AS n FROM meters;",
    )
    b.append([(s, "d1", 1.0) for s in range(4)])
    runs = [b.engine, Engine(settings=b.settings, spark_session=spark)]  # two runs' engines

    def batch(engine, tick, before_commit=None):
        if before_commit is not None:  # both runs have computed the tick before either commits
            real = engine.storage.replace_where
            engine.storage.replace_where = lambda *a, **kw: (before_commit.wait(timeout=120), real(*a, **kw))[1]
        out: queue.Queue = queue.Queue()
        execute_rounds(engine, {"whole": [tick]}, {}, out)
        return _drained(out)

    def succeeded(tick):
        return [e for e in runs[0].ledger.entries("whole") if e.fire_time == tick and e.status == "succeeded"]

    # One after the other: the second run finds the tick in the sink and skips it.
    assert batch(runs[0], NOW) == [("ok", "RunResult")]
    assert batch(runs[1], NOW) == [("skipped", "AlreadyCommitted")]
    assert len(succeeded(NOW)) == 1 and [r["n"] for r in b.sink("whole_out")] == [4]

    # At the same time: both compute, both commit; exactly one commit lands.
    b.append([(70, "d1", 1.0)])
    barrier = threading.Barrier(2)
    seen: list = []
    threads = [threading.Thread(target=lambda e=e: seen.extend(batch(e, NOW + M, barrier))) for e in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert sorted(seen) == [("ok", "RunResult"), ("skipped", "AlreadyCommitted")], seen
    assert len(succeeded(NOW + M)) == 1
    assert sorted(r["n"] for r in b.sink("whole_out")) == [4, 5]
    # One commit per tick in the sink's log (each carries the tick's application transaction).
    log = Path(b.settings.table_uri("whole_out")) / "_delta_log"
    ticks = [
        json.loads(line)["txn"]["version"]
        for f in sorted(log.glob("*.json"))
        for line in f.read_text().splitlines()
        if '"txn"' in line and "cq-engine/whole/period" in line
    ]
    assert sorted(ticks) == [us(NOW), us(NOW + M)], ticks


def _drained(out) -> list[tuple[str, str]]:
    items = []
    while not out.empty():
        kind, _d, _fire, value = out.get_nowait()
        items.append((kind, type(value).__name__))
    return items


@BOTH
def test_recalculate_stream_and_cq_tick(tmp_path, spark, monkeypatch, capsys):
    b = Bench(tmp_path, spark, INTERVAL_SQL)
    b.tick("s_int")
    b.append([(s, d, 2.0) for s in range(0, 200, 10) for d in ("d1", "d2")])
    b.tick("s_int")
    expected = sink_summary(b.sink("s_int_out"))
    b.engine.storage.replace_range(
        "s_int_out",
        b.engine.storage.schema("s_int_out").empty_table(),
        time_column="_twstart",
        time_range=(T0, T0 + 10 * M),
        app_id="test",
        app_version=1,
    )
    r = b.engine.recalculate("s_int", start=T0 + 30 * S, end=T0 + 2 * M)
    assert r.kind == "recalculate" and r.rows_written == 4
    assert sink_summary(b.sink("s_int_out")) == [e for e in expected if e[1] < T0 + 2 * M]
    for var, value in {
        "CQ_SQL_DIR": b.settings.sql_dir,
        "CQ_WAREHOUSE": b.settings.warehouse,
        "CQ_HOME": b.settings.home,
    }.items():
        monkeypatch.setenv(var, value)
    b.append([(s, "d1", 2.0) for s in range(200, 300, 10)])
    assert main(["tick", "s_int", "--at", "2026-11-21T12:00:00Z"]) == 0
    out = capsys.readouterr().out
    assert "s_int: created at version" in out
    b.append([(s, "d1", 2.0) for s in range(300, 400, 10)])
    assert main(["tick", "s_int"]) == 0
    out = capsys.readouterr().out
    assert "windows starting in [2026-11-21T10:04:00+00:00, 2026-11-21T10:06:00+00:00)" in out and "realtime run" in out
    # The cursor is replaced atomically (no temp file left) and a truncated one is an error naming
    # the file, not a silent restart that would skip the windows closed meanwhile.
    cursor = tmp_path / ".cq" / "ticks" / "s_int.json"
    assert cursor.read_text().startswith("{") and [p.name for p in cursor.parent.iterdir()] == ["s_int.json"]
    saved = cursor.read_text()
    for bad in ("", '{"version": 3'):
        cursor.write_text(bad)
        assert main(["tick", "s_int"]) == 1
        err = capsys.readouterr().err
        assert f"{cursor}: " in err and ("empty" in err or "unreadable" in err) and "Traceback" not in err
    cursor.write_text(saved)
    # DROP STREAM: a defined stream is dropped by removing its statement; its outputs stay.
    assert main(["drop", "s_int"]) == 1
    assert "s_int' is defined at" in capsys.readouterr().err
    (tmp_path / "sql" / "s.sql").write_text(
        "CREATE TABLE meters (ts TIMESTAMP, current DOUBLE) TAGS (location STRING);"
    )
    assert main(["drop", "s_int"]) == 0
    assert '"outputs": "kept"' in capsys.readouterr().out and b.sink("s_int_out")


def test_sliding_only_trigger_placeholders_follow_the_daily_ticks(tmp_path, spark):
    b = Bench(
        tmp_path,
        spark,
        """CREATE STREAM sl SLIDING(5h30m) FROM meters PARTITION BY tbname
        INTO sl_out AS SELECT _tcurrent_ts, _tprev_ts AS prev, _tnext_ts AS nxt, count(*) AS n FROM %%trows;""",
    )
    b.tick("sl")
    hour = 3600
    b.append([(s, "d1", 1.0) for s in (0, 60, 120)] + [(12 * hour + 600, "d1", 1.0), (14 * hour + 1800, "d1", 1.0)])
    b.tick("sl")
    day = T0.replace(hour=0)
    assert [(r["_tcurrent_ts"], r["prev"], r["nxt"], r["n"]) for r in b.sink("sl_out")] == [
        (day + 11 * hour * S, day + 5.5 * hour * S, day + 16.5 * hour * S, 3),
        (day + 24 * hour * S, day + 22 * hour * S, day + 29.5 * hour * S, 1),
    ]  # the day's last window is shorter
