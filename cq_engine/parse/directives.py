"""Comment directives: ``-- cq: key value`` (or ``/* cq: key=value */``) in the comments right before
a ``CREATE CQ`` / ``CREATE STREAM`` / ``CREATE RULE`` statement set per-definition options that are
not part of the dialect's SQL. A comment whose text starts with ``cq:`` is a directive, so a typo
is an error naming the comment's ``file:line:col``, never silently ignored."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import timedelta

from sqlglot.tokens import Token

from cq_engine.durations import IOTDB_UNITS, parse_duration
from cq_engine.errors import CQError
from cq_engine.model import ContinuousQuery, Stream
from cq_engine.parse.cursor import Cursor

_DIRECTIVE = re.compile(r"^\s*cq\s*:(?P<body>.*)$", re.DOTALL)
_KEY_VALUE = re.compile(r"^\s*(?P<key>[A-Za-z_][A-Za-z0-9_]*)\s*(?:=\s*|\s+)(?P<value>\S+)\s*$")
# directive -> the model field it sets (a duration)
DIRECTIVES = {"freshness_grace": "freshness_grace"}


def apply_directives(cur: Cursor, start: Token, statement):
    """``statement`` with the directives in the comments before its first token applied."""
    found: dict[str, timedelta] = {}
    searched_to = start.start
    for comment in reversed(start.comments or []):
        at = cur.source.text.rfind(comment, 0, searched_to)
        searched_to = at if at >= 0 else searched_to
        where = max(at - 2, 0) if at >= 0 else start.start  # at its `--` or `/*`
        match = _DIRECTIVE.match(comment)
        if not match:
            continue
        if not isinstance(statement, (ContinuousQuery, Stream)):
            raise cur.source.error(
                where, "a `cq:` directive applies to continuous queries and streams, not to tables or triggers"
            )
        kv = _KEY_VALUE.match(match["body"])
        if not kv:
            raise cur.source.error(where, f"cq: directive {comment.strip()!r}: expected `cq: key value`")
        key = kv["key"].lower()
        if key not in DIRECTIVES:
            raise cur.source.error(
                where, f"cq: unknown directive {kv['key']!r} (known: {', '.join(sorted(DIRECTIVES))})"
            )
        if key in found:
            raise cur.source.error(where, f"cq: directive {key!r} is given twice for {statement.name!r}")
        try:
            value = parse_duration(kv["value"], units=IOTDB_UNITS, what=f"cq: {key}")
        except CQError as exc:
            raise cur.source.error(where, str(exc)) from None
        found[key] = value
    if not found:
        return statement
    return replace(statement, **{DIRECTIVES[k]: v for k, v in found.items()})
