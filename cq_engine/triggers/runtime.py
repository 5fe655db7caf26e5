"""Running triggers: patterns, loading ``'module:Class'``, one instance per trigger and process,
BEFORE INSERT dispatch (``ingest``), and what ``cq triggers`` / ``cq drop`` show and do. AFTER INSERT
delivery is ``trigger_after``.

A trigger's registration lives in ``$CQ_HOME/triggers/<name>/registration.json``, written by the first
process that creates an instance of the statement; its ``generation`` changes when the statement does."""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import logging
import os
import re
import shutil
import sys
import threading
import uuid
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from cq_engine.config import Settings
from cq_engine.errors import CQError
from cq_engine.model import Catalog, SourceLocation, TriggerDef, statement_hash
from cq_engine.names import check_name, inside
from cq_engine.statefile import read_json_state, write_atomic
from cq_engine.times import iso
from cq_engine.triggers import BatchInfo, FailureStrategy, Trigger, TriggerAttributes, TriggerError, with_info

if TYPE_CHECKING:  # `cq validate` looks for trigger modules without loading pyarrow
    import pyarrow as pa

log = logging.getLogger("cq_engine.triggers")
_T = TypeVar("_T")


# -- patterns and classes --------------------------------------------------------------------------


def matches(pattern: str, table: str) -> bool:
    """``*`` matches any run of characters; names compare case-insensitively, as tables do."""
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, table, flags=re.IGNORECASE) is not None


def matching(triggers: Iterable[TriggerDef], *, table: str, event: str) -> list[TriggerDef]:
    """The ``event`` triggers whose pattern matches ``table``, by name (IoTDB promises no order)."""
    return sorted((t for t in triggers if t.event == event and matches(t.pattern, table)), key=lambda t: t.name.lower())


def where(trigger: TriggerDef) -> str:
    return f"{trigger.location}: trigger {trigger.name!r}"


def trigger_dirs(settings: Settings) -> list[Path]:
    """Where trigger modules are looked for besides installed packages: ``CQ_TRIGGER_PATH``
    (``os.pathsep``-separated), by default the project directory (the parent of ``CQ_SQL_DIR``)."""
    if settings.trigger_path:
        return [Path(p).resolve() for p in settings.trigger_path.split(os.pathsep) if p]
    return [Path(settings.sql_dir).resolve().parent]


def find_module(trigger: TriggerDef, *, settings: Settings) -> str:
    """Where the trigger's top-level module is (a file or package directory), found without importing
    or running anything; a ``TriggerError`` if neither the trigger path nor the installed packages
    hold it. Python's implicit current-directory entry (``''``) is never searched."""
    top = trigger.target.partition(":")[0].split(".")[0]
    dirs = [str(d) for d in trigger_dirs(settings)]
    installed = [p for p in sys.path if p not in ("", ".")]
    for path in (dirs, installed):
        try:
            spec = importlib.machinery.PathFinder.find_spec(top, path)
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            return spec.origin or next(iter(spec.submodule_search_locations or []), top)
    if top in sys.modules and getattr(sys.modules[top], "__spec__", None) is not None:
        return "(already imported)"
    raise TriggerError(
        f"{where(trigger)}: no module {top!r} in the trigger path ({os.pathsep.join(dirs)}; "
        "set CQ_TRIGGER_PATH) or the installed packages"
    )


