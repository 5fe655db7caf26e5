"""Housekeeping for long-running deployments (``cq maintain``, the ``cq_maintenance`` Dagster schedule):
the ledger's retention, then ``storage.maintain`` of every engine state table under ``_cq/`` and every
sink (and, if asked, every declared source). Idempotent: a second run right after the first commits
nothing. Safe beside running firings: every step is a Delta commit under Delta's conflict rules, or a
delete of files past their retention (docs/operations/housekeeping.md, ARCHITECTURE.md §3)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

from cq_engine.context import EngineContext
from cq_engine.storage.ledger import STATE_NAME
from cq_engine.storage.maintain import Retention, TableReport

# The engine state tables' log is kept at most this long: the engine reads them at their latest version
# only (no reader travels back in them), and a delta-rs open lists every log file kept, so a month of
# a commit per firing would make every ledger read list tens of thousands of files.
STATE_LOG_RETENTION = timedelta(days=1)
# Tables maintained at once.
MAINTAIN_THREADS = 4


def maintain(ctx: EngineContext, *, now: datetime, sources: bool = False) -> list[TableReport]:
    """Maintain the engine's tables at ``now``; one report per table, a failed table's with ``error``
    set (the others are still maintained)."""
    ledger_keep, log_keep, file_keep = ctx.settings.retention
    # The completeness check reads the ledger that far back: never keep less.
    ledger_keep = max(ledger_keep, ctx.settings.completeness_horizon_delta)
    retention = Retention(log=log_keep, files=file_keep)
    state_retention = Retention(log=min(log_keep, STATE_LOG_RETENTION), files=file_keep)

    def guarded(name: str, step: Callable[[], TableReport]) -> TableReport:
        try:
            return step()
        except Exception as exc:  # one table's failure (a damaged log, a lost object store) is reported
            return TableReport(name, error=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}")

    def trim_ledger() -> TableReport:
        dropped = ctx.ledger.drop_before(now - ledger_keep)
        report = ctx.storage.maintain_state(STATE_NAME, retention=state_retention)
        report.dropped_entries = dropped
        return report

    steps: list[tuple[str, Callable[[], TableReport]]] = [
        (f"_cq/{name}", trim_ledger if name == STATE_NAME else _state(ctx, name, state_retention))
        for name in ctx.storage.state_names()
    ]
    tables = {d.sink for d in ctx.catalog.definitions if d.sink}
    if sources:
        tables |= {t.name for t in ctx.catalog.tables}
    for table in sorted(tables, key=str.lower):
        if ctx.storage.exists(table):
            steps.append((table, functools.partial(ctx.storage.maintain, table, retention=retention)))
    # Tables are independent and each step mostly waits (object-store requests, Spark jobs), so a few
    # at once: one by one, the soak's 200-odd tables on S3 beside a busy stack took over 10 minutes.
    with ThreadPoolExecutor(max_workers=MAINTAIN_THREADS, thread_name_prefix="cq-maintain") as pool:
        return list(pool.map(lambda step: guarded(*step), steps))


def _state(ctx: EngineContext, name: str, retention: Retention) -> Callable[[], TableReport]:
    return lambda: ctx.storage.maintain_state(name, retention=retention)
