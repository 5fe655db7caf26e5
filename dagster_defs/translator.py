"""Maps each cq-engine definition to Dagster objects; subclass it to change keys, groups, tags."""

from __future__ import annotations

import copy
import importlib
import os

import dagster as dg

from cq_engine.config import Settings
from cq_engine.errors import CQError
from cq_engine.model import ContinuousQuery, Definition, Stream, TableDecl, statement_hash

from . import health

TRANSLATOR_ENV = "CQ_TRANSLATOR"


class CQTranslator:
    """In the manner of dagster-dbt's ``DagsterDbtTranslator``: one method per Dagster attribute.
    ``build_definitions`` hands it the location's settings (``bound``) for what depends on them:
    freshness policies, table locations and schemas."""

    settings: Settings | None = None

    def bound(self, settings: Settings) -> CQTranslator:
        """A copy of this translator that knows the location's settings (the original is untouched)."""
        out = copy.copy(self)
        out.settings = settings
        return out

    def _settings(self) -> Settings:
        return self.settings if self.settings is not None else Settings()

    def get_asset_key(self, table: str) -> dg.AssetKey:
        return dg.AssetKey([table])

    def get_group_name(self, definition: Definition) -> str:
        return "cq_engine"

    def get_job_name(self, definition: Definition) -> str:
        """The job of a definition with an asset of its own (a window-triggered stream; every definition
        under ``CQ_RUN_MODEL=per_firing``). A batched one has none: its runs are ``get_batch_job_name``'s."""
        return f"{definition.name}_job"

    def get_op_name(self, definition: Definition) -> str:
        return f"cq_{definition.name}"

    def get_recalculate_job_name(self, definition: Definition) -> str:
        """Like ``get_job_name``: only definitions with an asset of their own have this job."""
        return f"{definition.name}_recalculate"

    def get_tags(self, definition: Definition) -> dict[str, str]:
        """Run and asset tags; ``cq/timeout_policy`` only where the dialect has one (IoTDB's
        continuous queries): a stream's runs never overlap whatever it says."""
        tags = {"cq/name": definition.name, "cq/kind": definition.kind.replace(" ", "_")}
        if isinstance(definition, ContinuousQuery):
            tags["cq/timeout_policy"] = definition.timeout_policy
        return tags

    def get_code_version(self, definition: Definition) -> str:
        return statement_hash(definition)

    def get_description(self, definition: Definition) -> str:
        """Markdown that also reads as plain text (the catalog's list shows it unrendered): a
        sentence, then the statement as an indented code block."""
        into = f"writes {definition.sink}" if definition.sink else "notifies only"
        sql = "\n".join(f"    {line}" for line in definition.sql.strip().splitlines())
        return f"{kind_label(definition)} {definition.name} ({definition.location}), {into}.\n\n{sql}\n"

    def get_freshness_policy(self, definition: Definition) -> dg.FreshnessPolicy | None:
        """Derived from the definition's schedule or windows and the grace (``dagster_defs.health``);
        return None for no policy."""
        return health.freshness_policy(definition, self._settings())

    def get_source_asset_spec(self, table: str, decl: TableDecl | None = None) -> dg.AssetSpec:
        """A source table, with its location and schema (``decl``: its CREATE TABLE, if any)."""
        return dg.AssetSpec(
            key=self.get_asset_key(table),
            group_name="sources",
            description=f"Delta table {table}, a source of the definitions.",  # no markdown: lists show it raw
            metadata=health.source_metadata(self._settings(), table, decl),
            kinds={"delta"},
        )

    def get_sink_asset_spec(self, definition: Definition) -> dg.AssetSpec:
        """The sink; a stream without INTO (it only notifies) gets the asset ``<name>_notifications``."""
        return dg.AssetSpec(
            key=self.get_asset_key(definition.sink or f"{definition.name}_notifications"),
            deps=[
                self.get_asset_key(t)
                for t in dict.fromkeys(x for x in (getattr(definition, "trigger_table", None), definition.source) if x)
            ],
            group_name=self.get_group_name(definition),
            description=self.get_description(definition),
            code_version=self.get_code_version(definition),
            tags={k.replace("/", "_"): v for k, v in self.get_tags(definition).items() if k != "cq/kind"},
            metadata={
                "cq/definition": definition.name,
                "cq/source": definition.source,
                "cq/location": str(definition.location),
                **(health.table_identity(self._settings(), definition.sink) if definition.sink else {}),
            },
            freshness_policy=self.get_freshness_policy(definition),
        )

    def get_schedule_name(self, definition: Definition) -> str:
        return f"{definition.name}_schedule"

    def get_sensor_name(self, definition: Definition) -> str:
        """A stream's sensor, a tick sensor (``per_firing``), or a batched definition's switch schedule."""
        return f"{definition.name}_ticks"

    # The batched run model (dagster_defs.batch): one op, job and sensor for the location's firings.
    def get_batch_op_name(self) -> str:
        return "cq_firings"

    def get_batch_job_name(self) -> str:
        """The batches' job, and one batched definition's runs (its sink alone selected)."""
        return "cq_firings_job"

    def get_batch_sensor_name(self) -> str:
        return "cq_firings"

    # Window-triggered streams and eKuiper rules (dagster_defs.streams): one op, job and sensor.
    def get_streams_op_name(self) -> str:
        return "cq_streams"

    def get_streams_job_name(self) -> str:
        return "cq_streams_job"

    def get_streams_sensor_name(self) -> str:
        return "cq_streams"

    def get_health_sensor_name(self) -> str:
        """The sensor that marks stopped and stale sinks (``dagster_defs.sink_health``)."""
        return "cq_health"


def kind_label(definition: Definition) -> str:
    """What a definition is, in its dialect's words."""
    if isinstance(definition, ContinuousQuery):
        return "IoTDB continuous query"
    if isinstance(definition, Stream) and definition.form == "ekuiper":
        return "eKuiper rule"
    return "TDengine stream"


def configured_translator(spec: str | None = None) -> CQTranslator:
    """The translator named by ``spec`` or ``$CQ_TRANSLATOR`` (``module:Class``, a ``CQTranslator``
    subclass importable from the code location's working directory or an installed package), else
    ``CQTranslator()``. The code location and the CLI's Dagster commands both use it, so they agree
    on job, schedule and sensor names."""
    spec = spec if spec is not None else os.environ.get(TRANSLATOR_ENV, "")
    if not spec.strip():
        return CQTranslator()
    module, sep, attr = spec.strip().partition(":")
    if not sep or not module or not attr:
        raise CQError(f"{TRANSLATOR_ENV}={spec!r}: expected module:Class")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise CQError(f"{TRANSLATOR_ENV}={spec!r}: cannot load it: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, CQTranslator)):
        raise CQError(f"{TRANSLATOR_ENV}={spec!r} is not a subclass of dagster_defs.CQTranslator")
    return cls()
