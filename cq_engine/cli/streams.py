"""``cq tick | stop | start | pause | resume | drop``: stream operations (seed 000's START/STOP/PAUSE/
RESUME/DROP STREAM) for a file-defined system whose running state lives in Dagster."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path

from cq_engine.cli.common import name_arg, open_engine, open_ledger, open_storage
from cq_engine.config import Settings
from cq_engine.errors import CQError, reported
from cq_engine.model import ContinuousQuery, Definition, PeriodTrigger, Stream
from cq_engine.statefile import read_state, write_atomic
from cq_engine.times import UTC, iso, parse_time


def register(cmd) -> None:
    sp = cmd(
        "tick",
        _tick,
        "evaluate definitions' schedules or sensors once, as the daemon would, and run what they request",
    )
    sp.add_argument("names", nargs="*", type=name_arg, metavar="NAME", help="one or more definitions, in this order")
    sp.add_argument("--all", action="store_true", help="every definition of CQ_SQL_DIR, in file order")
    sp.add_argument("--at", metavar="T", help="evaluation time (a schedule: its tick; default: now)")
    for name, verb in (("stop", "stop"), ("start", "start"), ("pause", "stop"), ("resume", "start")):
        sp = cmd(name, _control, f"{name} a definition's sensor or schedule in Dagster (STREAM {name.upper()})")
        sp.add_argument("name", type=name_arg)
        sp.set_defaults(verb=verb)
        if verb == "start":
            sp.add_argument(
                "--ignore-untreated",
                action="store_true",
                help="skip the data written while stopped instead of processing it as history",
            )
        sp.add_argument("--dagster", default="localhost:3000", metavar="HOST:PORT")
        sp.add_argument(
            "--via-airflow",
            nargs="?",
            const="http://localhost:8080",
            metavar="URL",
            help=f"{'unpause' if verb == 'start' else 'pause'} the definition's DAG on an Airflow API server "
            "instead (credentials: CQ_AIRFLOW_TOKEN, or CQ_AIRFLOW_USER and CQ_AIRFLOW_PASSWORD)",
        )
    sp = cmd("drop", _drop, "what dropping a file-defined definition means (its outputs stay)")
    sp.add_argument("name", type=name_arg)
    sp = cmd(
        "listen",
        _listen,
        "a local WebSocket server printing the NOTIFY messages it receives, one JSON "
        "line each (for trying NOTIFY('ws://127.0.0.1:8765/notify'))",
    )
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=8765)
    sp.add_argument("--count", type=int, default=0, help="exit after this many messages (default: run until Ctrl-C)")


def cursor_path(settings: Settings, name: str) -> Path:
    """``cq tick``'s own sensor cursor (independent of the daemon's)."""
    return Path(settings.home) / "ticks" / f"{name}.json"


def read_cursor(path: Path) -> str | None:
    """The stream cursor stored at ``path`` (``cursor_path``), checked readable; None if there is none."""
    from cq_engine.streams.timing import StreamCursor

    cursor = read_state(path, what="stream cursor")
    if cursor is not None:
        try:
            StreamCursor.from_json(cursor)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CQError(
                f"{path}: unreadable stream cursor ({type(exc).__name__}: {exc}); delete the file "
                "to start the stream over"
            ) from None
    return cursor


def _tick(args, settings: Settings) -> int:
    """Tick each NAME (or ``--all``) in order with one engine (one Spark session); a definition that
    fails is reported as ``cq: error:`` and the others still tick; exit 1 if any failed."""
    if bool(args.names) == args.all:
        raise CQError("name the definitions to tick, or pass --all (not both)")
    engine = open_engine(settings)
    now = parse_time(args.at, tz=settings.tz, what="--at") if args.at else datetime.now(UTC)
    failed = 0
    if args.all:
        for err in engine.catalog.errors:  # a definition that failed to load cannot tick
            print(f"cq: error: {err}", file=sys.stderr)
            failed += 1
        targets: list = list(engine.catalog.definitions)
    else:
        targets = list(dict.fromkeys(args.names))
    for target in targets:
        try:
            d = target if args.all else engine.definition(target)
            with reported(d.name, d.location):
                _tick_one(engine, d, settings=settings, now=now, exact=bool(args.at))
        except CQError as exc:
            if len(targets) == 1 and not args.all:
                raise
            print(f"cq: error: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def _tick_one(engine, d: Definition, *, settings: Settings, now: datetime, exact: bool) -> None:
    """One definition's tick at ``now`` (``exact``: ``now`` must be a schedule's tick, else its latest)."""
    if isinstance(d, ContinuousQuery) or isinstance(d.trigger, PeriodTrigger):
        ticks = engine.ticks(d.name, now=now)
        fire = now if exact else ticks.latest(now)
        if fire is None or not ticks.is_tick(fire):
            nearest = ticks.between(now, now + ticks.every * 2)
            raise CQError(
                f"{iso(now)} is not a tick of {d.name!r} ({ticks.description})"
                + (f"; next: {iso(nearest[0])}" if nearest else "")
            )
        r = engine.run_firing(d.name, fire) if isinstance(d, ContinuousQuery) else engine.run_period(d.name, fire)
        print(
            f"{d.name}: tick {iso(fire)} over [{iso(r.time_range[0])}, {iso(r.time_range[1])}): "
            f"{r.rows_written} rows -> {d.sink} v{r.sink_version}"
        )
        return
    from cq_engine.notify.outbox import gate
    from cq_engine.streams.sensor import evaluate_stream

    paused = gate(engine.ctx, d)
    if paused:  # ON_FAILURE PAUSE: the cursor stays until the pending notifications are delivered
        print(f"{d.name}: {paused}")
        return
    path = cursor_path(settings, d.name)
    cursor = read_cursor(path)
    plan = evaluate_stream(engine.ctx, d, cursor=cursor, now=now)
    print(f"{d.name}: {plan.reason}")
    for item in plan.ignored:
        print(f"{d.name}: {item.text}")
    for work in plan.works:
        r = engine.run_stream(d.name, work)
        print(
            f"{d.name}: {work.kind} run over [{iso(r.time_range[0])}, {iso(r.time_range[1])}) at version "
            f"{work.version}: {r.rows_written} rows -> {d.sink} "
            f"v{r.sink_version} ({r.seconds:.2f}s)"
        )
        for line in r.ignored:
            print(f"{d.name}: {line}")
    # Saved once the requested runs succeeded, so a failed run is requested again next time.
    write_atomic(path, plan.cursor.to_json())


def _control(args, settings: Settings) -> int:
    if args.via_airflow:
        return _control_via_airflow(args)
    from dagster_defs.client import control, windowed
    from dagster_defs.translator import configured_translator

    engine = open_engine(settings)
    d = engine.definition(args.name)
    new_cursor, extra = None, ""
    if args.verb == "start" and getattr(args, "ignore_untreated", False):
        if isinstance(d, Stream) and windowed(d):
            from cq_engine.streams.sensor import skip_untreated

            stream = d

            def new_cursor(cursor):
                return skip_untreated(engine.ctx, stream, cursor)

            extra = " (data written while stopped skipped)"
        else:
            extra = " (--ignore-untreated applies to window-triggered streams only: nothing skipped)"
    kind, name, location = control(
        d, verb=args.verb, address=args.dagster, translator=configured_translator(), new_cursor=new_cursor
    )
    state = "running" if args.verb == "start" else "stopped"
    print(f"{d.name}: {kind} {name} in {location} {state}{extra}")
    return 0


def _control_via_airflow(args) -> int:
    """stop/pause pause the DAG, start/resume unpause it (a stream DAG's cursor is `cq tick`'s file)."""
    from cq_engine.cli.viaairflow import pause

    if getattr(args, "ignore_untreated", False):
        raise CQError(
            "--ignore-untreated is not available with --via-airflow: a stream DAG's cursor is `cq tick`'s file "
            "under the workers' CQ_HOME, which the API server cannot reach"
        )
    dag = pause(args.via_airflow, args.name, paused=args.verb == "stop")
    state = "paused" if dag.get("is_paused") else "unpaused"
    print(f"{args.name}: DAG {dag.get('dag_id', args.name)} on {args.via_airflow} {state}")
    return 0


def _drop(args, settings: Settings) -> int:
    from cq_engine.catalog import settings_catalog

    catalog = settings_catalog(settings)
    d = catalog.definition(args.name)
    if d is not None:
        raise CQError(
            f"{d.name!r} is defined at {d.location}: remove that statement (or its file) to drop it; "
            f"its sink {d.sink!r} and the rows already written stay, as DROP STREAM leaves them"
        )
    runs = open_ledger(settings).entries(args.name)
    # The engine's per-stream state (frontier, ticks, outbox): a re-created stream starts afresh.
    removed = open_storage(settings).drop_state(f"streams/{args.name}")
    if not runs and removed is None:
        raise CQError(f"no definition named {args.name!r} in {settings.sql_dir}, and none has run")
    print(json.dumps({"dropped": args.name, "runs_in_ledger": len(runs), "state_removed": removed, "outputs": "kept"}))
    return 0


def _listen(args, settings: Settings) -> int:
    """Receive NOTIFY messages and print each on one line; ``--count`` stops after that many."""
    import threading

    from websockets.sync.server import serve

    seen = {"n": 0}
    done = threading.Event()

    def handle(ws) -> None:
        for text in ws:
            print(text if isinstance(text, str) else text.decode(), flush=True)
            seen["n"] += 1
            if args.count and seen["n"] >= args.count:
                done.set()

    with serve(handle, args.host, args.port) as server:
        print(f"listening on ws://{args.host}:{args.port}/ (Ctrl-C to stop)", flush=True)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            while not done.wait(0.2):
                pass
        except KeyboardInterrupt:
            pass
        server.shutdown()
    return 0
