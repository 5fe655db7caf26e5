"""IoTDB-style triggers in Python (seed 004): subclass :class:`Trigger`, name the class in
``CREATE [STATELESS | STATEFUL] TRIGGER name BEFORE | AFTER INSERT ON pattern AS 'module:Class'``.

Every method is optional, as in IoTDB's Java interface. The engine calls them from
``cq_engine.triggers.runtime``: ``validate`` then ``on_create`` when it creates an instance, ``restore``
after that for a STATEFUL trigger that was registered by an earlier process, ``fire`` once per batch,
``on_drop`` from ``cq drop NAME`` once the statement is gone."""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cq_engine.errors import CQError

if TYPE_CHECKING:  # `cq validate` looks for trigger modules without loading pyarrow
    import pyarrow as pa

__all__ = ["BatchInfo", "FailureStrategy", "Trigger", "TriggerAttributes", "TriggerError", "batch_info"]


class TriggerError(CQError):
    """A trigger cannot be loaded or created, or a PESSIMISTIC trigger failed."""


class FailureStrategy(enum.Enum):
    """What a failed ``fire`` (``False`` or an exception) does.

    OPTIMISTIC: logged; later triggers still fire and the write (BEFORE) or the delivery (AFTER) goes on.
    PESSIMISTIC: later triggers do not fire; BEFORE INSERT: nothing is written; AFTER INSERT: delivery
    stops at that version and retries it at the next sensor evaluation."""

    OPTIMISTIC = "OPTIMISTIC"
    PESSIMISTIC = "PESSIMISTIC"


class TriggerAttributes(Mapping[str, str]):
    """The ``WITH ("k" = "v", ...)`` attributes (strings, keys as written), with typed getters whose
    errors name the trigger, the key and the value. ``name`` and ``warehouse`` are the engine's:
    the trigger's name and the warehouse root (``CQ_WAREHOUSE``, Delta tables at ``<warehouse>/<table>``)."""

    def __init__(
        self, values: Mapping[str, str] | tuple[tuple[str, str], ...] = (), *, name: str = "", warehouse: str = ""
    ):
        self._values = dict(values)
        self.name, self.warehouse = name, warehouse

    def __getitem__(self, key: str) -> str:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"TriggerAttributes({self._values!r}, name={self.name!r})"

    def string(self, key: str, default: str | None = None) -> str:
        if key in self._values:
            return self._values[key]
        if default is None:
            raise self.error(f'needs the attribute {key!r}: WITH ("{key}" = "...")')
        return default

    def float(self, key: str, default: float | None = None) -> float:
        return self._typed(key, default, float, "a number")

    def int(self, key: str, default: int | None = None) -> int:
        return self._typed(key, default, int, "an integer")

    def bool(self, key: str, default: bool | None = None) -> bool:
        def parse(text: str) -> bool:
            if text.lower() not in ("true", "false"):
                raise ValueError(text)
            return text.lower() == "true"

        return self._typed(key, default, parse, "true or false")

    def _typed(self, key, default, convert, what: str):
        if key not in self._values:
            if default is None:
                raise self.error(f"needs the attribute {key!r}")
            return default
        try:
            return convert(self._values[key])
        except ValueError:
            raise self.error(f"attribute {key!r} must be {what}, got {self._values[key]!r}") from None

    def error(self, message: str) -> TriggerError:
        """A ``TriggerError`` naming this trigger, for ``validate`` to raise."""
        return TriggerError(f"trigger {self.name!r}: {message}")


class Trigger:
    """Base class of every trigger. ``failure_strategy`` may be overridden (a class attribute or a
    property, read after ``on_create``). Instances are per process; a STATEFUL trigger's ``fire``
    calls never overlap, a STATELESS one must be safe to call from several threads."""

    failure_strategy: FailureStrategy = FailureStrategy.OPTIMISTIC

    def validate(self, attributes: TriggerAttributes) -> None:
        """Check the attributes; raise (``attributes.error(...)``) to refuse them."""

    def on_create(self, attributes: TriggerAttributes) -> None:
        """Once per instance, after ``validate``: read attributes, open resources."""

    def on_drop(self) -> None:
        """Once, when ``cq drop NAME`` drops the trigger whose statement was removed."""

    def restore(self) -> None:
        """STATEFUL triggers only: the instance replaces one of an earlier process (a restart);
        rebuild whatever state ``fire`` keeps."""

    def fire(self, batch: pa.Table) -> bool:
        """One batch: the rows of one insert into one table (BEFORE), or exactly the rows one Delta
        version of one table committed (AFTER). ``batch_info(batch)`` says which. Return True on
        success; False or an exception is a failure, handled per ``failure_strategy``."""
        return True


@dataclass(frozen=True)
class BatchInfo:
    """Where a batch comes from: the trigger, the table, the event, and (AFTER) the Delta version that
    committed its rows, so side effects can be made idempotent per ``(table, version)``."""

    trigger: str
    table: str
    event: str  # "before" | "after"
    version: int | None


_KEYS = {"trigger": b"cq.trigger", "table": b"cq.table", "event": b"cq.event", "version": b"cq.version"}


def with_info(batch: pa.Table, info: BatchInfo) -> pa.Table:
    """``batch`` carrying ``info`` in its schema metadata (what ``batch_info`` reads)."""
    meta = dict(batch.schema.metadata or {})
    meta.update(
        {key: str(getattr(info, name)).encode() for name, key in _KEYS.items() if getattr(info, name) is not None}
    )
    return batch.replace_schema_metadata(meta)


def batch_info(batch: pa.Table) -> BatchInfo:
    """The ``BatchInfo`` of a batch handed to ``fire``."""
    meta = batch.schema.metadata or {}
    if _KEYS["table"] not in meta:
        raise TriggerError("this batch was not handed over by the engine: it has no cq.table metadata")
    version = meta.get(_KEYS["version"])
    return BatchInfo(
        trigger=meta.get(_KEYS["trigger"], b"").decode(),
        table=meta[_KEYS["table"]].decode(),
        event=meta.get(_KEYS["event"], b"").decode(),
        version=int(version) if version else None,
    )
