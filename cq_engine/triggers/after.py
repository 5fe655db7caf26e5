"""AFTER INSERT delivery: fire a trigger once per new Delta version of each table its pattern matches,
with exactly the rows that version added (read with pyarrow from the version's added files, no Spark),
and advance a cursor after each version. The Dagster sensor ``<name>_trigger`` calls
:func:`deliver_after`; ``$CQ_HOME/triggers/<name>/delivered.json`` holds the last version handled per
table, rewritten after every version, so a restart resumes right after the last delivered one."""

from __future__ import annotations

import json
import logging
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pyarrow as pa

from cq_engine.config import Settings
from cq_engine.context import EngineContext
from cq_engine.errors import TableError
from cq_engine.model import Catalog, TriggerDef, statement_hash
from cq_engine.statefile import read_state
from cq_engine.storage.log import Commit
from cq_engine.triggers import BatchInfo, FailureStrategy, TriggerError, with_info
from cq_engine.triggers.runtime import (
    fire_one,
    instance,
    matches,
    registration,
    sensor_name,
    state_dir,
    where,
    write_json,
)

log = logging.getLogger("cq_engine.triggers")
MAX_VERSIONS = 100  # per evaluation, so one sensor tick stays well inside Dagster's timeout
# Rows an UPDATE or DELETE writes are rewritten survivors, not inserts.
NOT_INSERTS = ("DELETE", "UPDATE")


@dataclass(frozen=True)
class AfterCursor:
    """Per table (lower-case name), the last version handled, for one registration generation."""

    generation: str
    tables: dict[str, int]

    def to_json(self) -> str:
        return json.dumps({"generation": self.generation, "tables": self.tables}, sort_keys=True)

    @classmethod
    def parse(cls, text: str | None, generation: str) -> AfterCursor | None:
        try:
            raw = json.loads(text) if text else None
            if raw and raw["generation"] == generation:
                return cls(generation, {str(k): int(v) for k, v in raw["tables"].items()})
        except (ValueError, KeyError, TypeError, AttributeError):
            pass  # not ours: another generation or a foreign cursor
        return None


@dataclass(frozen=True)
class Delivery:
    """One AFTER evaluation: the cursor to save, what was fired, what failed."""

    cursor: str
    delivered: tuple[tuple[str, int, int], ...] = ()  # (table, version, rows) fired successfully
    failures: tuple[str, ...] = ()  # OPTIMISTIC failures (the version counts as handled)
    blocked: str | None = None  # a PESSIMISTIC failure: delivery stopped before that version
    reason: str = ""


def progress_path(settings: Settings, trigger: TriggerDef) -> Path:
    return state_dir(settings, trigger.name) / "delivered.json"


def _later(a: AfterCursor | None, b: AfterCursor | None) -> AfterCursor | None:
    """Per table, the further of two cursors of one generation."""
    if a is None or b is None:
        return a or b
    return AfterCursor(a.generation, {t: max(a.tables.get(t, -1), b.tables.get(t, -1)) for t in {*a.tables, *b.tables}})


