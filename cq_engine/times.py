"""Points in time from users: ISO-8601 with or without offset, or epoch milliseconds. UTC inside."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone, tzinfo

from cq_engine.errors import TimeError

UTC = timezone.utc
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_time(text: str, *, tz: tzinfo, what: str = "time") -> datetime:
    """Parse ``text`` into an aware UTC datetime; naive times are read in ``tz``."""
    raw = text.strip()
    if raw.lstrip("-").isdigit():
        return EPOCH + timedelta(milliseconds=int(raw))
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00") if raw.endswith("Z") else raw)
    except ValueError:
        raise TimeError(
            f"{what}: {text!r} is not a time (use ISO-8601 such as 2021-05-11T22:18:40+08:00, "
            "or epoch milliseconds)"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=tz)
    return parsed.astimezone(UTC)


def epoch_ms(t: datetime) -> int:
    """Milliseconds since the UTC epoch (``t`` timezone-aware)."""
    return (t - EPOCH) // timedelta(milliseconds=1)


def iso(t: datetime) -> str:
    """ISO-8601 UTC with a ``Z``-free ``+00:00`` offset, millisecond precision when needed."""
    t = t.astimezone(UTC)
    spec = "milliseconds" if t.microsecond % 1000 == 0 and t.microsecond else (
        "seconds" if not t.microsecond else "microseconds")
    return t.isoformat(timespec=spec)
