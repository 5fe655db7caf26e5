"""Sink health without Dagster or Spark (cq_engine.health): freshness windows derived from definitions
and the grace settings (cq.toml, CQ_FRESHNESS_GRACE, the `-- cq: freshness_grace` directive), and the
completeness of firings and stream runs against a real ledger on disk (delta-rs)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cq_engine.catalog import load_catalog
from cq_engine.config import load_settings
from cq_engine.errors import CQError, ParseError
from cq_engine.health import MIN_WINDOW, firing_completeness, freshness_window, run_completeness
from cq_engine.parse import parse_text
from cq_engine.schedule.ticks import ticks_of
from cq_engine.storage.delta import DeltaRsStorage
from cq_engine.storage.ledger import Ledger, LedgerEntry

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
S = timedelta(seconds=1)
MINUTE_CQ = """
-- a comment that is not a directive
-- cq: freshness_grace 5m
CREATE CQ per_minute RESAMPLE EVERY 1m BEGIN
  SELECT max_value(temperature) AS m INTO per_minute_out FROM sensors GROUP BY (1m), device
END;
CREATE CQ fast RESAMPLE EVERY 5s RANGE 10s TIMEOUT POLICY DISCARD BEGIN
  SELECT max_value(temperature) AS m INTO fast_out FROM sensors GROUP BY (5s), device
END;
"""
TABLES = """
CREATE TABLE sensors (ts TIMESTAMP, device STRING, temperature DOUBLE);
CREATE TABLE meters (ts TIMESTAMP, current DOUBLE) TAGS (location STRING);
"""
STREAMS = """
/* cq: freshness_grace=2m */
CREATE STREAM win INTERVAL(30s) SLIDING(30s) FROM meters PARTITION BY tbname OPTIONS(WATERMARK(10s))
  INTO win_out AS SELECT _twstart, count(*) AS n FROM %%trows;
