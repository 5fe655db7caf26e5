"""A run rides out the deployment's transient faults instead of failing (``make chaos-test`` runs these
first; docs/operations/guarantees.md, *Faults on the deployed topology*), each against the real server
started here on 127.0.0.1:

- the engine's Spark Connect server SIGKILLed and started again keeps its token, and a run's firing in
  flight carries on through a new session once it answers (``cq_engine.recovery.SparkRecovery``);
- PostgreSQL stopped for 40 s under a Dagster run: the run waits for its events to be written and
  finishes without a failure event (``dagster_defs.pgstorage``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from netutil import free_port
from test_cluster import PG_BIN, Cluster

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parent.parent

# A firing of a continuous query through the Connect server whose JVM the parent kills and starts
# again: the child reports each step on stdout and waits for the parent's go-ahead in a file.
FIRING = textwrap.dedent(
    """
    import json, queue, sys, time
    from datetime import UTC, datetime, timedelta
    from pathlib import Path

    import pyarrow as pa

    from cq_engine.config import load_settings
    from cq_engine.engine import Engine
    from cq_engine.resample.rounds import execute_rounds

    go = Path(sys.argv[1])
    engine = Engine(settings=load_settings())
    engine.ensure_tables()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [{"ts": start + timedelta(seconds=10 * i), "device": "d1", "temperature": float(i)} for i in range(12)]
    engine.storage.append("sensors", pa.Table.from_pylist(rows, schema=pa.schema(
        [("ts", pa.timestamp("us", "UTC")), ("device", pa.string()), ("temperature", pa.float64())])))

    def fire(at):
        out = queue.Queue()
        execute_rounds(engine, {"t_cq": [at]}, {}, out)
        seen = []
        while not out.empty():
            kind, d, when, value = out.get()
            seen.append([kind, str(value)[:300]])
        return seen

    print(json.dumps({"first": fire(start + timedelta(minutes=1))}), flush=True)
    while not go.exists():  # the parent kills the server now
        time.sleep(0.2)
    print(json.dumps({"second": fire(start + timedelta(minutes=2))}), flush=True)
    print(json.dumps({"count": engine.spark.range(3).count()}), flush=True)
    """
)
DEFINITION = """\
CREATE TABLE IF NOT EXISTS sensors (ts TIMESTAMP, device STRING, temperature DOUBLE);
CREATE CONTINUOUS QUERY t_cq RESAMPLE EVERY 1m BEGIN
  SELECT max_value(temperature) AS temperature_max, count(temperature) AS samples INTO t_cq FROM sensors GROUP BY (1m), device
END;
"""


def test_a_firing_carries_on_through_a_connect_server_killed_and_started_again(tmp_path):
    from cq_engine.config import Settings
    from cq_engine.spark import server_status, server_token, start_server, stop_server

    settings = Settings(home=str(tmp_path / ".cq"), spark_port=free_port())
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "t.sql").write_text(DEFINITION)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "CQ_", "AWS_"))},
        "CQ_HOME": settings.home,
        "CQ_SPARK_PORT": str(settings.spark_port),
        "CQ_SQL_DIR": str(tmp_path / "sql"),
        "CQ_WAREHOUSE": str(tmp_path / "warehouse"),
        "CQ_CONFIG": str(tmp_path / "no-cq.toml"),
        "PYTHONPATH": str(REPO),
    }
    go = tmp_path / "go"
    child = None
    try:
        start_server(settings)
        token = server_token(settings)
        child = subprocess.Popen(
            [sys.executable, "-c", FIRING, str(go)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        first = json.loads(child.stdout.readline() or "{}")
        assert [kind for kind, _ in first.get("first", [])] == ["ok"], (first, child.stderr.read()[-3000:])
        os.kill(server_status(settings).pid or 0, signal.SIGKILL)
        go.touch()  # the second firing starts against the dead server
        time.sleep(15)
        start_server(settings)  # what `cq dev`'s supervisor and `cq spark start` do after a crash
        assert server_token(settings) == token, "a server started again after a crash keeps its token"
        out, err = child.communicate(timeout=400)
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        second = next(line["second"] for line in lines if "second" in line)
        # No failure reported: the firing ran again through a new session once the server answered.
        assert [kind for kind, _ in second] == ["ok"], (second, err[-3000:])
        assert {"count": 3} in lines, err[-3000:]
        assert child.returncode == 0, err[-3000:]
    finally:
        if child is not None and child.poll() is None:
            child.kill()
        stop_server(settings)
    assert not Path(settings.home, "spark", "connect.token").exists(), "a clean stop retires the token"


def test_a_run_finishes_without_a_failure_when_postgresql_is_away_for_40_seconds(tmp_path):
    if not (PG_BIN / "initdb").is_file():
        pytest.fail(f"PostgreSQL is not installed ({PG_BIN}/initdb): run `make cluster-setup`")
    import dagster as dg
    from dagster import DagsterEventType, DagsterInstance

    cluster = Cluster(tmp_path)
    try:
        cluster.start_postgres()
        home = tmp_path / "dagster_home"
        home.mkdir()
        # The Deployment page's storage block (docs/operations/deployment.md), on this test's port.
        block = cluster.local(cluster.blocks[4][1])
        storage = block.split("run_coordinator:", 1)[0]
        (home / "dagster.yaml").write_text(storage + "telemetry:\n  enabled: false\n")

        @dg.op
        def tick(context):  # an event a second for a minute
            for i in range(60):
                context.log.info(f"tick {i}")
                time.sleep(1)

        @dg.job(executor_def=dg.in_process_executor)  # as the engine's runs: steps in the run's process
        def ticking():
            tick()

        instance = DagsterInstance.from_config(str(home))
        outage = threading.Thread(target=_stop_for, args=(cluster, instance, 40.0), daemon=True)
        outage.start()
        result = ticking.execute_in_process(instance=instance, raise_on_error=False)
        outage.join(timeout=300)
        run_id = result.run_id
        failures = [
            e
            for e in instance.all_logs(run_id)
            if e.dagster_event
            and e.dagster_event.event_type in (DagsterEventType.RUN_FAILURE, DagsterEventType.STEP_FAILURE)
        ]
        assert result.success and not failures, [e.message for e in failures]
        ticks = [e for e in instance.all_logs(run_id) if e.user_message.startswith("tick ")]
        assert len(ticks) == 60, len(ticks)  # every event written, those of the outage after it
        assert instance.get_run_by_id(run_id).status.value == "SUCCESS"
    finally:
        cluster.stop()


def _stop_for(cluster: Cluster, instance, seconds: float) -> None:
    """Once the run has started, stop PostgreSQL for ``seconds``, then start it again."""
    from dagster import DagsterRunStatus, RunsFilter

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.STARTED]), limit=1):
            break
        time.sleep(0.5)
    time.sleep(3)
    subprocess.run(cluster.pg_stop, capture_output=True, check=True)
    time.sleep(seconds)
    cluster._run(cluster.pg_start)
