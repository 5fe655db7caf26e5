"""Pure stream timing: what a sensor tick requests, from cursor + commit statistics + now."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from cq_engine.model import CountTrigger, SelectItem, SessionTrigger, SlidingTrigger, Stream, StreamOptions
from cq_engine.streams.timing import (
    Change,
    Span,
    StreamCursor,
    StreamWork,
    first_tick,
    key_ranges,
    merge_ranges,
    plan_tick,
    recalculation_work,
    starts_ending_in,
    tick_after,
    tick_floor,
    work_range,
)

US = timedelta(microseconds=1)
M = timedelta(minutes=1)
S = timedelta(seconds=1)


def t(hh, mm, ss=0, day=21):
    return datetime(2026, 11, day, hh, mm, ss, tzinfo=UTC)


def stream(trigger=None, *, key_bound="start", **options) -> Stream:
    return Stream(
        name="s",
        trigger=trigger or SlidingTrigger(sliding=M, interval=M),
        trigger_table="meters",
        source="meters",
        sink="out",
        select=(SelectItem("__cq_twstart", "_twstart", False),),
        options=StreamOptions(**options),
        key_bound=key_bound,
    )


def cursor(max_event, *, watermark=timedelta(0), version=3, created=None, **kw) -> StreamCursor:
    return StreamCursor(
        version=version, created=created or t(10, 0), max_event=max_event, closed_until=max_event - watermark, **kw
    )


def added(lo, hi, rows=10) -> Change:
    return Change(added=(Span(lo, hi, rows),))


def starts(work: StreamWork) -> list[datetime]:
    """The 1-minute grid starts inside the work's ranges."""
    out = []
    for a, b in work.windows:
        s = a.replace(second=0, microsecond=0)
        s = s if s >= a else s + M
        while s < b:
            out.append(s)
            s += M
    return out


def test_first_tick_without_history_starts_at_the_current_watermark():
    plan = first_tick(
        stream(watermark=10 * S),
        version=7,
        span=Span(t(9, 0), t(10, 0, 30), 500),
        now=t(12, 0),
        tz="UTC",
        chunk_rows=100,
    )
    assert plan.works == ()
    assert plan.cursor.version == 7 and plan.cursor.closed_until == t(10, 0, 20)
    assert plan.cursor.origin == t(10, 0, 30) + US  # data-shaped windows: later rows only
    assert "history" in plan.reason


def test_fill_history_is_chunked_and_covers_every_closed_window_once():
    s = stream(fill_history=True)
    plan = first_tick(s, version=7, span=Span(t(9, 0), t(10, 0, 30), 450), now=t(12, 0), tz="UTC", chunk_rows=100)
    assert len(plan.works) == 5 and all(w.kind == "history" for w in plan.works)
    got = [x for w in plan.works for x in starts(w)]
    assert got == [t(9, 0) + i * M for i in range(60)]  # 09:00 .. 09:59; 10:00 is still open


def test_fill_history_from_a_start_time():
    s = stream(fill_history_first=True, history_start=t(9, 30))
    plan = first_tick(s, version=7, span=Span(t(9, 0), t(10, 0, 30), 100), now=t(12, 0), tz="UTC", chunk_rows=1000)
    assert [x for w in plan.works for x in starts(w)] == [t(9, 30) + i * M for i in range(30)]


def test_new_data_closes_windows_up_to_the_watermark():
    plan = plan_tick(
        stream(), cursor(t(10, 0, 30)), version=4, changes=[added(t(10, 0, 40), t(10, 2, 10))], now=t(12, 0), tz="UTC"
    )
    assert starts(plan.works[0]) == [t(10, 0), t(10, 1)]
    assert plan.cursor.version == 4 and plan.cursor.closed_until == t(10, 2, 10)


