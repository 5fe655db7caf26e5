"""delta-rs (DataFusion) SQL predicates for ``write_deltalake(mode="overwrite", predicate=...)``.

Pure functions: they build text and touch no table. delta-rs deletes the rows matching the predicate
and refuses (``DeltaError``) data rows that do not match it, so a predicate also states what the new
data may contain.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime
from decimal import Decimal

from cq_engine.errors import CQError
from cq_engine.storage.base import TimeRange

# What delta-rs accepts as a predicate that matches no row (checked in tests/test_delta_log.py).
FALSE = "false"


def quote_ident(name: str) -> str:
    """A double-quoted identifier (exact case, embedded quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'


def _range_bounds(time_range: TimeRange) -> tuple[datetime, datetime]:
    lo, hi = time_range
    if lo.tzinfo is None or hi.tzinfo is None:
        raise CQError(f"time range [{lo}, {hi}) must be timezone-aware")
    if not lo < hi:
        raise CQError(f"empty time range [{lo.isoformat()}, {hi.isoformat()})")
    return lo.astimezone(UTC), hi.astimezone(UTC)


def _literal(t: datetime) -> str:
    # delta-rs (DataFusion) casts a string literal compared with a timestamp column to that column's
    # type, microseconds included; TIMESTAMP '...' and CAST(... AS TIMESTAMP) give Timestamp(ns) and fail.
    if t.tzinfo is None:
        raise CQError(f"timestamp {t.isoformat()} in a predicate must be timezone-aware")
    return "'" + t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ") + "'"


def sql_literal(value: object) -> str:
    """A SQL literal for a key value: strings quoted ('' escaping), ints/floats/bools/decimals as
    literals, aware datetimes as ``_literal``, dates as 'YYYY-MM-DD' (cast to the column's type).
    None has no literal (use ``IS NULL``)."""
    if value is None:
        raise CQError("NULL has no literal; compare with IS NULL")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CQError(f"cannot match the key value {value!r} in a predicate")
        return repr(value)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise CQError(f"cannot match the key value {value!r} in a predicate")
        return format(value, "f")
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, datetime):
        return _literal(value)
    if isinstance(value, date):
        return "'" + value.isoformat() + "'"
    raise CQError(f"cannot write a predicate literal for {type(value).__name__} value {value!r}")


def range_predicate(time_column: str, time_range: TimeRange) -> str:
    """The delta-rs SQL predicate for ``time_column`` in the half-open ``time_range``."""
    lo, hi = _range_bounds(time_range)
    column = quote_ident(time_column)
    return f"{column} >= {_literal(lo)} AND {column} < {_literal(hi)}"


def merge_ranges(ranges: Iterable[TimeRange]) -> list[tuple[datetime, datetime]]:
    """The half-open ``ranges`` (aware, non-empty) sorted, with overlapping and adjacent ones merged."""
    merged: list[list[datetime]] = []
    for lo, hi in sorted(_range_bounds(r) for r in ranges):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


def ranges_predicate(time_column: str, ranges: Sequence[TimeRange]) -> str:
    """``time_column`` in any of the half-open ``ranges`` (merged first); no range: ``false``."""
    merged = merge_ranges(ranges)
    if not merged:
        return FALSE
    if len(merged) == 1:
        return range_predicate(time_column, merged[0])
    return " OR ".join(f"({range_predicate(time_column, r)})" for r in merged)


def groups_predicate(time_column: str, key_columns: Sequence[str], groups: Sequence[tuple[tuple, datetime]]) -> str:
    """For each ``(key values, lower bound)``: the rows of that group with ``time_column >= lower bound``.

    A group listed several times keeps its earliest bound. Groups sharing a bound are matched together:
    ``"k" IN (...)`` for one key column (``OR "k" IS NULL`` for a NULL key), an OR of ANDs for several.
    No group: ``false``; no key column: ``time_column >= `` the earliest bound."""
    bounds: dict[tuple, datetime] = {}
    for keys, lower in groups:
        keys = tuple(keys)
        if len(keys) != len(key_columns):
            raise CQError(f"group {keys!r} has {len(keys)} key value(s) for {len(key_columns)} key column(s)")
        if lower.tzinfo is None:
            raise CQError(f"lower bound {lower.isoformat()} of group {keys!r} must be timezone-aware")
        lower = lower.astimezone(UTC)
        if keys not in bounds or lower < bounds[keys]:
            bounds[keys] = lower
    if not bounds:
        return FALSE
    time = quote_ident(time_column)
    if not key_columns:
        return f"{time} >= {_literal(min(bounds.values()))}"
    by_bound: dict[datetime, list[tuple]] = {}
    for keys, lower in bounds.items():  # insertion order: the caller's order within a bound
        by_bound.setdefault(lower, []).append(keys)
    parts = []
    for lower in sorted(by_bound):
        match = _keys_match([quote_ident(c) for c in key_columns], by_bound[lower])
        parts.append(f"({match}) AND {time} >= {_literal(lower)}")
    if len(parts) == 1:
        return parts[0]
    return " OR ".join(f"({p})" for p in parts)


def _keys_match(columns: list[str], keys: list[tuple]) -> str:
    if len(columns) == 1:
        column = columns[0]
        values = [k[0] for k in keys]
        terms = []
        literals = [sql_literal(v) for v in values if v is not None]
        if literals:
            terms.append(f"{column} = {literals[0]}" if len(literals) == 1 else f"{column} IN ({', '.join(literals)})")
        if any(v is None for v in values):
            terms.append(f"{column} IS NULL")
        return " OR ".join(terms)
    ands = [
        " AND ".join(f"{c} IS NULL" if v is None else f"{c} = {sql_literal(v)}" for c, v in zip(columns, k))
        for k in keys
    ]
    if len(ands) == 1:
        return ands[0]
    return " OR ".join(f"({a})" for a in ands)
