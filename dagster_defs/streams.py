"""Window-triggered streams and eKuiper rules: one sensor ``cq_streams`` for all of them.

- Each evaluation plans every running stream from its trigger table's new Delta commits, Spark-free
  (``evaluate_stream``); the cursor is a versioned map stream -> ``StreamCursor`` and run state
  (``cq_engine.streams.rounds``).
- Live works are computed in the sensor's own process through the Spark Connect server when one
  serves (no process start on the latency path), least recently served streams first, within a time
  budget (``CQ_STREAM_BUDGET``); each committed work is a runless materialization of the stream's sink.
  A stream the budget did not reach keeps its cursor, so its next plan covers more commits in one work.
- What the sensor does not compute (history chunks, a stream that failed, everything without a
  Connect server) goes into one run per evaluation of ``cq_streams_job`` (a subsettable multi-asset
  over the sinks, the works in its run config); a stream is never in two runs at once nor in the
  sensor while its run is in flight; a failed stream is retried alone after a back-off.
- ``<name>_ticks`` is the stream's on/off switch (``cq stop/start``); its cursor carries what
  ``cq start --ignore-untreated`` computed, which the sensor adopts.
- A journal under ``CQ_HOME`` makes an evaluation whose cursor Dagster lost (daemon killed after
  the sinks were committed) count: the next evaluation adopts it instead of computing again.
"""

import contextlib
import fcntl
import json
import logging
import time
from collections.abc import Collection, Iterator
from datetime import datetime

import dagster as dg

from cq_engine.engine import Engine
from cq_engine.errors import CQError
from cq_engine.model import Stream
from cq_engine.notify.outbox import gate, paused_by_notify
from cq_engine.recovery import SparkRecovery, server_coming_back
from cq_engine.scheduling import env_seconds
from cq_engine.spark import server_status
from cq_engine.streams import rounds as r
from cq_engine.streams.sensor import TriggerLogs, evaluate_stream
from cq_engine.streams.timing import StreamWork, work_range
from cq_engine.times import UTC, iso

from . import health
from .batch import MAX_RUNTIME_SECONDS, build_shared_asset, names_summary, switch_states
from .batch_run import keyed_runs
from .builders import IN_FLIGHT, materialization

LOG = logging.getLogger(__name__)
INTERVAL_SECONDS = 1
ADOPT = "adopt"  # key of a switch cursor carrying a StreamCursor for the sensor to take
LOCK_WAIT_SECONDS = 5  # an evaluation still running elsewhere (a hung work): skip rather than pile up


CHECK_EVERY_SECONDS = 60.0  # a stream computed in the sensor: its completeness check at most this often
_checked: dict[str, float] = {}  # stream -> when this process last reported its check (time.time())
SAY_EVERY_SECONDS = 60.0  # a stream that cannot be planned (its table missing) is said this often
_said: dict[tuple[str, str], float] = {}  # (stream, message) -> when it was last said, in this process


def _say_again(name: str, message: str) -> bool:
    """Whether to log (and show on the sink) this planning error now: new, or last said a minute ago."""
    now = time.monotonic()
    if now - _said.get((name, message), -SAY_EVERY_SECONDS) < SAY_EVERY_SECONDS:
        return False
    _said[(name, message)] = now
    return True


def budget_seconds() -> float:
    """Seconds of Spark work one evaluation may spend in the sensor (``CQ_STREAM_BUDGET``, default
    20; Dagster's sensor gRPC timeout is 60 s by default)."""
    return env_seconds("CQ_STREAM_BUDGET", 20)


def computes_inline(engine: Engine) -> bool:
    """The sensor computes live works itself when a Spark Connect server serves the code server
    (never a JVM inside it)."""
    return bool(engine.settings.spark_remote) or server_status(engine.settings).running


def stream_materialization(
    stream: Stream, result, work: StreamWork, sink_key, *, engine, **extra
) -> dg.AssetMaterialization:
    metadata = dict(materialization(stream, result, ignored=work.ignored, engine=engine).metadata or {})
    return dg.AssetMaterialization(asset_key=sink_key, metadata={**metadata, **extra})