def test_watermark_holds_windows_open():
    s = stream(watermark=30 * S)
    plan = plan_tick(
        s,
        cursor(t(10, 0, 30), watermark=30 * S),
        version=4,
        changes=[added(t(10, 0, 40), t(10, 1, 20))],
        now=t(12, 0),
        tz="UTC",
    )
    assert plan.works == ()  # T = 10:00:50: the 10:00 window is still open
    plan = plan_tick(s, plan.cursor, version=5, changes=[added(t(10, 1, 21), t(10, 1, 30))], now=t(12, 0), tz="UTC")
    assert starts(plan.works[0]) == [t(10, 0)]  # T = 10:01:00 closes [10:00, 10:01)


def test_late_rows_recompute_exactly_the_closed_windows_they_fall_in():
    c = cursor(t(10, 5, 30))
    plan = plan_tick(stream(), c, version=4, changes=[added(t(10, 1, 10), t(10, 1, 20))], now=t(12, 0), tz="UTC")
    assert starts(plan.works[0]) == [t(10, 1)]
    # A late file reaching into the open window recomputes only the closed part.
    plan = plan_tick(stream(), c, version=4, changes=[added(t(10, 3, 10), t(10, 5, 20))], now=t(12, 0), tz="UTC")
    assert starts(plan.works[0]) == [t(10, 3), t(10, 4)]


def test_ignore_disorder_and_expired_time_drop_late_rows():
    c = cursor(t(10, 5, 30))
    late = [added(t(10, 1, 10), t(10, 1, 20))]
    assert plan_tick(stream(ignore_disorder=True), c, version=4, changes=late, now=t(12, 0), tz="UTC").works == ()
    assert plan_tick(stream(expired_time=2 * M), c, version=4, changes=late, now=t(12, 0), tz="UTC").works == ()
    assert plan_tick(stream(delete_mark=2 * M), c, version=4, changes=late, now=t(12, 0), tz="UTC").works == ()
    plan = plan_tick(stream(expired_time=5 * M), c, version=4, changes=late, now=t(12, 0), tz="UTC")
    assert starts(plan.works[0]) == [t(10, 1)]


def test_removed_files_recompute_only_with_delete_recalc():
    c = cursor(t(10, 5, 30))
    gone = [Change(removed=(Span(t(10, 2, 5), t(10, 2, 50)),))]
    assert plan_tick(stream(), c, version=4, changes=gone, now=t(12, 0), tz="UTC").works == ()
    plan = plan_tick(stream(delete_recalc=True), c, version=4, changes=gone, now=t(12, 0), tz="UTC")
    assert starts(plan.works[0]) == [t(10, 2)]


def test_max_delay_emits_open_windows_after_that_much_processing_time():
    s = stream(watermark=2 * M, max_delay=M)
    c = cursor(t(10, 5, 30), watermark=2 * M, created=t(12, 0))
    change = [added(t(10, 5, 31), t(10, 5, 40))]
    assert plan_tick(s, c, version=4, changes=change, now=t(12, 0, 30), tz="UTC").works == ()
    plan = plan_tick(s, c, version=4, changes=change, now=t(12, 1), tz="UTC")
    assert starts(plan.works[0]) == [t(10, 3), t(10, 4), t(10, 5)]  # open: T = 10:03:40
    assert plan.cursor.last_partial == t(12, 1)


def test_window_open_event_computes_windows_when_their_first_row_arrives():
    s = stream(event_types=("WINDOW_OPEN",))
    plan = plan_tick(
        s, cursor(t(10, 5, 30)), version=4, changes=[added(t(10, 5, 40), t(10, 7, 5))], now=t(12, 0), tz="UTC"
    )
    assert starts(plan.works[0]) == [t(10, 6), t(10, 7)]  # no WINDOW_CLOSE: 10:05 is not recomputed


