"""``cq dev`` keeps its Spark Connect server running: a thread checks it every few seconds and starts a
dead one again, with a back-off between failed attempts and a line for each event.

While the server is down, a Dagster run that starts opens an in-process session (and logs a warning
saying so); a run that was using the dead server fails (its Connect calls fail once the server is gone
or, restarted, no longer knows the session) and the batch sensor requests its firings again; nothing
half-written stays (every commit is atomic). See docs/operations/guarantees.md."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable

from cq_engine.config import Settings
from cq_engine.errors import CQError


class ServerSupervisor:
    """Restarts ``cq dev``'s local Spark Connect server when it is found dead (checked every ``every``
    seconds). A failed start is tried again after ``backoff`` seconds, doubling up to ``max_backoff``.
    ``say`` prints one line per event (died, restarted, a failed attempt)."""

    def __init__(
        self,
        settings: Settings,
        *,
        say: Callable[[str], None],
        every: float = 2.0,
        backoff: float = 2.0,
        max_backoff: float = 60.0,
    ):
        self.settings = settings
        self.say = say
        self.every = every
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.restarts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cq-spark-supervisor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 240) -> None:
        """No more restarts; waits for a start in progress (its server is then stopped with the rest)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        from cq_engine import spark
        from cq_engine.cli import agent

        pid = spark.server_status(self.settings).pid
        while not self._stop.wait(self.every):
            status = spark.server_status(self.settings)
            if status.running:
                pid = status.pid
                continue
            down = time.monotonic()
            self.say(
                f"cq dev: the Spark Connect server{f' (pid {pid})' if pid else ''} is not running; starting it "
                "again (runs starting meanwhile use an in-process session; runs that used it fail and are retried)"
            )
            delay = self.backoff
            while not self._stop.is_set():
                try:
                    status = spark.start_server(self.settings)
                except (CQError, OSError, subprocess.SubprocessError) as exc:
                    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    self.say(
                        f"cq dev: starting the Spark Connect server failed ({first}); next attempt in {delay:.0f}s"
                    )
                    if self._stop.wait(delay):
                        return
                    delay = min(delay * 2, self.max_backoff)
                    continue
                self.restarts += 1
                agent.start(self.settings.home)  # gone if the server was stopped, not crashed
                pid = status.pid
                self.say(f"cq dev: {status.describe()} again, {time.monotonic() - down:.0f}s after it was found dead")
                break
