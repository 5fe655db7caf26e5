"""Dagster's own ways of showing a sink's health (docs/dagster/health.md): a freshness policy on
every sink (the daemon turns a late sink red), the ``cq_completeness`` asset check (the firings owed
over a recent horizon against the ledger, evaluated after every batch or stream run without Spark),
and the standard table metadata (``dagster/row_count``, ``dagster/column_schema``,
``dagster/table_name``, ``dagster/uri``) on sinks and sources. The logic is ``cq_engine.health``;
this module only shapes it into Dagster objects. Everything here is per definition and attached
to its spec, so a location of N definitions pays O(N)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta
from functools import partial

import dagster as dg
import pyarrow as pa

from cq_engine.arrivals import arrived_later
from cq_engine.config import Settings
from cq_engine.health import FreshnessWindow, firing_completeness, freshness_window, run_completeness
from cq_engine.model import ContinuousQuery, Definition, PeriodTrigger, TableDecl
from cq_engine.scheduling import batch_lead  # the batch sensor's lead: a firing may run that much early
from cq_engine.storage.delta import DeltaRsStorage
from cq_engine.times import UTC

CHECK_NAME = "cq_completeness"
ROW_COUNT, COLUMN_SCHEMA = "dagster/row_count", "dagster/column_schema"
TABLE_NAME, URI = "dagster/table_name", "dagster/uri"
# At most this many owed firings per definition and evaluation (the newest): a 1 s EVERY over a long
# horizon would otherwise cost every batch run millions of tick comparisons.
MAX_OWED = 1000


def is_ticked(definition: Definition) -> bool:
    """A continuous query or PERIOD stream: fired on a schedule (the others by their data)."""
    return isinstance(definition, ContinuousQuery) or isinstance(definition.trigger, PeriodTrigger)


# -- freshness ----------------------------------------------------------------------------------------
def freshness_policy(definition: Definition, settings: Settings) -> dg.FreshnessPolicy:
    """Fail when the sink's newest materialization is older than its cadence plus the grace (see
    ``cq_engine.health.freshness_window``); warn past the cadence alone when Dagster allows it."""
    window = sink_freshness(definition, settings)
    return dg.FreshnessPolicy.time_window(fail_window=window.fail, warn_window=window.warn)


def sink_freshness(definition: Definition, settings: Settings) -> FreshnessWindow:
    """How often the definition's sink should change, and when it is stale (``freshness_window``)."""
    lead = timedelta(0)
    if is_ticked(definition):
        lead = batch_lead(_every(definition), definition.timeout_policy)
    return freshness_window(definition, grace=settings.freshness_grace_delta, lead=lead)


def _every(definition: Definition) -> timedelta:
    if isinstance(definition, ContinuousQuery):
        return definition.resample.every
    assert isinstance(definition.trigger, PeriodTrigger)
    return definition.trigger.period


# -- completeness -------------------------------------------------------------------------------------
def completeness_check_spec(definition: Definition, key: dg.AssetKey) -> dg.AssetCheckSpec:
    what = "firings its schedule owed" if is_ticked(definition) else "runs that failed and were not redone"
    return dg.AssetCheckSpec(
        CHECK_NAME,
        asset=key,
        description=f"The {what} over the recent horizon (CQ_COMPLETENESS_HORIZON) against the ledger; "
        "metadata `missing_ranges` lists the gaps. A rerun or `cq recalculate` over a gap fills it.",
    )


def completeness_results(
    engine,
    definitions: Iterable[Definition],
    keys: dict[str, dg.AssetKey],
    *,
    now: datetime | None = None,
    runless: bool = False,
) -> list:
    """One ``cq_completeness`` result per definition, from one read of the ledger's recent entries
    (delta-rs, no Spark). ``keys``: definition name -> its sink's asset key. ``runless``: as
    ``AssetCheckEvaluation`` events (a sensor reports them), else a run's ``AssetCheckResult``."""
    definitions = list(definitions)
    if not definitions:
        return []
    now = now or datetime.now(UTC)
    horizon = engine.settings.completeness_horizon_delta
    since = now - horizon
    # A firing of `since` may have started a batch lead (less than its EVERY) before it.
    entries = engine.ledger.entries_since(since - horizon, [d.name for d in definitions])
    by_name: dict[str, list] = {}
    for entry in entries:
        by_name.setdefault(entry.definition, []).append(entry)
    results = []
    logs: dict = {}  # a source's commits, read once for every definition over it (cq_engine.arrivals)
    for d in definitions:
        mine = by_name.get(d.name, [])
        if is_ticked(d):
            ticks = engine.ticks(d.name, now=now)
            report = firing_completeness(
                between=ticks.between,
                range_of=ticks.range_of,
                entries=mine,
                since=since,
                every=ticks.every,
                max_owed=MAX_OWED,
                discard=d.timeout_policy == "DISCARD",
                arrived_later=partial(arrived_later, engine.ctx, d.source, cache=logs) if d.source else None,
            )
        else:
            report = run_completeness(entries=mine, since=since)
        skipped_only = report.passed and report.count("skipped") > 0
        result: dict = dict(
            asset_key=keys[d.name],
            check_name=CHECK_NAME,
            passed=report.passed and not skipped_only,
            severity=dg.AssetCheckSeverity.WARN if skipped_only else dg.AssetCheckSeverity.ERROR,
            description=report.description,
            metadata={
                **{k: v for k, v in report.metadata().items() if k != "missing_ranges" and v is not None},
                "horizon": str(horizon),
                "missing_ranges": dg.MetadataValue.json(report.metadata()["missing_ranges"]),
            },
        )
        results.append(dg.AssetCheckEvaluation(**result) if runless else dg.AssetCheckResult(**result))
    return results


