"""assign_windows against the pure-Python reference (tests/window_reference.py) and hand-made cases.

Randomized cases of one trigger type are unioned and collected in one Spark job; each case keeps its
own trigger and close_until and is told apart by the ``case`` column (a key, or the only group).
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import datetime, timedelta

import pyarrow as pa
import pytest
import window_reference as ref
from pyspark.sql import functions as F

from cq_engine.model import CountTrigger, EventTrigger, SessionTrigger, SlidingTrigger, StateTrigger
from cq_engine.streams.windows.tdengine import (
    CLOSE_ROW,
    NEXT_STATE,
    OPEN_ROW,
    PREV_STATE,
    STATE,
    WCLOSED,
    WEND,
    WLAST,
    WROWS,
    WSTART,
    assign_windows,
    condition_columns,
)
from cq_engine.times import EPOCH, UTC

S = 1_000_000
M = 60 * S
H = 60 * M
SCHEMA = pa.schema(
    [
        ("case", pa.int32()),
        ("g", pa.string()),
        ("tm", pa.int64()),
        ("v", pa.float64()),
        ("st", pa.int32()),
        ("a", pa.float64()),
        ("b", pa.string()),
    ]
)
COLS = SCHEMA.names


def frame(spark, data: list[tuple]):
    """A local DataFrame of SCHEMA rows (via Arrow: a LocalRelation, no Python workers), plus ``ts``."""
    table = pa.Table.from_pylist([dict(zip(COLS, r)) for r in data], schema=SCHEMA)
    return spark.createDataFrame(table).withColumn("ts", F.timestamp_micros("tm"))


def us(t: datetime) -> int:
    return (t - EPOCH) // timedelta(microseconds=1)


def at(us_: int) -> datetime:
    return EPOCH + timedelta(microseconds=us_)


def gen_rows(rng: random.Random, *, base: int, gaps: list[int], groups: int = 3) -> dict[str, list[dict]]:
    """2-3 groups of 50-200 rows with values and NULLs. Times advance by a gap from ``gaps`` or whole
    seconds up to the largest (so rows hit window boundaries and exact gaps), and some rows are
    jittered by a few microseconds (not cumulatively, so times stay unique and ordered)."""
    out = {}
    step = min(min(gaps), S)
    for gi in range(groups):
        t, st, rows = base + rng.randrange(0, max(gaps) // step) * step, rng.randrange(3), []
        for _ in range(rng.randrange(50, 201)):
            t += rng.choice(gaps) if rng.random() < 0.6 else rng.randrange(1, max(gaps) // S + 1) * S
            if rng.random() > 0.7:
                st = rng.randrange(3)
            rows.append(
                dict(
                    t=t + (rng.randrange(step) if rng.random() < 0.2 else 0),
                    v=None if rng.random() < 0.1 else round(rng.uniform(-5, 15), 1),
                    st=None if rng.random() < 0.1 else st,
                    a=None if rng.random() < 0.3 else rng.uniform(0, 1),
                    b=None if rng.random() < 0.5 else rng.choice("xy"),
                )
            )
        out[f"g{gi}"] = rows
    return out


def pick_until(rng: random.Random, groups: dict[str, list[dict]], near: int, anchor: int = 0) -> int:
    """A close_until inside the data: often a row's time (boundaries of data-shaped windows), else
    near one, or on the grid ``anchor + k*near`` (boundaries of time windows)."""
    ts = sorted(r["t"] for rows in groups.values() for r in rows)
    x = ts[rng.randrange(len(ts) // 4, len(ts) - 1)]
    return rng.choice([x, x, x + near, x - near, x + rng.randrange(0, near + 1), anchor + (x - anchor) // near * near])


def run_cases(spark, cases, extras=()):
    """cases: (trigger, groups, until, reference(rows, until) -> list, keyed, timezone).
    Returns (actual, expected) Counters of (case, g, t, ws, we, last, n, closed, *extras)."""
    data = [
        (ci, g, r["t"], r["v"], r["st"], r["a"], r["b"])
        for ci, (_, groups, *_rest) in enumerate(cases)
        for g, rows in groups.items()
        for r in rows
    ]
    df = frame(spark, data)
    frames, expected = {}, Counter()
    for ci, (trigger, groups, until, reference, keyed, tz) in enumerate(cases):
        rng = random.Random(ci)
        if rng.random() < 0.6:  # exactly on an instant where some window's closing flips
            windows = reference(groups["g0"], until)
            until = rng.choice(sorted({w[k] for w in windows for k in ("ws", "we", "last")}))
        sub = df.filter(F.col("case") == ci)
        if not keyed:  # one group only
            sub = sub.filter(F.col("g") == "g0")
            groups = {"g0": groups["g0"]}
        out = assign_windows(
            sub, trigger, time_column="ts", keys=["case", "g"] if keyed else [], close_until=at(until), timezone=tz
        )
        frames.setdefault(out.schema.simpleString(), []).append(out)  # event structs differ per case
        for g, rows in groups.items():
            for w in reference(rows, until):
                expected[
                    (ci, g, w["t"], w["ws"], w["we"], w["last"], w["n"], w["closed"], *[w[e] for e in extras])
                ] += 1
    extra_cols = {
        "state": STATE,
        "prev_state": PREV_STATE,
        "next_state": NEXT_STATE,
        "open_row": OPEN_ROW,
        "close_row": CLOSE_ROW,
    }
    actual = Counter()
    for same_schema in frames.values():
        out = same_schema[0]
        for f in same_schema[1:]:
            out = out.unionByName(f)
        assert out.columns[: len(COLS) + 1] == [*COLS, "ts"]
        got = out.select(
            "case",
            "g",
            F.unix_micros("ts"),
            *[F.unix_micros(c) for c in (WSTART, WEND, WLAST)],
            WROWS,
            WCLOSED,
            *[extra_cols[e] for e in extras],
        ).collect()
        actual.update(tuple(tuple(x) if hasattr(x, "__fields__") else x for x in row) for row in got)
    return actual, expected


def check(actual: Counter, expected: Counter) -> None:
    if actual != expected:
        missing, extra = sorted((expected - actual).elements()), sorted((actual - expected).elements())
        pytest.fail(
            f"{len(missing)} expected rows missing, e.g. {missing[:5]}; {len(extra)} unexpected rows, e.g. {extra[:5]}"
        )


BASE = us(datetime(2024, 3, 1, 10, 0, tzinfo=UTC))


# --- randomized ------------------------------------------------------------------------------


def test_interval_random(spark):
    variants = [  # interval, sliding, offset, gaps, keyed
        (M, 30 * S, 0, [S, 10 * S, 30 * S], True),
        (M, M, 7 * S, [S, 20 * S, 60 * S], True),
        (10 * M, 3 * M, M, [30 * S, M, 3 * M], True),
        (H, H, 0, [M, 10 * M], False),
        (30 * S, 45 * S, 5 * S, [5 * S, 15 * S], True),
        (7 * M, 2 * M, 0, [10 * S, M], True),
    ]
    cases = []
    for seed, (i, s, o, gaps, keyed) in enumerate(variants):
        rng = random.Random(seed)
        groups = gen_rows(rng, base=BASE, gaps=gaps)
        cases.append(
            (
                SlidingTrigger(
                    sliding=timedelta(microseconds=s),
                    interval=timedelta(microseconds=i),
                    interval_offset=timedelta(microseconds=o),
                ),
                groups,
                pick_until(rng, groups, s, anchor=o + i),
                lambda rows, until, i=i, s=s, o=o: ref.interval_windows(
                    rows, interval=i, sliding=s, offset=o, until=until
                ),
                keyed,
                "UTC",
            )
        )
    check(*run_cases(spark, cases))


def test_sliding_only_random(spark):
    ny = us(datetime(2025, 3, 7, 12, tzinfo=UTC))  # spans the 2025-03-09 DST change
    ny_fall = us(datetime(2025, 10, 31, 12, tzinfo=UTC))  # spans 2025-11-02
    variants = [  # sliding, offset, zone, base, gaps, keyed
        (5 * H + 30 * M, 0, "Asia/Shanghai", BASE, [H, 2 * H], True),
        (5 * H + 30 * M, S, "Asia/Shanghai", BASE, [30 * M, 3 * H], True),
        (5 * H + 30 * M, 20 * M, "America/New_York", ny, [H, 2 * H], True),
        (2 * H, 90 * M, "Europe/Berlin", BASE, [15 * M, H], True),
        (25 * H, S, "Asia/Shanghai", BASE, [4 * H, 8 * H], True),
        (7 * M, 0, "UTC", BASE, [S, 3 * M], False),
        (3 * H + 7 * M, 11 * M, "America/New_York", ny_fall, [20 * M, H], True),
        # the 23-hour 2025-03-09 has no tick (offset >= its length): windows span two days
        (5 * H, 23 * H + 30 * M, "America/New_York", ny, [H, 3 * H], True),
    ]
    cases = []
    for seed, (s, o, tz, base, gaps, keyed) in enumerate(variants):
        rng = random.Random(100 + seed)
        groups = gen_rows(rng, base=base, gaps=gaps)
        cases.append(
            (
                SlidingTrigger(sliding=timedelta(microseconds=s), sliding_offset=timedelta(microseconds=o)),
                groups,
                pick_until(rng, groups, s),
                lambda rows, until, s=s, o=o, tz=tz: ref.tick_windows(
                    rows, sliding=s, offset=o, timezone=tz, until=until
                ),
                keyed,
                tz,
            )
        )
    check(*run_cases(spark, cases))


def test_session_random(spark):
    variants = [
        (10 * S, [S, 10 * S, 11 * S, 30 * S], True),
        (M, [10 * S, M, M + 1, 3 * M], True),
        (30 * S, [5 * S, 30 * S, 2 * M], False),
        (S, [S // 2, S, 3 * S], True),
    ]
    cases = []
    for seed, (gap, gaps, keyed) in enumerate(variants):
        rng = random.Random(200 + seed)
        groups = gen_rows(rng, base=BASE, gaps=gaps)
        cases.append(
            (
                SessionTrigger(gap=timedelta(microseconds=gap)),
                groups,
                pick_until(rng, groups, gap),
                lambda rows, until, gap=gap: ref.session_windows(rows, gap=gap, until=until),
                keyed,
                "UTC",
            )
        )
    check(*run_cases(spark, cases))


def test_state_random(spark):
    variants = [
        ("st", None, True),
        ("st", 30 * S, True),
        ("st", 2 * M, False),
        ("st * 2", 20 * S, True),
        ("st", None, True),
    ]
    cases = []
    for seed, (col, true_for, keyed) in enumerate(variants):
        rng = random.Random(300 + seed)
        groups = gen_rows(rng, base=BASE, gaps=[S, 10 * S, 30 * S])
        state = (lambda r: r["st"]) if col == "st" else (lambda r: None if r["st"] is None else r["st"] * 2)
        tf = None if true_for is None else timedelta(microseconds=true_for)
        cases.append(
            (
                StateTrigger(column=col, true_for=tf),
                groups,
                pick_until(rng, groups, 10 * S),
                lambda rows, until, state=state, tf=true_for: ref.state_windows(
                    rows, state=state, true_for=tf, until=until
                ),
                keyed,
                "UTC",
            )
        )
    check(*run_cases(spark, cases, extras=("state", "prev_state", "next_state")))


def _v(op, x):
    return lambda r: r["v"] is not None and op(r["v"], x)


def test_event_random(spark):
    lt, gt = (lambda a, b: a < b), (lambda a, b: a > b)
    variants = [  # start sql, end sql, start fn, end fn, true_for, keyed
        ("v < 0", "v > 9", _v(lt, 0), _v(gt, 9), None, True),
        ("v < 0", "v > 9", _v(lt, 0), _v(gt, 9), 40 * S, True),
        ("v > 5", "v > 8", _v(gt, 5), _v(gt, 8), None, False),
        (
            "a IS NOT NULL AND v < 2",
            "b = 'x'",
            lambda r: r["a"] is not None and _v(lt, 2)(r),
            lambda r: r["b"] == "x",
            15 * S,
            True,
        ),
    ]
    cases = []
    for seed, (start, end, sf, ef, true_for, keyed) in enumerate(variants):
        rng = random.Random(400 + seed)
        groups = gen_rows(rng, base=BASE, gaps=[S, 10 * S, 30 * S])
        tf = None if true_for is None else timedelta(microseconds=true_for)
        oc, cc = condition_columns(start, COLS), condition_columns(end, COLS)
        cases.append(
            (
                EventTrigger(start=start, end=end, true_for=tf),
                groups,
                pick_until(rng, groups, 10 * S),
                lambda rows, until, sf=sf, ef=ef, tf=true_for, oc=oc, cc=cc: ref.event_windows(
                    rows, start=sf, end=ef, true_for=tf, until=until, open_cols=oc, close_cols=cc
                ),
                keyed,
                "UTC",
            )
        )
    assert condition_columns("a IS NOT NULL AND V < 2", COLS) == ["a", "v"]
    check(*run_cases(spark, cases, extras=("open_row", "close_row")))


def test_count_random(spark):
    variants = [(10, 10, (), True), (4, 2, (), True), (5, 3, ("a", "b"), True), (3, 5, ("b",), True), (7, 1, (), False)]
    cases = []
    for seed, (n, slide, cols, keyed) in enumerate(variants):
        rng = random.Random(500 + seed)
        groups = gen_rows(rng, base=BASE, gaps=[S, 10 * S])
        cases.append(
            (
                CountTrigger(count=n, slide=slide, columns=cols),
                groups,
                pick_until(rng, groups, 5 * S),
                lambda rows, until, n=n, slide=slide, cols=cols: ref.count_windows(
                    rows, count=n, slide=slide, columns=cols, until=until
                ),
                keyed,
                "UTC",
            )
        )
    check(*run_cases(spark, cases))


# --- hand-computed ---------------------------------------------------------------------------


def _hand(spark, rows, trigger, until, *, timezone="UTC", extras=()):
    """rows: (g, seconds after BASE, v, st); returns sorted tuples
    (g, t_s, ws_s, we_s, last_s, n, closed, *extras) in seconds after BASE."""
    df = frame(spark, [(0, g, BASE + int(t * S), v, st, None, None) for g, t, v, st in rows])
    out = assign_windows(
        df, trigger, time_column="ts", keys=["g"], close_until=at(BASE + int(until * S)), timezone=timezone
    )
    sec = lambda c: (F.unix_micros(c) - F.lit(BASE)) / F.lit(S)
    got = out.select("g", sec("ts"), sec(WSTART), sec(WEND), sec(WLAST), WROWS, WCLOSED, *extras).collect()
    return sorted(tuple(tuple(x) if hasattr(x, "__fields__") else x for x in r) for r in got)


def test_hand_interval_1m_sliding_30s(spark):
    got = _hand(
        spark,
        [("m", 10, 1.0, 0), ("m", 40, 2.0, 0), ("m", 65, 3.0, 0)],
        SlidingTrigger(sliding=timedelta(seconds=30), interval=timedelta(minutes=1)),
        until=60,
    )
    assert got == [
        ("m", 10, -30, 30, 10, 1, True),
        ("m", 10, 0, 60, 40, 2, True),
        ("m", 40, 0, 60, 40, 2, True),
        ("m", 40, 30, 90, 65, 2, False),
        ("m", 65, 30, 90, 65, 2, False),
        ("m", 65, 60, 120, 65, 1, False),
    ]


def test_hand_sliding_only_shanghai(spark):
    # BASE is 2024-03-01 18:00 in Shanghai; 5h30m with 1s offset ticks at 00:00:01, 05:30:01,
    # 11:00:01, 16:30:01, 22:00:01 local. BASE - 16:30:01 local = -5399 s.
    day_tick = 6 * 3600 + 1  # next day's 00:00:01 local, in seconds after BASE
    got = _hand(
        spark,
        [("s", 0, 1.0, 0), ("s", 5 * 3600, 1.0, 0), ("s", day_tick, 1.0, 0)],
        SlidingTrigger(sliding=timedelta(hours=5, minutes=30), sliding_offset=timedelta(seconds=1)),
        until=day_tick,
        timezone="Asia/Shanghai",
    )
    assert got == [
        ("s", 0, -5399, 4 * 3600 + 1, 0, 1, True),
        ("s", 5 * 3600, 4 * 3600 + 1, day_tick, 5 * 3600, 1, True),
        ("s", day_tick, day_tick, day_tick + 19800, day_tick, 1, False),
    ]


def test_hand_session(spark):
    rows = [("a", 0, 1.0, 0), ("a", 10, 1.0, 0), ("a", 25, 1.0, 0), ("a", 30, 1.0, 0)]
    got = _hand(spark, rows, SessionTrigger(gap=timedelta(seconds=10)), until=30)
    assert got == [
        ("a", 0, 0, 20, 10, 2, True),
        ("a", 10, 0, 20, 10, 2, True),
        ("a", 25, 25, 40, 30, 2, False),
        ("a", 30, 25, 40, 30, 2, False),
    ]
    # last + gap == T is not closed yet: a row at T would still join
    assert _hand(spark, rows[:2], SessionTrigger(gap=timedelta(seconds=10)), until=20)[0][6] is False


def test_hand_state(spark):
    rows = [
        ("a", 0, 0, 1),
        ("a", 1, 0, 1),
        ("a", 2, 0, None),
        ("a", 3, 0, 1),
        ("a", 4, 0, 2),
        ("a", 5, 0, 2),
        ("a", 9, 0, 1),
    ]
    got = _hand(spark, rows, StateTrigger(column="st"), until=8, extras=(STATE, PREV_STATE, NEXT_STATE))
    assert got == [
        ("a", 0, 0, 3, 3, 3, True, 1, None, 2),
        ("a", 1, 0, 3, 3, 3, True, 1, None, 2),
        ("a", 3, 0, 3, 3, 3, True, 1, None, 2),
        ("a", 4, 4, 5, 5, 2, False, 2, 1, 1),
        ("a", 5, 4, 5, 5, 2, False, 2, 1, 1),
        ("a", 9, 9, 9, 9, 1, False, 1, 2, None),
    ]
    got = _hand(spark, rows, StateTrigger(column="st", true_for=timedelta(seconds=2)), until=9, extras=(STATE,))
    assert [r[1] for r in got] == [0, 1, 3, 9]  # [4, 5] lasted 1 s and is closed: dropped; [9] is open


def test_hand_event(spark):
    vs = [1, -1, 3, 10, -2, 11, 5, -3, 4]
    rows = [("e", i, float(v), 0) for i, v in enumerate(vs)]
    trig = EventTrigger(start="v < 0", end="v > 9")
    got = _hand(spark, rows, trig, until=8, extras=(OPEN_ROW, CLOSE_ROW))
    assert got == [
        ("e", 1, 1, 3, 3, 3, True, (-1.0,), (10.0,)),
        ("e", 2, 1, 3, 3, 3, True, (-1.0,), (10.0,)),
        ("e", 3, 1, 3, 3, 3, True, (-1.0,), (10.0,)),
        ("e", 4, 4, 5, 5, 2, True, (-2.0,), (11.0,)),
        ("e", 5, 4, 5, 5, 2, True, (-2.0,), (11.0,)),
        ("e", 7, 7, 8, 8, 2, False, (-3.0,), None),
        ("e", 8, 7, 8, 8, 2, False, (-3.0,), None),
    ]
    # the opening row may close its own window
    got = _hand(
        spark,
        [("e", 0, 9.0, 0), ("e", 1, 6.0, 0), ("e", 2, 7.0, 0), ("e", 3, 9.5, 0)],
        EventTrigger(start="v > 5", end="v > 8"),
        until=3,
    )
    assert got == [
        ("e", 0, 0, 0, 0, 1, True),
        ("e", 1, 1, 3, 3, 3, True),
        ("e", 2, 1, 3, 3, 3, True),
        ("e", 3, 1, 3, 3, 3, True),
    ]


def test_hand_count(spark):
    rows = [("c", i, 0.0, 0) for i in range(25)]
    got = _hand(spark, rows, CountTrigger(count=10, slide=10), until=30)
    windows = sorted({r[2:] for r in got})
    assert windows == [(0, 9, 9, 10, True), (10, 19, 19, 10, True), (20, 24, 24, 5, False)]
    got = _hand(spark, rows[:6], CountTrigger(count=4, slide=2), until=4)
    assert sorted({r[2:] for r in got}) == [(0, 3, 3, 4, True), (2, 5, 5, 4, False), (4, 5, 5, 2, False)]
    assert len(got) == 10


def test_empty_input_keeps_schema(spark):
    df = frame(spark, [(0, "g", BASE, 1.0, 1, None, None)]).filter(F.col("case") < 0)
    for trig, extra in [
        (SlidingTrigger(sliding=timedelta(hours=1)), []),
        (StateTrigger(column="st"), [STATE, PREV_STATE, NEXT_STATE]),
        (EventTrigger(start="v < 0", end="v > 9"), [OPEN_ROW, CLOSE_ROW]),
    ]:
        out = assign_windows(df, trig, time_column="ts", keys=[], close_until=at(BASE), timezone="Asia/Shanghai")
        assert out.columns == [*COLS, "ts", WSTART, WEND, WLAST, WROWS, WCLOSED, *extra]
        assert out.count() == 0
    assert dict(out.dtypes)[WROWS] == "bigint" and dict(out.dtypes)[WCLOSED] == "boolean"


def test_rejects_bad_arguments(spark):
    df = frame(spark, [(0, "g", BASE, 1.0, 1, None, None)])
    with pytest.raises(ValueError, match="timezone-aware"):
        assign_windows(
            df, SessionTrigger(gap=timedelta(seconds=1)), time_column="ts", keys=[], close_until=datetime(2024, 1, 1)
        )
    with pytest.raises(ValueError, match="offset"):
        assign_windows(
            df,
            SlidingTrigger(sliding=timedelta(hours=1), sliding_offset=timedelta(days=1)),
            time_column="ts",
            keys=[],
            close_until=at(BASE),
        )
    with pytest.raises(TypeError):
        assign_windows(df, object(), time_column="ts", keys=[], close_until=at(BASE))
