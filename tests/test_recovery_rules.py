"""The rules of riding out a fault, without a server: which errors say the Connect server was lost
(``cq_engine.recovery.lost_connection``) and how long a run's advisory calls to the run storage may hold
its rounds (``dagster_defs.batch_run.Advisory``). The servers themselves: tests/test_recovery.py."""

from __future__ import annotations

import threading
import time

from cq_engine.errors import RunError
from cq_engine.recovery import lost_connection
from dagster_defs.batch_run import Advisory


class SparkConnectGrpcException(Exception):  # the name pyspark's client raises under
    pass


def _reported(cause: BaseException) -> RunError:
    """An engine error as a run reports it: one line naming the definition, the cause chained."""
    try:
        raise RunError("t_cq (chaos.sql:3:1): SparkConnectGrpcException") from cause
    except RunError as exc:
        return exc


def test_a_lost_server_is_told_from_a_failing_work_through_the_chain_of_causes():
    unavailable = SparkConnectGrpcException("<_InactiveRpcError: status = StatusCode.UNAVAILABLE>")
    changed = SparkConnectGrpcException("(org.apache.spark.SparkSQLException) [INVALID_HANDLE.SESSION_CHANGED]")
    assert lost_connection(_reported(unavailable))
    assert lost_connection(_reported(changed))
    assert lost_connection(_reported(RuntimeError("[RETRIES_EXCEEDED] The maximum number of retries")))
    # The work's own failures: not a lost server.
    assert not lost_connection(_reported(SparkConnectGrpcException("[UNRESOLVED_COLUMN] `tempx` cannot be resolved")))
    assert not lost_connection(ValueError("division by zero"))


def test_an_advisory_call_gives_its_default_while_the_storage_waits_and_one_at_a_time():
    advise = Advisory(wait=0.2)
    assert advise(lambda: {"a"}, set()) == {"a"}  # answered in time
    release = threading.Event()
    started = time.monotonic()
    assert advise(lambda: release.wait(30) and {"late"}, set()) == set()  # the database is away
    assert time.monotonic() - started < 5
    assert advise(lambda: {"b"}, set()) == set()  # the first is still out: not a second thread
    release.set()
    deadline = time.monotonic() + 10
    while advise(lambda: {"c"}, set()) != {"c"}:  # back once the first returned
        assert time.monotonic() < deadline
        time.sleep(0.05)
