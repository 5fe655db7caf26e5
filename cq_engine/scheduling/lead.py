"""How early a batch of firings is requested and how far ahead one run reaches: pure functions of a
definition's period and timeout policy (and ``CQ_BATCH_*`` environment settings)."""

from __future__ import annotations

import os
from datetime import timedelta

from cq_engine.errors import CQError

MAX_HORIZON_SECONDS = 600  # a run lives about one horizon window; run monitoring allows 1800 s
HORIZON_LEAD = timedelta(seconds=60)  # how early a window's batch may be requested, at most


def env_seconds(name: str, default: float) -> float:
    """A number of seconds >= 0 from environment variable ``name`` (``default`` when unset)."""
    value = os.environ.get(name, str(default))
    try:
        seconds = float(value)
    except ValueError:
        raise CQError(f"{name}={value!r}: expected a number of seconds") from None
    if seconds < 0:
        raise CQError(f"{name}={value!r}: expected a number of seconds >= 0")
    return seconds


def batch_lead(every: timedelta, policy: str = "BLOCKED", *, horizon: timedelta = timedelta(0)) -> timedelta:
    """How early a firing may be requested: ``CQ_BATCH_LEAD`` seconds (default 25), at most half the
    definition's period, or for BLOCKED its period less 5 s if that is more. A run takes seconds to
    be created and to start (a new process); requested early, it has started by the time its firings
    are due, and waits for each. BLOCKED may ask that early since a run that follows one still going
    waits for its commit (pipelining); DISCARD may not: it decides to skip a firing when it is
    requested, and a run one lead after its firing is due is not late."""
    cap = every / 2 if policy == "DISCARD" else max(every / 2, every - timedelta(seconds=5))
    lead = min(timedelta(seconds=env_seconds("CQ_BATCH_LEAD", 25)), cap)
    if horizon > timedelta(0):
        # A window's batch is one large run: creating it (an event per sink) and starting it took
        # 25-45 s at 1,000 definitions. Asked for earlier it is ready when the window starts; it is
        # asked only once the run before has committed all but its last firing anyway.
        lead = max(lead, min(horizon / 2, HORIZON_LEAD))
    return lead


def batch_horizon(every: timedelta, policy: str = "BLOCKED") -> timedelta:
    """The horizon window of a BLOCKED definition (``CQ_BATCH_HORIZON`` seconds, default 120, at most
    600): a batch run holds every firing of the window, waiting for each, so one process start serves
    several periods. None (zero) for DISCARD, which decides what to skip when it requests, and for a
    definition with fewer than two firings per window."""
    span = timedelta(seconds=min(env_seconds("CQ_BATCH_HORIZON", 120), MAX_HORIZON_SECONDS))
    if policy == "DISCARD" or every * 2 > span:
        return timedelta(0)
    return span
