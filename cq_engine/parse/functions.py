"""Function names resolved when a definition loads: the dialect's own functions (translated before this
check), then Spark's built-ins (``spark_functions``). A name the engine cannot compute is an error at
the call (``file:line:col``), not a Spark error at run time (docs/dialects/index.md, *Functions*)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping

from sqlglot import exp

from cq_engine.parse.spark_functions import SPARK_FUNCTIONS

# Spark SQL forms that are syntax rather than entries of SHOW FUNCTIONS.
SQL_FORMS = frozenset({"try_cast", "timestampadd", "timestampdiff"})
_CALL = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(")


def spark_name(node: exp.Func) -> str | None:
    """The function Spark will be asked for when ``node`` is rendered as Spark SQL (lower-cased), or
    None for a node Spark reads as syntax (CASE, operators, literals)."""
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    match = _CALL.match(node.sql(dialect="spark"))
    return match.group(1).lower() if match else None


def unknown_function(tree: exp.Expr) -> tuple[exp.Func, str] | None:
    """The first call in ``tree`` Spark has no function for, with its name."""
    for node in tree.walk():
        if isinstance(node, exp.Func):
            name = spark_name(node)
            if name is not None and name not in SPARK_FUNCTIONS and name not in SQL_FORMS:
                return node, name
    return None


def check_functions(
    tree: exp.Expr,
    error,
    *,
    dialect: str,
    refused: Mapping[str, str] | None = None,
    own: tuple[str, ...] = (),
) -> None:
    """Raise ``error(node, message)`` at the first call Spark cannot compute. ``refused``: the dialect's
    functions the engine knowingly does not compute, each with the reason; ``own``: the dialect's
    functions it translates (offered in the message's suggestion)."""
    found = unknown_function(tree)
    if found is None:
        return
    node, name = found
    if refused and name in refused:
        raise error(node, f"{name.upper()}() is not supported in {dialect} definitions: {refused[name]}")
    close = difflib.get_close_matches(name, [*own, *sorted(SPARK_FUNCTIONS)], n=1, cutoff=0.8)
    hint = f" (did you mean {close[0].upper()}?)" if close else ""
    raise error(
        node,
        f"unknown function {name.upper()}(): neither {'an' if dialect[0] in 'aeiouAEIOU' else 'a'} {dialect} "
        "function the engine translates nor a Spark "
        f"built-in{hint} (docs/dialects/index.md, Functions)",
    )
