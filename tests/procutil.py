"""The processes a test starts (each in a session of its own, its output in a log file) and finding them
again by their environment."""

from __future__ import annotations

import os
import subprocess
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


def spawn_logged(cmd: list[str], *, log: Path, cwd: Path, env: dict[str, str], append: bool = True) -> subprocess.Popen:
    """Start ``cmd`` with stdout and stderr in ``log`` (appended: a restarted process adds to it) and no
    stdin, in its own session, so a teardown signals its whole group (its children included)."""
    with open(log, "a" if append else "w") as out:  # the child holds its own copy of the descriptor
        return subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
