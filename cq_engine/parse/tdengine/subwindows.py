"""``INTERVAL(i[, offset]) [SLIDING(s)]`` inside a new-form stream's query: per trigger window, the rows
read are aggregated per sub-window (TDengine's "every minute, the last hour per 10 s"); ``_wstart``,
``_wend`` and ``_wduration`` are the sub-window's. The other window clauses and FILL are refused at
load (not built)."""

from __future__ import annotations

from sqlglot.tokens import Token

from cq_engine.model import SubWindows
from cq_engine.parse.tdengine.query import Scope
from cq_engine.parse.tdengine.triggers import interval_sliding

_NOT_BUILT = (
    "{word} inside a stream's query is not supported: the trigger before AS windows the rows "
    "(a query's own windows are INTERVAL(...) [SLIDING(...)])"
)


def sub_windows(scope: Scope, window: list[Token]) -> SubWindows:
    """The query's window clause (its tokens, keyword first)."""
    cur = scope.cur.sub(window, window[-1].end + 1)
    keyword = cur.advance()
    word = keyword.text.upper()
    if word == "SLIDING":
        raise cur.error_at(keyword, "SLIDING needs INTERVAL(...) before it in a query's window clause")
    if word != "INTERVAL":
        raise cur.error_at(keyword, _NOT_BUILT.format(word=word))
    interval, offset, sliding = interval_sliding(cur, keyword)
    if not cur.at_end():
        tok = cur.peek()
        if tok is not None and tok.text.upper() in ("SESSION", "STATE_WINDOW", "EVENT_WINDOW", "COUNT_WINDOW"):
            raise cur.error_at(tok, _NOT_BUILT.format(word=tok.text.upper()))
        raise cur.unexpected("expected the end of the query's window clause")
    return SubWindows(interval=interval, sliding=sliding, offset=offset)