CREATE STREAM sess SESSION(ts, 45s) FROM meters PARTITION BY tbname INTO sess_out AS SELECT _twstart, count(*) AS n FROM %%trows;
CREATE STREAM cnt COUNT_WINDOW(10) FROM meters PARTITION BY tbname INTO cnt_out AS SELECT _twstart, count(*) AS n FROM %%trows;
CREATE STREAM per PERIOD(2m) INTO per_out AS SELECT _tlocaltime AS ts, count(*) AS n FROM meters;
"""


def _defs(tmp_path, *texts: str):
    (tmp_path / "sql").mkdir(exist_ok=True)
    for i, text in enumerate((TABLES, *texts)):
        (tmp_path / "sql" / f"{i}.sql").write_text(text)
    catalog = load_catalog(tmp_path / "sql")
    assert not catalog.errors, catalog.errors
    return {d.name: d for d in catalog.definitions}


# -- freshness ---------------------------------------------------------------------------------------
def test_freshness_windows_follow_every_window_watermark_and_grace(tmp_path):
    defs = _defs(tmp_path, MINUTE_CQ, STREAMS)
    grace, lead = timedelta(seconds=30), timedelta(seconds=20)
    # The directive overrides the default grace; EVERY + lead is the cadence (and the warn window).
    w = freshness_window(defs["per_minute"], grace=grace, lead=lead)
    assert (w.expected, w.grace, w.fail, w.warn) == (80 * S, 300 * S, 380 * S, 80 * S)
    assert "EVERY 1m" in w.why and "grace 5m" in w.why
    # Sub-minute: Dagster's one-minute floor, and no warn window it would refuse.
    w = freshness_window(defs["fast"], grace=grace, lead=2500 * S / 1000)
    assert (w.fail, w.warn) == (MIN_WINDOW, None)
    w = freshness_window(defs["win"], grace=grace)  # window step 30s + WATERMARK 10s + its own 2m
    assert (w.expected, w.fail, w.warn) == (40 * S, 160 * S, None)
    assert freshness_window(defs["sess"], grace=timedelta(minutes=2)).fail == 165 * S  # gap 45s + grace
    assert freshness_window(defs["cnt"], grace=timedelta(minutes=3)).fail == 180 * S  # data-shaped: grace only
    w = freshness_window(defs["per"], grace=grace, lead=lead)
    assert (w.expected, w.fail) == (140 * S, 170 * S)


@pytest.mark.parametrize(
    ("directive", "message"),
    [
        ("-- cq: freshness_grace 5x", "unknown unit 'x'"),
        ("-- cq: freshnes_grace 5m", "unknown directive 'freshnes_grace' (known: freshness_grace)"),
        ("-- cq: freshness_grace", "expected `cq: key value`"),
        ("-- cq: freshness_grace 1m\n-- cq: freshness_grace 2m", "given twice"),
    ],
)
def test_bad_directives_name_the_comment(directive, message):
    text = (
        "\n\n"
        + directive
        + "\nCREATE CQ c RESAMPLE EVERY 1m BEGIN SELECT max_value(t) AS m INTO o FROM s GROUP BY (1m) END;"
    )
    with pytest.raises(ParseError) as exc:
        parse_text(text, file="defs.sql")
    assert message in str(exc.value) and str(exc.value).startswith("defs.sql:3:")


def test_a_directive_on_a_table_is_an_error():
    with pytest.raises(ParseError, match=r"t.sql:1:1: .*applies to continuous queries and streams"):
        parse_text("-- cq: freshness_grace 1m\nCREATE TABLE x (ts TIMESTAMP, v DOUBLE);", file="t.sql")


def test_grace_and_horizon_settings_from_cq_toml_and_the_environment(tmp_path):
    toml = tmp_path / "cq.toml"
    toml.write_text('[cq]\nfreshness_grace = "2m"\ncompleteness_horizon = "6h"\n')
    settings = load_settings(environ={}, config_file=str(toml))
    assert (settings.freshness_grace_delta, settings.completeness_horizon_delta) == (120 * S, timedelta(hours=6))
    settings = load_settings(environ={"CQ_FRESHNESS_GRACE": "45s"}, config_file=str(toml))
    assert settings.freshness_grace_delta == 45 * S
    with pytest.raises(CQError, match="CQ_FRESHNESS_GRACE: unknown unit 'q'"):
        load_settings(environ={"CQ_FRESHNESS_GRACE": "5q"}, config_file=str(toml))
    with pytest.raises(CQError, match="CQ_COMPLETENESS_HORIZON: expected a positive duration"):
        load_settings(environ={"CQ_COMPLETENESS_HORIZON": "0s"}, config_file=str(toml))


# -- completeness -------------------------------------------------------------------------------------
def _entry(name, kind, fire, lo, hi, status="succeeded", started=None):
    started = started or (fire or hi)
    return LedgerEntry(
        definition=name,
        kind=kind,
        fire_time=fire,
        range_start=lo,
        range_end=hi,
        source_versions={"sensors": 1},
        rows_written=3 if status == "succeeded" else 0,
        sink_version=1 if status == "succeeded" else None,
        status=status,
        started_at=started,
        finished_at=started + S,
        error=None if status == "succeeded" else "boom",
    )


def _firing(d, t, status="succeeded"):
    lo, hi = ticks_of(d, timezone="UTC").range_of(t)
    return _entry(d.name, "firing", t, lo, hi, status)


def test_owed_firings_against_a_real_ledger_find_missing_failed_and_recalculated(tmp_path):
    d = _defs(tmp_path, MINUTE_CQ)["per_minute"]
    ledger = Ledger(store=DeltaRsStorage(warehouse=str(tmp_path / "wh")))
    m = timedelta(minutes=1)
    # 12:00..12:07: 12:02 and 12:03 never ran, 12:05 failed; another definition's entries are ignored.
    ok = [0, 1, 4, 6, 7]
    ledger.record_many([_firing(d, T0 + k * m) for k in ok] + [_firing(d, T0 + 5 * m, "failed")])
    ledger.record(_entry("other", "firing", T0 + 2 * m, T0 + m, T0 + 2 * m, "failed"))
    ticks = ticks_of(d, timezone="UTC")

    def report(since=T0 - timedelta(hours=1)):
        entries = ledger.entries_since(since - timedelta(hours=1), [d.name])
        assert {e.definition for e in entries} == {d.name}
        return firing_completeness(
            between=ticks.between, range_of=ticks.range_of, entries=entries, since=since, discard=False
        )

    r = report()
    assert not r.passed and (r.owed, r.count("missing"), r.count("failed"), r.count("skipped")) == (8, 2, 1, 0)
    assert [g.to_json() for g in r.gaps] == [
        {"start": "2026-01-05T12:01:00+00:00", "end": "2026-01-05T12:03:00+00:00", "reason": "missing", "count": 2},
        {"start": "2026-01-05T12:04:00+00:00", "end": "2026-01-05T12:05:00+00:00", "reason": "failed", "count": 1},
    ]
    assert r.metadata()["missing_ranges"][0]["count"] == 2 and "2 missing, 1 failed of 8 owed" in r.description
    # A cap on the firings owed: only the newest ones (12:05 failed, 12:06, 12:07).
    capped = firing_completeness(
        between=ticks.between,
        range_of=ticks.range_of,
        entries=ledger.entries_since(T0 - timedelta(hours=2), [d.name]),
        since=T0 - timedelta(hours=1),
        discard=False,
        every=m,
        max_owed=2,
    )
    assert (capped.owed, capped.count("failed"), capped.count("missing")) == (3, 1, 0)
    # The horizon: only firings from `since` on are owed.
    assert report(since=T0 + 4 * m).count("missing") == 0 and report(since=T0 + 4 * m).count("failed") == 1
    # A recalculation over the gaps (`cq recalculate`) fills them; a rerun of the failed firing too.
    ledger.record(_entry(d.name, "recalculate", None, T0 + m, T0 + 3 * m, started=T0 + 10 * m))
    ledger.record(_firing(d, T0 + 5 * m))
    r = report()
    assert r.passed and r.gaps == () and r.description.startswith("complete: 8 owed")


def test_discard_skips_only_warn_and_nothing_run_owes_nothing(tmp_path):
    d = _defs(tmp_path, MINUTE_CQ)["fast"]
    ticks = ticks_of(d, timezone="UTC")
    entries = [_firing(d, T0 + k * 5 * S) for k in (0, 1, 4)]
    r = firing_completeness(
        between=ticks.between, range_of=ticks.range_of, entries=entries, since=T0 - S * 3600, discard=True
    )
    assert r.passed and r.count("skipped") == 2 and r.gaps[0].reason == "skipped"
    assert (r.gaps[0].start, r.gaps[0].end) == (T0, T0 + 15 * S)  # RANGE 10s: the two skipped ranges, merged
    empty = firing_completeness(between=ticks.between, range_of=ticks.range_of, entries=[], since=T0, discard=False)
    assert empty.passed and empty.owed == 0 and "nothing ran" in empty.description


def test_stream_runs_fail_until_a_later_run_covers_the_failed_range():
    m = timedelta(minutes=1)
    runs = [
        _entry("s", "realtime", None, T0, T0 + m, started=T0 + m),
        _entry("s", "realtime", None, T0 + m, T0 + 2 * m, "failed", started=T0 + 2 * m),
        _entry("s", "ignored", None, T0, T0 + m, "ignored", started=T0 + 2 * m),
    ]
    r = run_completeness(entries=runs, since=T0)
    assert not r.passed and [g.to_json()["reason"] for g in r.gaps] == ["failed"] and r.owed == 2
    again = [*runs, _entry("s", "realtime", None, T0 + m, T0 + 3 * m, started=T0 + 3 * m)]
    assert run_completeness(entries=again, since=T0).passed
    assert run_completeness(entries=runs, since=T0 + 5 * m).owed == 0  # outside the horizon


def test_a_firing_that_wrote_no_row_before_its_rows_arrived_is_not_complete(tmp_path):
    """A firing that committed 0 rows while its source still received rows for its range (a feed that
    commits late, a shutdown that stopped the feed first) is "empty", which fails the check; one whose
    range stayed empty, and one whose later rows fell outside its range, are complete."""
    import dataclasses

    import pyarrow as pa

    from cq_engine.arrivals import arrived_later
    from cq_engine.config import Settings
    from cq_engine.engine import Engine

    d = _defs(tmp_path, MINUTE_CQ)["per_minute"]
    settings = Settings(
        sql_dir=str(tmp_path / "sql"), warehouse=str(tmp_path / "wh"), home=str(tmp_path / ".cq"), storage="deltars"
    )
    engine = Engine(settings=settings)
    engine.ensure_tables("sensors")
    m = timedelta(minutes=1)

    def rows(*times):
        return pa.table(
            {
                "ts": pa.array(list(times), pa.timestamp("us", tz="UTC")),
                "device": ["a"] * len(times),
                "temperature": [1.0] * len(times),
            }
        )

    read = engine.storage.append("sensors", rows(T0 - m))
    ticks = ticks_of(d, timezone="UTC")
    # 12:01 ([12:00, 12:01)), 12:02 and 12:03 wrote no row at that version; then rows of [12:01, 12:02) arrive.
    entries = [
        dataclasses.replace(_firing(d, T0 + k * m), rows_written=0, source_versions={"sensors": read})
        for k in (1, 2, 3)
    ]
    entries.insert(0, dataclasses.replace(_firing(d, T0), source_versions={"sensors": read}))
    engine.storage.append("sensors", rows(T0 + m + 10 * S, T0 + m + 20 * S))
    engine.storage.append("sensors", rows(T0 + 10 * m))  # after every range: nothing late for them
    assert arrived_later(engine.ctx, "sensors", entries[1:]) == {T0 + 2 * m}
    cache: dict = {}  # one check evaluation: the source's log is read once for every definition over it
    assert arrived_later(engine.ctx, "sensors", entries[1:], cache=cache) == {T0 + 2 * m}
    assert cache["sensors"][0] == read and len(cache["sensors"][1]) == 2
    assert arrived_later(engine.ctx, "sensors", entries[2:], cache=cache) == {T0 + 2 * m}

    def report(entries):
        return firing_completeness(
            between=ticks.between,
            range_of=ticks.range_of,
            entries=entries,
            since=T0 - timedelta(hours=1),
            discard=False,
            arrived_later=lambda zero: arrived_later(engine.ctx, "sensors", zero),
        )

    r = report(entries)
    assert not r.passed and (r.owed, r.count("empty"), r.count("missing")) == (4, 1, 0)
    assert [g.to_json()["reason"] for g in r.gaps] == ["empty"] and r.gaps[0].start == T0 + m
    assert r.description.startswith("1 empty (no row written, though rows for their range arrived later) of 4 owed")
    # Run again (a recalculation of that range, or the firing itself) with the rows: complete.
    again = [*entries, dataclasses.replace(entries[2], rows_written=2, source_versions={"sensors": read + 2})]
    r = report(again)
    assert r.passed, r.description
