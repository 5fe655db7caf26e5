"""MkDocs hook: fills the generated parts of the pages (cq_engine/cli/reference.py) and includes
ARCHITECTURE.md, the engineer's file at the repository root, as the Architecture page."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- cq:([\w-]+)(?: (\S+))? -->$", re.MULTILINE)


def render(kind: str, arg: str | None) -> str:
    if str(ROOT) not in sys.path[:1]:  # this checkout's engine, not whichever one the venv installed
        sys.path.insert(0, str(ROOT))
    from cq_engine.cli import reference

    if kind == "cli-reference":
        return reference.cli_reference()
    if kind == "settings-table":
        return reference.settings_reference()
    if kind == "include" and arg:
        return (ROOT / arg).read_text()
    raise ValueError(f"unknown docs marker cq:{kind}")


def on_page_markdown(markdown: str, page, config, files) -> str:
    return MARKER.sub(lambda m: render(m.group(1), m.group(2)), markdown)
