"""SQL that reaches outside its data: what a definition's expressions and ``cq query`` may not do.

A definition reads its tables with side-effect-free expressions. Spark SQL can also call Java methods
(``reflect``, ``java_method``), read files (``text.`/path```, ``read_files``), and, as a statement,
write directories, create tables at a location or load jars; none of that may run from a definition,
and ``cq query`` refuses it unless ``--allow-writes`` says otherwise."""

from __future__ import annotations

import logging

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from cq_engine.errors import CQError
from cq_engine.names import name_problem

# Spark functions that call into the JVM or name files. Compared lower-cased.
UNSAFE_FUNCTIONS = frozenset(
    {
        "reflect",
        "java_method",
        "try_reflect",
        "read_files",
        "input_file_name",
        "input_file_block_start",
        "input_file_block_length",
    }
)
# Table-valued functions that only generate rows.
SAFE_TABLE_FUNCTIONS = frozenset({"range"})


def function_name(node: exp.Expr) -> str | None:
    if isinstance(node, exp.Anonymous):
        return str(node.this)
    if isinstance(node, exp.Func):
        return node.sql_name()
    return None


def unsafe_expression(tree: exp.Expr) -> tuple[exp.Expr, str] | None:
    """The first node of a definition's expression that reaches outside the data, and why."""
    for node in tree.walk():
        name = function_name(node)
        if name is not None and name.lower() in UNSAFE_FUNCTIONS:
            return node, f"{name}() reaches outside the data (the JVM or files) and is not allowed in a definition"
        if isinstance(node, exp.Dot) and isinstance(node.expression, exp.Func):
            return node, "qualified function calls (db.function) are not allowed in a definition"
        if isinstance(node, (exp.Table, exp.Subquery)) or (isinstance(node, exp.Query) and node is not tree):
            return node, "subqueries are not supported in a definition's expressions: it reads only its tables"
    return None


def check_read_only(sql: str) -> None:
    """``cq query``'s default: one SELECT (or WITH ... SELECT, or a set operation of them) over the
    warehouse tables by name, with no function that reaches the JVM or files; a ``CQError`` otherwise."""
    hint = " (`cq query --allow-writes` runs anything)"
    log = logging.getLogger("sqlglot")
    level = log.level
    log.setLevel(logging.ERROR)  # not its "falling back to a Command" warning on the terminal
    try:
        statements = [s for s in sqlglot.parse(sql, read="spark") if s is not None]
    except (SqlglotError, RecursionError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CQError(f"query: cannot check that it only reads: {detail}{hint}") from None
    finally:
        log.setLevel(level)
    if len(statements) != 1:
        raise CQError(f"query: expected one SELECT statement, got {len(statements)}{hint}")
    tree = statements[0]
    if not isinstance(tree, exp.Query):
        raise CQError(f"query: only SELECT (or WITH ... SELECT) is allowed, not {tree.key.upper()}{hint}")
    for node in tree.walk():
        name = function_name(node)
        if name is not None and name.lower() in UNSAFE_FUNCTIONS:
            raise CQError(f"query: {name}() reaches outside the data (the JVM or files){hint}")
        if isinstance(node, exp.Table):
            _check_table(node, hint)
        if isinstance(node, (exp.Insert, exp.Create, exp.Command, exp.Drop, exp.Delete, exp.Update)):
            raise CQError(f"query: {node.key.upper()} is not a read{hint}")


def _check_table(node: exp.Table, hint: str) -> None:
    if isinstance(node.this, exp.Func):
        name = function_name(node.this) or ""
        if name.lower() not in SAFE_TABLE_FUNCTIONS:
            raise CQError(f"query: table function {name}() is not allowed{hint}")
        return
    if node.args.get("db") or node.args.get("catalog"):
        raise CQError(
            f"query: {node.sql(dialect='spark')!r} is not a warehouse table: direct file reads "
            f"(text.`path`) and other catalogs are not allowed{hint}"
        )
    if node.name and name_problem(node.name) is not None:
        raise CQError(f"query: {node.name!r} is not a table name{hint}")


def table_names(sql: str) -> set[str] | None:
    """The lower-cased names of the tables ``sql`` reads by name (CTE names excluded); None when it
    does not parse (then a caller must assume any table)."""
    log = logging.getLogger("sqlglot")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        statements = [s for s in sqlglot.parse(sql, read="spark") if s is not None]
    except (SqlglotError, RecursionError):
        return None
    finally:
        log.setLevel(level)
    names: set[str] = set()
    ctes: set[str] = set()
    for tree in statements:
        if isinstance(tree, exp.Command):
            return None  # not parsed into a tree: its tables are unknown
        ctes |= {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
        names |= {t.name.lower() for t in tree.find_all(exp.Table) if t.name and not isinstance(t.this, exp.Func)}
    return names - ctes
