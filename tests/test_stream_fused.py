"""streams.fused: a round of stream works run together gives exactly the sinks, frontiers, ledger
entries, NOTIFY outbox events and run results of the same works run one by one (two warehouses fed
the same commits, real Spark and Delta); a failing stream costs only itself."""

from __future__ import annotations

import json
import random
from dataclasses import asdict
from datetime import timedelta

import pyarrow as pa
import pytest
import window_reference as ref
from deltalake import DeltaTable
from streams_util import NOW, T0, TYPES, Bench, reference, sink_summary, us
from ws_recorder import Recorder

from cq_engine.errors import RunError
from cq_engine.streams import fused
from cq_engine.streams.fused import WorkRequest, run_works
from cq_engine.streams.run import run_work
from cq_engine.streams.sensor import evaluate_stream
from cq_engine.streams.timing import StreamWork

S = timedelta(seconds=1)
AGG = "SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows"
WM = "OPTIONS(WATERMARK(3s) | DELETE_RECALC)"
# Streams over `meters` of every window type: three of one shape (one shared aggregation), a HOPPING
# one, output subtables and tags, PARTITION BY an expression's groups and none, NOTIFY, an eKuiper
# rule, one over a second table `m2`, and TWA (interpolated at the windows' bounds: its own plan).
STREAMS = f"""
CREATE TABLE m2 (ts TIMESTAMP, current DOUBLE, voltage INT, status INT) TAGS (location STRING);
CREATE STREAM i1 INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname {WM} INTO i1_out AS {AGG};
CREATE STREAM i2 INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname {WM} INTO i2_out AS
  SELECT _twstart, max(voltage) AS mv, sum(current) AS total, _twend AS we FROM %%trows;
CREATE STREAM i3 INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname {WM} INTO i3_out AS
  SELECT _twstart, min(current) AS lo, count(status) AS ns, _twrownum AS rn FROM %%trows;
CREATE STREAM hop INTERVAL(1m) SLIDING(30s) FROM meters PARTITION BY tbname {WM} INTO hop_out AS {AGG};
CREATE STREAM whole INTERVAL(1m) SLIDING(1m) FROM meters {WM} INTO whole_out AS {AGG};
CREATE STREAM shaped INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname, location {WM}
  INTO shaped_out OUTPUT_SUBTABLE(CONCAT('out_', %%1)) TAGS (loc VARCHAR(24) AS CONCAT('at-', %%2)) AS
  SELECT _twstart, count(*) AS n FROM %%trows;
CREATE STREAM sess SESSION(ts, 9s) FROM meters PARTITION BY tbname {WM} INTO sess_out AS {AGG};
CREATE STREAM state STATE_WINDOW(status) TRUE_FOR(5s) FROM meters PARTITION BY tbname {WM} INTO state_out AS {AGG};
CREATE STREAM event EVENT_WINDOW(START WITH current > 5 END WITH current < 2) FROM meters PARTITION BY tbname {WM}
  INTO event_out AS {AGG};
CREATE STREAM cnt COUNT_WINDOW(4, 2) FROM meters PARTITION BY tbname {WM} INTO cnt_out AS {AGG};
CREATE STREAM told INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname {WM}
  NOTIFY('URL') ON (WINDOW_OPEN|WINDOW_CLOSE) INTO told_out AS SELECT _twstart, _twend, avg(current) AS c FROM %%trows;
CREATE RULE rule INTO rule_out AS SELECT count(*) AS n, avg(current) AS c FROM meters
  GROUP BY tbname, SLIDINGWINDOW(ss, 10) OVER (WHEN current > 6);
CREATE STREAM other INTERVAL(1m) SLIDING(1m) FROM m2 PARTITION BY tbname {WM} INTO other_out AS {AGG};
CREATE STREAM sess2 SESSION(ts, 9s) FROM meters PARTITION BY tbname {WM} INTO sess2_out AS
  SELECT _twstart, max(voltage) AS mv, count(status) AS ns FROM %%trows;
CREATE STREAM cnt2 COUNT_WINDOW(4, 2) FROM meters PARTITION BY tbname {WM} INTO cnt2_out AS {AGG};
CREATE STREAM event2 EVENT_WINDOW(START WITH current > 5 END WITH current < 2) FROM meters PARTITION BY tbname {WM}
  INTO event2_out AS SELECT _twstart, _twend AS we, sum(voltage) AS v FROM %%trows;
CREATE STREAM cnt3 COUNT_WINDOW(4, 2) FROM meters PARTITION BY tbname {WM} INTO cnt3_out AS
  SELECT _twstart, min(current) AS lo FROM %%trows;
CREATE STREAM tw INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname {WM} INTO tw_out AS
  SELECT _twstart, twa(current) AS tw, count(*) AS n FROM %%trows;
"""
# sess2, cnt2, event2 and cnt3 share their windows with sess, cnt and event whenever their frontiers agree
# (one aggregation for all); the half-round tick below moves one of each pair apart, and they converge again.
NAMES = ["i1", "i2", "i3", "hop", "whole", "shaped", "sess", "state", "event", "cnt", "told", "rule", "other"]
NAMES += ["sess2", "cnt2", "event2", "cnt3", "tw"]


