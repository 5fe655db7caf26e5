"""eKuiper windows (seed 003) of assign_windows: the seed's examples by hand, and randomized cases
against the pure-Python reference (tests/ekuiper_reference.py).

Randomized cases of one window kind are unioned and collected in one Spark job; each case keeps its
own trigger and close_until and is told apart by the ``case`` key column.
"""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import datetime, timedelta

import ekuiper_reference as ref
import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from cq_engine.model import CountTrigger, EkSessionTrigger, EkSlidingTrigger
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


def windows_of(out, *, key=("case", "g"), origin=0, unit=1):
    """Collect assign_windows output as {(*key, start): (end, members, closed)} with times as
    ``(t - origin) / unit``, checking each row's WLAST/WROWS against its window's members."""
    sec = lambda c: (F.unix_micros(c) - F.lit(origin)) / F.lit(unit) if unit != 1 else F.unix_micros(c)
    rows = out.select(*key, sec("ts"), sec(WSTART), sec(WEND), sec(WLAST), WROWS, WCLOSED).collect()
    members, info = defaultdict(list), {}
    for r in rows:
        *k, t, ws, we, last, n, closed = r
        members[(*k, ws)].append(t)
        info.setdefault((*k, ws), set()).add((we, last, n, closed))
    got = {}
    for w, ts in members.items():
        assert len(info[w]) == 1, f"window {w}: rows disagree on its bounds {info[w]}"
        ((we, last, n, closed),) = info[w]
        assert len(set(ts)) == len(ts) == n and max(ts) == last, f"window {w}: rows {sorted(ts)} vs {n}, {last}"
        got[w] = (we, frozenset(ts), closed)
    return got


# --- hand-checked: the seed's examples --------------------------------------------------------------


def _hand(spark, times, trigger, until, *, vs=None, ph=None, count_phase_column=None):
    """One group ``g`` of rows at ``times`` (seconds after BASE); returns sorted
    (start, end, sorted members, closed) in seconds after BASE."""
    vs = vs or [0.0] * len(times)
    df = frame(spark, [(0, "g", BASE + round(t * S), v, ph) for t, v in zip(times, vs)])
    out = assign_windows(
        df,
        trigger,
        time_column="ts",
        keys=["g"],
        close_until=at(BASE + round(until * S)),
        count_phase_column=count_phase_column,
    )
    got = windows_of(out, key=("g",), origin=BASE, unit=S)
    return sorted((ws, we, sorted(ts), closed) for (_, ws), (we, ts, closed) in got.items())


def test_sliding_with_delay_seed(spark):
    # SLIDINGWINDOW(ss, 5, 5): each event at t opens (t - 5 s, t + 5 s]
    got = _hand(
        spark, [0, 2, 4, 7, 12, 13], EkSlidingTrigger(size=timedelta(seconds=5), delay=timedelta(seconds=5)), until=12
    )
    assert got == [
        (-5, 5, [0, 2, 4], True),
        (-3, 7, [0, 2, 4, 7], True),
        (-1, 9, [0, 2, 4, 7], True),
        (2, 12, [4, 7, 12], True),  # ends at T on a row: nothing can still join
        (7, 17, [12, 13], False),
        (8, 18, [12, 13], False),
    ]
    # without a row at the end, a window ending at T is still open (a row could arrive at T)
    got = _hand(spark, [0, 2], EkSlidingTrigger(size=timedelta(seconds=5), delay=timedelta(seconds=5)), until=7)
    assert got == [(-5, 5, [0, 2], True), (-3, 7, [0, 2], False)]


def test_sliding_without_delay_and_over(spark):
    # SLIDINGWINDOW(ss, 1) OVER(WHEN v > 200): only rows with v > 200 (NULL: no) open a window
    times = [0, 0.5, 1.2, 3, 3.5, 4]
    vs = [100.0, 250.0, 300.0, 50.0, 201.0, None]
    got = _hand(spark, times, EkSlidingTrigger(size=timedelta(seconds=1), over="v > 200"), until=3.5, vs=vs)
    assert got == [(-0.5, 0.5, [0, 0.5], True), (0.2, 1.2, [0.5, 1.2], True), (2.5, 3.5, [3, 3.5], True)]
    # without OVER every row opens one; (t - 1, t] excludes t - 1 itself
    got = _hand(spark, [0, 1, 1.5], EkSlidingTrigger(size=timedelta(seconds=1)), until=1)
    assert got == [(-1, 0, [0], True), (0, 1, [1], True), (0.5, 1.5, [1, 1.5], False)]


