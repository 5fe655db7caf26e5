"""``make dev-airflow`` (``python -m airflow_dags.dev``): Airflow 3 on this machine over the project's
``sql/`` (``CQ_SQL_DIR``): a local Spark Connect server for the tasks (``cq spark start``), then the
scheduler (LocalExecutor), the DAG processor, the triggerer and the API server (UI and REST API) on
127.0.0.1, ``AIRFLOW_HOME`` under ``CQ_HOME`` (``.cq/airflow``), the metadata DB SQLite there, or
``--db`` / ``CQ_AIRFLOW_DB`` (a PostgreSQL URL), and ``cq dev``'s simulated feed of the declared
tables it knows (``--feed-every``; 0: none). Prints the URL and the login; Ctrl-C stops every
process it started. Each component logs to ``AIRFLOW_HOME/logs/<component>.log``."""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cq_engine.cli.devstop import stop_process_group

from . import stack

USER = "admin"


@dataclass(frozen=True)
class Plan:
    """What ``dev`` starts: its environment, the component command lines, the login."""

    home: Path
    url: str
    password: str
    env: dict[str, str]
    commands: dict[str, list[str]]


def plan(*, environ: dict[str, str], port: int, db_url: str | None) -> Plan:
    """The stack for the project the environment (``CQ_*``, cq.toml) describes; writes the login once."""
    from cq_engine.config import load_settings

    settings = load_settings()
    home = Path(settings.home).resolve() / "airflow"
    home.mkdir(parents=True, exist_ok=True)
    db = db_url or environ.get("CQ_AIRFLOW_DB") or f"sqlite:///{home / 'airflow.db'}"
    password = _password(home)
    secret_file = home / "secret"
    if not secret_file.exists():  # kept across restarts: the UI's sessions and tokens stay valid
        secret_file.write_text(secrets.token_hex(16))
        secret_file.chmod(0o600)
    warehouse = settings.warehouse if "://" in settings.warehouse else str(Path(settings.warehouse).resolve())
    env = {
        **{k: v for k, v in environ.items() if not k.startswith("AIRFLOW")},
        **stack.airflow_env(home=home, port=port, db_url=db, user=USER, secret=secret_file.read_text().strip()),
        **stack.cq_env(
            sql_dir=Path(settings.sql_dir).resolve(),
            warehouse=warehouse,
            home=Path(settings.home).resolve(),
            timezone=settings.timezone,
        ),
    }
    return Plan(
        home=home, url=f"http://127.0.0.1:{port}", password=password, env=env, commands=stack.commands(port=port)
    )


