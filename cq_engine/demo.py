"""``cq demo``: ingest a sample feed, run the sample queries' latest firings, print their sinks."""

from __future__ import annotations

from datetime import datetime, timedelta

from . import timing
from .config import Settings
from .feed import floor_time, sensor_rows
from .run import Engine
from .times import UTC, iso


def run_demo(settings: Settings, *, firings: int = 3, now: datetime | None = None) -> int:
    engine = Engine(settings=settings)
    for err in engine.catalog.errors:
        print(f"skipping: {err}")
    now = floor_time(now or datetime.now(UTC), timedelta(minutes=1))
    print(f"creating tables: {', '.join(engine.ensure_tables()) or 'all exist'}")
    feed = sensor_rows(start=now - timedelta(minutes=10), end=now)
    version = engine.storage.append("sensors", feed, metadata={"cq.ingest": "demo feed"})
    print(f"sensors: appended {feed.num_rows} readings for [{iso(now - timedelta(minutes=10))}, {iso(now)}) (v{version})")
    for d in engine.catalog.definitions:
        latest = timing.latest_firing(d.resample, now=now)
        fires = [latest - k * d.resample.every for k in reversed(range(firings))]
        for fire in fires:
            r = engine.run_firing(d.name, fire)
            print(f"  {d.name:<24} fired {iso(fire)} over [{iso(r.time_range[0])}, {iso(r.time_range[1])}): "
                  f"{r.rows_written} rows -> {d.sink} v{r.sink_version}")
    for d in engine.catalog.definitions:
        table = engine.query(f"SELECT * FROM {d.sink} ORDER BY 1 DESC, 2 LIMIT 6")
        print(f"\n{d.sink} (latest rows):")
        for row in table.to_pylist():
            print("  " + "  ".join(iso(v) if isinstance(v, datetime) else str(v) for v in row.values()))
    return 0
