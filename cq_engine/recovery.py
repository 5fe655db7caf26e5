"""Riding out a Spark Connect server that goes away under a run or the stream sensor (ARCHITECTURE.md §8).

A Connect server that is killed and started again (``cq dev``'s supervisor, the Deployment's service
manager) keeps its token (``spark._launch``), but not its sessions: the first request of an old
session to the new server is refused (``INVALID_HANDLE.SESSION_CHANGED``), and while no server runs
the client's bounded retries fail the request (``spark.bound_retries``). What failed is the session,
not the work, so after a failure the rounds ask ``SparkRecovery``: if the session still answers, the
failure is the work's own and stands; if not, the session is dropped, and once a server answers again
(waiting at most ``wait`` seconds) a new session runs the failed work again. A server that does not come
back in time leaves the work to be handed back (the sensor requests it again once the server answers).

The session is taken for lost when a probe gets no answer, or when the error says the connection
was lost (``lost_connection``: the server was unreachable past the client's retries, or refused the
session as another server's) even if the server, back by then, answers the probe. A firing that fails
on its own, on a server that answers, is never run twice here; at most ``MAX_RECOVERIES`` per run.
"""

from __future__ import annotations

import logging
import threading
import time

from cq_engine.spark import server_expected, server_status

log = logging.getLogger(__name__)

ANSWERS, RECOVERED, AWAY = "answers", "recovered", "away"
RECONNECT_SECONDS = 180.0  # a run waits this long for its Connect server to answer again
PROBE_SECONDS = 10.0  # a session that does not run `SELECT 1` within this is taken for lost
MAX_RECOVERIES = 5  # per run: a server that keeps going away fails the work after this many


# What a Connect call that lost its server raises, in its message or its causes': the server was
# unreachable past the client's retries, or a restarted server does not know the session.
_LOST = (
    "StatusCode.UNAVAILABLE",
    "RETRIES_EXCEEDED",
    "INVALID_HANDLE.SESSION_CHANGED",
    "INVALID_HANDLE.SESSION_NOT_FOUND",
    "INVALID_HANDLE.OPERATION_NOT_FOUND",
    "StatusCode.UNAUTHENTICATED",
)


def lost_connection(exc: BaseException) -> bool:
    """Does ``exc`` (or one of its causes) say the Connect server was lost, not that the work failed?"""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = f"{type(current).__name__}: {current}"
        if type(current).__name__ == "RetriesExceeded" or any(marker in text for marker in _LOST):
            return True
        current = current.__cause__ or current.__context__
    return False


def is_connect(session) -> bool:
    return session is not None and type(session).__module__.startswith("pyspark.sql.connect")


def session_answers(session, timeout: float = PROBE_SECONDS) -> bool:
    """Does ``session`` run a trivial query within ``timeout`` seconds? A classic session lives in this
    process: it always does. The probe runs in a thread of its own, so a dead server's retries (about
    a minute) do not hold the caller; the thread ends with them."""
    if not is_connect(session):
        return True
    answered: list[bool] = []

    def probe() -> None:
        try:
            session.sql("SELECT 1").collect()
            answered.append(True)
        except Exception:  # any error: the session is not usable
            answered.append(False)

    thread = threading.Thread(target=probe, name="cq-spark-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(answered and answered[0])


def spark_reachable(settings) -> bool:
    """Whether a new Connect session could be opened now: the remote server's port, or our own server
    running (pid alive, port open). Never an in-process session: a run waits for its server."""
    if settings.spark_remote:
        from urllib.parse import urlparse

        from cq_engine.spark import _port_open

        parsed = urlparse(settings.spark_remote.replace("sc://", "http://", 1).split(";", 1)[0])
        return _port_open(parsed.port or 15002, parsed.hostname or "localhost", timeout=2)
    return server_status(settings).running


class SparkRecovery:
    """Called after a failure on ``ctx``'s Spark session: ``ANSWERS`` (the session is fine: the failure
    stands), ``RECOVERED`` (the session was lost and a new one answers: run the work again) or ``AWAY``
    (lost, and no server answered within ``wait`` seconds: hand the work back)."""

    def __init__(self, ctx, *, wait: float = RECONNECT_SECONDS, limit: int = MAX_RECOVERIES):
        self.ctx, self.wait, self.left = ctx, wait, limit

    def __call__(self, errors=()) -> str:
        """``errors``: the round's failures."""
        session = self.ctx.spark_session
        if not is_connect(session):
            return ANSWERS
        lost = any(lost_connection(e) for e in errors)
        if self.left <= 0 or not lost:
            if session_answers(session):
                return ANSWERS  # the failures are the works' own (or the server keeps going away)
            if self.left <= 0:
                self.ctx.drop_spark()
                return AWAY
        self.left -= 1
        if lost and session_answers(session):
            # The server was away and is back, and this session is still good on it (it had made no
            # call before the server went away): the work runs again on it.
            log.warning("the Spark Connect server answers again: the failed work runs again")
            return RECOVERED
        self.ctx.drop_spark()  # never reused: an old session is refused by a restarted server
        deadline = time.monotonic() + self.wait
        while True:
            if spark_reachable(self.ctx.settings):
                try:
                    if session_answers(self.ctx.spark):
                        log.warning("the Spark Connect server answers again: a new session carries on")
                        return RECOVERED
                except Exception as exc:  # e.g. the server is still starting: try again
                    log.debug("reopening the Spark session failed: %s", exc)
                self.ctx.drop_spark()
            if time.monotonic() >= deadline:
                return AWAY
            time.sleep(1.0)


SERVER_HOLD_SECONDS = 180.0  # the sensors wait this long for a crashed Connect server to come back
_away_since: list[float] = []  # when this process first saw the expected server away (empty: it runs)


def server_coming_back(settings) -> bool:
    """Is our Connect server away though expected back (``spark.server_expected``: it crashed, and
    whoever started it starts it again), for less than ``SERVER_HOLD_SECONDS`` so far in this process?
    The sensors then keep their live works and retries until it answers, instead of handing them to a
    run that would start a JVM of its own; past it, they go to runs as without a server."""
    if settings.spark_remote or not server_expected(settings):
        _away_since.clear()
        return False
    if not _away_since:
        _away_since.append(time.monotonic())
    return time.monotonic() - _away_since[0] < SERVER_HOLD_SECONDS
