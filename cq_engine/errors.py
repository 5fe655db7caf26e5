"""One flat error hierarchy: every failure the engine reports on purpose is a ``CQError``."""

from __future__ import annotations


class CQError(Exception):
    """Base of every error cq-engine raises for bad input or a failed operation."""


class ParseError(CQError):
    """A definition file is malformed; the message starts with ``file:line:col:``."""

    def __init__(self, message: str, *, file: str = "<string>", line: int = 1, col: int = 1):
        self.file, self.line, self.col, self.detail = file, line, col, message
        super().__init__(f"{file}:{line}:{col}: {message}")


class TableError(CQError):
    """A table is missing, lacks a column, or holds data of the wrong type."""


class TimeError(CQError):
    """A time or time range given by the user is malformed or not a firing time."""


class SparkError(CQError):
    """The Spark runtime cannot be started, reached or stopped."""
