"""``CREATE STREAM``: TDengine streams in the new form (seed 000) and the old form (seed 000's second
half, seed 002), both parsed into one ``Stream``.

New form: ``CREATE STREAM [IF NOT EXISTS] [db.]name trigger [FROM table] [PARTITION BY cols]
[OPTIONS(...)] [NOTIFY(...) ...] [INTO table] [OUTPUT_SUBTABLE(expr)] [(cols)] [TAGS (...)]
[AS SELECT ... FROM %%trows | table [WHERE ...]]``.
Old form: ``CREATE STREAM [IF NOT EXISTS] name [TRIGGER ...] [WATERMARK t] [IGNORE EXPIRED 0|1]
[IGNORE UPDATE 0|1] [DELETE_MARK t] [FILL_HISTORY 0|1] [INTO table [(cols)] [TAGS (...)]
[SUBTABLE(expr)]] AS SELECT ... FROM table [WHERE ...] [PARTITION BY cols] window [NOTIFY ...]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sqlglot.tokens import Token, TokenType

from ..model import PLACEHOLDERS, SourceLocation, Stream
from .cursor import Cursor, split_top
from .options import ParseOptions
from .stream_notify import notify_where, parse_notify, parse_old_notify
from .stream_options import (old_stream_options, parse_column_list, parse_old_options, parse_options, parse_subtable,
                             parse_tags)
from .stream_query import Scope, find_marks, from_clause, select_items, split_query, where_clause
from .stream_triggers import NEW_TRIGGERS, parse_trigger, parse_window

# Clauses that parse into the IR but that the engine does not run yet: using one is an error at its
# keyword. Shrink this set as the engine learns them.
NOT_YET_SUPPORTED = frozenset({"NOTIFY", "OUTPUT_SUBTABLE", "SUBTABLE", "TAGS", "FORCE_OUTPUT", "CALC_NOTIFY_ONLY",
                               "DELETE_OUTPUT_TABLE", "WITHOUT INTO"})
_MESSAGES = {"WITHOUT INTO": "a stream without INTO (one that only sends notifications) is not supported yet"}

# The new form's clauses after the trigger, in the order they must come ("(" is INTO's column list).
_HEADER = ("FROM", "PARTITION BY", "OPTIONS", "NOTIFY", "INTO", "OUTPUT_SUBTABLE", "(", "TAGS", "AS")
_WINDOW_USAGE = ("INTERVAL(i) [SLIDING(s)], SESSION(ts_col, gap), STATE_WINDOW(col), "
                 "EVENT_WINDOW START WITH c1 END WITH c2 or COUNT_WINDOW(n)")


@dataclass
class _Build:
    fields: dict = field(default_factory=dict)
    features: list[tuple[str, Token]] = field(default_factory=list)  # (clause, keyword) used


def parse_create_stream(cur: Cursor, opts: ParseOptions, start: Token) -> Stream:
    stream, features = parse_stream(cur, opts, start)
    for name, tok in sorted(features, key=lambda f: f[1].start):
        if name in NOT_YET_SUPPORTED:
            raise cur.error_at(tok, _MESSAGES.get(name, f"{name} is not supported yet"))
    return stream


def parse_stream(cur: Cursor, opts: ParseOptions, start: Token) -> tuple[Stream, list[tuple[str, Token]]]:
    """The whole statement, and the features it uses as (clause name, keyword token)."""
    if_not_exists = cur.match("IF", "NOT", "EXISTS")
    name_tok = cur.table_name("a stream name")
    nxt = cur.peek()
    form = "new" if nxt is not None and nxt.text.upper() in NEW_TRIGGERS else "old"
    scope = Scope(cur, find_marks(cur.tokens), form)
    b = _Build()
    if form == "new":
        _new_form(cur, opts, scope, name_tok, b)
    else:
        _old_form(cur, scope, name_tok, b)
    scope.check_all_used()
    line, col = cur.source.line_col(start.start)
    stream = Stream(name=name_tok.text, form=form, if_not_exists=if_not_exists,
                    location=SourceLocation(cur.source.file, line, col),
                    sql=" ".join(cur.source.text[start.start : cur.end].split()), **b.fields)
    return stream, b.features


def partition_names(cur: Cursor, keyword: Token, toks: list[Token]) -> tuple[str, ...]:
    """``PARTITION BY col[, ...]``: column names only."""
    names: list[str] = []
    for part in split_top(toks):
        tok = part[0] if part else keyword
        if (len(part) != 1 or tok.token_type in (TokenType.STRING, TokenType.NUMBER)
                or not tok.text.replace("_", "a").isalnum()):
            text = cur.source.text[part[0].start : part[-1].end + 1] if part else ""
            raise cur.error_at(tok, f"PARTITION BY takes column names (no expressions or aliases), found {text!r}")
        if tok.text.lower() in PLACEHOLDERS:
            raise cur.error_at(tok, f"{tok.text} is a placeholder, not a column: PARTITION BY takes column names")
        if tok.text.lower() in (n.lower() for n in names):
            raise cur.error_at(tok, f"PARTITION BY names {tok.text!r} twice")
        names.append(tok.text)
    return tuple(names)


def _header_partition(cur: Cursor) -> tuple[str, ...]:
    keyword = cur.advance()
    toks, depth = [], 0
    while (tok := cur.peek()) is not None:
        word = tok.text.upper()
        if depth == 0 and word in _HEADER and word not in ("(", "PARTITION BY"):
            alias = word == "AS" and cur.peek(1) is not None and cur.peek(1).text.upper() != "SELECT"
            if not alias:
                break
        depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(tok.token_type, 0)
        toks.append(cur.advance())
    return partition_names(cur, keyword, toks)


def _new_form(cur: Cursor, opts: ParseOptions, scope: Scope, name_tok: Token, b: _Build) -> None:
    f = b.fields
    f["trigger"], trigger_tok = parse_trigger(cur, scope)
    done, query, notify_where_toks = _new_header(cur, opts, scope, b)
    label, notify = scope.label, f.get("notify")
    if "FROM" not in done and scope.family != "period":
        raise cur.error_at(trigger_tok, f"the {label} trigger needs a trigger table: add FROM table after it")
    if notify is not None and not notify.events and scope.family == "window":
        raise cur.error_at(done["NOTIFY"], f"NOTIFY needs ON (WINDOW_OPEN|WINDOW_CLOSE) with the {label} trigger")
    if "CALC_NOTIFY_ONLY" in done and notify is None:
        raise cur.error_at(done["CALC_NOTIFY_ONLY"], "CALC_NOTIFY_ONLY needs NOTIFY(...)")
    for key in ("OUTPUT_SUBTABLE", "(", "TAGS"):
        if key in done and "INTO" not in done:
            raise cur.error_at(done[key], f"{'a column list' if key == '(' else key} needs INTO table")
    if query is None:
        if "INTO" in done:
            raise cur.error_at(done["INTO"], "INTO needs AS SELECT ...: the query computes what is written")
        if notify is None:
            raise cur.error_at(name_tok, "a stream needs AS SELECT ... (or NOTIFY(...) to only send its trigger's events)")
    if "INTO" not in done:
        b.features.append(("WITHOUT INTO", done.get("AS", name_tok)))  # where INTO would be
    if query is not None:
        _new_query(cur, scope, query, b, done.get("("))
    if notify_where_toks:
        names = tuple(i.name for i in f.get("select", ()))
        f["notify"] = replace(notify, where=notify_where(scope, notify_where_toks, names))
    for key in ("trigger_table", "source", "sink"):
        f.setdefault(key, None)


def _new_header(cur: Cursor, opts: ParseOptions, scope: Scope,
                b: _Build) -> tuple[dict[str, Token], list[Token] | None, list[Token] | None]:
    """The clauses after the trigger, in ``_HEADER`` order: the keyword of each one given, the
    query's tokens (after AS) and NOTIFY's WHERE tokens."""
    f = b.fields
    done: dict[str, Token] = {}
    query, notify_where_toks, last = None, None, -1
    while not cur.at_end():
        tok = cur.peek()
        key = "(" if tok.token_type == TokenType.L_PAREN else tok.text.upper()
        if key not in _HEADER:
            later = ["(columns)" if k == "(" else k for k in _HEADER[last + 1 :]]
            raise cur.unexpected(f"expected {', '.join(later)} or the end of the statement")
        if key in done:
            raise cur.error_at(tok, f"{key} given twice")
        if _HEADER.index(key) < last:
            raise cur.error_at(tok, f"{key} must come before {_HEADER[last]}")
        done[key], last = tok, _HEADER.index(key)
        if key == "AS":
            cur.advance()
            query, cur.pos = cur.tokens[cur.pos :], len(cur.tokens)
        elif key == "FROM":
            cur.advance()
            f["trigger_table"] = cur.table_name("a trigger table name after FROM").text
        elif key == "PARTITION BY":
            scope.partition_by = f["partition_by"] = _header_partition(cur)
        elif key == "OPTIONS":
            f["options"], given = parse_options(cur, scope, opts)
            for name in ("FORCE_OUTPUT", "CALC_NOTIFY_ONLY", "DELETE_OUTPUT_TABLE"):
                if name in given:
                    b.features.append((name, given[name]))
                    done[name] = given[name]
            if "DELETE_OUTPUT_TABLE" in given and "tbname" not in (p.lower() for p in scope.partition_by):
                raise cur.error_at(given["DELETE_OUTPUT_TABLE"], "DELETE_OUTPUT_TABLE needs PARTITION BY tbname")
        elif key == "NOTIFY":
            f["notify"], keyword, notify_where_toks = parse_notify(cur)
            b.features.append(("NOTIFY", keyword))
        elif key == "INTO":
            cur.advance()
            f["sink"] = cur.table_name("a table name after INTO").text
        elif key == "OUTPUT_SUBTABLE":
            f["output_subtable"], keyword = parse_subtable(cur, scope)
            b.features.append(("OUTPUT_SUBTABLE", keyword))
        elif key == "(":
            f["sink_columns"], _ = parse_column_list(cur)
        else:
            f["tags"], keyword = parse_tags(cur, scope)
            b.features.append(("TAGS", keyword))
    return done, query, notify_where_toks


def _new_query(cur: Cursor, scope: Scope, query: list[Token], b: _Build, columns_tok: Token | None) -> None:
    """``AS SELECT ... FROM %%trows | table [WHERE ...]``."""
    clauses = split_query(cur, query, form="new")
    source, is_placeholder, tok = from_clause(scope, *clauses["FROM"])
    if is_placeholder and source == "tbname":
        raise cur.error_at(tok, "FROM %%tbname (reading each group's own table) is not supported yet: use FROM %%trows")
    if is_placeholder:
        source = b.fields.get("trigger_table")
        if source is None:
            raise cur.error_at(tok, "FROM %%trows needs a trigger table: add FROM table after the trigger")
    elif scope.family != "period":
        raise cur.error_at(tok, f"the {scope.label} trigger's query reads FROM %%trows: reading another table per "
                                "window is not supported yet")
    b.fields["source"] = source
    _query(scope, clauses, b, columns_tok)


def _query(scope: Scope, clauses: dict, b: _Build, columns_tok: Token | None) -> None:
    f = b.fields
    if "WHERE" in clauses:
        f["where"] = where_clause(scope, clauses["WHERE"][1])
    f["select"], f["key_bound"] = select_items(scope, clauses["SELECT"][1], sink_columns=f.get("sink_columns"),
                                               columns_tok=columns_tok)


def _old_form(cur: Cursor, scope: Scope, name_tok: Token, b: _Build) -> None:
    f = b.fields
    start_pos = cur.pos
    old = parse_old_options(cur)
    columns_tok = None
    if cur.is_word("INTO"):
        cur.advance()
        f["sink"] = cur.table_name("a table name after INTO").text
        if cur.peek() is not None and cur.peek().token_type == TokenType.L_PAREN:
            f["sink_columns"], columns_tok = parse_column_list(cur)
        if cur.is_word("TAGS"):
            f["tags"], keyword = parse_tags(cur, scope)
            b.features.append(("TAGS", keyword))
        if cur.is_word("SUBTABLE"):
            f["output_subtable"], keyword = parse_subtable(cur, scope)
            b.features.append(("SUBTABLE", keyword))
    elif cur.is_word("AS"):
        b.features.append(("WITHOUT INTO", cur.peek()))  # where INTO would be
    if not cur.is_word("AS"):
        if cur.pos == start_pos:
            raise cur.unexpected(f"expected a trigger ({', '.join(NEW_TRIGGERS)}), or the old form's TRIGGER, "
                                 "WATERMARK, IGNORE EXPIRED, IGNORE UPDATE, DELETE_MARK, FILL_HISTORY, INTO or AS")
        raise cur.unexpected("expected AS and the stream's query" if "sink" in f else "expected INTO or AS")
    cur.advance()
    clauses = split_query(cur, cur.tokens[cur.pos :], form="old")
    cur.pos = len(cur.tokens)
    source, _, _ = from_clause(scope, *clauses["FROM"])
    f["trigger_table"] = f["source"] = source
    if "PARTITION BY" in clauses:
        scope.partition_by = f["partition_by"] = partition_names(cur, *clauses["PARTITION BY"])
    if "WINDOW" not in clauses:
        raise cur.error_at(clauses["SELECT"][0], f"a stream needs a window clause at the end of its query: {_WINDOW_USAGE}")
    wtok, wtoks = clauses["WINDOW"]
    window = [wtok] + wtoks
    f["trigger"], _ = parse_window(cur.sub(window, window[-1].end + 1), scope)
    f["options"] = old_stream_options(cur, old, f["trigger"], scope.label)
    _query(scope, clauses, b, columns_tok)
    if "NOTIFY" in clauses:
        ntok, ntoks = clauses["NOTIFY"]
        f["notify"], keyword = parse_old_notify(cur.sub([ntok] + ntoks, cur.end))
        b.features.append(("NOTIFY", keyword))
    f.setdefault("sink", None)
