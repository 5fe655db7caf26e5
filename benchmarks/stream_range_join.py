"""stream_range_join: a stream whose query reads a table (``FROM %%tbname WHERE ts >= _twstart AND
ts < _twend``, a range join of all the run's windows to the table) versus the same stream over
``%%trows`` (target: join / %%trows <= 2.0), and, as a note, per-window evaluation (the fallback for
a nondeterministic WHERE) versus the join over the same windows.

A meters table (full: 20 meters x 1 row/s x 12 h = 864,000 rows; quick: 20 meters x 2 h) gets

    CREATE STREAM trows INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname
      INTO trows_out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;
    CREATE STREAM joined ... INTO joined_out AS SELECT _twstart, count(*) AS n, avg(current) AS c
      FROM %%tbname WHERE ts >= _twstart AND ts < _twend;

and one recalculation run of every window (``Engine.run_stream`` with a ``StreamWork``: pinned read,
windows, the query, the atomic replace) is timed for each; the two sinks must hold the same rows.
The note runs ``joined`` and ``perwindow`` (the same WHERE plus ``rand() >= 0``) over the first
``NOTE_MINUTES`` minutes only, since per-window evaluation costs one filter branch per window.
"""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa

from . import T0, Context, Outcome, make_engine, measure, spread, verdict
from .stream_catchup import METERS, _rows

NAME = "stream_range_join"
TARGET = 2.0
NOTE_MINUTES = 10
SQL = """
CREATE TABLE meters (ts TIMESTAMP, current DOUBLE, voltage INT, status INT) TAGS (location STRING);
CREATE STREAM trows INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname
  INTO trows_out AS SELECT _twstart, count(*) AS n, avg(current) AS c FROM %%trows;
CREATE STREAM joined INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname
  INTO joined_out AS SELECT _twstart, count(*) AS n, avg(current) AS c
  FROM %%tbname WHERE ts >= _twstart AND ts < _twend;
CREATE STREAM perwindow INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname
  INTO perwindow_out AS SELECT _twstart, count(*) AS n, avg(current) AS c
  FROM %%tbname WHERE ts >= _twstart AND ts < _twend AND rand() >= 0;
"""


def _sink(engine, table: str) -> list[tuple]:
    from deltalake import DeltaTable

    data = pa.table(DeltaTable(engine.settings.table_uri(table)).scan())
    return sorted((r["tbname"], r["_twstart"], r["n"], round(r["c"], 9)) for r in data.to_pylist())


def run(ctx: Context) -> Outcome:
    import logging

    from cq_engine.streams.timing import StreamWork

    logging.getLogger("cq_engine.streams.plan").setLevel(logging.ERROR)  # the fallback's warning, once per run
    hours = 2 if ctx.quick else 12
    repeat = 3 if ctx.quick else 5
    engine = make_engine(ctx.workdir(NAME), SQL, ctx.spark)
    schema = engine.storage.schema("meters")
    version = engine.storage.append("meters", _rows(schema, 0, hours * 3600))
    end = T0 + timedelta(hours=hours)
    now = end + timedelta(hours=1)

    def job(name: str, until) -> object:
        work = StreamWork(version=version, kind="recalculate", windows=((T0, until),), close_until=now, tick=now)
        return engine.run_stream(name, work)

    cases = {"%%trows": lambda: job("trows", end), "range join": lambda: job("joined", end)}
    medians, samples, _ = measure(cases, repeat=repeat)
    if _sink(engine, "trows_out") != _sink(engine, "joined_out"):
        raise AssertionError("the range join and %%trows streams wrote different rows")
    ratio = medians["range join"] / medians["%%trows"]

    note_end = T0 + timedelta(minutes=NOTE_MINUTES)
    small = {"range join": lambda: job("joined", note_end), "per window": lambda: job("perwindow", note_end)}
    small_medians, small_samples, _ = measure(small, repeat=max(2, repeat - 2))
    windows = NOTE_MINUTES * METERS
    rows = hours * 3600 * METERS
    line = (
        f"{rows:,} rows, {hours * 60 * METERS:,} windows: %%trows {medians['%%trows']:.2f}s "
        f"({spread(samples['%%trows'])}), range join {medians['range join']:.2f}s "
        f"({spread(samples['range join'])}) -> {verdict(ratio, TARGET)}"
    )
    note = (
        f"{windows} windows: per-window evaluation {small_medians['per window']:.2f}s "
        f"({spread(small_samples['per window'])}) vs range join {small_medians['range join']:.2f}s "
        f"({spread(small_samples['range join'])}): x{small_medians['per window'] / small_medians['range join']:.1f}"
    )
    return Outcome(NAME, line, ratio=ratio, target=TARGET, notes=[note])