def deliver_after(
    trigger: TriggerDef, *, ctx: EngineContext, cursor: str | None, now: datetime, max_versions: int = MAX_VERSIONS
) -> Delivery:
    """Fire ``trigger`` once per new Delta version of each matching table with exactly the rows that
    version added, each table's versions in order (tables interleaved by commit time), advancing the
    cursor after each version. The first evaluation of a registration only records where the tables
    are: a trigger sees what is written after it is created."""
    settings = ctx.settings
    live = instance(trigger, settings=settings, now=now)
    generation = live.registration.generation
    progress = progress_path(settings, trigger)
    known = _later(
        AfterCursor.parse(cursor, generation),
        AfterCursor.parse(read_state(progress, what="trigger progress"), generation),
    )
    declared = [d.name for d in ctx.catalog.tables if matches(trigger.pattern, d.name)]
    if declared:  # created as a continuous query's declared source is
        ctx.ensure_tables(*declared)
    tables = [t for t in ctx.tables() if matches(trigger.pattern, t)]
    storage = ctx.storage
    if known is None:
        start = {t.lower(): storage.latest_version(t) for t in tables}
        known = AfterCursor(generation, {t: v for t, v in start.items() if v is not None})
        write_json(progress, json.loads(known.to_json()))
        watched = ", ".join(f"{t}@v{v}" for t, v in sorted(known.tables.items())) or "no table yet"
        return Delivery(
            cursor=known.to_json(), reason=f"{trigger.name}: created; watching {trigger.pattern} from {watched}"
        )
    positions = dict(known.tables)
    queues: dict[str, deque[Commit]] = {}
    for table in tables:
        after = positions.get(table.lower(), -1)
        latest = storage.latest_version(table, known=after if after >= 0 else None)
        if latest is not None and latest > after:
            until = min(latest, after + max_versions)
            queues[table] = deque(storage.read_commits(table, after=after, until=until, time_column=""))
    delivered, failures, blocked = [], [], None
    schemas: dict[str, pa.Schema] = {}  # commit_rows' cache of each table's schema
    for _ in range(max_versions):
        heads = [(q[0].timestamp, t.lower(), t) for t, q in queues.items() if q]
        if not heads:
            break
        table = min(heads)[2]
        commit = queues[table].popleft()
        rows = None if commit.operation in NOT_INSERTS else _added_rows(ctx, table, commit, schemas)
        if rows is not None and rows.num_rows:
            info = BatchInfo(trigger.name, table, "after", commit.version)
            problem = fire_one(live, with_info(rows, info))
            if problem is not None:
                message = (
                    f"{where(trigger)} failed on version {commit.version} of table {table!r} "
                    f"({rows.num_rows} rows): {problem}"
                )
                if live.strategy is FailureStrategy.PESSIMISTIC:
                    blocked = f"{message}; PESSIMISTIC: delivery stops here and retries this version next time"
                    break
                log.warning("%s; OPTIMISTIC, so delivery goes on", message)
                failures.append(message)
            else:
                delivered.append((table, commit.version, rows.num_rows))
        positions[table.lower()] = commit.version
        write_json(progress, {"generation": generation, "tables": positions})
    cursor_out = AfterCursor(generation, positions).to_json()
    return Delivery(
        cursor=cursor_out,
        delivered=tuple(delivered),
        failures=tuple(failures),
        blocked=blocked,
        reason=blocked or _summary(trigger, delivered, failures),
    )


def _summary(trigger: TriggerDef, delivered: list, failures: list) -> str:
    if not delivered and not failures:
        return f"{trigger.name}: no new rows in {trigger.pattern}"
    by_table: dict[str, list] = {}
    for table, version, rows in delivered:
        by_table.setdefault(table, []).append((version, rows))
    parts = [
        f"{t} v{v[0][0]}..v{v[-1][0]} ({len(v)} versions, {sum(r for _, r in v)} rows)" for t, v in by_table.items()
    ]
    failed = f"; {len(failures)} failed (OPTIMISTIC, logged)" if failures else ""
    return f"{trigger.name}: fired on {', '.join(parts) or 'nothing'}{failed}"


def _added_rows(ctx: EngineContext, table: str, commit: Commit, schemas: dict[str, pa.Schema]) -> pa.Table:
    """The rows of the files ``commit`` added, in the table's current schema (``storage.commit_rows``);
    a table whose versions cannot be read file by file is a ``TriggerError``."""
    try:
        return ctx.storage.commit_rows(table, commit, schemas=schemas)
    except TableError as exc:
        raise TriggerError(f"{exc} for AFTER INSERT triggers") from None


def show(catalog: Catalog, *, ctx: EngineContext) -> list[dict[str, str]]:
    """SHOW TRIGGERS: every defined trigger, and the registered ones whose statement is gone (DROPPING:
    ``cq drop NAME`` calls their ``on_drop``)."""
    settings = ctx.settings
    tables = ctx.tables()
    rows = []
    defined = {t.name.lower() for t in catalog.triggers}
    root = Path(settings.home) / "triggers"
    gone = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name not in defined) if root.is_dir() else []
    orphans = [r.trigger() for r in (registration(settings, n) for n in gone) if r is not None]
    for t in list(catalog.triggers) + orphans:
        reg = registration(settings, t.name)
        if t.name.lower() not in defined:
            state = "DROPPING"
        else:
            state = "ACTIVE" if reg is not None and reg.hash == statement_hash(t) else "INACTIVE"
        done = AfterCursor.parse(_read_text(progress_path(settings, t)), reg.generation) if reg else None
        watched = [
            f"{x}@v{done.tables[x.lower()]}" if done and x.lower() in done.tables else x
            for x in tables
            if matches(t.pattern, x)
        ]
        rows.append(
            {
                "name": t.name,
                "event": f"{t.event.upper()}_INSERT",
                "type": "STATEFUL" if t.stateful else "STATELESS",
                "state": state,
                "pattern": t.pattern,
                "class": t.target,
                "runs in": "ingest" if t.event == "before" else f"sensor {sensor_name(t)}",
                "tables": ", ".join(watched) or "-",
                "location": str(t.location),
            }
        )
    return rows


def _read_text(path: Path) -> str | None:
    return read_state(path, what="trigger progress")
