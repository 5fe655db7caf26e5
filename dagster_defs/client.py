"""The CLI's way into a running Dagster (``cq stop/start/pause/resume``, ``cq recalculate
--via-dagster``): GraphQL over HTTP, with job, schedule and sensor names from the configured
translator (``CQ_TRANSLATOR``), so a translator that renames them works here too."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable

from cq_engine.errors import CQError
from cq_engine.model import ContinuousQuery, Definition, PeriodTrigger

from .translator import CQTranslator

_SENSOR = """query($s: SensorSelector!) { sensorOrError(sensorSelector: $s) { __typename
  ... on Sensor { id sensorState { status typeSpecificData { ... on SensorData { lastCursor } } } }
  ... on Error { message } } }"""
_SCHEDULE = """query($s: ScheduleSelector!) { scheduleOrError(scheduleSelector: $s) { __typename
  ... on Schedule { id scheduleState { status } } ... on Error { message } } }"""
_REPOSITORIES = """{ repositoriesOrError { __typename ... on Error { message }
  ... on RepositoryConnection { nodes { name location { name } sensors { name } schedules { name }
  jobs { name } } } } }"""
_MUTATIONS = {
    ("sensor", "start"): "mutation($s: SensorSelector!) { startSensor(sensorSelector: $s) { __typename "
    "... on Error { message } } }",
    ("sensor", "stop"): "mutation($id: String) { stopSensor(id: $id) { __typename ... on Error { message } } }",
    ("schedule", "start"): "mutation($s: ScheduleSelector!) { startSchedule(scheduleSelector: $s) { __typename "
    "... on Error { message } } }",
    ("schedule", "stop"): "mutation($id: String) { stopRunningSchedule(id: $id) { __typename "
    "... on Error { message } } }",
}
_SET_CURSOR = (
    "mutation($s: SensorSelector!, $c: String) { setSensorCursor(sensorSelector: $s, cursor: $c) "
    "{ __typename ... on Error { message } } }"
)
_LAUNCH = """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) { __typename
  ... on LaunchRunSuccess { run { runId } } ... on Error { message }
  ... on RunConfigValidationInvalid { errors { message } } } }"""
_BACKFILL = """mutation($p: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $p) { __typename
  ... on LaunchBackfillSuccess { backfillId } ... on Error { message } } }"""
# A daemon tick that read the sensor's state just before a stop writes that state back, running
# (a read-modify-write race of the sensor daemon, cf. dagster-io/dagster#7736): a stop is checked
# again after this long, and repeated if the daemon undid it.
STOP_SETTLE_SECONDS = 2.0
STOP_ATTEMPTS = 3


class GraphQL:
    """POSTs to ``http://<address>/graphql``; every failure is a ``CQError`` naming the address."""

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

    def locate(self, candidates: list[tuple]) -> tuple[str, str, str, str]:
        """``(kind, name, location, repository)`` of the first of ``candidates`` (``(kind, name)``,
        kind ``schedule``, ``sensor`` or ``job``) loaded in any code location of the workspace. A
        candidate ``(kind, name, (kind2, name2))`` counts only in a repository that also holds
        ``name2``: a shared job (every location has one) in the location of one definition."""
        data = self(_REPOSITORIES)["repositoriesOrError"]
        if data["__typename"] != "RepositoryConnection":
            raise CQError(f"Dagster at {self.url}: {data.get('message', data['__typename'])}")
        nodes = data.get("nodes") or []
        if not nodes:
            raise CQError(f"Dagster at {self.url} has no code location loaded")

        def holds(node: dict, kind: str, name: str) -> bool:
            return name in {x["name"] for x in node[f"{kind}s"]}

        for kind, name, *also in candidates:
            found = [
                (kind, name, n["location"]["name"], n["name"])
                for n in nodes
                if holds(n, kind, name) and all(holds(n, *a) for a in also)
            ]
            if len(found) > 1:
                raise CQError(
                    f"Dagster at {self.url}: {kind} {name} is in several code locations "
                    f"({', '.join(f[2] for f in found)})"
                )
            if found:
                return found[0]
        wanted = " or ".join(
            f"{kind} {name}" + "".join(f" beside {k} {n}" for k, n in also) for kind, name, *also in candidates
        )
        raise CQError(
            f"Dagster at {self.url} has no {wanted} in its code locations "
            f"({', '.join(sorted({n['location']['name'] for n in nodes}))})"
        )


def _check(result: dict, what: str) -> dict:
    """A mutation's or query's single result, or a CQError naming Dagster's error."""
    outcome = next(iter(result.values()))
    if outcome.get("__typename", "").endswith("Error") or outcome.get("__typename") == "RunConfigValidationInvalid":
        detail = (
            outcome.get("message")
            or "; ".join(e["message"] for e in outcome.get("errors") or [])
            or outcome["__typename"]
        )
        raise CQError(f"{what} failed in Dagster: {detail}")
    return outcome


def windowed(d: Definition) -> bool:
    """A window-triggered stream (its own sensor), as opposed to a definition with ticks."""
    return not isinstance(d, ContinuousQuery) and not isinstance(d.trigger, PeriodTrigger)