def _commits(seed: int = 7) -> list[list[tuple]]:
    """Three in-order commits, then one with late rows, for two meters; unique seconds per meter."""
    rng = random.Random(seed)
    times = {d: sorted(rng.sample(range(0, 600), 90)) for d in ("d1", "d2")}
    batches: list[list[tuple]] = [[], [], [], []]
    for d, ts in times.items():
        late = set(rng.sample(ts[:45], 6))
        for t in ts:
            row = (t, d, round(rng.uniform(0, 8), 2), rng.randint(-3, 12), rng.choice([0, 0, 1, 1, None]))
            batches[3 if t in late else min(2, t // 200)].append(row)
    return batches


def _m2(b: Bench, rows: list[tuple]) -> None:
    cols: dict[str, list] = {k: [] for k in TYPES}
    for sec, name, current in rows:
        for k, v in zip(TYPES, (T0 + sec * S, name, current, 220, 0, "loc-" + name)):
            cols[k].append(v)
    b.engine.storage.append("m2", pa.table({k: pa.array(v, TYPES[k]) for k, v in cols.items()}))


class Pair:
    """Two warehouses fed the same commits: one runs each stream's works alone, the other in rounds."""

    def __init__(self, tmp_path, spark, sql: str, names: list[str]):
        self.names = names
        (tmp_path / "alone").mkdir()
        (tmp_path / "fused").mkdir()
        self.alone = Bench(tmp_path / "alone", spark, sql)
        self.fused = Bench(tmp_path / "fused", spark, sql)
        self.results: dict[str, list] = {"alone": [], "fused": []}

    def append(self, rows: list[tuple], *, m2: bool = False) -> None:
        for b in (self.alone, self.fused):
            _m2(b, rows) if m2 else b.append(rows)

    def tick(self, names: list[str] | None = None) -> None:
        """One sensor evaluation of each stream of ``names`` in both; the works run alone in one, as
        rounds (each stream's r-th work) through ``run_works`` in the other."""
        works = {}
        for n in names or self.names:
            for side, b in (("alone", self.alone), ("fused", self.fused)):
                stream = b.engine.stream(n)
                plan = evaluate_stream(b.engine, stream, cursor=b.cursors.get(n), now=NOW)
                b.cursors[n] = plan.cursor.to_json()
                if side == "alone":
                    for w in plan.works:
                        self.results["alone"].append(_outcome(_try(run_work, b.engine.ctx, stream, w)))
                else:
                    works[n] = [WorkRequest(stream=stream, work=w) for w in plan.works]
        self.run_rounds(works)

    def run_rounds(self, works: dict[str, list[WorkRequest]]) -> None:
        heard = []
        for r in range(max((len(w) for w in works.values()), default=0)):
            requests = [w[r] for w in works.values() if r < len(w)]
            got = run_works(self.fused.engine.ctx, requests, on_outcome=lambda q, o: heard.append((q, o)))
            assert [q.stream.name for q, _ in sorted(heard, key=lambda h: requests.index(h[0]))] == [
                q.stream.name for q in requests
            ]
            heard.clear()
            self.results["fused"].extend(_outcome(o) for o in got)

    def assert_same(self) -> None:
        for name in self.names:
            stream = self.alone.engine.stream(name)
            assert _table(self.fused, stream.sink_table) == _table(self.alone, stream.sink_table), name
            for state in ("frontier", "outbox"):
                path = f"_cq/streams/{name}/{state}"
                assert _table(self.fused, path) == _table(self.alone, path), (name, state)
        assert _ledger(self.fused) == _ledger(self.alone)
        assert sorted(self.results["fused"], key=str) == sorted(self.results["alone"], key=str)


def _try(f, *args):
    try:
        return f(*args)
    except Exception as exc:
        return exc


def _outcome(o) -> tuple:
    """A run's result without its duration; an error as its text (a located ``RunError``: its cause's,
    as a run alone raises it)."""
    if isinstance(o, RunError):
        assert o.__cause__ is not None and "s.sql:" in str(o)
        o = o.__cause__
    if isinstance(o, Exception):
        return ("error", str(o))
    return tuple(sorted((k, str(v)) for k, v in asdict(o).items() if k != "seconds"))


def _table(b: Bench, path: str) -> list[dict]:
    uri = f"{b.settings.warehouse}/{path}"
    if not DeltaTable.is_deltatable(uri):
        return []
    rows = pa.table(DeltaTable(uri).scan()).to_pylist()
    for r in rows:  # outbox events carry the processing time they were made at
        if "event" in r:
            r["event"] = {k: v for k, v in json.loads(r["event"]).items() if k != "eventTime"}
    return sorted(rows, key=lambda r: json.dumps(r, default=str, sort_keys=True))


_ENTRY = (
    "definition",
    "kind",
    "fire_time",
    "range_start",
    "range_end",
    "rows_written",
    "sink_version",
    "status",
    "error",
)


def _ledger(b: Bench) -> list[tuple]:
    return sorted(
        (*[str(getattr(e, f)) for f in _ENTRY], json.dumps(e.source_versions)) for e in b.engine.ledger.entries()
    )


@pytest.fixture
def recorder():
    with Recorder() as r:
        yield r


def test_fused_stream_works_equal_works_run_alone(tmp_path, spark, recorder, caplog, monkeypatch):
    shared: list[set[str]] = []  # the streams each shared aggregation answered
    share = fused._shared

    def spy(planned, members):
        shared.append({planned[i].stream.name for i in members})
        return share(planned, members)

    monkeypatch.setattr(fused, "_shared", spy)
    p = Pair(tmp_path, spark, STREAMS.replace("URL", recorder.url()), NAMES)
    p.tick()
    commits = _commits()
    for k, batch in enumerate(commits):
        p.append(batch)
        if k == 1:  # two versions of `meters` in one round: half the streams see the second commit
            p.append([(s, "d3", 1.5) for s in range(100, 400, 20)])
            p.tick(NAMES[::2])
            p.append([(s, "d3", 6.5) for s in range(400, 500, 20)])
            p.tick()
        else:
            p.append([(s, "m", float(s % 9)) for s in range(k * 200, k * 200 + 200, 7)], m2=True)
            p.tick()
    p.append(commits[0][:5])  # rows already there again, and a delete
    for b in (p.alone, p.fused):
        b.delete("current > 7 AND ts < '2026-11-21T10:03:00Z'")
    p.tick()
    p.assert_same()
    assert not [r.message for r in caplog.records if "fused job" in r.message]  # none fell back to alone
    assert {"sess", "sess2"} in shared and {"cnt", "cnt2", "cnt3"} in shared and {"event", "event2"} in shared
    assert {"cnt2", "cnt3"} in shared  # the round in which cnt had moved apart
    assert len(p.results["fused"]) >= 4 * len(NAMES)
    assert all(r[0] != "error" for r in p.results["fused"])
    # ... and both are right: the references of tests/window_reference.py over the table's rows
    until = max(r["ts"] for r in p.fused.rows()) - 3 * S
    expected = reference(p.fused.rows(), ref.session_windows, gap=9_000_000, until=us(until))
    assert expected and sink_summary(p.fused.sink("sess_out")) == expected
    interval = reference(
        p.fused.rows(), ref.interval_windows, interval=60_000_000, sliding=60_000_000, offset=0, until=us(until)
    )
    assert sink_summary(p.fused.sink("i1_out")) == interval
    assert {(r["tbname"], r["_twstart"], r["rn"]) for r in p.fused.sink("i3_out")} == {
        (g, s, n) for g, s, n, _ in interval
    }


BROKEN = f"""
CREATE STREAM good INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname {WM} INTO good_out AS {AGG};
CREATE STREAM bad INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname {WM} INTO bad_out AS
  SELECT _twstart, max(assert_true(current < 0, 'current is not negative')) AS v FROM %%trows;
CREATE STREAM twin INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname {WM} INTO twin_out AS
  SELECT _twstart, max(current) AS v FROM %%trows;
CREATE STREAM badcount COUNT_WINDOW(3) FROM meters PARTITION BY tbname {WM} INTO badcount_out AS
  SELECT _twstart, sum(assert_true(current > 100, 'too small')) AS v FROM %%trows;
CREATE STREAM sess SESSION(ts, 9s) FROM meters PARTITION BY tbname {WM} INTO sess_out AS {AGG};
"""


def test_a_failing_stream_costs_only_itself(tmp_path, spark, caplog):
    names = ["good", "bad", "twin", "badcount", "sess"]
    p = Pair(tmp_path, spark, BROKEN, names)
    p.tick()
    p.append([(s, d, float(s % 5) + 0.5) for s in range(0, 200, 4) for d in ("d1", "d2")])
    p.tick()
    p.assert_same()
    # bad's and badcount's fused jobs failed: their groups ran again one by one
    assert [r.message for r in caplog.records if "fused job" in r.message]
    errors = {r[1] for r in p.results["fused"] if r[0] == "error"}
    assert any("current is not negative" in e for e in errors) and any("too small" in e for e in errors)
    status = {(e.definition, e.status) for e in p.fused.engine.ledger.entries()}
    assert ("bad", "failed") in status and ("badcount", "failed") in status
    assert {("good", "succeeded"), ("twin", "succeeded"), ("sess", "succeeded")} <= status
    assert len(p.fused.sink("good_out")) == 6 and len(p.fused.sink("twin_out")) == 6


def test_one_work_per_stream(tmp_path, spark):
    b = Bench(tmp_path, spark, f"CREATE STREAM i1 INTERVAL(1m) SLIDING(1m) FROM meters {WM} INTO i1_out AS {AGG};")
    request = WorkRequest(stream=b.engine.stream("i1"), work=StreamWork(version=0, windows=((T0, T0 + 60 * S),)))
    with pytest.raises(ValueError, match="one work item per stream"):
        run_works(b.engine.ctx, [request, request])


# New-form queries with several rows per window: each a plan of its own in a round, the same sinks.
QUERIES = f"""
CREATE STREAM grouped INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname {WM} INTO grouped_out AS
  SELECT _twstart, status, count(*) AS n, max(current) AS m FROM %%trows GROUP BY status HAVING count(*) > 1;
CREATE STREAM top INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname {WM} INTO top_out AS
  SELECT ts, current FROM %%trows ORDER BY current DESC, ts LIMIT 3;
CREATE STREAM sess_top SESSION(ts, 9s) FROM meters PARTITION BY tbname {WM} INTO sess_top_out AS
  SELECT last(ts) AS t, status, count(*) AS n FROM %%trows PARTITION BY status;
CREATE STREAM plain INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname {WM} INTO plain_out AS {AGG};
CREATE STREAM sub INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname {WM} INTO sub_out AS
  SELECT _twstart, max(a) AS m, count(*) AS k FROM (SELECT status, avg(current) a FROM %%trows GROUP BY status);
CREATE STREAM uni INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname {WM} INTO uni_out AS
  SELECT ts, current FROM %%trows WHERE current > 5 UNION ALL SELECT ts, current FROM (SELECT ts, current FROM
  %%trows ORDER BY current LIMIT 1);
CREATE STREAM joined INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname {WM} INTO joined_out AS
  SELECT _twstart, count(*) AS n, max(o.current) AS m FROM %%trows a JOIN meters o ON a.ts = o.ts AND a.status = o.status;
CREATE STREAM subwin INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname {WM} INTO subwin_out AS
  SELECT _wstart, count(*) AS n, avg(current) AS a FROM %%trows INTERVAL(10s);
CREATE STREAM series INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname {WM} INTO series_out AS
  SELECT ts, diff(current) AS d, csum(current) AS cs, statecount(current, 'GT', 5) AS sc FROM %%trows;
CREATE STREAM sessions INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname {WM} INTO sessions_out AS
  SELECT _wstart, count(*) AS n FROM %%trows SESSION(ts, 2s);
CREATE STREAM nearest INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname {WM} INTO nearest_out AS
  SELECT a.ts, o.current AS c, o.ts AS ot FROM %%trows a LEFT ASOF JOIN meters o ON a.ts > o.ts JLIMIT 2;
CREATE STREAM around INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname {WM} INTO around_out AS
  SELECT a.ts, count(o.current) AS n, max(o.current) AS m FROM %%trows a LEFT WINDOW JOIN meters o
  ON a.status = o.status WINDOW_OFFSET(-3s, 3s);
"""


def test_fused_rounds_of_new_form_queries_equal_runs_alone(tmp_path, spark):
    names = ["grouped", "top", "sess_top", "plain", "sub", "uni", "joined", "subwin", "series", "sessions"]
    names += ["nearest", "around"]
    p = Pair(tmp_path, spark, QUERIES, names)
    p.tick()
    for batch in _commits(11):
        p.append(batch)
        p.tick()
    p.assert_same()
    assert all(r[0] != "error" for r in p.results["fused"])
    assert len(p.fused.sink("top_out")) > len(p.fused.sink("plain_out"))  # several rows per window
    assert p.fused.sink("sub_out") and len(p.fused.sink("uni_out")) > len(p.fused.sink("plain_out"))
    assert p.fused.sink("joined_out") and len(p.fused.sink("subwin_out")) > len(p.fused.sink("plain_out"))
    assert len(p.fused.sink("series_out")) > len(p.fused.sink("plain_out")) and p.fused.sink("sessions_out")
    assert len(p.fused.sink("nearest_out")) > len(p.fused.sink("around_out")) > len(p.fused.sink("plain_out"))