def test_at_once_recomputes_every_window_the_new_rows_touch():
    s = stream(trigger_mode="at_once")
    plan = plan_tick(
        s, cursor(t(10, 5, 30)), version=4, changes=[added(t(10, 5, 40), t(10, 6, 5))], now=t(12, 0), tz="UTC"
    )
    assert starts(plan.works[0]) == [t(10, 5), t(10, 6)]


def test_force_window_close_closes_by_processing_time():
    s = stream(trigger_mode="force_window_close", ignore_disorder=True)
    c = StreamCursor(version=3, created=t(10, 0), max_event=t(9, 0), closed_until=t(10, 0))
    plan = plan_tick(s, c, version=3, changes=[], now=t(10, 2, 30), tz="UTC")
    assert starts(plan.works[0]) == [t(10, 0), t(10, 1)]


def test_continuous_window_close_batches_changes_until_the_recalculation_period():
    s = stream(trigger_mode="continuous_window_close", recalc_every=10 * M)
    c = cursor(t(10, 5, 30), created=t(12, 0))
    plan = plan_tick(s, c, version=4, changes=[added(t(10, 1, 10), t(10, 1, 20))], now=t(12, 1), tz="UTC")
    assert plan.works == () and plan.cursor.pending
    plan = plan_tick(s, plan.cursor, version=4, changes=[], now=t(12, 11), tz="UTC")
    assert starts(plan.works[0]) == [t(10, 1)] and plan.cursor.pending == ()


def test_data_shaped_windows_close_by_watermark_and_recompute_from_the_earliest_change():
    s = stream(SessionTrigger(gap=10 * S), watermark=5 * S)
    c = cursor(t(10, 5), watermark=5 * S, origin=t(9, 0))
    plan = plan_tick(s, c, version=4, changes=[added(t(10, 2), t(10, 6))], now=t(12, 0), tz="UTC")
    (work,) = plan.works
    assert work.close_until == t(10, 5, 55) and work.recompute_from == t(10, 2) and work.origin == t(9, 0)
    assert not work.emit_open
    plan = plan_tick(
        stream(CountTrigger(count=3, slide=3), trigger_mode="at_once"),
        c,
        version=4,
        changes=[added(t(10, 5, 1), t(10, 6))],
        now=t(12, 0),
        tz="UTC",
    )
    assert plan.works[0].emit_open and plan.works[0].recompute_from is None


def test_nothing_new_requests_nothing():
    plan = plan_tick(stream(), cursor(t(10, 5, 30)), version=3, changes=[], now=t(12, 0), tz="UTC")
    assert plan.works == () and plan.cursor.version == 3


def test_sliding_only_ticks_reset_daily_like_period():
    trig = SlidingTrigger(sliding=timedelta(hours=5, minutes=30), sliding_offset=S)
    assert tick_floor(trig, t(23, 0), "UTC") == t(22, 0, 1)
    assert tick_after(trig, t(23, 0), "UTC") == t(0, 0, 1, day=22)  # the day's last window is shorter
    assert tick_floor(trig, t(0, 0, 0, day=22), "UTC") == t(22, 0, 1)
    shanghai = datetime(2026, 11, 21, 16, 0, 1, tzinfo=UTC)  # 00:00:01 in Asia/Shanghai
    assert tick_floor(trig, shanghai + M, "Asia/Shanghai") == shanghai
    assert starts_ending_in(trig, t(5, 0), t(12, 0), "UTC") == (t(0, 0, 1), t(11, 0, 1))


def test_key_ranges_follow_the_first_column():
    w = [(t(10, 0), t(10, 2))]
    assert key_ranges(stream(), w, "UTC") == w
    assert key_ranges(stream(key_bound="end"), w, "UTC") == [(t(10, 1), t(10, 3))]


def test_recalculation_covers_closed_windows_only():
    work = recalculation_work(
        stream(), version=9, start=t(10, 1, 30), end=t(10, 9), max_event=t(10, 5, 30), now=t(12, 0), tz="UTC"
    )
    assert starts(work) == [t(10, 1), t(10, 2), t(10, 3), t(10, 4)] and work.kind == "recalculate"


