"""``cq demo``: ingest a sample feed, run the sample queries' latest firings, print their sinks."""

from __future__ import annotations

from datetime import datetime, timedelta

from cq_engine.cli.feed import FEEDS, floor_time
from cq_engine.config import Settings
from cq_engine.engine import Engine
from cq_engine.ingest import ingest
from cq_engine.model import ContinuousQuery, PeriodTrigger
from cq_engine.resample import timing
from cq_engine.times import UTC, iso


def run_demo(settings: Settings, *, firings: int = 3, now: datetime | None = None) -> int:
    engine = Engine(settings=settings)
    for err in engine.catalog.errors:
        print(f"skipping: {err}")
    now = floor_time(now or datetime.now(UTC), timedelta(minutes=1))
    print(f"creating tables: {', '.join(engine.ensure_tables()) or 'all exist'}")
    from cq_engine.cli.dev import seed_start

    for table in [t.name for t in engine.catalog.tables if t.name in FEEDS]:
        # After the newest reading already there (`cq dev`'s feed, an earlier demo): never a reading twice.
        start = seed_start(engine, table, now=now, backfill=timedelta(minutes=10))
        if start >= now:
            print(f"{table}: already holds readings up to {iso(now)}; nothing appended")
            continue
        feed = FEEDS[table](start=start, end=now)
        version = ingest(table=table, data=feed, engine=engine, label="demo feed").version
        print(f"{table}: appended {feed.num_rows} readings for [{iso(start)}, {iso(now)}) (v{version})")
    for d in engine.catalog.definitions:
        if not isinstance(d, ContinuousQuery):
            _stream(engine, d, now)
            continue
        latest = timing.latest_firing(d.resample, now=now)
        if latest is None:  # the BOUNDARY lies in the future: nothing to show yet
            print(f"  {d.name:<24} has not fired yet (first firing {iso(d.resample.boundary)})")
            continue
        fires = [latest - k * d.resample.every for k in reversed(range(firings))]
        for fire in fires:
            r = engine.run_firing(d.name, fire)
            print(
                f"  {d.name:<24} fired {iso(fire)} over [{iso(r.time_range[0])}, {iso(r.time_range[1])}): "
                f"{r.rows_written} rows -> {d.sink} v{r.sink_version}"
            )
    for d in engine.catalog.definitions:
        table = engine.query(f"SELECT * FROM {d.sink} ORDER BY 1 DESC, 2 LIMIT 6")
        print(f"\n{d.sink} (latest rows):")
        for row in table.to_pylist():
            print("  " + "  ".join(iso(v) if isinstance(v, datetime) else str(v) for v in row.values()))
    return 0


def _stream(engine: Engine, d, now: datetime) -> None:
    """A stream's demo: a PERIOD stream's latest tick; a window stream recalculates the fed data."""
    if isinstance(d.trigger, PeriodTrigger):
        from cq_engine.schedule.ticks import ticks_of

        tick = ticks_of(d, timezone=engine.settings.timezone, created=now - timedelta(days=1)).latest(now)
        if tick is None:
            print(f"  {d.name:<24} has no tick before {iso(now)}")
            return
        r = engine.run_period(d.name, tick)
        print(f"  {d.name:<24} tick {iso(tick)}: {r.rows_written} rows -> {d.sink} v{r.sink_version}")
        return
    r = engine.recalculate(d.name, start=now - timedelta(minutes=10), now=now)
    print(f"  {d.name:<24} {d.trigger.kind} windows over the feed: {r.rows_written} rows -> {d.sink} v{r.sink_version}")