@contextlib.contextmanager
def exclusive(path) -> Iterator[bool]:
    """One evaluation at a time per location (a daemon restarted while its predecessor's evaluation
    still runs in the code server must not compute the same works)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "w") as handle:
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    yield False
                    return
                time.sleep(0.2)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# -- the run ----------------------------------------------------------------------------------------
def run_streams(context, engine: Engine, works: dict[str, list[str]], *, sink_keys: dict, retry: bool) -> Iterator:
    """Execute each stream's works in order (rounds, ``rounds.run_rounds``); a failing work stops its
    stream but not the others; a lost Spark Connect session is opened again (``SparkRecovery``), and
    the streams whose server did not answer again in time are handed back (run tag ``cq/left_out``). One materialization per committed work; at the end a failure naming
    the streams that failed (run tag ``cq/failed``). A retried run skips works the ledger holds."""
    streams = {n: engine.stream(n) for n in works}
    pending = {n: [StreamWork.from_json(w) for w in ws] for n, ws in works.items()}
    if retry:
        entries = engine.ledger.entries()
        tz = engine.settings.timezone
        for name, ws in pending.items():
            done = r.done_works(entries, streams[name])
            kept = [w for w in ws if r.work_identity(streams[name], w, tz) not in done]
            if len(kept) < len(ws):
                context.log.info(f"{name}: {len(ws) - len(kept)} work(s) already done (ledger); skipped")
            pending[name] = kept
    failures: list[str] = []
    for name, work, outcome in r.run_rounds(engine.ctx, streams, pending, recover=SparkRecovery(engine.ctx)):
        if isinstance(outcome, Exception):
            failures.append(name)
            context.log.error(f"{name}: {work.kind} v{work.version} failed: {outcome}")
            continue
        context.log.info(f"{name}: {work.kind} v{work.version} committed: {outcome.rows_written} rows")
        yield stream_materialization(streams[name], outcome, work, sink_keys[name], engine=engine)
    handed = sorted(n for n, ws in pending.items() if ws)
    if handed:  # its Spark Connect server did not answer again in time: not a failure of the streams
        context.log.warning(
            f"{len(handed)} stream(s) handed back (their Spark Connect server did not answer again in time; "
            f"the sensor requests their works once it does): {', '.join(handed)}"
        )
        context.instance.add_run_tags(context.run_id, {"cq/left_out": ",".join(handed)})
    if failures:
        context.instance.add_run_tags(context.run_id, {"cq/failed": ",".join(sorted(failures))})
        raise dg.Failure(
            description=f"{len(failures)} stream(s) failed (retried from there; the others are committed): "
            + ", ".join(sorted(failures))
        )


def build_streams_asset(streams: list[Stream], translator) -> tuple[dg.AssetsDefinition, dict]:
    """The multi-asset of the window-triggered streams' sinks: rounds of stream works."""
    return build_shared_asset(
        streams,
        translator,
        name=translator.get_streams_op_name(),
        description="The works of the location's window-triggered streams and eKuiper rules that their "
        "sensor hands to a run (run config `works`), or one stream's run or recalculation (its sink selected).",
        many="works",
        run_many=lambda context, engine, works, *, sink_keys, retry, checks, config: run_streams(
            context, engine, works, sink_keys=sink_keys, retry=retry
        ),
    )


