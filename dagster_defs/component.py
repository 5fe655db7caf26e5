"""cq-engine as a Dagster Component: an existing Dagster project adds it with a ``defs.yaml`` and no
Python (docs/dagster/component.md)::

    type: dagster_defs.component.CQComponent
    attributes:
      sql_dir: sql                 # relative to this defs.yaml's folder
      warehouse: s3://bucket/warehouse
      timezone: Asia/Shanghai
      translator: my_package.translators:MyTranslator   # optional

It builds exactly what ``dagster_defs.location`` builds from ``CQ_*`` (``build_definitions``); the
other settings still come from ``cq.toml`` and the environment. Importing this module builds nothing.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import dagster as dg
from pydantic import Field

from cq_engine.config import load_settings

from .definitions import build_definitions
from .translator import configured_translator


class CQComponent(dg.Component, dg.Model, dg.Resolvable):
    """The continuous queries, streams and triggers of ``sql_dir`` over the Delta tables of
    ``warehouse``: their sinks as assets (with freshness policies and completeness checks), the
    ``cq_firings`` job and sensor, the per-definition jobs and sensors."""

    sql_dir: str = Field(
        description="Directory of the .sql definitions; relative paths start at this defs.yaml's folder."
    )
    warehouse: str = Field(
        description="Warehouse root (a directory, relative to this defs.yaml's folder, or a URL such as s3://bucket/path)."
    )
    timezone: str = Field(default="UTC", description="Zone for times without offset and for schedules (CQ_TIMEZONE).")
    translator: str | None = Field(
        default=None,
        description="A CQTranslator subclass as module:Class (as CQ_TRANSLATOR); default: CQ_TRANSLATOR, else CQTranslator().",
    )

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        base = Path(context.path)
        base = base if base.is_dir() else base.parent

        def local(path: str) -> str:
            return path if "://" in path or Path(path).is_absolute() else str((base / path).resolve())

        settings = replace(
            load_settings(), sql_dir=local(self.sql_dir), warehouse=local(self.warehouse), timezone=self.timezone
        )
        _ = settings.tz  # an unknown zone fails the load with its name, not later in a run
        return build_definitions(settings=settings, translator=configured_translator(self.translator))
