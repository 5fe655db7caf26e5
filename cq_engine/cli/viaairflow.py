"""``--via-airflow URL``: ``cq stop/start/pause/resume`` and ``cq recalculate`` against an Airflow 3 API
server (its REST API ``/api/v2``), for the DAGs of ``airflow_dags``: one per definition, named after it.

Standard library only (``urllib.request``): ``cq`` imports and runs without Airflow installed.
Credentials come from the environment: ``CQ_AIRFLOW_TOKEN`` (a JWT, used as is), else
``CQ_AIRFLOW_USER`` and ``CQ_AIRFLOW_PASSWORD`` (exchanged at ``/auth/token``, the simple auth
manager's endpoint), else none (an API server with ``simple_auth_manager_all_admins``). Every failure
is a :class:`CQError` naming the URL and the DAG."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from cq_engine.errors import CQError
from cq_engine.times import iso

TIMEOUT = 30.0
# Already-run firings are run again: a backfill is a recalculation (each firing an idempotent replace).
REPROCESS = "completed"


class AirflowClient:
    """A few calls of Airflow's REST API, authenticated once per client."""

    def __init__(self, url: str, *, env: Mapping[str, str] | None = None):
        url = url if "://" in url else f"http://{url}"
        self.url = url.rstrip("/")
        self.env = os.environ if env is None else env
        self._token: str | None = self.env.get("CQ_AIRFLOW_TOKEN") or None

    def _request(self, method: str, path: str, body: Any = None, *, auth: bool = True) -> Any:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if auth:
            headers.update(self._auth())
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as exc:
            raise _http_error(exc, f"{method} {path}") from None  # the callers name the URL
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CQError(f"API server unreachable ({reason})") from None
        try:
            return json.loads(text) if text else None
        except ValueError:
            raise CQError(f"{method} {path}: not a JSON answer (is {self.url} Airflow's API server?)") from None

    def _auth(self) -> dict[str, str]:
        if self._token is None:
            user, password = self.env.get("CQ_AIRFLOW_USER"), self.env.get("CQ_AIRFLOW_PASSWORD")
            if user and password:
                answer = self._request("POST", "/auth/token", {"username": user, "password": password}, auth=False)
                self._token = (answer or {}).get("access_token")
                if not self._token:
                    raise CQError(f"/auth/token gave no access_token for user {user!r}")
            else:
                self._token = ""
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def get(self, path: str) -> Any:
        """``GET`` of an API path (``/api/v2/...``), the JSON answer."""
        return self._request("GET", path)

    def dag(self, dag_id: str) -> dict:
        return self._request("GET", f"/api/v2/dags/{_quote(dag_id)}")

    def set_paused(self, dag_id: str, *, paused: bool) -> dict:
        return self._request("PATCH", f"/api/v2/dags/{_quote(dag_id)}?update_mask=is_paused", {"is_paused": paused})

    def create_backfill(self, dag_id: str, *, start: datetime, end: datetime, max_active_runs: int = 1) -> dict:
        body = {
            "dag_id": dag_id,
            "from_date": iso(start),
            "to_date": iso(end),
            "reprocess_behavior": REPROCESS,
            "max_active_runs": max_active_runs,
        }
        return self._request("POST", "/api/v2/backfills", body)


def _quote(dag_id: str) -> str:
    from urllib.parse import quote

    return quote(dag_id, safe="")


def _http_error(exc: urllib.error.HTTPError, what: str) -> CQError:
    try:
        detail = json.loads(exc.read().decode() or "null")
        detail = detail.get("detail", detail) if isinstance(detail, dict) else detail
    except (ValueError, OSError):
        detail = exc.reason
    if exc.code == 401:
        hint = "set CQ_AIRFLOW_TOKEN, or CQ_AIRFLOW_USER and CQ_AIRFLOW_PASSWORD"
        return CQError(f"{what}: 401 unauthorized ({detail}): {hint}")
    if exc.code == 403:
        return CQError(f"{what}: 403 forbidden ({detail}): the Airflow user may not do this")
    return CQError(f"{what}: {exc.code} {detail}")


def pause(url: str, dag_id: str, *, paused: bool, env: Mapping[str, str] | None = None) -> dict:
    """Pause or unpause ``dag_id``; the DAG as Airflow reports it afterwards."""
    client = AirflowClient(url, env=env)
    try:
        return client.set_paused(dag_id, paused=paused)
    except CQError as exc:
        raise CQError(f"--via-airflow {client.url}: DAG {dag_id!r}: {exc}") from None


def backfill(url: str, dag_id: str, *, start: datetime, end: datetime, env: Mapping[str, str] | None = None) -> dict:
    """A backfill of ``dag_id`` over the runs whose data interval starts in [start, end]: Airflow's
    answer (``id``, ``from_date``, ``to_date``, ``reprocess_behavior``...)."""
    client = AirflowClient(url, env=env)
    try:
        client.dag(dag_id)  # a 404 names the DAG before anything is created
        return client.create_backfill(dag_id, start=start, end=end)
    except CQError as exc:
        raise CQError(f"--via-airflow {client.url}: DAG {dag_id!r}: {exc}") from None
