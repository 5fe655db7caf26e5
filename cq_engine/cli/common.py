"""What every ``cq`` command module shares: opening the engine and the ledger from the settings, and the
name rule for NAME/TABLE arguments."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from cq_engine.config import Settings
from cq_engine.names import name_problem

if TYPE_CHECKING:  # imported where used: pyarrow and deltalake cost `cq validate` and `cq --help` nothing
    from cq_engine.engine import Engine
    from cq_engine.storage.delta import DeltaRsStorage
    from cq_engine.storage.ledger import Ledger


def open_engine(settings: Settings) -> Engine:
    """The engine facade over the configured catalog and warehouse."""
    # Imported here: the engine pulls in pyspark, which commands like `cq validate` never need.
    from cq_engine.engine import Engine

    return Engine(settings=settings)


def open_storage(settings: Settings) -> DeltaRsStorage:
    """The warehouse's storage, without loading the catalog or Spark."""
    from cq_engine.storage.delta import DeltaRsStorage

    return DeltaRsStorage(warehouse=settings.warehouse)


def open_ledger(settings: Settings) -> Ledger:
    from cq_engine.storage.ledger import Ledger

    return Ledger(store=open_storage(settings))


def name_arg(text: str) -> str:
    """argparse ``type`` for a definition, stream, trigger or table name: the name rule, before any
    command touches anything."""
    problem = name_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid name: {problem}")
    return text
