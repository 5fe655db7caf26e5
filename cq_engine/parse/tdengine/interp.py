"""``INTERP`` in a new-form stream's query: ``SELECT _irowts, [_isfilled,] interp(x[, ignore_null_values])
... FROM ... [WHERE ...] [PARTITION BY ...] [RANGE(start[, end])] EVERY(every) [FILL(mode)]`` — a row per
time point of the range in each trigger window (docs/dialects/tdengine.md, *INTERP*)."""

from __future__ import annotations

from datetime import timedelta

from sqlglot import exp
from sqlglot.tokens import Token

from cq_engine.model import DATA_SHAPED, Interp, SubWindows
from cq_engine.parse.cursor import split_top
from cq_engine.parse.fragments import is_aggregate, to_spark
from cq_engine.parse.tdengine.query import Scope
from cq_engine.parse.tdengine.subwindows import fill_clause

_WITHOUT = ("WINDOW", "GROUP BY", "HAVING")


def interp_clauses(scope: Scope, clauses: dict, f: dict) -> dict:
    """RANGE, EVERY and FILL of an INTERP query (before its SELECT is read): Interp's fields but its calls."""
    every_tok, every_toks = clauses.get("EVERY") or (None, [])
    at = every_tok or clauses["RANGE"][0]
    if every_tok is None:
        raise scope.cur.error_at(at, "RANGE needs EVERY(duration) in a stream's query: INTERP's time points")
    for word in _WITHOUT:
        if word in clauses:
            raise scope.cur.error_at(clauses[word][0], f"{word} does not go with INTERP's EVERY(...)")
    every = _duration(scope, _inside(scope, every_tok, every_toks), "EVERY", every_tok)
    out: dict = {"every": every}
    if "RANGE" in clauses:
        rtok, rtoks = clauses["RANGE"]
        parts = split_top(_inside(scope, rtok, rtoks))
        if len(parts) != 2 or not all(parts):
            raise scope.cur.error_at(rtok, "expected RANGE(start, end)")
        out["start"], out["end"] = (to_spark(scope.expression(p, "RANGE", rtok)) for p in parts)
    elif f["trigger"].kind in DATA_SHAPED:
        raise scope.cur.error_at(every_tok, f"INTERP in {scope.label} windows needs RANGE(start, end)")
    if "FILL" in clauses:
        ftok, ftoks = clauses["FILL"]
        filled = fill_clause(scope, SubWindows(interval=every, sliding=every), ftoks, ftok)
        out["fill"], out["fill_values"] = filled.fill, filled.fill_values
    scope.interp_mode, scope.interp_calls = True, []
    return out


def interp(scope: Scope, clauses: dict, q: dict, fields: dict) -> Interp:
    """The query's Interp, its SELECT read (``q["select"]``)."""
    at = clauses["SELECT"][0]
    calls = tuple(scope.interp_calls)
    if not calls:
        raise scope.cur.error_at(clauses["EVERY"][0], "EVERY(...) needs INTERP(column) in the SELECT")
    if any(i.is_aggregate for i in q["select"]) or q.get("series"):
        raise scope.cur.error_at(
            at, "INTERP gives a row per time point: it does not go with aggregates or DIFF, TOP..."
        )
    if fields.get("fill") == "value" and len(fields["fill_values"]) != len(calls):
        raise scope.cur.error_at(
            clauses["FILL"][0],
            f"FILL(VALUE, ...) gives {len(fields['fill_values'])} value(s) for {len(calls)} INTERP call(s)",
        )
    return Interp(calls=calls, **fields)


def _inside(scope: Scope, keyword: Token, toks: list[Token]) -> list[Token]:
    if len(toks) < 2 or toks[0].text != "(" or toks[-1].text != ")":
        raise scope.cur.error_at(keyword, f"expected {keyword.text.upper()}(...)")
    return toks[1:-1]


def _duration(scope: Scope, toks: list[Token], what: str, at: Token) -> timedelta:
    node = scope.expression(toks, what, at) if toks else None
    if not (isinstance(node, exp.Interval) and node.text("unit").upper() == "MICROSECOND") or is_aggregate(node):
        raise scope.cur.error_at(toks[0] if toks else at, f"{what} takes a duration such as 1s or 10a")
    us = int(node.this.name)
    if us <= 0:
        raise scope.cur.error_at(toks[0], f"{what} must be positive")
    return timedelta(microseconds=us)
