"""One flat error hierarchy: every failure the engine reports on purpose is a ``CQError``."""

from __future__ import annotations


class CQError(Exception):
    """Base of every error cq-engine raises for bad input or a failed operation."""


class ParseError(CQError):
    """A definition file is malformed or does not fit the tables; ``str()`` is ``file:line:col: message``.

    Structured for the catalog's load errors: ``file``, ``line``, ``col``, ``detail`` (the message without
    its place) and ``names``, the definitions the error kept from loading (when known)."""

    def __init__(
        self, message: str, *, file: str = "<string>", line: int = 1, col: int = 1, names: tuple[str, ...] = ()
    ):
        message = " ".join(part.strip() for part in message.splitlines())  # one error, one line
        self.file, self.line, self.col, self.detail, self.names = file, line, col, message, names
        super().__init__(f"{file}:{line}:{col}: {message}")

    def removing(self, names: tuple[str, ...]) -> ParseError:
        """The same error, recording the definitions it removed from the catalog."""
        return ParseError(self.detail, file=self.file, line=self.line, col=self.col, names=names)


class TableError(CQError):
    """A table is missing, lacks a column, or holds data of the wrong type."""


class TimeError(CQError):
    """A time or time range given by the user is malformed or not a firing time."""


class SparkError(CQError):
    """The Spark runtime cannot be started, reached or stopped."""
