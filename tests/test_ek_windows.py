"""eKuiper windows (seed 003) of assign_windows: the seed's examples by hand, and randomized cases
against the pure-Python reference (tests/ekuiper_reference.py).

Randomized cases of one window kind are unioned and collected in one Spark job; each case keeps its
own trigger and close_until and is told apart by the ``case`` key column.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from datetime import datetime, timedelta

import ekuiper_reference as ref
import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from cq_engine.model import CountTrigger, EkSessionTrigger, EkSlidingTrigger
from cq_engine.streams.windows.common import WSEQ
from cq_engine.streams.windows.tdengine import WCLOSED, WEND, WLAST, WROWS, WSTART, assign_windows
from cq_engine.times import EPOCH, UTC

S = 1_000_000
M = 60 * S
SCHEMA = pa.schema(
    [("case", pa.int32()), ("g", pa.string()), ("tm", pa.int64()), ("v", pa.float64()), ("ph", pa.int32())]
)
COLS = SCHEMA.names
BASE = (datetime(2024, 3, 1, 10, 0, tzinfo=UTC) - EPOCH) // timedelta(microseconds=1)  # a whole hour


def frame(spark, data: list[tuple]):
    """A local DataFrame of SCHEMA rows (via Arrow: no Python workers), plus the timestamp ``ts``."""
    table = pa.Table.from_pylist([dict(zip(COLS, r)) for r in data], schema=SCHEMA)
    return spark.createDataFrame(table).withColumn("ts", F.timestamp_micros("tm"))


def at(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=us)


def windows_of(out, *, key=("case",), origin=0, unit=1):
    """Collect assign_windows output as a Counter of ``(*key, start, end, members, closed)`` with times
    as ``(t - origin) / unit`` and ``members`` the sorted tuple of the window's row times (windows
    sharing a start, eKuiper's sliding windows at one time, are told apart by WSEQ), checking each
    row's WLAST/WROWS against its window's members."""
    sec = lambda c: (F.unix_micros(c) - F.lit(origin)) / F.lit(unit) if unit != 1 else F.unix_micros(c)
    seq = [WSEQ] if WSEQ in out.columns else [F.lit(0).alias(WSEQ)]
    rows = out.select(*key, *seq, sec("ts"), sec(WSTART), sec(WEND), sec(WLAST), WROWS, WCLOSED).collect()
    members, info = defaultdict(list), {}
    for r in rows:
        *k, q, t, ws, we, last, n, closed = r
        members[(*k, ws, q)].append(t)
        info.setdefault((*k, ws, q), set()).add((we, last, n, closed))
    got: Counter = Counter()
    for w, ts in members.items():
        assert len(info[w]) == 1, f"window {w}: rows disagree on its bounds {info[w]}"
        ((we, last, n, closed),) = info[w]
        assert len(ts) == n and max(ts) == last, f"window {w}: rows {sorted(ts)} vs {n}, {last}"
        got[(*w[:-1], we, tuple(sorted(ts)), closed)] += 1
    return got


# --- hand-checked: the seed's examples and eKuiper's rules -----------------------------------------


def _hand(spark, times, trigger, until, *, vs=None, ph=None, count_phase_column=None, gs=None):
    """The stream of rows at ``times`` (seconds after BASE; devices ``gs``) as one eKuiper stream
    (windows over all of it); returns sorted (start, end, sorted members, closed) in seconds after BASE."""
    vs = vs or [0.0] * len(times)
    gs = gs or ["g"] * len(times)
    df = frame(spark, [(0, g, BASE + round(t * S), v, ph) for t, v, g in zip(times, vs, gs)])
    out = assign_windows(
        df,
        trigger,
        time_column="ts",
        keys=[],
        close_until=at(BASE + round(until * S)),
        count_phase_column=count_phase_column,
    )
    got = windows_of(out, key=(), origin=BASE, unit=S)
    return sorted((ws, we, list(ts), closed) for (ws, we, ts, closed), n in got.items() for _ in range(n))


def test_sliding_with_delay_seed(spark):
    # SLIDINGWINDOW(ss, 5, 5): each event at t has [t - 5 s, t + 5 s) (eKuiper replays the trigger at
    # t + 5 s; a row exactly there belongs to the next windows only)
    got = _hand(
        spark, [0, 2, 4, 7, 12, 13], EkSlidingTrigger(size=timedelta(seconds=5), delay=timedelta(seconds=5)), until=12
    )
    assert got == [
        (-5, 5, [0, 2, 4], True),
        (-3, 7, [0, 2, 4], True),  # 7 is the end: out
        (-1, 9, [0, 2, 4, 7], True),
        (2, 12, [2, 4, 7], True),  # ends at T: emitted (the row at 12 is not in it)
        (7, 17, [7, 12, 13], False),  # 7 = 12 - 5: in
        (8, 18, [12, 13], False),
    ]


def test_sliding_without_delay_and_over(spark):
    # SLIDINGWINDOW(ss, 1) OVER(WHEN v > 200): only rows with v > 200 (NULL: no) open a window
    times = [0, 0.5, 1.2, 3, 3.5, 4]
    vs = [100.0, 250.0, 300.0, 50.0, 201.0, None]
    got = _hand(spark, times, EkSlidingTrigger(size=timedelta(seconds=1), over="v > 200"), until=3.5, vs=vs)
    assert got == [(-0.5, 0.5, [0, 0.5], True), (0.2, 1.2, [0.5, 1.2], True), (2.5, 3.5, [3, 3.5], True)]
    # without OVER every row opens one: [t - 1, t], a row exactly 1 s before the trigger is in;
    # emitted once the watermark reaches t
    got = _hand(spark, [0, 1, 1.5], EkSlidingTrigger(size=timedelta(seconds=1)), until=1)
    assert got == [(-1, 0, [0], True), (0, 1, [0, 1], True), (0.5, 1.5, [1, 1.5], False)]


def test_sliding_equal_timestamps_one_window_per_row(spark):
    # issue 21: d1 at 1 s, d2 and d3 at 5 s, d1 at 11 s; SLIDINGWINDOW(ss, 10): eKuiper emits four
    # windows (the two rows at 5 s trigger one each) holding 1, 3, 3 and 4 rows
    got = _hand(
        spark, [1, 5, 5, 11], EkSlidingTrigger(size=timedelta(seconds=10)), until=11, gs=["d1", "d2", "d3", "d1"]
    )
    assert got == [
        (-9, 1, [1], True),
        (-5, 5, [1, 5, 5], True),
        (-5, 5, [1, 5, 5], True),
        (1, 11, [1, 5, 5, 11], True),
    ]
    assert got == _ref_sliding([1, 5, 5, 11], size=10, delay=0, until=11)


def _ref_sliding(times, *, size, delay, until):
    ws = ref.sliding_windows([round(t * S) for t in times], size=size * S, delay=delay * S, until=round(until * S))
    return sorted((w["start"] / S, w["end"] / S, [m / S for m in w["members"]], w["closed"]) for w in ws)


def _ref_session(times, *, timeout, max_duration, until, offset=0):
    ws = ref.session_windows(
        [round(t * S) for t in times],
        timeout=timeout * S,
        max_duration=max_duration * S,
        offset=offset * S,
        until=round(until * S),
    )
    return sorted((w["start"] / S, w["end"] / S, [m / S for m in w["members"]], w["closed"]) for w in ws)


def _session(max_duration, timeout, offset=0):
    return EkSessionTrigger(
        timeout=timedelta(seconds=timeout),
        max_duration=timedelta(seconds=max_duration),
        offset=timedelta(seconds=offset),
    )


def test_session_on_check_point_is_cut_only_past_the_maximum(spark):
    # issue 21: rows every 4 s from 120 s to 200 s, SESSIONWINDOW(ss, 60, 5): the session starts on
    # the check point at 120 s and has lasted exactly 60 s at 180 s, not more: eKuiper does not cut
    # it there (it cuts a window only when start < check point - max_duration); one window [120, 205]
    times = list(range(120, 201, 4))
    got = _hand(spark, times, _session(60, 5), until=300)
    assert got == [(120, 205, times, True)]
    assert got == _ref_session(times, timeout=5, max_duration=60, until=300)
    # issue 21: rows 3 s apart, SESSIONWINDOW(ss, 60, 5) (a 60 s maximum, a 5 s timeout): two windows
    times = list(range(0, 178, 3))
    got = _hand(spark, times, _session(60, 5), until=300)
    assert got == [(0, 120, list(range(0, 118, 3)), True), (120, 182, list(range(120, 178, 3)), True)]
    # a session starting on a check point and running on is cut at the second check point after it
    times = list(range(0, 131, 10))
    got = _hand(spark, times, _session(60, 15), until=200)
    assert got == [(0, 120, list(range(0, 111, 10)), True), (120, 145, [120, 130], True)]
    assert got == _ref_session(times, timeout=15, max_duration=60, until=200)


def test_session_after_a_cut_starts_at_the_check_point(spark):
    # SESSIONWINDOW(ss, 60, 45), rows every 30 s from 15 s: at 60 s the window is 45 s old, at 120 s
    # older than 60 s: cut there. eKuiper reports the next window as starting at the cut (120 s).
    times = list(range(15, 196, 30))
    got = _hand(spark, times, _session(60, 45), until=300)
    assert got == [(15, 120, [15, 45, 75, 105], True), (120, 240, [135, 165, 195], True)]
    assert got == _ref_session(times, timeout=45, max_duration=60, until=300)
    # a gap over the timeout ends a window early; WEND = min(last + timeout, cut); a gap of exactly
    # the timeout joins
    times = [0, 30, 75, 200]
    got = _hand(spark, times, _session(60, 45), until=400)
    assert got == [(0, 120, [0, 30, 75], True), (200, 245, [200], True)]
    assert got == _ref_session(times, timeout=45, max_duration=60, until=400)


def test_session_closing_and_equal_timestamps(spark):
    trig = _session(60, 10)
    times = [0, 5, 5, 15, 30, 30, 30, 59, 61, 70, 80, 90, 100, 110, 119, 120, 125]
    got = _hand(spark, times, trig, until=40)
    assert got == [
        (0, 25, [0, 5, 5, 15], True),  # a gap of exactly the timeout joins; the next row is there
        (30, 40, [30, 30, 30], False),  # last + timeout == T: a row at T would still join
        (59, 120, [59, 61, 70, 80, 90, 100, 110, 119], False),  # starts 1 s before a minute: cut at 120
        (120, 135, [120, 125], False),  # a new window at the cut, which it reports as its start
    ]
    assert got == _ref_session(times, timeout=10, max_duration=60, until=40)
    assert [w[3] for w in _hand(spark, times, trig, until=120)] == [True, True, True, False]
    assert _hand(spark, times, trig, until=120) == _ref_session(times, timeout=10, max_duration=60, until=120)
    # check points on local time: in +05:30 (offset 19800 s = 30 min mod 60 min) an hour's maximum
    # cuts at hh:30 UTC
    hour = _session(3600, 600, offset=1800)
    times = [0, 500, 1000, 1500, 2000, 2500, 3000, 3500, 4000, 4500, 5000, 5500, 6000]
    got = _hand(spark, times, hour, until=9000)
    assert [(w[0], w[1]) for w in got] == [(0, 5400), (5400, 6600)]
    assert got == _ref_session(times, timeout=600, max_duration=3600, offset=1800, until=9000)


def test_countwindow_5_2_seed(spark):
    times = list(range(1, 10))  # event i at i s
    got = _hand(spark, times, CountTrigger(count=5, slide=2, ekuiper=True), until=100)
    assert got == [
        (2, 6, [2, 3, 4, 5, 6], True),  # fired by event 6; event 1 ignored; nothing at events 2 and 4
        (4, 8, [4, 5, 6, 7, 8], True),  # fired by event 8
        (6, 9, [6, 7, 8, 9], False),  # event 10 would fire it
        (8, 9, [8, 9], False),
    ]
    assert [w[3] for w in _hand(spark, times, CountTrigger(count=5, slide=2, ekuiper=True), until=7)] == [
        True,
        False,
        False,
        False,
    ]


def test_countwindow_5_1_and_tumbling(spark):
    got = _hand(spark, list(range(1, 8)), CountTrigger(count=5, slide=1, ekuiper=True), until=100)
    assert got == [
        (1, 5, [1, 2, 3, 4, 5], True),
        (2, 6, [2, 3, 4, 5, 6], True),
        (3, 7, [3, 4, 5, 6, 7], True),
        (4, 7, [4, 5, 6, 7], False),
        (5, 7, [5, 6, 7], False),
        (6, 7, [6, 7], False),
        (7, 7, [7], False),
    ]
    got = _hand(spark, list(range(1, 13)), CountTrigger(count=5, slide=5, ekuiper=True), until=100)
    assert got == [(1, 5, [1, 2, 3, 4, 5], True), (6, 10, [6, 7, 8, 9, 10], True), (11, 12, [11, 12], False)]


def test_count_phase_column(spark):
    trig = CountTrigger(count=5, slide=2, ekuiper=True)
    # resumed at a window start: phase 0
    got = _hand(spark, list(range(1, 10)), trig, until=100, ph=0, count_phase_column="ph")
    assert got == [
        (1, 5, [1, 2, 3, 4, 5], True),
        (3, 7, [3, 4, 5, 6, 7], True),
        (5, 9, [5, 6, 7, 8, 9], True),
        (7, 9, [7, 8, 9], False),
        (9, 9, [9], False),
    ]
    # NULL: the default phase (ceil(5/2)*2 - 5 = 1)
    got = _hand(spark, list(range(1, 10)), trig, until=100, ph=None, count_phase_column="ph")
    assert [w[0] for w in got] == [2, 4, 6, 8]
    # applies to TDengine's COUNT_WINDOW too (default phase 0)
    got = _hand(spark, list(range(1, 7)), CountTrigger(count=3, slide=3), until=100, ph=2, count_phase_column="ph")
    assert got == [(3, 5, [3, 4, 5], True), (6, 6, [6], False)]


def test_empty_input_and_bad_arguments(spark):
    df = frame(spark, [(0, "g", BASE, 1.0, None)])
    empty = df.filter(F.col("case") < 0)
    for trig in (
        EkSlidingTrigger(size=timedelta(seconds=1), over="v > 0"),
        EkSessionTrigger(timeout=timedelta(seconds=1), max_duration=timedelta(seconds=5)),
        CountTrigger(count=3, slide=2, ekuiper=True),
    ):
        out = assign_windows(empty, trig, time_column="ts", keys=["g"], close_until=at(BASE))
        seq = [WSEQ] if isinstance(trig, EkSlidingTrigger) else []
        assert out.columns == [*COLS, "ts", WSTART, WEND, WLAST, WROWS, WCLOSED, *seq]
        assert out.count() == 0
    with_null_time = frame(spark, [(0, "g", BASE, 1.0, None), (0, "g", None, 1.0, None)])
    out = assign_windows(
        with_null_time,
        EkSessionTrigger(timeout=timedelta(seconds=1), max_duration=timedelta(seconds=5)),
        time_column="ts",
        keys=["g"],
        close_until=at(BASE),
    )
    assert out.count() == 1
    for trig, msg in [
        (EkSlidingTrigger(size=timedelta(0)), "size"),
        (EkSlidingTrigger(size=timedelta(seconds=1), delay=timedelta(seconds=-1)), "delay"),
        (EkSessionTrigger(timeout=timedelta(0), max_duration=timedelta(seconds=1)), "timeout"),
        (EkSessionTrigger(timeout=timedelta(seconds=1), max_duration=timedelta(0)), "max_duration"),
    ]:
        with pytest.raises(ValueError, match=msg):
            assign_windows(df, trig, time_column="ts", keys=["g"], close_until=at(BASE))


# --- randomized against the reference -------------------------------------------------------------


def gen_stream(rng: random.Random, *, base: int, gaps: list[int], n: int, ties: bool = True) -> list[tuple]:
    """One eKuiper stream: ``(device, time, value)`` rows at increasing times from ``base``, advancing
    by one of ``gaps`` (the interesting distances: the timeout, multiples of the max duration, the
    window size...) or a random few seconds; with ``ties`` often several devices at one time (a
    sensor clock tick). Devices g0, g1 and None (a NULL key is a group too)."""
    t, out = base, []
    while len(out) < n:
        t += rng.choice(gaps) if rng.random() < 0.7 else rng.randrange(1, 8 * S)
        devices = rng.sample(["g0", "g1", None], rng.choice([1, 1, 2, 3]) if ties else 1)
        out += [(g, t, None if rng.random() < 0.15 else round(rng.uniform(0, 10), 1)) for g in devices]
    return out


def pick_until(rng: random.Random, times: list[int], windows: list[dict]) -> int:
    """Often an instant where some window's closing flips (its end, a row's time, one off), else any."""
    ends = sorted({x for w in windows for x in (w["end"], w["end"] - 1, w["end"] + 1, max(w["members"]))})
    if ends and rng.random() < 0.8:
        return rng.choice(ends)
    return rng.randrange(min(times) - S, max(times) + 10 * S)


def run_random(spark, cases, *, untils=3):
    """cases: (trigger, rows, reference(rows, until) -> windows, seed), ``rows`` one stream's
    ``(device, time, value)``; each case runs with ``untils`` close_until values, its windows over
    the whole stream (the devices only ride along). Compares every window's start, end, members and
    WCLOSED (and WLAST/WROWS, via windows_of)."""
    data, runs = [], []
    expected: Counter = Counter()
    for ci, (trigger, rows, reference, seed) in enumerate(cases):
        rng = random.Random(seed)
        data += [(ci, g, t, v, None) for g, t, v in rows]
        for _ in range(untils):
            until = pick_until(rng, [t for _, t, _ in rows], reference(rows, 10**18))
            for w in reference(rows, until):
                expected[(len(runs), ci, w["start"], w["end"], w["members"], w["closed"])] += 1
            runs.append((ci, trigger, until))
    df = frame(spark, data)
    out = None
    for ri, (ci, trigger, until) in enumerate(runs):
        o = assign_windows(
            df.filter(F.col("case") == ci), trigger, time_column="ts", keys=["case"], close_until=at(until)
        )
        o = o.withColumn("run", F.lit(ri))
        out = o if out is None else out.unionByName(o)
    got = windows_of(out, key=("run", "case"))
    missing, extra = expected - got, got - expected
    if missing or extra:
        pytest.fail(
            f"{sum(missing.values())} windows missing, e.g. {sorted(missing, key=str)[:2]}; "
            f"{sum(extra.values())} unexpected, e.g. {sorted(extra, key=str)[:2]}"
        )
    closed = [k[-1] for k in expected]
    assert any(closed) and not all(closed)


def test_sliding_random(spark):
    variants = [  # size, delay, over (SQL, python)
        (5 * S, 5 * S, None),
        (10 * S, 0, None),
        (3 * S, 2 * S, ("v > 5", lambda v: v is not None and v > 5)),
        (M, 0, ("v < 3 OR v IS NULL", lambda v: v is None or v < 3)),
        (7 * S, 1, None),
    ]
    cases = []
    for seed, (size, delay, over) in enumerate(variants):
        rng = random.Random(600 + seed)
        gaps = [size, delay or S, size + delay, S, 1, 2 * S, size - 1]
        rows = gen_stream(rng, base=BASE, gaps=gaps, n=rng.randrange(60, 160))

        def reference(rows, until, size=size, delay=delay, over=over):
            fires = None if over is None else [over[1](v) for _, _, v in rows]
            return ref.sliding_windows([t for _, t, _ in rows], size=size, delay=delay, triggers=fires, until=until)

        trigger = EkSlidingTrigger(
            size=timedelta(microseconds=size), delay=timedelta(microseconds=delay), over=over and over[0]
        )
        cases.append((trigger, rows, reference, seed))
    run_random(spark, cases)


def test_session_random(spark):
    variants = [  # max_duration, timeout, offset, base (timeout <= max_duration: see the reference)
        (M, M, 0, BASE),
        (M, 10 * S, 0, BASE),
        (25 * S, 25 * S, 0, BASE + 7 * S),
        (7 * S, 7 * S, 3 * S, BASE),
        (30 * 60 * S, 5 * M, 19_800 * S % (30 * 60 * S), BASE + 13 * S),  # +05:30, MI 30: hh:00 / hh:30
        (20 * S, 10 * S, 0, -(10**15) - 3 * S),  # before 1970: floor division of negative times
    ]
    cases = []
    for seed, (d, timeout, offset, base) in enumerate(variants):
        rng = random.Random(700 + seed)
        gaps = [timeout, timeout + 1, d, d - 1, 2 * d, d // 2, S, 1, 3 * S]
        rows = gen_stream(rng, base=base, gaps=gaps, n=rng.randrange(60, 160))

        def reference(rows, until, timeout=timeout, d=d, offset=offset):
            times = [t for _, t, _ in rows]
            return ref.session_windows(times, timeout=timeout, max_duration=d, offset=offset, until=until)

        trigger = EkSessionTrigger(
            timeout=timedelta(microseconds=timeout),
            max_duration=timedelta(microseconds=d),
            offset=timedelta(microseconds=offset),
        )
        cases.append((trigger, rows, reference, seed))
    run_random(spark, cases)


def test_count_random(spark):
    # COUNTWINDOW counts the stream's rows, whichever device they come from (unique times: rows
    # sharing one would be counted in an order eKuiper takes from their arrival)
    variants = [(5, 2), (5, 1), (5, 5), (4, 3), (7, 2), (3, 3), (6, 4)]
    cases = []
    for seed, (n, k) in enumerate(variants):
        rng = random.Random(800 + seed)
        rows = gen_stream(rng, base=BASE, gaps=[S, 10 * S], n=rng.randrange(40, 120), ties=False)

        def reference(rows, until, n=n, k=k):
            return ref.count_windows([t for _, t, _ in rows], count=n, interval=k, until=until)

        cases.append((CountTrigger(count=n, slide=k, ekuiper=True), rows, reference, seed))
    run_random(spark, cases)
