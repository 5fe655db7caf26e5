"""One flat error hierarchy: every failure the engine reports on purpose is a ``CQError``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


class CQError(Exception):
    """Base of every error cq-engine raises for bad input or a failed operation."""


class ParseError(CQError):
    """A definition file is malformed or does not fit the tables; ``str()`` is ``file:line:col: message``.

    Structured for the catalog's load errors: ``file``, ``line``, ``col``, ``detail`` (the message without
    its place), ``names``, the definitions the error kept from loading (when known), and ``kept``, those
    of the file that still run at the file's last good version (``since``: when that was recorded)."""

    def __init__(
        self,
        message: str,
        *,
        file: str = "<string>",
        line: int = 1,
        col: int = 1,
        names: tuple[str, ...] = (),
        kept: tuple[str, ...] = (),
        since: str = "",
    ):
        message = " ".join(part.strip() for part in message.splitlines())  # one error, one line
        self.file, self.line, self.col, self.detail, self.names = file, line, col, message, names
        self.kept, self.since = kept, since
        super().__init__(f"{file}:{line}:{col}: {message}")

    def removing(self, names: tuple[str, ...]) -> ParseError:
        """The same error, recording the definitions it removed from the catalog."""
        return ParseError(self.detail, file=self.file, line=self.line, col=self.col, names=names)

    def keeping(self, names: tuple[str, ...], *, since: str) -> ParseError:
        """The same error, recording the definitions that run on at the file's last good version."""
        return ParseError(self.detail, file=self.file, line=self.line, col=self.col, kept=names, since=since)

    def consequence(self) -> str:
        """What the error does to the definitions, in one sentence."""
        if self.kept:
            return (
                f"{', '.join(self.kept)} keep running at the file's last good version ({self.since}) "
                "until it loads again"
            )
        if self.names:
            return f"{', '.join(self.names)} did not load"
        return "none of its definitions loaded"


class TableError(CQError):
    """A table is missing, lacks a column, or holds data of the wrong type."""


class TimeError(CQError):
    """A time or time range given by the user is malformed or not a firing time."""


class SparkError(CQError):
    """The Spark runtime cannot be started, reached or stopped."""


class AlreadyCommitted(CQError):
    """A write made ``once`` found its identity committed: the sink already holds this firing (or a
    later one of the same definition), written by another run. Not a failure: nothing is written and
    the ledger records nothing; ``version`` is the sink's version that holds it."""

    def __init__(self, table: str, app_id: str, app_version: int, *, version: int):
        self.table, self.app_id, self.app_version, self.version = table, app_id, app_version, version
        super().__init__(f"table '{table}' already holds {app_id} at {app_version} or later (version {version})")


class RunError(CQError):
    """A definition's run failed on something its load-time checks could not see (data, the cluster);
    ``str()`` is one line naming the definition and its file, the cause (and its trace) is chained."""


def summary(exc: BaseException, *, limit: int = 400) -> str:
    """The first line of an exception's message (Spark's are pages long), with its type."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    first = lines[0] if lines else ""
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def located(name: str, where: object, exc: Exception) -> CQError:
    """``exc`` as the engine's error: itself if it is one, else a one-line ``RunError`` naming the
    definition ``name`` and ``where`` (its ``file:line:col``) with ``exc`` as its cause, whose trace is
    logged at DEBUG (Dagster's run log shows the cause; ``CQ_DEBUG=1 cq ...`` prints it)."""
    if isinstance(exc, CQError):
        return exc
    log.debug("%s (%s) failed", name, where, exc_info=exc)
    error = RunError(f"{name} ({where}): {summary(exc)}")
    error.__cause__ = exc
    return error


@contextmanager
def reported(name: str, where: object) -> Iterator[None]:
    """Run the body of definition ``name``: an exception that is not the engine's own is raised as
    ``located(name, where, exc)``."""
    try:
        yield
    except CQError:
        raise
    except Exception as exc:
        raise located(name, where, exc) from exc