def test_session_seed_cuts_at_aligned_minutes(spark):
    trig = EkSessionTrigger(timeout=timedelta(minutes=2), max_duration=timedelta(minutes=1))
    # events every 30 s from a whole minute: the 1-minute checks cut at each minute
    got = _hand(spark, list(range(0, 181, 30)), trig, until=180)
    assert got == [
        (0, 60, [0, 30], True),
        (60, 120, [60, 90], True),
        (120, 180, [120, 150], True),
        (180, 240, [180], False),
    ]
    # from 15 s past: at 60 the window is 45 s old (not over a minute), at 120 it is: cut there
    got = _hand(spark, list(range(15, 181, 30)), trig, until=200)
    assert got == [(15, 120, [15, 45, 75, 105], True), (135, 240, [135, 165], False)]
    # a gap over the timeout ends a window early; WEND = min(last + timeout, cut)
    got = _hand(spark, [0, 30, 200], trig, until=400)
    assert got == [(0, 60, [0, 30], True), (200, 300, [200], True)]


def test_session_timeout_below_max_duration(spark):
    trig = EkSessionTrigger(timeout=timedelta(seconds=10), max_duration=timedelta(seconds=60))
    times = [0, 5, 15, 30, 59, 61, 70, 80, 90, 100, 110, 119, 120, 125]
    got = _hand(spark, times, trig, until=40)
    assert got == [
        (0, 25, [0, 5, 15], True),  # a gap of exactly the timeout joins
        (30, 40, [30], False),  # last + timeout == T: a row at T would still join
        (59, 120, [59, 61, 70, 80, 90, 100, 110, 119], False),  # 59 is 1 s before a minute: cut at 120
        (120, 135, [120, 125], False),  # a new window from the cut, although 1 s after 119
    ]
    assert [w[3] for w in _hand(spark, times, trig, until=120)] == [True, True, True, False]
    # a window whose last row is 1 us before its cut: closed at that row's time (no row can still join)
    minute, edge = EkSessionTrigger(timeout=timedelta(seconds=60), max_duration=timedelta(seconds=60)), [0, 60 - 1e-6]
    assert [w[3] for w in _hand(spark, edge, minute, until=60 - 1e-6)] == [True]
    assert [w[3] for w in _hand(spark, edge, minute, until=60 - 2e-6)] == [False]
    # a window starting past a minute is cut at the second minute after its start
    got = _hand(spark, [61, *range(70, 181, 10)], trig, until=200)
    assert got == [(61, 180, [61, *range(70, 171, 10)], True), (180, 190, [180], True)]


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
        assert out.columns == [*COLS, "ts", WSTART, WEND, WLAST, WROWS, WCLOSED]
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


def gen_times(rng: random.Random, *, base: int, gaps: list[int], n: int) -> list[int]:
    """Unique increasing times from ``base`` advancing by one of ``gaps`` (the interesting distances:
    the timeout, multiples of the max duration, the window size...) or a random few seconds."""
    t, out = base, []
    for _ in range(n):
        t += rng.choice(gaps) if rng.random() < 0.7 else rng.randrange(1, 8 * S)
        out.append(t)
    return out


def pick_until(rng: random.Random, times: list[int], windows: list[dict]) -> int:
    """Often an instant where some window's closing flips (its end, a row's time, one off), else any."""
    ends = sorted({x for w in windows for x in (w["end"], w["end"] - 1, w["end"] + 1, max(w["members"]))})
    if ends and rng.random() < 0.8:
        return rng.choice(ends)
    return rng.randrange(times[0] - S, times[-1] + 10 * S)


