"""Finding the processes a test started, by their environment (they may run in sessions of their own)."""

from __future__ import annotations

import os
from pathlib import Path


def live_pids(*entries: str) -> list[int]:
    """The live (not zombie) processes other than this one whose environment holds any of ``entries``
    (``"VAR=value"``)."""
    needles = {entry.encode() for entry in entries}
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needles & set((entry / "environ").read_bytes().split(b"\0")) and alive(int(entry.name)):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def alive(pid: int) -> bool:
    """``pid`` runs: it exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def command_line(pid: int) -> str:
    """A process's command line, its arguments joined by spaces (``OSError`` once it has exited)."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
