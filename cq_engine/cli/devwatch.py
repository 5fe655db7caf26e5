"""``cq dev``'s watch of the sql directory: every load error of a ``.sql`` file is said in its terminal
and log when it appears and when it goes, with what the running stack does meanwhile."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from cq_engine.catalog import settings_catalog
from cq_engine.config import Settings
from cq_engine.errors import CQError
from cq_engine.parse import sql_files

RELOAD_HINT = "reload definitions in the Dagster UI (Deployment, Reload) to run what the files now say"


def _signature(sql_dir: str) -> tuple:
    try:
        files = sql_files(sql_dir)
    except CQError:
        return ()
    out = []
    for f in files:
        try:
            st = f.stat()
        except OSError:
            continue
        out.append((str(f), st.st_mtime_ns, st.st_size))
    return tuple(out)


def describe(error) -> str:
    """One line: the error at its ``file:line:col`` and what it does to the file's definitions."""
    return f"{error} ({error.consequence()})"


class SqlWatch:
    """Polls the sql directory every ``every`` seconds; ``say`` gets one line per change worth saying."""

    def __init__(self, settings: Settings, say: Callable[[str], None], *, every: float = 2.0):
        self.settings, self.say, self.every = settings, say, every
        self.stop_event = threading.Event()
        self._seen = _signature(settings.sql_dir)
        self._errors = self._current()
        self._thread = threading.Thread(target=self._run, name="cq-dev-sql-watch", daemon=True)

    def _current(self) -> dict[str, str]:
        """file -> the line describing its error (read-only: recording last good versions is the
        code location's business)."""
        try:
            catalog = settings_catalog(self.settings, record=False)
        except CQError as exc:
            return {self.settings.sql_dir: str(exc)}
        return {e.file: describe(e) for e in catalog.errors}

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stop_event.set()

    def check(self) -> None:
        """Compare with the last look; say what appeared, changed or went."""
        signature = _signature(self.settings.sql_dir)
        if signature == self._seen:
            return
        self._seen = signature
        errors = self._current()
        for file, line in errors.items():
            if self._errors.get(file) != line:
                self.say(f"cq dev: {line}; fix it, then {RELOAD_HINT}")
        for file in self._errors.keys() - errors.keys():
            self.say(f"cq dev: {Path(file).name} loads again; {RELOAD_HINT}")
        if not errors and not (self._errors.keys() - errors.keys()):
            self.say(f"cq dev: the sql directory changed and loads; {RELOAD_HINT}")
        self._errors = errors

    def _run(self) -> None:
        while not self.stop_event.wait(self.every):
            try:
                self.check()
            except Exception as exc:  # a watch must never take cq dev down
                self.say(f"cq dev: could not check the sql directory: {exc}")