def _password(home: Path) -> str:
    """The admin's password: the one already in the password file, else a new one written there."""
    import json

    path = home / "passwords.json"
    if path.exists():
        known = json.loads(path.read_text() or "{}")
        if known.get(USER):
            return str(known[USER])
    password = secrets.token_urlsafe(12)
    stack.write_password(home=home, user=USER, password=password)
    return password


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_dags.dev", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8080, help="the API server's (UI's) port, default 8080")
    parser.add_argument("--db", metavar="URL", help="Airflow's metadata DB (default: CQ_AIRFLOW_DB, else SQLite)")
    parser.add_argument("--no-spark-server", action="store_true", help="each task starts its own Spark")
    parser.add_argument(
        "--feed-every", type=float, default=5.0, metavar="SECONDS", help="the simulated feed's batches (0: no feed)"
    )
    args = parser.parse_args(argv)
    try:
        p = plan(environ=dict(os.environ), port=args.port, db_url=args.db)
    except Exception as exc:  # a broken cq.toml or CQ_HOME: one line
        print(f"dev-airflow: error: {exc}", file=sys.stderr)
        return 1
    if _listening(args.port):
        print(
            f"dev-airflow: error: port {args.port} on 127.0.0.1 is taken: choose another with --port", file=sys.stderr
        )
        return 1
    logs = p.home / "logs"
    logs.mkdir(exist_ok=True)
    procs: dict[str, subprocess.Popen] = {}
    cq = str(Path(sys.executable).parent / "cq")
    spark_started = False
    stop_feed = threading.Event()
    # Ctrl-C, and a SIGTERM too, stop everything (a shell starting this in the background ignores SIGINT).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        print(
            f"dev-airflow: migrating Airflow's metadata DB ({p.env['AIRFLOW__DATABASE__SQL_ALCHEMY_CONN']})", flush=True
        )
        out = subprocess.run(stack.migrate_command(), env=p.env, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"dev-airflow: error: airflow db migrate failed:\n{out.stderr[-2000:]}", file=sys.stderr)
            return 1
        if not args.no_spark_server:
            # A server already running for this CQ_HOME is used, and left running at the end.
            status = subprocess.run([cq, "spark", "status"], env=p.env, capture_output=True, text=True)
            if "running at" not in status.stdout:
                started = subprocess.run([cq, "spark", "start"], env=p.env, capture_output=True, text=True)
                if started.returncode != 0:
                    print(f"dev-airflow: error: cq spark start failed: {started.stderr.strip()}", file=sys.stderr)
                    return 1
                spark_started = True
        fed = feed(every=args.feed_every, stop=stop_feed) if args.feed_every > 0 else []
        for name, cmd in p.commands.items():
            with open(logs / f"{name}.log", "a") as log:
                procs[name] = subprocess.Popen(
                    cmd,
                    env=p.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        while not _listening(args.port) and all(proc.poll() is None for proc in procs.values()):
            time.sleep(1)
        print(
            f"dev-airflow: Airflow UI and API at {p.url} (login {USER} / {p.password}); "
            f"DAGs from {p.env['CQ_SQL_DIR']}; logs in {logs}; "
            + (f"{', '.join(fed)} fed every {args.feed_every:g}s; " if fed else "")
            + "Ctrl-C stops everything",
            flush=True,
        )
        while True:
            for name, proc in procs.items():
                if proc.poll() is not None:
                    print(
                        f"dev-airflow: error: airflow {name} exited ({proc.returncode}); see {logs / name}.log",
                        file=sys.stderr,
                    )
                    return 1
            time.sleep(1)
    except KeyboardInterrupt:
        print("dev-airflow: stopping", flush=True)
        return 0
    except Exception as exc:  # the feed's tables, a trigger's module, Spark: one line, then stop all
        print(f"dev-airflow: error: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C does not cut the stopping short
        stop_feed.set()
        for proc in procs.values():
            stop_process_group(proc, first_signal=signal.SIGTERM, timeout=30)
        if spark_started:
            subprocess.run([cq, "spark", "stop"], env=p.env, capture_output=True)


def feed(*, every: float, stop: threading.Event) -> list[str]:
    """``cq dev``'s simulated feed: the declared tables it knows (sensors, meters...) created, filled
    with the last minutes and appended to every ``every`` seconds until ``stop``; their names."""
    from datetime import UTC, datetime, timedelta

    from cq_engine.cli.dev import feed_forever, seed_start
    from cq_engine.cli.feed import FEEDS, floor_time
    from cq_engine.config import load_settings
    from cq_engine.engine import Engine
    from cq_engine.ingest import ingest

    engine = Engine(settings=load_settings())
    engine.ensure_tables()
    now = floor_time(datetime.now(UTC), timedelta(seconds=5))
    fed = [t.name for t in engine.catalog.tables if t.name in FEEDS]
    for table in fed:
        start = seed_start(engine, table, now=now, backfill=timedelta(minutes=10))
        if start < now:
            ingest(table=table, data=FEEDS[table](start=start, end=now), engine=engine, label="dev-airflow")
        kwargs = {"every": every, "stop": stop, "table": table, "start": max(start, now), "label": "dev-airflow feed"}
        threading.Thread(target=feed_forever, args=(engine,), kwargs=kwargs, daemon=True).start()
    return fed


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


if __name__ == "__main__":
    sys.exit(main())
