"""The Dagster code location: ``defs`` built from the definitions in ``CQ_SQL_DIR``."""

from .builders import FiringConfig, due_firings, firing_request
from .definitions import build_definitions, error_placeholder
from .resource import CQEngineResource, pyspark_resource
from .translator import CQTranslator

defs = build_definitions()

__all__ = ["CQEngineResource", "CQTranslator", "FiringConfig", "build_definitions", "defs", "due_firings",
           "error_placeholder", "firing_request", "pyspark_resource"]
