"""The Dagster adapter. Importing it builds nothing and writes nothing: Dagster loads the code
location from ``dagster_defs.location`` (see workspace.yaml), whose ``defs`` is built at load. Names
resolve lazily, so ``dagster_defs.client`` (the CLI's) does not import Spark or the builders."""

from importlib import import_module

_EXPORTS = {
    "CQEngineResource": "resource",
    "pyspark_resource": "resource",
    "CQTranslator": "translator",
    "configured_translator": "translator",
    "FiringConfig": "builders",
    "due_firings": "builders",
    "firing_request": "builders",
    "build_definitions": "definitions",
    "error_placeholder": "definitions",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dagster_defs' has no attribute {name!r}")
    return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
