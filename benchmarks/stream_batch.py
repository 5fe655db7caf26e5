"""``stream_batch``: a round of live stream works executed together vs one by one (same server).

Through a Spark Connect server started for it (the path of the stream sensor computing live windows
in its warm process under ``cq dev``).

100 window-triggered streams over one fed ``meters`` table (``cq dev``'s smart meters, one reading
per meter per second): 50 of one INTERVAL shape (the plainest stream, each with its own aggregates),
and 50 of other kinds (HOPPING windows, SESSION, STATE_WINDOW, EVENT_WINDOW, COUNT_WINDOW, eKuiper
SLIDINGWINDOW rules, INTERVAL streams with a WHERE of their own). Two warehouses are fed the same
commits (10 s of readings each); after every commit each stream's sensor is evaluated (Spark-free,
not timed) and its live work runs: in one warehouse one by one with ``streams.run.run_work`` (the
one-run-per-stream model, minus its process start), in the other as one round of
``streams.fused.run_works``. The ratio is fused / one-by-one; every sink, frontier and ledger row
count is checked equal at the end.
"""

from __future__ import annotations

import os
from datetime import timedelta

from . import T0, Context, Outcome, make_engine, verdict

NAME = "stream_batch"
SUBPROCESS = True  # the runner stops its classic session: this one is a Connect client
TARGET = 0.25  # fused must be at least 4x cheaper per stream than one by one
_TABLE = """CREATE TABLE meters (ts TIMESTAMP, current FLOAT, voltage INT, phase FLOAT, status INT)
  TAGS (location VARCHAR(64), groupid INT);
"""
_AGGS = ("avg(current)", "max(current)", "min(voltage)", "sum(phase)", "avg(voltage)")


def streams_sql(n: int) -> str:
    """``n`` streams: half of one INTERVAL shape, the rest a mix of window types (``sNNN``)."""
    out = [_TABLE]
    for i in range(n):
        agg = _AGGS[i % len(_AGGS)]
        into = f"INTO s{i:03d}_out AS SELECT _twstart, {agg} AS v, count(*) AS n FROM %%trows"
        k = i - n // 2
        if k < 0:
            trigger = "INTERVAL(10s) SLIDING(10s)"
        elif k % 10 in (0, 1):
            trigger = "INTERVAL(30s) SLIDING(10s)"
        elif k % 10 == 2:
            trigger = "SESSION(ts, 3s)"
            into += " WHERE current > 10"
        elif k % 10 == 3:
            trigger = "STATE_WINDOW(status)"
        elif k % 10 == 4:
            trigger = "EVENT_WINDOW(START WITH current > 11 END WITH current < 10)"
        elif k % 10 == 5:
            trigger = "COUNT_WINDOW(12)"
        elif k % 10 in (6, 7):
            out.append(
                f"CREATE RULE s{i:03d} INTO s{i:03d}_out AS SELECT {agg} AS v, count(*) AS n FROM meters "
                f"GROUP BY tbname, SLIDINGWINDOW(ss, {3 + k % 5}) OVER (WHEN current > 11.5);\n"
            )
            continue
        else:
            trigger = "INTERVAL(10s) SLIDING(10s)"
            into += f" WHERE voltage > {200 + k}"
        out.append(f"CREATE STREAM s{i:03d} {trigger} FROM meters PARTITION BY tbname {into};\n")
    return "".join(out)


def run(ctx: Context) -> Outcome:
    from . import on_connect_server

    n = 20 if ctx.quick else 100
    rounds = 1 if ctx.quick else 2
    return on_connect_server(ctx, NAME, lambda work, spark: _measure(ctx, work, spark, n=n, rounds=rounds))


