"""Every shell block of README.md and of the docs site's pages (docs/**/*.md) runs as written, in a
fresh copy of the repository with its own CQ_HOME and warehouse. A block whose text holds a
``# long-running`` comment (``make dev``, ``make test``) is not collected here (``make dev`` is
exercised by tests/test_dev.py, ``make test`` is this suite), and the marker is visible in the page
itself. Only blocks whose fence starts a line are collected: the Deployment page's blocks, indented in
its numbered steps, are run by tests/test_cluster.py on a cluster."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from netutil import free_port

REPO = Path(__file__).resolve().parent.parent
SKIP_MARKER = re.compile(r"^\s*#\s*long-running\b", re.MULTILINE)
BLOCK = re.compile(r"^```(sh|bash|shell|console)\s*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def shell_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, body) of each shell block in ``text``."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(2)) for m in BLOCK.finditer(text)]


def doc_pages() -> list[Path]:
    """README.md, then every page of the docs site, in a stable order."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def page_blocks() -> list[tuple[str, int, str]]:
    """(page relative to the repository, line number, body) of every shell block of every page."""
    return [(str(p.relative_to(REPO)), line, body) for p in doc_pages() for line, body in shell_blocks(p.read_text())]


def test_the_readme_has_blocks_and_marks_the_long_ones():
    blocks = shell_blocks((REPO / "README.md").read_text())
    assert blocks, "no shell block found in README.md"
    assert any(SKIP_MARKER.search(body) for _, body in blocks)  # the quickstart's make dev / make test
    assert any(not SKIP_MARKER.search(body) for _, body in blocks)
    pages = {page for page, _, _ in page_blocks()}
    assert "docs/getting-started.md" in pages, pages  # the docs' blocks are collected too


def fresh_copy(dest: Path) -> Path:
    """The repository's files as a fresh clone has them (tracked plus new, unignored ones), with
    ``.venv`` pointing at the virtualenv running the tests (what ``make setup`` would create)."""
    files = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    (dest / ".venv").symlink_to(Path(sys.prefix))
    return dest


@pytest.mark.spark
@pytest.mark.parametrize(
    "page,line,body",
    [
        pytest.param(page, line, body, id=f"{page}:{line}")
        for page, line, body in page_blocks()
        if not SKIP_MARKER.search(body)
    ],
)
def test_readme_shell_block_runs_verbatim(tmp_path, page, line, body):
    if not (Path(sys.prefix) / "bin" / "activate").is_file():
        pytest.skip("the tests do not run from a virtualenv that `. .venv/bin/activate` could stand for")
    root = fresh_copy(tmp_path / "clone")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CQ_", "DAGSTER_", "SPARK_"))}
    # The copy's code, not the checkout the virtualenv was installed from; a free port, not 15002,
    # so a `cq dev` running on this machine is left alone.
    env.update(PYTHONPATH=os.pathsep.join([str(root), str(root / "tests")]), CQ_SPARK_PORT=str(free_port()))
    try:
        out = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", body],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            stdin=subprocess.DEVNULL,
        )
    finally:  # a block that started the local server and then failed must not leave it running
        subprocess.run(
            [str(Path(sys.prefix) / "bin" / "cq"), "spark", "stop"], cwd=root, env=env, capture_output=True, timeout=120
        )
    shown = (
        f"{page}:{line} failed ({out.returncode}):\n{body}\n--- stdout\n{out.stdout[-3000:]}\n"
        f"--- stderr\n{out.stderr[-3000:]}"
    )
    assert out.returncode == 0, shown
    assert "Traceback" not in out.stdout + out.stderr, shown
