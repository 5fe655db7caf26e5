"""The one name rule for tables, definitions, streams and triggers, in every dialect and command.

Names become directory names (``<warehouse>/<table>``, ``_cq/streams/<name>``, ``$CQ_HOME/triggers/<name>``),
so a name is one plain path segment: letters (any script), digits and ``_``, not starting with a digit,
at most ``MAX_NAME_BYTES`` bytes of UTF-8 (well below the 255 bytes filesystems allow, leaving room for
suffixes). That rules out ``..``, ``/``, ``\\``, absolute paths, NUL, control and bidi characters."""

from __future__ import annotations

import unicodedata
from pathlib import Path

from cq_engine.errors import CQError

MAX_NAME_BYTES = 128


def name_problem(name: str) -> str | None:
    """Why ``name`` breaks the rule, or ``None`` if it is a valid name."""
    if not name:
        return "a name cannot be empty"
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        return f"a name is at most {MAX_NAME_BYTES} bytes, this one has {size}"
    bad = next((ch for ch in name if not (ch == "_" or ch.isalnum())), None)
    if bad is not None:
        kind = unicodedata.category(bad)
        what = repr(bad) if kind[0] not in "CZ" else f"U+{ord(bad):04X} ({unicodedata.name(bad, kind)})"
        return f"a name may hold only letters, digits and '_', not {what}"
    if name[0].isdigit():
        return "a name cannot start with a digit"
    return None


def check_name(name: str, *, what: str = "name") -> str:
    """``name`` if it follows the rule; a ``CQError`` quoting it (shortened) otherwise."""
    problem = name_problem(name)
    if problem is not None:
        raise CQError(f"{what} {shorten(name)!r}: {problem}")
    return name


def shorten(name: str) -> str:
    """A name as quoted in an error: at most 60 characters."""
    return name if len(name) <= 60 else name[:57] + "..."


def inside(base: str | Path, *parts: str) -> Path:
    """``base/parts...`` after checking that the resolved path stays inside ``base`` (a last defence
    for paths built from names: a ``rmtree`` must never leave its directory)."""
    root = Path(base).resolve()
    path = root.joinpath(*parts).resolve()
    if path == root or root not in path.parents:
        raise CQError(f"{'/'.join(parts)!r} is not inside {root}")
    return path