def _measure(ctx: Context, work, spark, *, n: int, rounds: int) -> Outcome:
    import time

    from cq_engine.cli.feed import meter_rows
    from cq_engine.streams.fused import WorkRequest, run_works
    from cq_engine.streams.run import run_work
    from cq_engine.streams.sensor import evaluate_stream

    sql = streams_sql(n)
    alone, fused = make_engine(work / "alone", sql, spark), make_engine(work / "fused", sql, spark)
    names = [f"s{i:03d}" for i in range(n)]
    cursors: dict = {"alone": {}, "fused": {}}
    feed = {"t": T0}

    def commit() -> None:
        """10 s of readings into both warehouses, in one commit each."""
        rows = meter_rows(start=feed["t"], end=feed["t"] + timedelta(seconds=10), every=timedelta(seconds=1))
        feed["t"] += timedelta(seconds=10)
        for engine in (alone, fused):
            engine.storage.append("meters", rows)

    def works(side: str, engine) -> list:
        """Each stream's sensor evaluation (Spark-free): its live work, if any."""
        out: list = []
        now = feed["t"] + timedelta(seconds=1)
        for name in names:
            stream = engine.stream(name)
            plan = evaluate_stream(engine, stream, cursor=cursors[side].get(name), now=now)
            cursors[side][name] = plan.cursor.to_json()
            out.extend(WorkRequest(stream=stream, work=w) for w in plan.works)
        return out

    def one_by_one() -> float:
        todo = works("alone", alone)
        clock = time.perf_counter()
        for r in todo:
            run_work(alone.ctx, r.stream, r.work)
        return time.perf_counter() - clock

    def together() -> tuple[float, int]:
        todo = works("fused", fused)
        rounds: list[list] = []  # each stream's r-th work in round r
        for r in todo:
            k = sum(q.stream.name == r.stream.name for q in todo[: todo.index(r)])
            rounds += [[]] * (k + 1 - len(rounds))
            rounds[k] = [*rounds[k], r]
        clock = time.perf_counter()
        failed = [o for batch in rounds for o in run_works(fused.ctx, batch) if isinstance(o, Exception)]
        if failed:
            raise RuntimeError(f"{len(failed)} fused stream work(s) failed: {failed[0]}")
        return time.perf_counter() - clock, len(todo)

    ctx.log(f"{n} streams; a minute of readings before they start")
    for _ in range(6):
        commit()
    works("alone", alone), works("fused", fused)  # the sensors start: history is not computed
    ctx.log("warm-up round")
    commit()
    one_by_one()
    together()
    a_times: list[float] = []
    f_times: list[float] = []
    counts: list[int] = []
    for r in range(rounds):
        commit()
        ctx.log(f"round {r + 1}/{rounds}")
        a_times.append(one_by_one())
        t, k = together()
        f_times.append(t)
        counts.append(k)
    _check_same(alone, fused, names)
    a, t, k = sum(a_times), sum(f_times), sum(counts)  # the rounds' totals (the same works both ways)
    ratio = t / a
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    line = (
        f"{NAME}: {k} live stream works in {rounds} round(s), fused {t:.2f}s ({t / k * 1000:.0f} ms/stream) vs "
        f"one by one {a:.2f}s ({a / k * 1000:.0f} ms/stream): {verdict(ratio, TARGET)}; load average {load}"
    )
    return Outcome(NAME, line, ratio=ratio, target=TARGET)


def _check_same(alone, fused, names: list[str]) -> None:
    """Every sink and frontier of the two warehouses holds the same rows, and the ledgers agree."""
    from deltalake import DeltaTable

    def rows(engine, path: str) -> list:
        uri = f"{engine.settings.warehouse}/{path}"
        if not DeltaTable.is_deltatable(uri):
            return []
        return sorted(str(sorted(r.items())) for r in DeltaTable(uri).to_pyarrow_table().to_pylist())

    written = 0
    for name in names:
        for path in (f"{name}_out", f"_cq/streams/{name}/frontier"):
            expected = rows(alone, path)
            if rows(fused, path) != expected:
                raise RuntimeError(f"fused and one-by-one stream works left different rows in {path}")
            written += len(expected) if path.endswith("_out") else 0
    if not written:
        raise RuntimeError("no stream wrote a row: the comparison would prove nothing")

    def ledger(engine) -> list:
        return sorted((e.definition, e.range_start, e.rows_written, e.status) for e in engine.ledger.entries())

    if ledger(alone) != ledger(fused):
        raise RuntimeError("fused and one-by-one stream works left different ledgers")
