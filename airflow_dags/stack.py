"""Airflow's components on one machine, as ``make dev-airflow`` and the stack test start them: the
scheduler (LocalExecutor), the DAG processor, the triggerer and the API server, all on 127.0.0.1, over
the DAG folder ``airflow_dags/dags``. Only builds configuration and command lines (imports no Airflow),
so it is cheap to check."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path

DAGS_FOLDER = Path(__file__).resolve().parent / "dags"
# The order they start in; each is `airflow <name> ...`.
COMPONENTS = ("api-server", "dag-processor", "scheduler", "triggerer")


def airflow_env(
    *, home: Path, port: int, db_url: str, user: str, secret: str, dags_folder: Path = DAGS_FOLDER
) -> dict[str, str]:
    """Airflow's configuration as ``AIRFLOW__*`` variables: every component and each task's process
    gets the same (the JWT secret signs the tasks' execution-API tokens and the REST API's)."""
    base = f"http://127.0.0.1:{port}"
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        # A definition runs once its file is in CQ_SQL_DIR, as under Dagster: not paused at creation.
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        # Each task is a process opening a Spark session: a few at a time on a small machine.
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db_url,
        **_async_conn(db_url),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base}/execution/",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": base,
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__SECRET_KEY": secret,
        "AIRFLOW__API_AUTH__JWT_SECRET": secret,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{user}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        # A changed sql/ shows within seconds; a paused DISCARD DAG's next firing moves past what it missed.
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "10",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
    }


def _async_conn(db_url: str) -> dict[str, str]:
    """PostgreSQL's async connection through psycopg 3 (the cluster extra's), not asyncpg, which
    Airflow assumes by default and nothing here installs."""
    scheme, _, rest = db_url.partition("://")
    if scheme.split("+")[0] in ("postgresql", "postgres"):
        return {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": f"postgresql+psycopg://{rest}"}
    return {}


def write_password(*, home: Path, user: str, password: str) -> Path:
    """The simple auth manager's password file with ``user``'s password (it generates one otherwise)."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / "passwords.json"
    path.write_text(json.dumps({user: password}) + "\n")
    path.chmod(0o600)
    return path


def airflow_bin() -> str:
    return str(Path(sys.executable).parent / "airflow")


def commands(*, port: int) -> dict[str, list[str]]:
    """Each component's command line. The scheduler and the triggerer serve no logs over HTTP (that
    server binds every interface; the API server reads the task logs from AIRFLOW_HOME)."""
    airflow = airflow_bin()
    return {
        "api-server": [airflow, "api-server", "--host", "127.0.0.1", "--port", str(port)],
        "dag-processor": [airflow, "dag-processor"],
        "scheduler": [airflow, "scheduler", "--skip-serve-logs"],
        "triggerer": [airflow, "triggerer", "--skip-serve-logs"],
    }


def migrate_command() -> list[str]:
    return [airflow_bin(), "db", "migrate"]


def cq_env(*, sql_dir: Path, warehouse: str, home: Path, timezone: str = "UTC") -> Mapping[str, str]:
    """The engine's settings the DAG processor and the tasks read (the same as ``cq``'s)."""
    return {"CQ_SQL_DIR": str(sql_dir), "CQ_WAREHOUSE": warehouse, "CQ_HOME": str(home), "CQ_TIMEZONE": timezone}