def control(
    d: Definition,
    *,
    verb: str,
    address: str,
    translator: CQTranslator,
    new_cursor: Callable[[str | None], str] | None = None,
) -> tuple[str, str, str]:
    """Start or stop (``verb``) the schedule or sensor of ``d``; ``new_cursor(old)`` (a sensor being
    started) replaces its cursor first. Returns ``(kind, name, location)``."""
    gql = GraphQL(address)
    candidates = [("sensor", translator.get_sensor_name(d))]
    if not windowed(d):  # per firing: a schedule, or a sensor where cron cannot express the ticks; batched: its switch
        candidates[:0] = [("schedule", translator.get_schedule_name(d)), ("schedule", translator.get_sensor_name(d))]
    kind, name, location, repository = gql.locate(candidates)
    selector = {"repositoryLocationName": location, "repositoryName": repository, f"{kind}Name": name}
    query = _SENSOR if kind == "sensor" else _SCHEDULE
    found = _check(gql(query, s=selector), f"{d.name}: looking up {kind} {name}")
    if verb == "start" and new_cursor is not None and kind == "sensor":
        cursor = (found["sensorState"].get("typeSpecificData") or {}).get("lastCursor")
        if windowed(d):  # the stream's cursor is in the streams sensor's; its switch hands the new one over
            cursor = json.dumps(
                {"adopt": new_cursor(stream_cursor(gql, d, selector, translator)), "id": uuid.uuid4().hex}
            )
        else:
            cursor = new_cursor(cursor)
        _check(gql(_SET_CURSOR, s=selector, c=cursor), f"{d.name}: setting the cursor of {name}")
    variables = {"s": selector} if verb == "start" else {"id": found["id"]}
    mutation = _MUTATIONS[(kind, verb)]
    _check(gql(mutation, **variables), f"{d.name}: {verb}")
    if kind == "sensor" and verb == "stop":
        for _ in range(STOP_ATTEMPTS):
            time.sleep(STOP_SETTLE_SECONDS)
            state = _check(gql(_SENSOR, s=selector), f"{d.name}: looking up {kind} {name}")["sensorState"]
            if state["status"] == "STOPPED":
                break
            _check(gql(mutation, **variables), f"{d.name}: {verb}")
        else:
            raise CQError(
                f"{d.name}: sensor {name} keeps running after {STOP_ATTEMPTS} stops (the Dagster daemon "
                "restores it); try again"
            )
    return kind, name, location


def stream_cursor(gql: GraphQL, d: Definition, selector: dict, translator: CQTranslator) -> str | None:
    """The ``StreamCursor`` JSON of stream ``d`` in the streams sensor next to its switch (``selector``)."""
    sensor = translator.get_streams_sensor_name()
    found = _check(gql(_SENSOR, s={**selector, "sensorName": sensor}), f"{d.name}: looking up sensor {sensor}")
    text = (found["sensorState"].get("typeSpecificData") or {}).get("lastCursor")
    streams = (json.loads(text) if text else {}).get("streams") or {}
    cursor = (streams.get(d.name) or {}).get("cursor")
    # Nested as an object (an older engine's cursor: a JSON string).
    return json.dumps(cursor, separators=(",", ":")) if isinstance(cursor, dict) else cursor


def shared_job(d: Definition, translator: CQTranslator) -> tuple[str, tuple[str, str]]:
    """The shared job that runs ``d`` when its sink alone is selected, and the switch it sits beside
    (every location has the shared jobs): ``cq_firings_job`` beside the switch schedule of a continuous
    query or PERIOD stream, the streams job beside a window-triggered stream's switch sensor."""
    if windowed(d):
        return translator.get_streams_job_name(), ("sensor", translator.get_sensor_name(d))
    return translator.get_batch_job_name(), ("schedule", translator.get_sensor_name(d))


def launch_recalculate(
    d: Definition, *, address: str, translator: CQTranslator, start: str, end: str | None = None
) -> tuple[str, str]:
    """Launch a recalculation of ``d`` (its range in the run's tags): ``("backfill", id)``, an asset
    backfill of ``d``'s sink alone, which the UI lists under Backfills with its title and whose run
    (Dagster's asset job, the sink selected) carries the tags; or ``("run", id)`` of ``d``'s own
    recalculate job where the location has one (``CQ_RUN_MODEL=per_firing``)."""
    tags = {
        **translator.get_tags(d),
        "cq/recalculate": "true",
        "cq/recalculate_from": start,
        **({"cq/recalculate_to": end} if end else {}),
    }
    own = translator.get_recalculate_job_name(d)
    shared, switch = shared_job(d, translator)
    gql = GraphQL(address)
    _, job, _, _ = gql.locate([("job", own), ("job", shared, switch)])
    if job == own:
        return "run", launch_one(d, address=address, translator=translator, own_job=own, tags=tags)
    params = {
        "assetSelection": [{"path": translator.get_sink_asset_spec(d).key.path}],
        "allPartitions": True,  # an unpartitioned asset: the backfill is the asset itself
        "tags": [{"key": k, "value": v} for k, v in tags.items()],
        "title": f"Recalculate {d.name} [{start}, {end or 'its latest firing'})",
        "description": f"cq recalculate {d.name} --from {start}" + (f" --to {end}" if end else ""),
    }
    outcome = _check(gql(_BACKFILL, p=params), f"{d.name}: launching a backfill of its sink")
    return "backfill", outcome["backfillId"]


def launch_one(d: Definition, *, address: str, translator: CQTranslator, own_job: str, tags: dict[str, str]) -> str:
    """Launch one run of ``d`` alone with ``tags``: ``own_job`` if the location has it, else
    ``shared_job`` with ``d``'s sink as the run's asset selection; the run id."""
    gql = GraphQL(address)
    shared, switch = shared_job(d, translator)
    candidates: list[tuple] = [("job", own_job), ("job", shared, switch)]
    _, job, location, repository = gql.locate(candidates)
    selector: dict = {"repositoryLocationName": location, "repositoryName": repository, "jobName": job}
    if job != own_job:
        selector["assetSelection"] = [{"path": translator.get_sink_asset_spec(d).key.path}]
    params = {"selector": selector, "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in tags.items()]}}
    outcome = _check(gql(_LAUNCH, p=params), f"{d.name}: launching {job}")
    return outcome["run"]["runId"]