class CheckReporter:
    """Reports the completeness check of each sink a run selected, once per run (Dagster takes one
    result per check and step): as soon as the run says which definitions are done (``report``), and
    at its end for the rest, also when it fails (``around``)."""

    def __init__(self, context, engine, by_key: dict[dg.AssetKey, Definition]):
        selected = {
            k.asset_key for k in (getattr(context, "selected_asset_check_keys", None) or ()) if k.name == CHECK_NAME
        }
        self.context, self.engine = context, engine
        self.pending = {d.name: key for key, d in by_key.items() if key in selected}
        self.definitions = {d.name: d for d in by_key.values()}

    def report(self, names: Iterable[str] | None = None) -> Iterator[dg.AssetCheckResult]:
        """The results of ``names`` (default: every check not reported yet), from one ledger read."""
        wanted = list(self.pending) if names is None else [n for n in names if n in self.pending]
        keys = {n: self.pending.pop(n) for n in wanted}
        if not keys:
            return
        try:
            results = completeness_results(self.engine, [self.definitions[n] for n in keys], keys)
        except Exception as exc:  # the check must never fail the firings it reports on
            self.context.log.warning(f"{CHECK_NAME}: not evaluated for {', '.join(keys)}: {exc}")
            return
        yield from results

    def around(self, run: Callable[[], Iterable]) -> Iterator:
        """What ``run()`` yields (the run's materializations and early check results), then the checks
        not reported yet; when the run fails, those first (its failed firings are what they report),
        then its error."""
        try:
            yield from run()
        except Exception:
            yield from self.report()
            raise
        yield from self.report()


# -- table metadata -----------------------------------------------------------------------------------
_SCHEMAS: dict[str, dg.TableSchema] = {}  # sink uri -> its schema, read once per process


def column_schema(schema: pa.Schema) -> dg.TableSchema:
    return dg.TableSchema(
        columns=[
            dg.TableColumn(name=f.name, type=str(f.type), constraints=dg.TableColumnConstraints(nullable=f.nullable))
            for f in schema
        ]
    )


def declared_schema(decl: TableDecl) -> dg.TableSchema:
    return dg.TableSchema(
        columns=[
            dg.TableColumn(name=c.name, type=c.type.lower(), tags={"cq/tag": "true"} if c.is_tag else {})
            for c in decl.columns
        ]
    )


def table_identity(settings: Settings, table: str) -> dict:
    """``dagster/table_name`` and ``dagster/uri`` of a warehouse table (no I/O)."""
    return {TABLE_NAME: table, URI: settings.table_uri(table)}


def sink_metadata(engine, definition: Definition) -> dict:
    """A materialization's standard metadata: the sink's name, location, rows (the table's, from its
    Delta log's statistics: Dagster's ``dagster/row_count`` means the table's, the firing's are
    ``cq/rows_written``) and schema (read once per process), all through ``cq_engine.storage``."""
    if not definition.sink:
        return {}
    out = table_identity(engine.settings, definition.sink)
    try:
        rows = engine.storage.row_count(definition.sink)
    except Exception:  # a sink not written yet has no rows to count; the next materialization has
        rows = None
    if rows is not None:
        out[ROW_COUNT] = dg.MetadataValue.int(rows)
    uri = engine.settings.table_uri(definition.sink)
    if uri not in _SCHEMAS:
        try:
            _SCHEMAS[uri] = column_schema(engine.storage.schema(definition.sink))
        except Exception:  # a sink not written yet has no schema; the next run reports it
            return out
    out[COLUMN_SCHEMA] = _SCHEMAS[uri]
    return out


def source_metadata(settings: Settings, table: str, decl: TableDecl | None) -> dict:
    """A source table's name, location and schema: its Delta schema when the table exists (read
    without Spark), else the schema its CREATE TABLE declares, else none."""
    out = table_identity(settings, table)
    try:
        store = DeltaRsStorage(warehouse=settings.warehouse)
        if store.exists(table):
            out[COLUMN_SCHEMA] = column_schema(store.schema(table))
            return out
    except Exception:  # unreachable storage at load time: the declared schema still helps
        pass
    if decl is not None:
        out[COLUMN_SCHEMA] = declared_schema(decl)
    return out
