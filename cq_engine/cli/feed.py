"""Simulated feeds for the sample ``sensors``, ``meters`` and ``demo`` tables (demo and dev setup)."""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta

import pyarrow as pa

from cq_engine.times import UTC

DEVICES = ("dev-a", "dev-b", "dev-c")


def sensor_rows(*, start: datetime, end: datetime, every: timedelta = timedelta(seconds=5), seed: int = 7) -> pa.Table:
    """Readings of every device at ``every`` in ``[start, end)``: smooth daily curves plus noise,
    with an occasional missing temperature so FILL and all-null rules have something to do."""
    rng = random.Random(seed + int(start.timestamp()))
    ts, device, temperature, humidity = [], [], [], []
    t = start
    while t < end:
        phase = (t.timestamp() % 86_400) / 86_400 * 2 * math.pi
        for i, d in enumerate(DEVICES):
            ts.append(t)
            device.append(d)
            temperature.append(
                None if rng.random() < 0.03 else round(20 + 5 * math.sin(phase) + i + rng.gauss(0, 0.3), 2)
            )
            humidity.append(round(55 + 10 * math.cos(phase) - 2 * i + rng.gauss(0, 1), 2))
        t += every
    return pa.table(
        {
            "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
            "device": device,
            "temperature": pa.array(temperature, pa.float64()),
            "humidity": pa.array(humidity, pa.float64()),
        }
    )


METERS = (
    ("d1001", "California.SanFrancisco", 2),
    ("d1002", "California.LosAngeles", 3),
    ("d1003", "California.SanDiego", 2),
)


def meter_rows(*, start: datetime, end: datetime, every: timedelta = timedelta(seconds=5), seed: int = 11) -> pa.Table:
    """TDengine's smart-meter example as one super table: ``current`` wanders around 10 A (so event
    windows open and close), ``status`` flips now and then (state windows), tags per meter."""
    rng = random.Random(seed + int(start.timestamp()))
    cols: dict[str, list] = {
        k: [] for k in ("ts", "current", "voltage", "phase", "status", "tbname", "location", "groupid")
    }
    t = start
    while t < end:
        phase = (t.timestamp() % 600) / 600 * 2 * math.pi
        for i, (name, location, group) in enumerate(METERS):
            cols["ts"].append(t)
            cols["current"].append(round(10 + 2 * math.sin(phase + i) + rng.gauss(0, 0.5), 3))
            cols["voltage"].append(int(220 + rng.gauss(0, 3)))
            cols["phase"].append(round(rng.random(), 3))
            cols["status"].append(int(math.sin(phase * 3 + i) > 0))
            cols["tbname"].append(name)
            cols["location"].append(location)
            cols["groupid"].append(group)
        t += every
    types = {
        "ts": pa.timestamp("us", tz="UTC"),
        "current": pa.float32(),
        "voltage": pa.int32(),
        "phase": pa.float32(),
        "status": pa.int32(),
        "tbname": pa.string(),
        "location": pa.string(),
        "groupid": pa.int32(),
    }
    return pa.table({k: pa.array(v, types[k]) for k, v in cols.items()})


def demo_rows(*, start: datetime, end: datetime, every: timedelta = timedelta(seconds=5), seed: int = 13) -> pa.Table:
    """eKuiper's ``demo`` stream (seed 003): two devices' temperature and revenue, with the revenue
    spiking now and then (so FILTER and OVER have something to choose)."""
    rng = random.Random(seed + int(start.timestamp()))
    cols: dict[str, list] = {k: [] for k in ("ts", "ID", "temperature", "revenue")}
    t = start
    while t < end:
        for device in ("dev-1", "dev-2"):
            cols["ts"].append(t)
            cols["ID"].append(device)
            cols["temperature"].append(round(20 + rng.gauss(0, 3), 2))
            cols["revenue"].append(round(rng.choice((50, 80, 120, 150, 250)) + rng.random(), 2))
        t += every
    types = {
        "ts": pa.timestamp("us", tz="UTC"),
        "ID": pa.string(),
        "temperature": pa.float64(),
        "revenue": pa.float64(),
    }
    return pa.table({k: pa.array(v, types[k]) for k, v in cols.items()})


FEEDS = {"sensors": sensor_rows, "meters": meter_rows, "demo": demo_rows}


def floor_time(t: datetime, step: timedelta) -> datetime:
    us = int((t - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(microseconds=1))
    step_us = int(step / timedelta(microseconds=1))
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us - us % step_us)
