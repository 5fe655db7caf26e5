"""What a window-triggered stream's DAG run does: one sensor evaluation of the stream, as ``cq tick``
does it, and the runs it requests, each window computed once.

- The cursor is ``cq tick``'s (``CQ_HOME/ticks/<name>.json``, ``cli.streams.cursor_path``): the plan
  comes from ``evaluate_stream`` on it, the works run through ``Engine.run_stream``, and the new cursor
  is written only after they committed. Airflow's workers share ``CQ_HOME`` as they share the
  catalog's last good versions.
- A plan with works is written next to the cursor (``<name>.plan.json``) before they run, with the
  cursor it came from. A run that failed, or a process killed, after some works committed resumes
  that plan (not a new one over newer commits): works the ledger holds as succeeded (same kind,
  range and trigger version, ``rounds.done_works``) are skipped, the others run, then the cursor is
  saved and the plan removed. A plan whose base is not the current cursor any more (or made for
  another version of the statement) is dropped.
- Evaluations of one stream hold a lock on the cursor (a second run waits, then plans from the
  cursor the first saved: nothing twice); the DAG runs one at a time (``max_active_runs=1``) anyway.
Spark and the engine are imported when the task runs, not when Airflow parses the DAG file."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cq_engine.statefile import read_json_state, write_atomic
from cq_engine.times import iso

if TYPE_CHECKING:
    from cq_engine.engine import Engine
    from cq_engine.model import Stream

LOG = logging.getLogger(__name__)


def run_stream_tick(*, name: str, outlet_events: Any = None, **_: Any) -> dict:
    """The DAG's task: tick ``name`` now; the result (XCom and the sink's asset event extra) says
    which works ran and what they wrote (:func:`tick_stream`)."""
    from cq_engine.catalog import settings_catalog
    from cq_engine.config import load_settings
    from cq_engine.engine import Engine

    settings = load_settings()
    engine = Engine(settings=settings, catalog=settings_catalog(settings))
    stream = engine.stream(name)
    summary = tick_stream(engine, stream, now=datetime.now(UTC))
    if outlet_events is not None and stream.sink:
        from .assets import table_asset

        outlet_events[table_asset(stream.sink, settings=settings)].extra = summary
    return summary


def plan_path(cursor: Path) -> Path:
    """Where the plan being run is kept, beside the cursor ``cursor``."""
    return cursor.with_name(f"{cursor.stem}.plan.json")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold ``<path>.lock``: one evaluation of a stream at a time on this CQ_HOME."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def tick_stream(engine: Engine, stream: Stream, *, now: datetime) -> dict:
    """One evaluation of ``stream`` at ``now`` from its cursor and the runs it requests (or the plan a
    failed evaluation left, resumed). Returns ``stream``, ``sink``, ``trigger_table``,
    ``trigger_version`` (the version planned up to), ``reason``, ``works`` (per work run: ``kind``,
    ``range_start``, ``range_end``, ``version``, ``rows_written``, ``sink_version``), ``skipped``
    (works the ledger already held), ``rows_written``, ``sink_version`` (the last, or None),
    ``ignored`` (what the plan and the runs left out, and why), ``resumed`` and ``seconds``."""
    from cq_engine.cli.streams import cursor_path, read_cursor
    from cq_engine.model import statement_hash
    from cq_engine.notify.outbox import gate
    from cq_engine.streams.rounds import done_works, work_identity
    from cq_engine.streams.sensor import evaluate_stream
    from cq_engine.streams.timing import StreamCursor, StreamWork

    clock = time.perf_counter()
    summary: dict[str, Any] = {
        "stream": stream.name,
        "sink": stream.sink,
        "trigger_table": stream.trigger_source,
        "works": [],
        "skipped": 0,
        "rows_written": 0,
        "sink_version": None,
        "ignored": [],
        "resumed": False,
    }
    paused = gate(engine.ctx, stream)
    if paused:  # ON_FAILURE PAUSE: the cursor stays until the pending notifications are delivered
        return {**summary, "trigger_version": None, "reason": paused, "seconds": 0.0}
    path = cursor_path(engine.settings, stream.name)
    pending_path = plan_path(path)
    with locked(path):
        cursor = read_cursor(path)
        pending = read_json_state(pending_path, what="stream plan")
        if (
            pending is not None
            and pending.get("base") == cursor
            and StreamCursor.from_json(str(pending["cursor"])).definition == statement_hash(stream)
        ):
            works = [StreamWork.from_json(w) for w in pending["works"]]
            new_cursor, reason = str(pending["cursor"]), f"resumed: {pending['reason']}"
            summary["resumed"] = True
        else:
            plan = evaluate_stream(engine.ctx, stream, cursor=cursor, now=now)
            works, new_cursor, reason = list(plan.works), plan.cursor.to_json(), plan.reason
            summary["ignored"] += [item.text for item in plan.ignored]
            if works:  # kept until the cursor is saved: a failed run resumes this plan
                record = {"base": cursor, "cursor": new_cursor, "reason": reason, "works": [w.to_json() for w in works]}
                write_atomic(pending_path, json.dumps(record))
        summary["trigger_version"] = StreamCursor.from_json(new_cursor).version
        LOG.info("%s: %s", stream.name, reason)
        done = done_works(engine.ledger.entries(stream.name), stream) if summary["resumed"] else set()
        tz = engine.settings.timezone
        for work in works:
            if work_identity(stream, work, tz) in done:
                LOG.info(
                    "%s: %s run at version %s already committed (ledger): skipped", stream.name, work.kind, work.version
                )
                summary["skipped"] += 1
                continue
            r = engine.run_stream(stream.name, work)
            LOG.info(
                "%s: %s run over [%s, %s) at version %s: %s rows -> %s v%s",
                stream.name,
                work.kind,
                iso(r.time_range[0]),
                iso(r.time_range[1]),
                work.version,
                r.rows_written,
                stream.sink,
                r.sink_version,
            )
            summary["ignored"] += list(r.ignored)
            summary["works"].append(
                {
                    "kind": work.kind,
                    "range_start": iso(r.time_range[0]),
                    "range_end": iso(r.time_range[1]),
                    "version": work.version,
                    "rows_written": r.rows_written,
                    "sink_version": r.sink_version,
                }
            )
            summary["rows_written"] += r.rows_written
            summary["sink_version"] = r.sink_version
        # Saved once the works committed, so a failed run is planned (or resumed) again next time.
        write_atomic(path, new_cursor)
        pending_path.unlink(missing_ok=True)
    return {**summary, "reason": reason, "seconds": round(time.perf_counter() - clock, 3)}
