"""A Connect session that failed is never handed out again in a long-lived process (``spark.forget_session``):
pyspark's ``getOrCreate`` returns its default session, so the code server's stream sensor would keep a
session whose server restarted (with a new token) for as long as the process lives. Run in a child
process: a Connect session there must not put pytest's own process in Connect mode. No server is
needed: creating a session makes no request."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent(
    """
    import os
    import threading
    from cq_engine.spark import connect_session, forget_session

    url = "sc://127.0.0.1:1"
    first = connect_session(url)
    print("kept", connect_session(url) is first)
    forget_session(first)
    second = connect_session(url)
    print("new", second is not first)
    print("kept again", connect_session(url) is second)
    other = []
    thread = threading.Thread(target=lambda: other.append(connect_session(url)))
    thread.start()
    thread.join()
    print("other thread", other[0] is second, flush=True)
    os._exit(0)  # no exit-time release of sessions on a server that is not there
    """
)


def test_a_forgotten_connect_session_is_never_handed_out_again():
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:4] == ["kept True", "new True", "kept again True", "other thread True"], (
        out.stdout + out.stderr
    )
