"""``cq tick | stop | start | pause | resume | drop``: stream operations (seed 000's START/STOP/PAUSE/
RESUME/DROP STREAM) for a file-defined system whose running state lives in Dagster."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

from cq_engine.cli.common import name_arg, open_engine, open_ledger, open_storage
from cq_engine.config import Settings
from cq_engine.errors import CQError
from cq_engine.model import ContinuousQuery, PeriodTrigger
from cq_engine.statefile import read_state, write_atomic
from cq_engine.streams.timing import StreamCursor
from cq_engine.times import UTC, iso, parse_time


def register(cmd) -> None:
    sp = cmd("tick", _tick, "evaluate a definition's schedule or sensor once, as the daemon would, and run "
                           "what it requests")
    sp.add_argument("name", type=name_arg)
    sp.add_argument("--at", metavar="T", help="evaluation time (a schedule: its tick; default: now)")
    for name, verb in (("stop", "stop"), ("start", "start"), ("pause", "stop"), ("resume", "start")):
        sp = cmd(name, _control, f"{name} a definition's sensor or schedule in Dagster (STREAM {name.upper()})")
        sp.add_argument("name", type=name_arg)
        sp.set_defaults(verb=verb)
        if verb == "start":
            sp.add_argument("--ignore-untreated", action="store_true",
                            help="skip the data written while stopped instead of processing it as history")
        sp.add_argument("--dagster", default="localhost:3000", metavar="HOST:PORT")
    sp = cmd("drop", _drop, "what dropping a file-defined definition means (its outputs stay)")
    sp.add_argument("name", type=name_arg)
    sp = cmd("listen", _listen, "a local WebSocket server printing the NOTIFY messages it receives, one JSON "
                               "line each (for trying NOTIFY('ws://127.0.0.1:8765/notify'))")
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=8765)
    sp.add_argument("--count", type=int, default=0, help="exit after this many messages (default: run until Ctrl-C)")


def cursor_path(settings: Settings, name: str) -> Path:
    """``cq tick``'s own sensor cursor (independent of the daemon's)."""
    return Path(settings.home) / "ticks" / f"{name}.json"


def _tick(args, settings: Settings) -> int:
    engine = open_engine(settings)
    d = engine.definition(args.name)
    now = parse_time(args.at, tz=settings.tz, what="--at") if args.at else datetime.now(UTC)
    if isinstance(d, ContinuousQuery) or isinstance(d.trigger, PeriodTrigger):
        ticks = engine.ticks(d.name, now=now)
        fire = now if args.at else ticks.latest(now)
        if fire is None or not ticks.is_tick(fire):
            nearest = ticks.between(now, now + ticks.every * 2)
            raise CQError(f"{iso(now)} is not a tick of {d.name!r} ({ticks.description})"
                          + (f"; next: {iso(nearest[0])}" if nearest else ""))
        r = engine.run_firing(d.name, fire) if isinstance(d, ContinuousQuery) else engine.run_period(d.name, fire)
        print(f"{d.name}: tick {iso(fire)} over [{iso(r.time_range[0])}, {iso(r.time_range[1])}): "
              f"{r.rows_written} rows -> {d.sink} v{r.sink_version}")
        return 0
    from cq_engine.notify.outbox import gate
    from cq_engine.streams.sensor import evaluate_stream

    paused = gate(engine.ctx, d)
    if paused:  # ON_FAILURE PAUSE: the cursor stays until the pending notifications are delivered
        print(f"{d.name}: {paused}")
        return 0
    path = cursor_path(settings, d.name)
    cursor = read_state(path, what="stream cursor")
    if cursor is not None:
        try:
            StreamCursor.from_json(cursor)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CQError(f"{path}: unreadable stream cursor ({type(exc).__name__}: {exc}); delete the file "
                          "to start the stream over") from None
    plan = evaluate_stream(engine.ctx, d, cursor=cursor, now=now)
    print(f"{d.name}: {plan.reason}")
    for item in plan.ignored:
        print(f"{d.name}: {item.text}")
    for work in plan.works:
        r = engine.run_stream(d.name, work)
        print(f"{d.name}: {work.kind} run at version {work.version}: {r.rows_written} rows -> {d.sink} "
              f"v{r.sink_version} ({r.seconds:.2f}s)")
    # Saved once the requested runs succeeded, so a failed run is requested again next time.
    write_atomic(path, plan.cursor.to_json())
    return 0


_SENSOR = """query($s: SensorSelector!) { sensorOrError(sensorSelector: $s) { __typename
  ... on Sensor { id sensorState { status typeSpecificData { ... on SensorData { lastCursor } } } }
  ... on Error { message } } }"""
_SCHEDULE = """query($s: ScheduleSelector!) { scheduleOrError(scheduleSelector: $s) { __typename
  ... on Schedule { id scheduleState { status } } ... on Error { message } } }"""
_REPOSITORIES = """{ repositoriesOrError { __typename ... on Error { message }
  ... on RepositoryConnection { nodes { name location { name } sensors { name } schedules { name } } } } }"""
_MUTATIONS = {
    ("sensor", "start"): "mutation($s: SensorSelector!) { startSensor(sensorSelector: $s) { __typename "
                         "... on Error { message } } }",
    ("sensor", "stop"): "mutation($id: String) { stopSensor(id: $id) { __typename ... on Error { message } } }",
    ("schedule", "start"): "mutation($s: ScheduleSelector!) { startSchedule(scheduleSelector: $s) { __typename "
                           "... on Error { message } } }",
    ("schedule", "stop"): "mutation($id: String) { stopRunningSchedule(id: $id) { __typename "
                          "... on Error { message } } }",
}
# A daemon tick that read the sensor's state just before a stop writes that state back, running
# (a read-modify-write race of the sensor daemon, cf. dagster-io/dagster#7736): a stop is checked
# again after this long, and repeated if the daemon undid it.
STOP_SETTLE_SECONDS = 2.0
STOP_ATTEMPTS = 3
_SET_CURSOR = ("mutation($s: SensorSelector!, $c: String) { setSensorCursor(sensorSelector: $s, cursor: $c) "
               "{ __typename ... on Error { message } } }")


class _GraphQL:
    def __init__(self, address: str):
        self.url = f"http://{address}/graphql"

    def __call__(self, query: str, **variables) -> dict:
        import requests

        try:
            response = requests.post(self.url, json={"query": query, "variables": variables}, timeout=30)
            body = response.json()
        except Exception as exc:  # connection refused, not JSON...
            raise CQError(f"cannot reach Dagster at {self.url}: {' '.join(str(exc).split())[:200]}") from None
        if body.get("errors"):
            raise CQError(f"Dagster at {self.url}: {body['errors'][0].get('message')}")
        return body["data"]

    def locate(self, candidates: list[tuple[str, str]]) -> tuple[str, str, str, str]:
        """``(kind, name, location, repository)`` of the first of ``candidates`` (``(kind, name)``,
        kind ``schedule`` or ``sensor``) loaded in any code location of the workspace."""
        data = self(_REPOSITORIES)["repositoriesOrError"]
        if data["__typename"] != "RepositoryConnection":
            raise CQError(f"Dagster at {self.url}: {data.get('message', data['__typename'])}")
        nodes = data.get("nodes") or []
        if not nodes:
            raise CQError(f"Dagster at {self.url} has no code location loaded")
        for kind, name in candidates:
            found = [(kind, name, n["location"]["name"], n["name"]) for n in nodes
                     if name in {x["name"] for x in n[f"{kind}s"]}]
            if len(found) > 1:
                raise CQError(f"Dagster at {self.url}: {kind} {name} is in several code locations "
                              f"({', '.join(f[2] for f in found)})")
            if found:
                return found[0]
        wanted = " or ".join(f"{kind} {name}" for kind, name in candidates)
        raise CQError(f"Dagster at {self.url} has no {wanted} in its code locations "
                      f"({', '.join(sorted({n['location']['name'] for n in nodes}))})")


def _check(result: dict, what: str) -> dict:
    """A mutation's or query's single result, or a CQError naming Dagster's error."""
    outcome = next(iter(result.values()))
    if outcome.get("__typename", "").endswith("Error"):
        raise CQError(f"{what} failed in Dagster: {outcome.get('message') or outcome['__typename']}")
    return outcome


