"""A simulated sensor feed for the sample ``sensors`` table (demo and dev setup)."""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta

import pyarrow as pa

from .times import UTC

DEVICES = ("dev-a", "dev-b", "dev-c")


def sensor_rows(*, start: datetime, end: datetime, every: timedelta = timedelta(seconds=5),
                seed: int = 7) -> pa.Table:
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
            temperature.append(None if rng.random() < 0.03 else round(20 + 5 * math.sin(phase) + i + rng.gauss(0, 0.3), 2))
            humidity.append(round(55 + 10 * math.cos(phase) - 2 * i + rng.gauss(0, 1), 2))
        t += every
    return pa.table({
        "ts": pa.array(ts, pa.timestamp("us", tz="UTC")), "device": device,
        "temperature": pa.array(temperature, pa.float64()), "humidity": pa.array(humidity, pa.float64()),
    })


def floor_time(t: datetime, step: timedelta) -> datetime:
    us = int((t - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(microseconds=1))
    step_us = int(step / timedelta(microseconds=1))
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us - us % step_us)
