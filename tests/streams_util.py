"""A stream test bench: a real warehouse, the sensor evaluated exactly as Dagster's (``evaluate_stream``)
and its runs executed by the engine, plus small reference computations over the table's rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
from deltalake import DeltaTable

from cq_engine.config import Settings
from cq_engine.engine import Engine
from cq_engine.streams.sensor import evaluate_stream

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
S = timedelta(seconds=1)
M = timedelta(minutes=1)
METERS = "CREATE TABLE meters (ts TIMESTAMP, current DOUBLE, voltage INT, status INT) TAGS (location STRING);\n"
TYPES = {
    "ts": pa.timestamp("us", tz="UTC"),
    "tbname": pa.string(),
    "current": pa.float64(),
    "voltage": pa.int32(),
    "status": pa.int32(),
    "location": pa.string(),
}


# The storage settings a Bench's engine uses unless told: the default (Spark's Delta connector, small
# commits through delta-rs); tests marked with ``on_both_storages`` (conftest) run on each of its storages.
STORAGE: dict[str, dict] = {"settings": {}}


class Bench:
    def __init__(self, tmp_path, spark, sql: str, **settings):
        (tmp_path / "sql").mkdir(exist_ok=True)
        (tmp_path / "sql" / "s.sql").write_text(METERS + sql)
        settings = {**STORAGE["settings"], **settings}
        self.settings = Settings(
            sql_dir=str(tmp_path / "sql"), warehouse=str(tmp_path / "wh"), home=str(tmp_path / ".cq"), **settings
        )
        self.engine = Engine(settings=self.settings, spark_session=spark)
        assert not self.engine.catalog.errors, self.engine.catalog.errors
        self.engine.ensure_tables()
        self.cursors: dict[str, str | None] = {}

    def append(self, rows: list[tuple]) -> int:
        """Rows ``(seconds after T0, tbname, current[, voltage[, status]])`` in one commit."""
        cols = {k: [] for k in TYPES}
        for r in rows:
            sec, name, current, voltage, status = ([*r, 220, 0])[:5]
            for k, v in zip(TYPES, (T0 + timedelta(seconds=sec), name, current, voltage, status, "loc-" + name)):
                cols[k].append(v)
        return self.engine.storage.append("meters", pa.table({k: pa.array(v, TYPES[k]) for k, v in cols.items()}))

    def delete(self, predicate: str) -> None:
        DeltaTable(self.settings.table_uri("meters")).delete(predicate)

    def tick(self, name: str, now: datetime = NOW):
        """One sensor evaluation and the runs it requests; returns the plan."""
        stream = self.engine.stream(name)
        plan = evaluate_stream(self.engine, stream, cursor=self.cursors.get(name), now=now)
        for work in plan.works:
            self.engine.run_stream(name, work)
        self.cursors[name] = plan.cursor.to_json()
        return plan

    def sink(self, table: str) -> list[dict]:
        uri = self.settings.table_uri(table)
        if not DeltaTable.is_deltatable(uri):
            return []
        data = pa.table(DeltaTable(uri).scan()).to_pylist()
        return sorted(data, key=lambda r: tuple(str(v) for v in r.values()))

    def rows(self) -> list[dict]:
        return pa.table(DeltaTable(self.settings.table_uri("meters")).scan()).to_pylist()


def us(t: datetime) -> int:
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def at(micros: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)


def by_group(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["tbname"], []).append({**r, "t": us(r["ts"])})
    return out


def summarize(members: list[dict], *, windows) -> list[tuple]:
    """(tbname, window start, count, round(avg current, 6)) per closed reference window."""
    out = {}
    for w in windows:
        if w["closed"]:
            out.setdefault((w["tbname"], w["ws"]), []).append(w["current"])
    return sorted((g, at(ws), len(v), round(sum(v) / len(v), 6)) for (g, ws), v in out.items())


def reference(rows: list[dict], window_fn, **kw) -> list[tuple]:
    """Closed windows of every meter by a reference function of tests/window_reference.py."""
    windows = []
    for name, members in by_group(rows).items():
        for w in window_fn(members, **kw):
            current = next(m["current"] for m in members if m["t"] == w["t"])
            windows.append({**w, "tbname": name, "current": current})
    return summarize(rows, windows=windows)


def sink_summary(rows: list[dict], *, start: str = "_twstart", count: str = "n", avg: str = "c") -> list[tuple]:
    return sorted((r["tbname"], r[start], r[count], round(r[avg], 6)) for r in rows)
