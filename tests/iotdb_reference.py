"""A pure-Python reference of what an IoTDB continuous query writes at one firing, in the table model
(one row per device and time, a NULL is a point that does not exist), and random definitions for it.

IoTDB's rules it follows (docs/dialects/iotdb.md):
- every measurement is its own series: an aggregate sees only the non-NULL values (points);
- the devices are every device the table holds (IoTDB's schema), not only those with rows in the range;
  a WHERE on ``device`` picks devices, a WHERE on values picks rows;
- GROUP BY (interval[, step]) windows start at ``lo + k*step`` for every start below ``hi``; every
  window of every device is a row of the result, empty or not;
- FILL fills within a device (PREVIOUS: the last value before; LINEAR: between the neighbouring values,
  by window index or by time; a constant: columns of its type);
- OFFSET/LIMIT number those rows: with ALIGN BY DEVICE device by device (devices in order), each
  device's windows in time order; otherwise one row per window (a time row holds every device);
- only then are NULL values left out: a row whose values are all NULL is not written.
Without GROUP BY and without aggregates, a row exists where a series the SELECT reads has a point
(``s1 + s2`` has a row where s1 alone has one); FILL and OFFSET/LIMIT work on those rows.
``max_time``/``min_time`` are INT64 milliseconds (here: offsets from the base time, in ms).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

AGGREGATES = [
    "max_value",
    "min_value",
    "first_value",
    "last_value",
    "count",
    "sum",
    "avg",
    "extreme",
    "max_time",
    "min_time",
]
TIMES = {"max_time", "min_time"}


@dataclass
class Case:
    """One random continuous query, fired once over ``[lo, hi)`` (seconds)."""

    name: str
    items: list[tuple[str, str]]  # (function or "" for a plain column, series)
    interval: int | None = None  # seconds; None: row-wise
    step: int | None = None
    by_device: str = "align"  # "align" (ALIGN BY DEVICE), "group" (GROUP BY ..., device), "one" (WHERE device = 'd1')
    where: str | None = None  # "s1 > 0", "device <> 'd2'"
    fill: str | None = None  # "PREVIOUS", "LINEAR", "0.0"
    limit: int | None = None
    offset: int = 0
    names: list[str] = field(default_factory=list)

    def sql(self, *, every: int, range_: int | None = None, name: str | None = None) -> str:
        select = ", ".join(f"{f}({s}) AS {n}" if f else f"{s} AS {n}" for (f, s), n in zip(self.items, self.names))
        where = [w for w in (self.where, "device = 'd1'" if self.by_device == "one" else None) if w]
        name = name or self.name
        out = (
            f"CREATE CQ {name} RESAMPLE EVERY {every}s RANGE {range_ or every}s "
            f"BEGIN SELECT {select} INTO {name}_out FROM t"
        )
        if where:
            out += " WHERE " + " AND ".join(where)
        if self.interval is not None:
            out += f" GROUP BY ({self.interval}s, {self.step}s)"
            if self.by_device == "group":
                out += ", device"
        if self.fill:
            out += f" FILL({self.fill})"
        if self.limit is not None:
            out += f" LIMIT {self.limit}"
        if self.offset:
            out += f" OFFSET {self.offset}"
        if self.by_device == "align":
            out += " ALIGN BY DEVICE"
        return out + " END"


def random_case(rng: random.Random, name: str) -> Case:
    if rng.random() < 0.2:  # row-wise, always per device
        items = rng.choice([[("", "s1")], [("", "s1"), ("", "s2")], [("", "s1 + s2"), ("", "s2")], [("", "s1 + s2")]])
        case = Case(name, items, by_device="align")
        case.fill = rng.choice([None, "PREVIOUS", "LINEAR", "0.0"])
    else:
        fill = rng.choice([None, None, "PREVIOUS", "LINEAR", "0.0"])
        # max_time/min_time are INT64 ms, which LINEAR interpolates too; a 0.0 constant would write the epoch
        pool = [a for a in AGGREGATES if not (fill == "0.0" and a in TIMES)]
        items = [(rng.choice(pool), rng.choice(["s1", "s2"])) for _ in range(rng.choice([1, 2, 3]))]
        interval = rng.choice([10, 15, 20])
        step = rng.choice([interval, interval, interval // 2 if interval % 2 == 0 else interval])
        case = Case(name, items, interval=interval, step=step, by_device=rng.choice(["align", "group", "one"]))
        case.fill = fill
    case.where = rng.choice([None, None, "s1 > 0", "device <> 'd2'"])
    if rng.random() < 0.5:
        case.limit, case.offset = rng.choice([1, 2, 3, 5, 8]), rng.choice([0, 0, 1, 2, 4])
    elif rng.random() < 0.3:
        case.offset = rng.choice([1, 3])
    case.names = [f"c{i}" for i in range(len(case.items))]
    return case


def random_rows(rng: random.Random, *, span: int) -> list[dict]:
    """(t seconds, device, s1, s2) with NULLs; d4 only after ``span`` (a known device, silent in range)."""
    rows = []
    for device in ("d1", "d2", "d3"):
        for t in sorted(rng.sample(range(span + 20), rng.randint(3, 14))):
            rows.append(
                {
                    "t": t,
                    "device": device,
                    "s1": None if rng.random() < 0.3 else float(rng.randint(-5, 5)),
                    "s2": None if rng.random() < 0.3 else float(rng.randint(-5, 5)),
                }
            )
    rows.append({"t": span + 10, "device": "d4", "s1": 1.0, "s2": None})
    return rows


def _aggregate(func: str, points: list[tuple[int, float]]):
    """IoTDB's aggregate over one series' points (time, value) in a window."""
    if func == "count":
        return len(points)
    if not points:
        return None
    values = [v for _, v in points]
    if func == "max_value":
        return max(values)
    if func == "min_value":
        return min(values)
    if func == "first_value":
        return min(points)[1]
    if func == "last_value":
        return max(points)[1]
    if func == "sum":
        return sum(values)
    if func == "avg":
        return sum(values) / len(values)
    if func == "extreme":
        return max(values, key=lambda v: (abs(v), v))
    if func == "max_time":  # IoTDB's times are INT64 milliseconds
        return max(t for t, _ in points) * 1000
    if func == "min_time":
        return min(t for t, _ in points) * 1000
    raise ValueError(func)


def _reads(expression: str) -> list[str]:
    """The series a raw expression reads (``s1``, ``s1 + s2``)."""
    return [part.strip() for part in expression.split("+")]


def _raw(expression: str, row: dict):
    """A raw expression's value in a row: NULL when a series it reads has no point there."""
    values = [row[s] for s in _reads(expression)]
    return None if any(v is None for v in values) else sum(values)


