"""One writer of tests/test_s3_commits.py, run as its own process: ``python s3_commit_worker.py MODE
WAREHOUSE WORKER SLOTS``. Each mode commits through the engine's own code, each write then retried once
with the same identity (a run worker whose commit landed but whose answer was lost):

- ``driver``: Arrow results committed by delta-rs from this process (``SparkDeltaStorage``'s small path);
- ``executor``: results written and committed by Spark's executors (a local session, the engine's log store);
- ``ledger``: ledger entries appended, one commit each.

Slot ``k`` of worker ``w`` is the minute ``BASE + (k * 10 + w)``: three rows, ``v = w * 1000 + k``.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta

import pyarrow as pa

BASE = datetime(2026, 1, 1, tzinfo=UTC)
SINK = "s3_sink"


def slot_rows(worker: int, slot: int) -> tuple[tuple[datetime, datetime], pa.Table]:
    lo = BASE + timedelta(minutes=slot * 10 + worker)
    ts = [lo + timedelta(seconds=s) for s in (0, 20, 40)]
    value = float(worker * 1000 + slot)
    table = pa.table({"ts": pa.array(ts, pa.timestamp("us", tz="UTC")), "v": pa.array([value] * 3, pa.float64())})
    return (lo, lo + timedelta(minutes=1)), table


def main(mode: str, warehouse: str, worker: int, slots: int) -> None:
    from cq_engine.storage.spark_delta import SparkDeltaStorage

    if mode == "ledger":
        from cq_engine.storage.delta import DeltaRsStorage
        from cq_engine.storage.ledger import Ledger, LedgerEntry

        ledger = Ledger(store=DeltaRsStorage(warehouse=warehouse))
        for slot in range(slots):
            (lo, hi), _ = slot_rows(worker, slot)
            ledger.record(LedgerEntry(f"w{worker}", "firing", hi, lo, hi, {"src": slot}, 3, None, "succeeded", hi, hi))
        return
    if mode == "executor":
        from cq_engine.config import load_settings
        from cq_engine.spark import local_session

        settings = load_settings(environ={"CQ_WAREHOUSE": warehouse}, config_file="/nonexistent")
        spark = local_session(settings=settings, master="local[1]")
        store = SparkDeltaStorage(warehouse=warehouse, session=lambda: spark, executor_write_bytes=0)
    else:

        def no_session():
            raise AssertionError("the driver path must not need Spark")

        store = SparkDeltaStorage(warehouse=warehouse, session=no_session)
    for slot in range(slots):
        time_range, rows = slot_rows(worker, slot)
        for _attempt in range(2):  # the second: the same identity again, which must add no commit
            store.replace_range(
                SINK,
                rows,
                time_column="ts",
                time_range=time_range,
                app_id=f"cq-engine/w{worker}/firing",
                app_version=slot,
                source_versions={"src": slot},
            )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