def test_json_round_trips_and_merging():
    w = StreamWork(version=3, windows=((t(10, 0), t(10, 1)),), tick=t(12, 0), close_until=t(11, 0))
    assert StreamWork.from_json(w.to_json()) == w
    c = cursor(t(10, 5), pending=((t(9, 0), t(9, 1)),), definition="abc")
    assert StreamCursor.from_json(c.to_json()) == c
    assert merge_ranges([(t(10, 2), t(10, 3)), (t(10, 0), t(10, 1)), (t(10, 1), t(10, 2))]) == ((t(10, 0), t(10, 3)),)


def test_persisted_json_carries_a_format_and_reads_older_and_rejects_newer():
    import json

    import pytest

    from cq_engine.errors import CQError
    from cq_engine.schedule.ticks import parse_tick_cursor, tick_cursor

    cursor = StreamCursor(version=3, created=datetime(2021, 5, 11, tzinfo=UTC), definition="abc")
    raw = json.loads(cursor.to_json())
    assert raw["format"] == 1 and StreamCursor.from_json(cursor.to_json()) == cursor
    del raw["format"]  # written before the field existed
    assert StreamCursor.from_json(json.dumps(raw)) == cursor
    work = StreamWork(version=7, windows=((datetime(2021, 5, 11, tzinfo=UTC),) * 2,))
    assert StreamWork.from_json(work.to_json()) == work
    with pytest.raises(CQError, match="format 2 was written by a newer cq-engine"):
        StreamWork.from_json(json.dumps({**json.loads(work.to_json()), "format": 2}))

    t = datetime(2021, 5, 11, 14, 30, tzinfo=UTC)
    assert json.loads(tick_cursor(t))["format"] == 1
    assert parse_tick_cursor(tick_cursor(t)) == t
    assert parse_tick_cursor("2021-05-11T14:30:00+00:00") == t  # a cursor from before the format field
    assert parse_tick_cursor(None) is None
    with pytest.raises(CQError, match="newer cq-engine"):
        parse_tick_cursor('{"format": 9, "last": "2021-05-11T14:30:00Z"}')
    with pytest.raises(CQError, match="is not one cq-engine wrote"):
        parse_tick_cursor('{"nope": 1}')


def test_ignored_rows_are_reported_with_why_and_the_fix():
    c = cursor(t(10, 5, 30))
    late = [added(t(10, 1, 10), t(10, 1, 20), rows=7)]
    plan = plan_tick(stream(ignore_disorder=True), c, version=4, changes=late, now=t(12, 0), tz="UTC")
    (item,) = plan.ignored
    assert (item.what, item.rows, item.span) == ("late", 7, (t(10, 1, 10), t(10, 1, 20)))
    assert "7 row(s) ignored" in item.text and "windows starting in [2026-11-21T10:01:00" in item.text
    assert "IGNORE_DISORDER" in item.text and "`cq recalculate s --from 2026-11-21T10:01:10" in item.text
    # EXPIRED_TIME: only the part older than the horizon (T - 2 min = 10:03:30) is ignored
    plan = plan_tick(
        stream(expired_time=2 * M), c, version=4, changes=[added(t(10, 2), t(10, 4), rows=9)], now=t(12, 0), tz="UTC"
    )
    (item,) = plan.ignored
    assert item.what == "expired" and item.span == (t(10, 2), t(10, 3, 30) - US)
    assert "up to 9 row(s)" in item.text and "EXPIRED_TIME" in item.text
    assert plan.works and plan.works[0].ignored == (item.text,)  # the run requested carries it
    assert StreamWork.from_json(plan.works[0].to_json()) == plan.works[0]
    # late rows that are recomputed, and rows in open windows, are not ignored
    assert plan_tick(stream(), c, version=4, changes=late, now=t(12, 0), tz="UTC").ignored == ()
    assert plan_tick(stream(), c, version=4, changes=[added(t(10, 6), t(10, 7))], now=t(12, 0), tz="UTC").ignored == ()