def _passes(where: str | None, row: dict) -> bool:
    if where == "s1 > 0":
        return row["s1"] is not None and row["s1"] > 0
    if where == "device <> 'd2'":
        return row["device"] != "d2"
    return True


def _fill(case: Case, cells: list[list], order: list[int]) -> None:
    """FILL in place over one device's rows (``cells[i][j]``: row i, item j), ``order`` their positions."""
    if not case.fill:
        return
    for j in range(len(case.items)):
        column = [c[j] for c in cells]
        known = [(order[i], v) for i, v in enumerate(column) if v is not None]
        for i, v in enumerate(column):
            if v is not None:
                continue
            before = [p for p in known if p[0] < order[i]]
            after = [p for p in known if p[0] > order[i]]
            if case.fill == "PREVIOUS":
                cells[i][j] = before[-1][1] if before else None
            elif case.fill == "LINEAR":
                if before and after:
                    (x0, y0), (x1, y1) = before[-1], after[0]
                    value = y0 + (y1 - y0) * (order[i] - x0) / (x1 - x0)
                    # an INT64 series (max_time, min_time) gets the interpolation truncated, as Java's (long)
                    cells[i][j] = math.floor(value) if case.items[j][0] in TIMES else value
            else:
                cells[i][j] = float(case.fill)


def expected(case: Case, rows: list[dict], *, lo: int, hi: int) -> set[tuple]:
    """The rows IoTDB writes for ``case`` fired over ``[lo, hi)``: (time, device or None, *values)."""
    devices = sorted({r["device"] for r in rows})  # every device the table holds
    if case.where == "device <> 'd2'":  # a condition on the device picks devices (IoTDB's FROM paths)
        devices.remove("d2")
    if case.by_device == "one":
        devices = ["d1"]
    seen = [r for r in rows if lo <= r["t"] < hi and _passes(case.where, r) and r["device"] in devices]
    device_column = case.by_device != "one"
    if case.interval is None:  # row-wise, per device
        out: list[tuple] = []
        for d in devices:
            mine = sorted((r for r in seen if r["device"] == d), key=lambda r: r["t"])
            # a row is where a series the SELECT reads has a point, whatever its expressions give there
            mine = [r for r in mine if any(r[s] is not None for _, e in case.items for s in _reads(e))]
            cells = [[_raw(e, r) for _, e in case.items] for r in mine]
            _fill(case, cells, [r["t"] for r in mine])
            out += [(r["t"], d, *c) for r, c in zip(mine, cells)]
        return _written(_limit(case, out))
    assert case.step is not None
    starts = list(range(lo, hi, case.step))
    by_device: dict[str, list[tuple]] = {}
    for d in devices:
        cells = []
        for w in starts:
            in_window = [r for r in seen if r["device"] == d and w <= r["t"] < w + case.interval]
            cells.append(
                [_aggregate(f, [(r["t"], r[s]) for r in in_window if r[s] is not None]) for f, s in case.items]
            )
        _fill(case, cells, list(range(len(starts))))
        by_device[d] = [(w, d if device_column else None, *c) for w, c in zip(starts, cells)]
    if case.by_device == "align":
        flat = [row for d in devices for row in by_device[d]]
        return _written(_limit(case, flat))
    windows = [[by_device[d][k] for d in devices] for k in range(len(starts))]
    kept = _limit(case, windows)
    return _written([row for window in kept for row in window])


def _limit(case: Case, rows: list) -> list:
    end = None if case.limit is None else case.offset + case.limit
    return rows[case.offset : end]


def _written(rows: list[tuple]) -> set[tuple]:
    return {_rounded(r) for r in rows if any(v is not None for v in r[2:])}


def _rounded(row: tuple) -> tuple:
    return tuple(round(v, 6) if isinstance(v, float) else v for v in row)


def upserted(firings: list[set[tuple]]) -> set[tuple]:
    """IoTDB's sink after ``firings`` (each ``expected``'s rows, in firing order): every firing's
    ``SELECT ... INTO`` writes its non-NULL cells over the points at the same time and device and
    deletes nothing, so overlapping firings leave the union of what each computed."""
    cells: dict[tuple, list] = {}
    for rows in firings:
        for row in rows:
            old = cells.get(row[:2], [None] * (len(row) - 2))
            cells[row[:2]] = [v if v is not None else o for v, o in zip(row[2:], old)]
    return {(*key, *values) for key, values in cells.items()}
