"""What parsing needs from the configuration."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta, tzinfo
from zoneinfo import ZoneInfo

_UTC_ZONE = ZoneInfo("UTC")


@dataclass(frozen=True)
class ParseOptions:
    """``tz`` reads times written without an offset; ``min_every`` is IoTDB's minimum EVERY."""

    tz: tzinfo = _UTC_ZONE
    min_every: timedelta = timedelta(seconds=1)
