"""Each ``.sql`` file's last text that loaded, kept under ``<CQ_HOME>/catalog/``.

A file that stops loading (a typo, a half-saved edit) keeps its definitions at that version: the
catalog parses the kept text instead, so their assets, switches, cursors and stream state stay and
they go on firing, while the file's error is reported (docs/dagster/cq-dev.md, *Editing definitions
while they run*).
Keyed by the file's resolved path; the text, not parsed objects, is kept, so a newer engine reads it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cq_engine.errors import CQError
from cq_engine.statefile import read_json_state, write_atomic
from cq_engine.times import UTC

FORMAT = 1
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Kept:
    """A file's last good text and when it was recorded (ISO-8601, UTC)."""

    text: str
    at: str


@dataclass(frozen=True)
class LastGood:
    """The store under ``home``; ``record=False`` reads it only (``cq validate`` reports, never records)."""

    home: str | Path
    record: bool = True

    def path(self, file: str | Path) -> Path:
        key = hashlib.sha1(str(Path(file).resolve()).encode()).hexdigest()[:20]
        return Path(self.home).resolve() / "catalog" / f"{key}.json"

    def get(self, file: str | Path) -> Kept | None:
        """The file's kept text; None if there is none or it cannot be read (then there is nothing to keep)."""
        try:
            data = read_json_state(self.path(file), what=f"last good version of {file}")
        except CQError:
            return None
        if not data or data.get("format") != FORMAT or not isinstance(data.get("text"), str):
            return None
        return Kept(text=data["text"], at=str(data.get("at", "")))

    def put(self, file: str | Path, text: str) -> None:
        """Record ``text`` as the file's last good version (only when it changed; an unwritable
        CQ_HOME is a warning: it loses only the fallback, not the load)."""
        if not self.record:
            return
        kept = self.get(file)
        if kept is not None and kept.text == text:
            return
        record = {
            "format": FORMAT,
            "file": str(Path(file).resolve()),
            "at": datetime.now(UTC).isoformat(),
            "text": text,
        }
        try:
            write_atomic(self.path(file), json.dumps(record))
        except OSError as exc:
            log.warning("cannot record the last good version of %s: %s", file, exc)
