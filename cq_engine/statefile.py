"""Engine state kept outside Delta (cursors, trigger progress, the local server's port and token):
written atomically, read strictly.

A crash between truncating a file and writing it would leave an empty file that a reader takes for
"no state yet" and silently starts over (e.g. a stream's closed windows never computed), so writes
go to a temporary file in the same directory, are fsynced and renamed over the old one; a file that
exists but is empty or unreadable is an error naming it, never a fresh start.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from cq_engine.errors import CQError


def write_atomic(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Replace ``path`` by ``text``: a reader (or a crash) sees the old or the new file, never part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # the umask may have narrowed or a previous file widened it
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power loss
    finally:
        os.close(dir_fd)


def read_state(path: Path, *, what: str) -> str | None:
    """The text of state file ``path``; None if it does not exist. An empty or unreadable file is a
    ``CQError`` naming it (``what`` says what it holds): deleting it is the user's decision."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise CQError(f"{path}: cannot read the {what}: {exc}") from None
    if not text.strip():
        raise CQError(
            f"{path}: the {what} is empty (a crash while it was written by an older engine?); "
            "delete the file to start over"
        )
    return text


def read_json_state(path: Path, *, what: str) -> dict | None:
    """``read_state`` parsed as a JSON object; malformed JSON is a ``CQError`` naming the file."""
    text = read_state(path, what=what)
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise CQError(f"{path}: the {what} is not valid JSON ({exc}); delete the file to start over") from None
    if not isinstance(value, dict):
        raise CQError(f"{path}: the {what} is not a JSON object; delete the file to start over")
    return value
