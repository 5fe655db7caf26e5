"""The frozen IR every stage after parsing talks in. Data only, no behaviour beyond validation."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal, Union

TimeoutPolicy = Literal["BLOCKED", "DISCARD"]
FillKind = Literal["previous", "linear", "constant"]


@dataclass(frozen=True)
class SourceLocation:
    """Where a definition starts: ``file:line:col``."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@dataclass(frozen=True)
class Column:
    """A declared column; ``type`` is a Spark SQL type name (``double``, ``timestamp``...)."""

    name: str
    type: str
    is_tag: bool = False


@dataclass(frozen=True)
class TableDecl:
    """``CREATE TABLE``: a Delta table the engine creates and whose schema it enforces."""

    name: str
    columns: tuple[Column, ...]
    time_column: str
    if_not_exists: bool
    location: SourceLocation
    sql: str = ""

    def column(self, name: str) -> Column | None:
        lowered = name.lower()
        return next((c for c in self.columns if c.name.lower() == lowered), None)


@dataclass(frozen=True)
class Resample:
    """IoTDB ``RESAMPLE``: firing i runs at ``boundary + i*every`` over
    ``[fire - start_offset, fire - end_offset)``."""

    every: timedelta
    start_offset: timedelta
    end_offset: timedelta
    boundary: datetime  # timezone-aware UTC

    def __post_init__(self) -> None:
        if self.boundary.tzinfo is None:
            raise ValueError("Resample.boundary must be timezone-aware")


@dataclass(frozen=True)
class TimeGrouping:
    """``GROUP BY (interval[, step])``: windows ``[lo + k*step, lo + k*step + interval)``."""

    interval: timedelta
    step: timedelta


@dataclass(frozen=True)
class Fill:
    """``FILL(PREVIOUS | LINEAR | constant)``; ``value`` is set for a constant."""

    kind: FillKind
    value: Union[float, int, str, bool, None] = None


@dataclass(frozen=True)
class SelectItem:
    """One output column: Spark SQL for the expression, and the sink column it lands in."""

    expression: str
    name: str
    is_aggregate: bool


@dataclass(frozen=True)
class ContinuousQuery:
    """``CREATE CONTINUOUS QUERY``: one SELECT run on every RESAMPLE firing."""

    name: str
    resample: Resample
    timeout_policy: TimeoutPolicy
    source: str
    sink: str
    select: tuple[SelectItem, ...]
    where: str | None = None
    time_grouping: TimeGrouping | None = None
    group_keys: tuple[str, ...] = ()
    having: str | None = None
    fill: Fill | None = None
    limit: int | None = None
    offset: int = 0
    align_by_device: bool = False
    location: SourceLocation = field(default_factory=lambda: SourceLocation("<string>", 1, 1))
    sql: str = ""

    @property
    def kind(self) -> str:
        return "continuous query"

    @property
    def is_aggregate(self) -> bool:
        return self.time_grouping is not None or any(i.is_aggregate for i in self.select)


Definition = ContinuousQuery  # streams join this union when they land


@dataclass(frozen=True)
class Catalog:
    """Everything loaded from the sql directory: tables, definitions and per-file errors."""

    tables: tuple[TableDecl, ...] = ()
    definitions: tuple[Definition, ...] = ()
    errors: tuple[str, ...] = ()

    def definition(self, name: str) -> Definition | None:
        lowered = name.lower()
        return next((d for d in self.definitions if d.name.lower() == lowered), None)

    def table(self, name: str) -> TableDecl | None:
        lowered = name.lower()
        return next((t for t in self.tables if t.name.lower() == lowered), None)
