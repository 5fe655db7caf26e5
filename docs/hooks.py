"""MkDocs hook: fills the generated parts of the pages (cq_engine/cli/reference.py) and includes files
of the repository root, so nothing is written twice: ARCHITECTURE.md (the engineer's file) as the
Architecture page, the README's tour on Getting started. An included section's links to ``docs/...``
and ``ARCHITECTURE.md`` are made relative to the page that includes it."""

from __future__ import annotations

import posixpath
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- cq:([\w-]+)(?: (\S+))? -->$", re.MULTILINE)
HEADING = re.compile(r"^(#{1,6}) (.+)$", re.MULTILINE)
LINK = re.compile(r"\]\((?!https?:|#|mailto:)([^)\s]+)\)")


def slug(title: str) -> str:
    """The anchor MkDocs (and GitHub) give a heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", title.strip().lower()))


def section(text: str, anchor: str) -> str:
    """The heading whose anchor is ``anchor`` and everything up to the next heading of its level or above."""
    for m in HEADING.finditer(text):
        if slug(m.group(2)) == anchor:
            level = len(m.group(1))
            end = next((n.start() for n in HEADING.finditer(text, m.end()) if len(n.group(1)) <= level), len(text))
            return text[m.start() : end]
    raise ValueError(f"no heading #{anchor}")


def include(arg: str, page_path: str) -> str:
    name, _, anchor = arg.partition("#")
    text = (ROOT / name).read_text()
    text = section(text, anchor) if anchor else text
    here = posixpath.dirname(page_path)

    def relink(m: re.Match) -> str:
        target = m.group(1)
        if target.startswith("docs/"):
            target = target.removeprefix("docs/")
        elif target == "ARCHITECTURE.md":
            target = "architecture.md"
        else:
            return m.group(0)
        path, _, frag = target.partition("#")
        rel = posixpath.relpath(path, here or ".")
        return f"]({rel}{'#' + frag if frag else ''})"

    return LINK.sub(relink, text) if name != "ARCHITECTURE.md" else text


def render(kind: str, arg: str | None, page_path: str) -> str:
    if str(ROOT) not in sys.path[:1]:  # this checkout's engine, not whichever one the venv installed
        sys.path.insert(0, str(ROOT))
    from cq_engine.cli import reference

    if kind == "cli-reference":
        return reference.cli_reference()
    if kind == "settings-table":
        return reference.settings_reference()
    if kind == "include" and arg:
        return include(arg, page_path)
    raise ValueError(f"unknown docs marker cq:{kind}")


def on_page_markdown(markdown: str, page, config, files) -> str:
    page_path = page.file.src_uri if page is not None else ""
    return MARKER.sub(lambda m: render(m.group(1), m.group(2), page_path), markdown)