def load_class(trigger: TriggerDef, *, settings: Settings) -> type[Trigger]:
    """Import ``module:Class`` (this runs the module's code: only where the trigger runs, never in
    ``cq validate``) from the trigger path or the installed packages."""
    module_name, _, class_name = trigger.target.partition(":")
    find_module(trigger, settings=settings)
    for d in trigger_dirs(settings):
        if str(d) not in sys.path and (
            (d / module_name.split(".")[0]).is_dir() or (d / f"{module_name.split('.')[0]}.py").is_file()
        ):
            sys.path.append(str(d))
            break
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise TriggerError(f"{where(trigger)}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type) or not issubclass(cls, Trigger):
        what = "no class" if cls is None else "a class that is not a cq_engine.triggers.Trigger:"
        raise TriggerError(f"{where(trigger)}: module {module_name!r} has {what} {class_name!r}")
    return cls


def attributes_of(trigger: TriggerDef, *, settings: Settings) -> TriggerAttributes:
    return TriggerAttributes(trigger.attributes, name=trigger.name, warehouse=settings.warehouse)


def _call(trigger: TriggerDef, method: str, fn: Callable[[], _T]) -> _T:
    """Run user code; its exceptions become a ``TriggerError`` naming the trigger and the method."""
    try:
        return fn()
    except TriggerError as exc:
        raise TriggerError(f"{trigger.location}: {exc}") from None
    except Exception as exc:
        raise TriggerError(f"{where(trigger)}: {method} failed: {type(exc).__name__}: {exc}") from None


def check_trigger(trigger: TriggerDef, *, settings: Settings) -> None:
    """``cq validate --check-triggers``: import the class and ``validate`` the attributes (no instance
    kept). This runs user code, so plain ``cq validate`` only looks for the module (``find_module``)."""
    cls = load_class(trigger, settings=settings)
    instance = _call(trigger, "creating the instance", cls)
    _call(trigger, "validate()", lambda: instance.validate(attributes_of(trigger, settings=settings)))


# -- registration --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Registration:
    """A trigger as first created: what ``restore`` and ``cq drop`` need once the file is gone."""

    name: str
    hash: str
    generation: str
    created: str
    sql: str
    event: Literal["before", "after"]
    stateful: bool
    pattern: str
    target: str
    attributes: list
    file: str
    line: int
    col: int

    def trigger(self) -> TriggerDef:
        return TriggerDef(
            name=self.name,
            stateful=self.stateful,
            event=self.event,
            pattern=self.pattern,
            target=self.target,
            attributes=tuple(tuple(a) for a in self.attributes),
            location=SourceLocation(self.file, self.line, self.col),
            sql=self.sql,
        )


def state_dir(settings: Settings, name: str) -> Path:
    return inside(Path(settings.home) / "triggers", check_name(name.lower(), what="trigger"))


def write_json(path: Path, value: dict) -> None:
    """Atomic replace: a reader (or a crash) never sees half a file."""
    write_atomic(path, json.dumps(value, indent=1))


def registration(settings: Settings, name: str) -> Registration | None:
    raw = read_json_state(state_dir(settings, name) / "registration.json", what="trigger registration")
    try:
        return Registration(**raw) if raw else None
    except TypeError:
        return None


def _register(trigger: TriggerDef, *, settings: Settings, now: datetime) -> tuple[Registration, bool]:
    """The trigger's registration and whether an earlier process made it (a restart)."""
    digest = statement_hash(trigger)
    known = registration(settings, trigger.name)
    if known is not None and known.hash == digest:
        return known, True
    loc = trigger.location
    reg = Registration(
        name=trigger.name,
        hash=digest,
        generation=uuid.uuid4().hex,
        created=iso(now),
        sql=trigger.sql,
        event=trigger.event,
        stateful=trigger.stateful,
        pattern=trigger.pattern,
        target=trigger.target,
        attributes=[list(a) for a in trigger.attributes],
        file=loc.file,
        line=loc.line,
        col=loc.col,
    )
    write_json(state_dir(settings, trigger.name) / "registration.json", asdict(reg))
    return reg, False


# -- instances -----------------------------------------------------------------------------------


@dataclass
class Live:
    """A trigger's instance in this process."""

    trigger: TriggerDef
    instance: Trigger
    strategy: FailureStrategy
    registration: Registration
    restored: bool  # restore() was called: an earlier process had registered the trigger
    lock: threading.Lock = field(default_factory=threading.Lock)


_LIVE: dict[tuple[str, str, str], Live] = {}
_LIVE_LOCK = threading.RLock()  # re-entrant: on_create may itself ingest


def instance(trigger: TriggerDef, *, settings: Settings, now: datetime) -> Live:
    """This process's instance of ``trigger``, created on first use: ``validate``, ``on_create``, and
    ``restore`` for a STATEFUL trigger that an earlier process registered."""
    key = (str(Path(settings.home).resolve()), trigger.name.lower(), statement_hash(trigger))
    with _LIVE_LOCK:
        if key in _LIVE:
            return _LIVE[key]
        cls = load_class(trigger, settings=settings)
        attrs = attributes_of(trigger, settings=settings)
        obj = _call(trigger, "creating the instance", cls)
        _call(trigger, "validate()", lambda: obj.validate(attrs))
        _call(trigger, "on_create()", lambda: obj.on_create(attrs))
        reg, existed = _register(trigger, settings=settings, now=now)
        restored = trigger.stateful and existed
        if restored:
            _call(trigger, "restore()", obj.restore)
        strategy = obj.failure_strategy
        if isinstance(strategy, str) and strategy.upper() in FailureStrategy.__members__:
            strategy = FailureStrategy[strategy.upper()]
        if not isinstance(strategy, FailureStrategy):
            raise TriggerError(
                f"{where(trigger)}: failure_strategy must be FailureStrategy.OPTIMISTIC or "
                f"PESSIMISTIC, got {strategy!r}"
            )
        _LIVE[key] = Live(trigger, obj, strategy, reg, restored)
        return _LIVE[key]


def forget_instances(name: str | None = None) -> None:
    """Drop this process's instances (of ``name``, or all): what a process restart does to them."""
    with _LIVE_LOCK:
        for key in [k for k in _LIVE if name is None or k[1] == name.lower()]:
            del _LIVE[key]


def fire_one(live: Live, batch: pa.Table) -> str | None:
    """None on success, else what went wrong. A STATEFUL instance fires one batch at a time."""
    try:
        with live.lock if live.trigger.stateful else nullcontext():
            result = live.instance.fire(batch)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    if isinstance(result, bool) or type(result).__name__ == "bool_":  # numpy's bool too
        return None if result else "fire() returned False"
    return f"fire() must return True or False, got {result!r}"


# -- BEFORE INSERT ---------------------------------------------------------------------------------


def fire_before(
    triggers: Iterable[TriggerDef], *, table: str, batch: pa.Table, settings: Settings, now: datetime
) -> tuple[str, ...]:
    """Fire the BEFORE INSERT triggers matching ``table`` on the rows about to be written. Returns the
    OPTIMISTIC failures (logged); a PESSIMISTIC failure raises ``TriggerError`` and no later trigger fires."""
    failures = []
    for trigger in matching(triggers, table=table, event="before"):
        live = instance(trigger, settings=settings, now=now)
        problem = fire_one(live, with_info(batch, BatchInfo(trigger.name, table, "before", None)))
        if problem is None:
            continue
        message = f"{where(trigger)} failed on {batch.num_rows} rows for table {table!r}: {problem}"
        if live.strategy is FailureStrategy.PESSIMISTIC:
            raise TriggerError(f"{message}; it is PESSIMISTIC, so nothing was written")
        log.warning("%s; OPTIMISTIC, so the rows are written", message)
        failures.append(message)
    return tuple(failures)


# -- cq triggers, cq drop ----------------------------------------------------------------------------


def sensor_name(trigger: TriggerDef) -> str:
    return f"{trigger.name}_trigger"


def drop(name: str, *, catalog: Catalog, settings: Settings) -> dict | None:
    """``cq drop NAME`` for a trigger whose statement was removed: a fresh instance gets ``on_create``
    then ``on_drop``, and the registration goes. None when ``name`` was never a registered trigger."""
    defined = next((t for t in catalog.triggers if t.name.lower() == name.lower()), None)
    if defined is not None:
        raise CQError(
            f"trigger {defined.name!r} is defined at {defined.location}: remove that statement (or its "
            f"file), then `cq drop {defined.name}` calls its on_drop()"
        )
    reg = registration(settings, name)
    if reg is None:
        return None
    if any(err.file == reg.file for err in catalog.errors):
        raise CQError(
            f"trigger {reg.name!r} was defined in {reg.file}, which does not load now: fix that file "
            "first (the trigger may still be in it)"
        )
    trigger = reg.trigger()
    path = state_dir(settings, name)
    try:
        cls = load_class(trigger, settings=settings)
        obj = _call(trigger, "creating the instance", cls)
        _call(trigger, "on_create()", lambda: obj.on_create(attributes_of(trigger, settings=settings)))
        _call(trigger, "on_drop()", obj.on_drop)
    except TriggerError as exc:
        raise TriggerError(
            f"{exc}; nothing was dropped (delete {path} to forget the trigger without its on_drop())"
        ) from None
    shutil.rmtree(path, ignore_errors=True)
    forget_instances(name)
    return {"dropped": reg.name, "trigger": True, "on_drop": "called", "state_removed": str(path)}