def test_history_without_fill_history_is_reported():
    plan = first_tick(
        stream(), version=7, span=Span(t(9, 0), t(10, 0, 30), 500), now=t(12, 0), tz="UTC", chunk_rows=100
    )
    (item,) = plan.ignored
    assert item.what == "history" and item.rows == 500 and "no FILL_HISTORY" in item.text
    assert "FILL_HISTORY 1" in item.text and "`cq recalculate s --from 2026-11-21T09:00:00" in item.text
    assert (
        first_tick(
            stream(fill_history=True),
            version=7,
            span=Span(t(9, 0), t(10, 0, 30), 500),
            now=t(12, 0),
            tz="UTC",
            chunk_rows=100,
        ).ignored
        == ()
    )


def test_work_ranges_are_shown_half_open_without_the_exclusive_cursor_microsecond():
    """A run's range (tags, metadata, ledger, `cq tick`) is the half-open ``[start, end)`` it is about:
    no ``...:40.000001`` from the exclusive origin or window-start cursor; the work's own fields (which
    rows and windows it reads) keep it."""
    session = stream(SessionTrigger(gap=10 * S))
    created = first_tick(session, version=1, span=Span(t(10, 0), t(10, 0, 40), 5), now=t(12, 0), tz="UTC", chunk_rows=9)
    assert created.cursor.origin == t(10, 0, 40) + US  # rows after the history: the exclusive cursor
    plan = plan_tick(
        session, created.cursor, version=2, changes=[added(t(10, 0, 50), t(10, 1))], now=t(12, 0), tz="UTC"
    )
    (work,) = plan.works
    assert work.origin == t(10, 0, 40) + US and work.close_until == t(10, 1)  # what the run reads: unchanged
    assert work_range(session, work, "UTC") == (t(10, 0, 40), t(10, 1))  # closes what T moving :40 -> 1:00 closes
    assert StreamWork.from_json(work.to_json()) == work
    # a recomputation is shown from where it recomputes
    c = replace(plan.cursor, version=2)
    plan = plan_tick(session, c, version=3, changes=[added(t(10, 0, 45), t(10, 1, 30))], now=t(12, 0), tz="UTC")
    assert work_range(session, plan.works[0], "UTC") == (t(10, 0, 45), t(10, 1, 30))
    # time windows: WINDOW_OPEN asks for the windows opened since the last max event (an exclusive
    # cursor); shown on the window grid, the same windows
    opened = stream(event_types=("WINDOW_OPEN", "WINDOW_CLOSE"))
    plan = plan_tick(
        opened, cursor(t(10, 0, 40)), version=4, changes=[added(t(10, 0, 45), t(10, 2, 5))], now=t(12, 0), tz="UTC"
    )
    (work,) = plan.works
    assert any(a.microsecond or b.microsecond for a, b in work.windows)  # the raw cursor ranges
    lo, hi = work_range(opened, work, "UTC")
    assert (lo, hi) == (t(10, 0), t(10, 3)) and "000001" not in plan.reason, plan.reason
    sliding_only = stream(SlidingTrigger(sliding=M))
    late = [added(t(10, 1, 10), t(10, 1, 20))]  # recomputes the closed window [10:01, 10:02)
    plan = plan_tick(sliding_only, cursor(t(10, 5)), version=4, changes=late, now=t(12, 0), tz="UTC")
    assert plan.works[0].windows == ((t(10, 1), t(10, 1, 20) + US),)
    assert work_range(sliding_only, plan.works[0], "UTC") == (t(10, 1), t(10, 2))
    assert plan.reason == "windows starting in [2026-11-21T10:01:00+00:00, 2026-11-21T10:02:00+00:00)"
