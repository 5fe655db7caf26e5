"""cq-engine: continuous queries (IoTDB CQs, TDengine streams, eKuiper rules, Python triggers) run as
idempotent Spark batches on Delta Lake.

The public API is what ``__all__`` lists. Names load on first use, so ``import cq_engine`` is cheap
(no Spark, no Delta, no Dagster) and has no side effects."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the module that defines it. Not ``ingest``: the submodule ``cq_engine.ingest`` would shadow
# it once imported (call ``cq_engine.ingest.ingest``).
_EXPORTS = {
    "Engine": "cq_engine.engine",
    "EngineContext": "cq_engine.context",
    "RunResult": "cq_engine.context",
    "Settings": "cq_engine.config",
    "load_settings": "cq_engine.config",
    "load_catalog": "cq_engine.catalog",
    "IngestResult": "cq_engine.ingest",
    "Trigger": "cq_engine.triggers",
    "TriggerAttributes": "cq_engine.triggers",
    "TriggerError": "cq_engine.triggers",
    "FailureStrategy": "cq_engine.triggers",
    "BatchInfo": "cq_engine.triggers",
    "batch_info": "cq_engine.triggers",
    "CQError": "cq_engine.errors",
    "ParseError": "cq_engine.errors",
    "TableError": "cq_engine.errors",
    "TimeError": "cq_engine.errors",
    "SparkError": "cq_engine.errors",
}

__all__ = [
    "BatchInfo",
    "CQError",
    "Engine",
    "EngineContext",
    "FailureStrategy",
    "IngestResult",
    "ParseError",
    "RunResult",
    "Settings",
    "SparkError",
    "TableError",
    "TimeError",
    "Trigger",
    "TriggerAttributes",
    "TriggerError",
    "batch_info",
    "load_catalog",
    "load_settings",
]

if TYPE_CHECKING:
    from cq_engine.catalog import load_catalog
    from cq_engine.config import Settings, load_settings
    from cq_engine.context import EngineContext, RunResult
    from cq_engine.engine import Engine
    from cq_engine.errors import CQError, ParseError, SparkError, TableError, TimeError
    from cq_engine.ingest import IngestResult
    from cq_engine.triggers import BatchInfo, FailureStrategy, Trigger, TriggerAttributes, TriggerError, batch_info


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cq_engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
