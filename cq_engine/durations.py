"""Duration literals of the three dialects (``20s``, ``1d1h``, ``10a``) as exact ``timedelta``s."""

from __future__ import annotations

import re
from datetime import timedelta

from cq_engine.errors import CQError

_NS = 1
_US = 1_000
_MS = 1_000_000
_S = 1_000_000_000

IOTDB_UNITS: dict[str, int] = {
    "ns": _NS,
    "us": _US,
    "ms": _MS,
    "s": _S,
    "m": 60 * _S,
    "h": 3600 * _S,
    "d": 86400 * _S,
    "w": 7 * 86400 * _S,
}
TDENGINE_UNITS: dict[str, int] = {
    "b": _NS,
    "u": _US,
    "a": _MS,
    "s": _S,
    "m": 60 * _S,
    "h": 3600 * _S,
    "d": 86400 * _S,
    "w": 7 * 86400 * _S,
}

_PART = re.compile(r"([0-9]+)([a-zA-Z]+)")

# The longest duration a definition may give: every time the engine derives from one (a firing's range,
# a window's end) stays well inside the dates Python, Arrow and Spark can hold (see ``times.EARLIEST``).
MAX_DURATION = timedelta(days=36_500)


def parse_duration(text: str, *, units: dict[str, int] = IOTDB_UNITS, what: str = "duration") -> timedelta:
    """``'1d1h'`` → ``timedelta(days=1, hours=1)``. Raises ``CQError`` naming ``what`` and the text.

    Durations are exact: nanosecond parts must add up to whole microseconds (Spark's resolution).
    """
    stripped = text.strip()
    pos, total_ns = 0, 0
    for match in _PART.finditer(stripped):
        if match.start() != pos:
            break
        unit = match.group(2).lower()
        if unit not in units:
            raise CQError(f"{what}: unknown unit {match.group(2)!r} in {text!r} (units: {', '.join(units)})")
        if len(match.group(1)) > 30:  # int() of thousands of digits is slow, then refused
            raise CQError(f"{what}: {text[:40]!r}... is longer than 100 years")
        total_ns += int(match.group(1)) * units[unit]
        pos = match.end()
    if pos != len(stripped) or not stripped:
        raise CQError(f"{what}: {text!r} is not a duration such as 20s or 1h30m")
    if total_ns % _US:
        raise CQError(f"{what}: {text!r} is finer than a microsecond, the engine's time resolution")
    return bounded(total_ns // _US, what=what, text=text)


def bounded(us: int, *, what: str, text: str) -> timedelta:
    """``us`` microseconds if at most ``MAX_DURATION`` (checked before a ``timedelta`` could overflow);
    a ``CQError`` quoting ``text`` otherwise."""
    if us > micros(MAX_DURATION):
        raise CQError(
            f"{what}: {text!r} is longer than {format_duration(MAX_DURATION)} (100 years), "
            "the longest duration the engine takes"
        )
    return timedelta(microseconds=us)


def micros(delta: timedelta) -> int:
    """Exact integer microseconds of a ``timedelta``."""
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def format_duration(delta: timedelta) -> str:
    """The shortest exact literal: ``timedelta(seconds=90)`` → ``'1m30s'``."""
    us = micros(delta)
    if us == 0:
        return "0s"
    out = []
    for unit, size in (
        ("d", 86_400_000_000),
        ("h", 3_600_000_000),
        ("m", 60_000_000),
        ("s", 1_000_000),
        ("ms", 1_000),
        ("us", 1),
    ):
        count, us = divmod(us, size)
        if count:
            out.append(f"{count}{unit}")
    return "".join(out)