def run_random(spark, cases, *, phase=False, untils=3):
    """cases: (trigger, {g: (times, vs, ph)}, reference(times, vs, ph, until) -> windows, seed); each
    case runs with ``untils`` close_until values. Compares every window's members, end and WCLOSED
    (and WLAST/WROWS, via windows_of)."""
    data, expected, runs = [], {}, []
    for ci, (trigger, groups, reference, seed) in enumerate(cases):
        rng = random.Random(seed)
        for g, (times, vs, ph) in groups.items():
            data += [(ci, g, t, v, ph) for t, v in zip(times, vs)]
        times, vs, ph = next(iter(groups.values()))
        for _ in range(untils):
            until = pick_until(rng, times, reference(times, vs, ph, 10**18))
            for g, (times_g, vs_g, ph_g) in groups.items():
                for w in reference(times_g, vs_g, ph_g, until):
                    expected[(len(runs), ci, g, w["start"])] = (w["end"], w["members"], w["closed"])
            runs.append((ci, trigger, until))
    df = frame(spark, data)
    out = None
    for ri, (ci, trigger, until) in enumerate(runs):
        o = assign_windows(
            df.filter(F.col("case") == ci),
            trigger,
            time_column="ts",
            keys=["case", "g"],
            close_until=at(until),
            count_phase_column="ph" if phase else None,
        )
        o = o.withColumn("run", F.lit(ri))
        out = o if out is None else out.unionByName(o)
    got = windows_of(out, key=("run", "case", "g"))
    missing = sorted(set(expected) - set(got), key=str)
    extra = sorted(set(got) - set(expected), key=str)
    wrong = sorted((k for k in set(got) & set(expected) if got[k] != expected[k]), key=str)
    if missing or extra or wrong:
        pytest.fail(
            f"{len(missing)} windows missing, e.g. {missing[:3]}; {len(extra)} unexpected, e.g. "
            f"{extra[:3]}; {len(wrong)} differ, e.g. "
            f"{[(k, got[k], expected[k]) for k in wrong[:2]]}"
        )
    assert any(c for _, _, c in expected.values()) and not all(c for _, _, c in expected.values())


def _groups(rng, *, base, gaps):
    names = ["g0", "g1", None][: rng.choice([2, 3])]  # a NULL key is a group too
    out = {}
    for g in names:
        times = gen_times(rng, base=base + rng.randrange(0, 3) * rng.choice(gaps), gaps=gaps, n=rng.randrange(40, 120))
        vs = [None if rng.random() < 0.15 else round(rng.uniform(0, 10), 1) for _ in times]
        out[g] = (times, vs, None)
    return out


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
        groups = _groups(rng, base=BASE, gaps=gaps)

        def reference(times, vs, ph, until, size=size, delay=delay, over=over):
            trig = None if over is None else {t for t, v in zip(times, vs) if over[1](v)}
            return ref.sliding_windows(times, size=size, delay=delay, triggers=trig, until=until)

        trigger = EkSlidingTrigger(
            size=timedelta(microseconds=size), delay=timedelta(microseconds=delay), over=over and over[0]
        )
        cases.append((trigger, groups, reference, seed))
    run_random(spark, cases)


def test_session_random(spark):
    variants = [  # timeout, max_duration, base
        (2 * M, M, BASE),
        (10 * S, M, BASE),
        (M, 25 * S, BASE + 7 * S),
        (7 * S, 7 * S, BASE),
        (30 * S, 20 * S, -(10**15) - 3 * S),  # before 1970: floor division of negative times
    ]
    cases = []
    for seed, (timeout, d, base) in enumerate(variants):
        rng = random.Random(700 + seed)
        gaps = [timeout, timeout + 1, d, d - 1, 2 * d, d // 2, S, 1, 3 * S]
        groups = _groups(rng, base=base, gaps=gaps)

        def reference(times, vs, ph, until, timeout=timeout, d=d):
            return ref.session_windows(times, timeout=timeout, max_duration=d, until=until)

        cases.append(
            (
                EkSessionTrigger(timeout=timedelta(microseconds=timeout), max_duration=timedelta(microseconds=d)),
                groups,
                reference,
                seed,
            )
        )
    run_random(spark, cases)


def test_count_random(spark):
    variants = [(5, 2), (5, 1), (5, 5), (4, 3), (7, 2), (3, 3), (6, 4)]
    cases = []
    for seed, (n, k) in enumerate(variants):
        rng = random.Random(800 + seed)
        groups = _groups(rng, base=BASE, gaps=[S, 10 * S])
        phases = iter([None, rng.choice([0, 1, 3]), rng.choice([None, 0, 2])])  # g0 has the default phase
        groups = {g: (times, vs, next(phases)) for g, (times, vs, _) in groups.items()}

        def reference(times, vs, ph, until, n=n, k=k):
            return ref.count_windows(times, count=n, interval=k, phase=ph, until=until)

        cases.append((CountTrigger(count=n, slide=k, ekuiper=True), groups, reference, seed))
    run_random(spark, cases, phase=True)
