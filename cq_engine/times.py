"""Points in time from users: ISO-8601 with or without offset, or epoch milliseconds. UTC inside."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo

from cq_engine.errors import TimeError

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Times users give lie in [EARLIEST, LATEST): with durations of at most 100 years (``durations``), every
# time derived from them stays inside what Python, Arrow and Spark can represent.
EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)


def parse_time(text: str, *, tz: tzinfo, what: str = "time", bounded: bool = True) -> datetime:
    """Parse ``text`` into an aware UTC datetime; naive times are read in ``tz``. ``bounded`` (times from
    users and definitions): it must lie in [EARLIEST, LATEST); without it (data, times the engine wrote)
    any time Python holds. A ``TimeError`` otherwise, never an ``OverflowError``."""
    raw = text.strip()
    epoch = raw.lstrip("-").isascii() and raw.lstrip("-").isdigit()
    try:
        if epoch:
            if len(raw) > 20:
                raise OverflowError
            parsed = EPOCH + timedelta(milliseconds=int(raw))
        else:
            parsed = datetime.fromisoformat(raw.replace("Z", "+00:00") if raw.endswith("Z") else raw)
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=tz)
            parsed = parsed.astimezone(UTC)
    except OverflowError:
        where = _RANGE if bounded else "the dates Python holds"
        raise TimeError(f"{what}: {text!r}{' as epoch milliseconds' if epoch else ''} is outside {where}") from None
    except ValueError:
        raise TimeError(
            f"{what}: {text!r} is not a time (use ISO-8601 such as 2021-05-11T22:18:40+08:00, or epoch milliseconds)"
        ) from None
    if bounded and not EARLIEST <= parsed < LATEST:
        raise TimeError(f"{what}: {text!r}{' as epoch milliseconds' if epoch else ''} is outside {_RANGE}")
    return parsed


_RANGE = f"the times the engine takes, [{EARLIEST.year}-01-01, {LATEST.year}-01-01) UTC"


def epoch_ms(t: datetime) -> int:
    """Milliseconds since the UTC epoch (``t`` timezone-aware)."""
    return (t - EPOCH) // timedelta(milliseconds=1)


def iso(t: datetime) -> str:
    """ISO-8601 UTC with a ``Z``-free ``+00:00`` offset, millisecond precision when needed."""
    t = t.astimezone(UTC)
    spec = (
        "milliseconds"
        if t.microsecond % 1000 == 0 and t.microsecond
        else ("seconds" if not t.microsecond else "microseconds")
    )
    return t.isoformat(timespec=spec)