def _control(args, settings: Settings) -> int:
    from dagster_defs.translator import CQTranslator

    engine = open_engine(settings)
    d = engine.definition(args.name)
    translator = CQTranslator()
    gql = _GraphQL(args.dagster)
    windowed = not isinstance(d, ContinuousQuery) and not isinstance(d.trigger, PeriodTrigger)
    candidates = [("sensor", translator.get_sensor_name(d))]
    if not windowed:  # a schedule, or a tick sensor where cron cannot express the ticks
        candidates.insert(0, ("schedule", translator.get_schedule_name(d)))
    kind, name, location, repository = gql.locate(candidates)
    selector = {"repositoryLocationName": location, "repositoryName": repository, f"{kind}Name": name}
    query = _SENSOR if kind == "sensor" else _SCHEDULE
    found = _check(gql(query, s=selector), f"{d.name}: looking up {kind} {name}")
    extra = ""
    if args.verb == "start" and getattr(args, "ignore_untreated", False):
        if windowed:
            from cq_engine.streams.sensor import skip_untreated

            cursor = (found["sensorState"].get("typeSpecificData") or {}).get("lastCursor")
            _check(gql(_SET_CURSOR, s=selector, c=skip_untreated(engine.ctx, d, cursor)),
                   f"{d.name}: setting the cursor of {name}")
            extra = " (data written while stopped skipped)"
        else:
            extra = " (--ignore-untreated applies to window-triggered streams only: nothing skipped)"
    variables = {"s": selector} if args.verb == "start" else {"id": found["id"]}
    mutation = _MUTATIONS[(kind, args.verb)]
    _check(gql(mutation, **variables), f"{d.name}: {args.command}")
    if kind == "sensor" and args.verb == "stop":
        for _ in range(STOP_ATTEMPTS):
            time.sleep(STOP_SETTLE_SECONDS)
            state = _check(gql(_SENSOR, s=selector), f"{d.name}: looking up {kind} {name}")["sensorState"]
            if state["status"] == "STOPPED":
                break
            _check(gql(mutation, **variables), f"{d.name}: {args.command}")
        else:
            raise CQError(f"{d.name}: sensor {name} keeps running after {STOP_ATTEMPTS} stops (the Dagster daemon "
                          "restores it); try again")
    state = "running" if args.verb == "start" else "stopped"
    print(f"{d.name}: {kind} {name} in {location} {state}{extra}")
    return 0


def _drop(args, settings: Settings) -> int:
    from cq_engine.catalog import load_catalog, parse_options
    catalog = load_catalog(settings.sql_dir, options=parse_options(settings))
    d = catalog.definition(args.name)
    if d is not None:
        raise CQError(f"{d.name!r} is defined at {d.location}: remove that statement (or its file) to drop it; "
                      f"its sink {d.sink!r} and the rows already written stay, as DROP STREAM leaves them")
    runs = open_ledger(settings).entries(args.name)
    # The engine's per-stream state (frontier, ticks, outbox): a re-created stream starts afresh.
    removed = open_storage(settings).drop_state(f"streams/{args.name}")
    if not runs and removed is None:
        raise CQError(f"no definition named {args.name!r} in {settings.sql_dir}, and none has run")
    print(json.dumps({"dropped": args.name, "runs_in_ledger": len(runs), "state_removed": removed,
                      "outputs": "kept"}))
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