# -- the sensor -------------------------------------------------------------------------------------
def build_streams_sensor(
    streams: list[Stream],
    job,
    translator,
    engine: Engine,
    sink_keys: dict,
    *,
    default_status: dg.DefaultSensorStatus,
    keep: Collection[str] = (),
) -> dg.SensorDefinition:
    """``keep``: streams a load error took out of the location; their cursors stay in this sensor's,
    so they resume where they stopped once they load again (never re-created, history ignored)."""
    by_name = {s.name: s for s in streams}
    switches = {translator.get_sensor_name(s): s.name for s in streams}
    op, sensor_name = translator.get_streams_op_name(), translator.get_streams_sensor_name()
    tz = engine.settings.timezone
    cost = r.CallCost()  # this process's calls so far, so a call fits the budget

    def evaluate(context: dg.SensorEvaluationContext):
        location = context.code_location_origin.location_name if context.code_location_origin else "local"
        journal_path = r.journal_path(engine.settings.home, sensor_name, f"{location}:{engine.settings.sql_dir}")
        with exclusive(journal_path) as mine:
            if not mine:
                return dg.SkipReason("the previous evaluation is still running (its process outlived a daemon)")
            return _evaluate(context, journal_path)

    def _evaluate(context, journal_path):
        now = datetime.now(UTC)
        cursor = r.load_cursor(context.cursor, sensor=sensor_name)
        events: list[dg.AssetMaterialization | dg.AssetObservation] = []
        lost = r.adopt(journal_path, cursor)
        if lost is not None:  # the daemon lost the previous evaluation's cursor: its work counts
            cursor = r.load_cursor(lost.cursor, sensor=sensor_name)
            context.log.warning(
                f"adopted the journal of an evaluation whose cursor was lost ({len(lost.events)} works)"
            )
            events += [
                dg.AssetMaterialization(asset_key=sink_keys[n], metadata={**m, "cq/recovered": "journal"})
                for n, m in lost.events
                if n in sink_keys
            ]
        states = {n: cursor.streams.get(n, r.StreamState()) for n in by_name}
        for name in r.unfinished(journal_path, cursor) if lost is None else []:
            if name in states:  # the evaluation computing it never returned: a run takes it over
                states[name].attempt = max(states[name].attempt, 1)
                context.log.warning(f"{name}: the evaluation computing it did not finish; a run takes over")
        switch = switch_states(context, switches)
        status, failed = _runs(context, states)
        if lost is not None:  # the run it requested was lost with it unless Dagster created it: ask again
            for s in states.values():
                if s.key and s.key not in status:
                    s.key, s.since = None, 0.0
        own = context.instance.get_run_records(dg.RunsFilter(tags={"cq/name": list(by_name)}, statuses=IN_FLIGHT))
        busy = {rec.dagster_run.tags["cq/name"] for rec in own if "cq/stream_batch" not in rec.dagster_run.tags}
        inline = computes_inline(engine)
        coming_back = not inline and server_coming_back(engine.settings)
        logs = TriggerLogs(engine.ctx.storage)  # one snapshot of each trigger table for every stream
        to_run: dict[str, list[str]] = {}
        to_sensor: dict[str, list[StreamWork]] = {}
        fresh: dict[str, str | None] = {}  # planned now from this cursor (restored if the budget ends first)
        notes: list[str] = []  # logged, and the skip reason
        quiet: list[str] = []  # the skip reason only (every stream, every second)
        for name, stream in by_name.items():
            s = states[name]
            running, switch_cursor = switch.get(name, (True, None))
            if not running:
                continue
            _take_switch_cursor(s, switch_cursor, context, name)
            how = r.settle(
                s,
                now=now.timestamp(),
                status=status.get(s.key or ""),
                failed=failed.get(s.key or ""),
                name=name,
                ready=not coming_back,
            )
            if how == "held" or (name in busy and how == "free"):
                continue
            if how == "free" and not s.backlog:
                if paused_by_notify(stream):  # ON_FAILURE PAUSE: undelivered notifications hold the cursor
                    try:
                        reason = gate(engine.ctx, stream)
                    except CQError as exc:
                        reason = str(exc)
                    if reason:
                        quiet.append(f"{name} {reason}")
                        continue
                try:
                    plan = evaluate_stream(engine.ctx, stream, cursor=s.cursor, now=now, logs=logs)
                except CQError as exc:  # e.g. its trigger table is not there yet: said in the tick
                    quiet.append(str(exc))
                    if _say_again(name, str(exc)):  # and, once a minute, in its log and on the sink
                        context.log.warning(f"{name}: {exc}")
                        events.append(dg.AssetObservation(asset_key=sink_keys[name], metadata={"cq/waiting": str(exc)}))
                    continue
                except Exception as exc:  # one stream's unreadable log must not hold the others back
                    notes.append(f"{name}: planning failed: {' '.join(str(exc).split())[:300]}")
                    continue
                for item in plan.ignored:
                    # The rows a stream finds at its creation are history by its definition (no
                    # FILL_HISTORY): expected, so not a warning (the ledger and `cq tick` keep it too).
                    say = context.log.info if item.what == "history" and s.cursor is None else context.log.warning
                    say(f"{name}: {item.text}")
                if plan.works and s.cursor and not plan.ignored:
                    fresh[name] = s.cursor
                s.cursor = plan.cursor.to_json()
                s.backlog = [w.to_json() for w in plan.works]
                if plan.works:
                    context.log.info(f"{name}: {plan.reason}")
                else:
                    quiet.append(f"{name}: {plan.reason}")
            if not s.backlog:
                continue
            works = [StreamWork.from_json(w) for w in s.backlog]
            if coming_back and r.destination(s, works, inline=True) == r.SENSOR:
                quiet.append(f"{name}: waits for the Spark Connect server, which is starting again")
                continue
            if r.destination(s, works, inline=inline) == r.RUN:
                to_run[name] = list(s.backlog)
            else:
                to_sensor[name] = works
        if to_sensor:
            r.mark_inflight(journal_path, base=cursor.seq, streams=list(to_sensor))
        done = _compute(context, states, to_sensor, to_run, fresh, events)
        events += _checks(context, states, {n for n, _ in done}, now=now.timestamp())
        requests = _request(states, to_run, now=now)
        for line in notes:
            context.log.info(line)
        absent = {n: s for n, s in cursor.streams.items() if n in keep and n not in by_name}
        cursor.streams = {**absent, **{n: s for n, s in states.items() if s.cursor or s.backlog or s.key}}
        if done or requests or lost is not None:
            base = cursor.seq
            cursor.seq += 1
            r.write_journal(
                journal_path,
                # An adopted journal's materializations are reported by this evaluation too: if its
                # cursor is lost as well, the next one reports them again.
                r.Journal(
                    base=base,
                    cursor=cursor.to_json(),
                    events=(lost.events if lost is not None else []) + [[n, m] for n, m in done],
                ),
            )
        r.clear_inflight(journal_path)
        reason = "; ".join([*notes, *quiet]) or "nothing to do"
        return dg.SensorResult(
            run_requests=requests,
            asset_events=events,
            cursor=cursor.to_json(),
            # An observation (a missing table, said on the sink) leaves the tick's reason in place.
            skip_reason=None if (requests or any(isinstance(e, dg.AssetMaterialization) for e in events)) else reason,
        )

    def _runs(context, states) -> tuple[dict[str, str], dict[str, set[str]]]:
        runs = keyed_runs(context.instance, {s.key for s in states.values() if s.key})
        status, failed = runs.status, runs.failed
        return status, failed

    def _take_switch_cursor(s: r.StreamState, text: str | None, context, name: str) -> None:
        if not text:
            return
        try:
            data = json.loads(text)
        except ValueError:
            return
        if isinstance(data, dict) and data.get(ADOPT) and data.get("id") != s.adopted:
            s.cursor, s.backlog, s.adopted = data[ADOPT], [], str(data.get("id"))
            context.log.info(f"{name}: took the cursor `cq start --ignore-untreated` set")

    def _compute(context, states, to_sensor, to_run, fresh, events) -> list:
        """Compute ``to_sensor`` in this process within the budget; what failed goes to ``to_run``,
        what the budget did not reach stays (a stream planned now from a cursor gets that cursor back)."""
        done: list = []
        if not to_sensor:
            return done
        order = r.service_order(states, list(to_sensor))
        pending = {n: list(to_sensor[n]) for n in order}
        deadline = time.monotonic() + budget_seconds()
        started: set[str] = set()
        try:
            # A lost session is opened again at once if the server answers, else the works wait in the
            # sensor for the next evaluation (not a run's in-process JVM while the server restarts).
            recover = SparkRecovery(engine.ctx, wait=0)
            rounds = r.run_rounds(engine.ctx, by_name, pending, deadline=deadline, cost=cost, recover=recover)
            for name, work, outcome in rounds:
                s = states[name]
                started.add(name)
                if isinstance(outcome, Exception):
                    context.log.warning(f"{name}: computing in the sensor failed, a run takes over: {outcome}")
                    # The code server's log keeps where it failed (the tick shows the one-line error).
                    LOG.warning("%s: computing in the sensor failed", name, exc_info=outcome.__cause__ or outcome)
                    engine.ctx.drop_spark()  # a broken Connect session is not reused (a restarted server)
                    s.attempt = max(s.attempt, 1)
                    to_run[name] = list(s.backlog)
                    continue
                s.backlog, s.served = s.backlog[1:], time.time()
                lo, hi = work_range(by_name[name], work, tz)
                context.log.info(
                    f"{name}: computed in the sensor: {work.kind} [{iso(lo)}, {iso(hi)}) "
                    f"wrote {outcome.rows_written} rows"
                )
                event = stream_materialization(
                    by_name[name], outcome, work, sink_keys[name], engine=engine, **{"cq/computed_in": "sensor"}
                )
                events.append(event)
                # The journal keeps what JSON holds (an adopted event goes without the schema).
                done.append(
                    (name, {k: _plain(v) for k, v in (event.metadata or {}).items() if k != health.COLUMN_SCHEMA})
                )
        finally:
            for name in set(to_sensor) - started:
                if name in fresh:  # not reached: plan again next time, over more commits
                    states[name].cursor, states[name].backlog = fresh[name], []
        return done

    def _checks(context, states, computed: set[str], *, now: float) -> list:
        """The completeness checks of the streams this evaluation computed, runless: their first
        since this process started or since a run of theirs, then at most every CHECK_EVERY_SECONDS.
        Dagster shows a runless check as evaluated for every runless materialization of its sink, so
        the sink's check keeps its result until a run materializes it (that run evaluates its own)."""
        for name, s in states.items():
            if s.key:
                _checked.pop(name, None)
        due = [by_name[n] for n in sorted(computed) if now - _checked.get(n, float("-inf")) >= CHECK_EVERY_SECONDS]
        if not due:
            return []
        try:
            results = health.completeness_results(engine, due, {d.name: sink_keys[d.name] for d in due}, runless=True)
        except Exception as exc:  # the check must never hold the streams back
            context.log.warning(f"{health.CHECK_NAME}: not evaluated for {', '.join(d.name for d in due)}: {exc}")
            return []
        _checked.update({d.name: now for d in due})
        return results

    def _request(states, to_run, *, now: datetime) -> list[dg.RunRequest]:
        if not to_run:
            return []
        attempt = max(states[n].attempt for n in to_run)
        key = r.run_key(to_run, attempt)
        for name in to_run:
            states[name].key, states[name].since = key, now.timestamp()
        count = sum(len(ws) for ws in to_run.values())
        kinds = {StreamWork.from_json(w).kind for ws in to_run.values() for w in ws}
        # Not `cq/batch`: that tag's queue limit (two at once) is for the continuous queries' batches,
        # which would hold a stream's run (history runs have the lowest priority) for as long as they
        # keep coming. This sensor bounds its own runs: one per evaluation, never a stream in two.
        tags = {
            "cq/stream_batch": "true",
            "cq/streams": f"{count} work(s) of {len(to_run)} stream(s)",
            "cq/definitions": names_summary(to_run),
            "cq/attempt": str(attempt),
            "cq/work_kind": ",".join(sorted(kinds)),
            "dagster/max_runtime": str(MAX_RUNTIME_SECONDS),
        }
        if len(to_run) == 1:
            tags["cq/name"] = next(iter(to_run))
        if kinds == {"history"} and not any(by_name[n].options.fill_history_first for n in to_run):
            tags["dagster/priority"] = "-1"
        return [
            dg.RunRequest(
                run_key=key,
                run_config={"ops": {op: {"config": {"works": to_run}}}},
                asset_selection=[sink_keys[n] for n in to_run],
                tags=tags,
            )
        ]

    return dg.SensorDefinition(
        name=sensor_name,
        job=job,
        evaluation_fn=evaluate,
        minimum_interval_seconds=INTERVAL_SECONDS,
        default_status=default_status,
        description="Plans every window-triggered stream and eKuiper rule from its trigger table's new Delta "
        "commits, computes the closed windows through the Spark Connect server, and hands history, retries "
        "and what it cannot compute to one run of its job. A stream's on/off switch is its sensor `<name>_ticks` "
        "(`cq stop NAME` / `cq start NAME`).",
    )


def _plain(value):
    """A metadata value as JSON (for the journal)."""
    inner = getattr(value, "value", value)
    if isinstance(inner, (str, int, float, bool, list, dict)) or inner is None:
        return inner
    return str(inner)
