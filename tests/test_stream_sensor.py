"""One sensor evaluation's reads of the trigger tables (``streams.sensor.TriggerLogs``), on a real
warehouse (delta-rs, no Spark): every stream of an evaluation plans at one snapshot of its table, and
what the streams share is read once."""

from __future__ import annotations

from streams_util import NOW, Bench

from cq_engine.streams.sensor import TriggerLogs, evaluate_stream

SQL = (
    "CREATE STREAM a INTO a_out AS SELECT _wstart, count(*) AS n FROM meters INTERVAL(10s);\n"
    "CREATE STREAM b INTO b_out AS SELECT _wstart, max(current) AS m FROM meters INTERVAL(10s);\n"
)


class Counted:
    """The bench's real storage, counting the log reads the sensor makes through it."""

    def __init__(self, storage) -> None:
        self.storage, self.calls = storage, {"latest_version": 0, "read_commits": 0}

    def latest_version(self, table, **kw):
        self.calls["latest_version"] += 1
        return self.storage.latest_version(table, **kw)

    def read_commits(self, table, **kw):
        self.calls["read_commits"] += 1
        return self.storage.read_commits(table, **kw)


def test_the_streams_of_one_evaluation_plan_at_one_version_of_their_table_read_once(tmp_path):
    b = Bench(tmp_path, None, SQL, storage="deltars")
    b.append([(0, "d1", 1.0)])
    created = {n: evaluate_stream(b.engine, b.engine.stream(n), cursor=None, now=NOW).cursor for n in "ab"}
    assert created["a"].version == created["b"].version == 1
    b.append([(12, "d1", 2.0)])
    b.append([(25, "d1", 3.0)])

    counted = Counted(b.engine.storage)
    logs = TriggerLogs(counted)
    plans = {}
    for name in "ab":
        plans[name] = evaluate_stream(
            b.engine, b.engine.stream(name), cursor=created[name].to_json(), now=NOW, logs=logs
        )
        b.append([(40, "d2", 4.0)])  # lands while the evaluation goes on: the next one sees it
    assert plans["a"].cursor.version == plans["b"].cursor.version == 3
    assert [w.to_json() for w in plans["a"].works] == [w.to_json() for w in plans["b"].works]
    assert plans["a"].works, plans["a"].reason
    assert counted.calls == {"latest_version": 1, "read_commits": 1}

    # Without the shared reads, each stream sees the table as it is when planned.
    alone = evaluate_stream(b.engine, b.engine.stream("b"), cursor=created["b"].to_json(), now=NOW)
    assert alone.cursor.version == 5
