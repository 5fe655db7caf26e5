"""Commits on an object store are coordinated for several writers (ARCHITECTURE.md, Commits on an object
store): delta-rs and the engine's Delta log store for Spark both claim a version with one PUT carrying
``If-None-Match: *``, so processes committing to one table at once lose no commit and double none.

Real moto S3 server on 127.0.0.1, real delta-rs, a real local Spark with hadoop-aws and delta-spark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netutil import free_port, port_open

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

HERE = Path(__file__).parent
BIN = Path(sys.executable).parent
BUCKET = "cq-commits"
CREDS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
}


@pytest.fixture
def s3(tmp_path, monkeypatch):
    """A moto S3 server with one bucket; the AWS variables every process of the test reads."""
    port = free_port()
    log = open(tmp_path / "moto.log", "w")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 60
        while not port_open(port):
            assert time.monotonic() < deadline and server.poll() is None, (tmp_path / "moto.log").read_text()
            time.sleep(0.2)
        env = {**CREDS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("AWS_S3_ALLOW_UNSAFE_RENAME", raising=False)
        import boto3

        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def _log_actions(client, prefix: str) -> dict[int, list[dict]]:
    """Every commit of the table at ``prefix``, by version: its actions as written."""
    commits: dict[int, list[dict]] = {}
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{prefix}/_delta_log/")
    for page in pages:
        for obj in page.get("Contents", []):
            name = obj["Key"].rsplit("/", 1)[-1]
            if name.endswith(".json") and name[:-5].isdigit():
                body = client.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read().decode()
                commits[int(name[:-5])] = [json.loads(line) for line in body.splitlines() if line.strip()]
    return commits


def test_writers_in_several_processes_lose_no_commit_and_double_none(s3, tmp_path):
    from deltalake import DeltaTable
    from s3_commit_worker import SINK, slot_rows

    from cq_engine.storage.delta import DeltaRsStorage
    from cq_engine.storage.ledger import Ledger

    warehouse = f"s3://{BUCKET}/wh"
    slots = 6
    # The sink exists before the writers race: its creation (version 0) and a first firing (version 1).
    (lo, hi), rows = slot_rows(9, 99)
    DeltaRsStorage(warehouse=warehouse).replace_range(
        SINK, rows, time_column="ts", time_range=(lo, hi), app_id="cq-engine/setup/firing", app_version=0
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)])}
    workers = {  # worker number -> mode: two delta-rs committers, Spark's executors, two ledger writers
        0: "driver",
        1: "driver",
        2: "executor",
        3: "ledger",
        4: "ledger",
    }
    procs = {
        w: subprocess.Popen(
            [sys.executable, str(HERE / "s3_commit_worker.py"), mode, warehouse, str(w), str(slots)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for w, mode in workers.items()
    }
    outputs = {w: p.communicate(timeout=900)[0] for w, p in procs.items()}
    for w, p in procs.items():
        assert p.returncode == 0, f"worker {w} ({workers[w]}) failed:\n{outputs[w][-4000:]}"

    # Every write is there once: each slot holds exactly its three rows, nothing else is in the sink.
    sink = DeltaTable(f"{warehouse}/{SINK}").to_pyarrow_table().sort_by([("ts", "ascending")])
    expected = [slot_rows(9, 99)[1]] + [
        slot_rows(w, k)[1] for w, mode in workers.items() if mode != "ledger" for k in range(slots)
    ]
    want = sorted((r["ts"], r["v"]) for t in expected for r in t.to_pylist())
    assert sorted((r["ts"], r["v"]) for r in sink.to_pylist()) == want

    # One commit per write: versions 0..N without a gap, and each idempotent-write identity in exactly
    # one of them (the retry of a landed write was skipped, by delta-rs and by Spark alike).
    commits = _log_actions(s3, f"wh/{SINK}")
    writes = 2 + 3 * slots
    shown = {
        v: [next(iter(a)) for a in acts] + [a["txn"]["appId"] for a in acts if "txn" in a]
        for v, acts in commits.items()
    }
    assert sorted(commits) == list(range(writes)), shown
    txns = [a["txn"]["appId"] for actions in commits.values() for a in actions if "txn" in a]
    ids = [t for t in txns if "@" in t]  # the source-versioned identity (the other names the definition)
    assert len(ids) == len(set(ids)) == 3 * slots, ids
    engines = {
        v: next(
            a["commitInfo"].get("engineInfo", "") or a["commitInfo"].get("clientVersion", "")
            for a in acts
            if "commitInfo" in a
        )
        for v, acts in commits.items()
    }
    assert sum("Apache-Spark" in e for e in engines.values()) == slots, engines  # the executor worker's
    assert sum("delta-rs" in e for e in engines.values()) == 2 + 2 * slots, engines

    # The ledger: every entry of both writers once.
    entries = Ledger(store=DeltaRsStorage(warehouse=warehouse)).entries()
    keys = sorted((e.definition, e.source_versions["src"]) for e in entries)
    assert keys == sorted((f"w{w}", k) for w, mode in workers.items() if mode == "ledger" for k in range(slots))


def test_sparks_commit_is_one_conditional_put(s3, tmp_path):
    """Why Spark's commits need the engine's log store: Delta's own S3 store checks for the version file
    and then writes it, and a plain create on S3 overwrites what another writer put in between; the
    engine's store claims the version with a conditional PUT that the store refuses."""
    from cq_engine.config import load_settings
    from cq_engine.jars import LOGSTORE_CLASS
    from cq_engine.spark import local_session

    settings = load_settings(environ={"CQ_WAREHOUSE": f"s3://{BUCKET}/wh"}, config_file="/nonexistent")
    spark = local_session(settings=settings, master="local[1]")
    try:
        assert spark.conf.get("spark.delta.logStore.s3a.impl") == LOGSTORE_CLASS
        jvm, conf = spark._jvm, spark._jsc.hadoopConfiguration()

        def race(key: str, create) -> bytes:
            path = jvm.org.apache.hadoop.fs.Path(f"s3a://{BUCKET}/{key}")
            out = create(path)
            out.write(bytearray(b'{"ours":1}\n'))
            s3.put_object(Bucket=BUCKET, Key=key, Body=b'{"theirs":1}\n')  # another writer wins the version
            try:
                out.close()
            except Exception as exc:
                assert "pre-conditions" in str(exc) or "412" in str(exc), exc
            return s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()

        fs = jvm.org.apache.hadoop.fs.Path(f"s3a://{BUCKET}/").getFileSystem(conf)
        # Delta's S3SingleDriverLogStore writes with create(path, overwrite=false): the other commit is lost.
        assert race("plain/_delta_log/00000000000000000001.json", lambda p: fs.create(p, False)) == b'{"ours":1}\n'
        conditional = (
            lambda p: fs.createFile(p).overwrite(False).must("fs.option.create.conditional.overwrite", True).build()
        )
        assert race("cond/_delta_log/00000000000000000001.json", conditional) == b'{"theirs":1}\n'

        # The log store turns the refused PUT into Delta's "version taken" signal, so Delta retries on top.
        store = jvm.io.cqengine.ConditionalPutLogStore(conf)
        taken = jvm.org.apache.hadoop.fs.Path(f"s3a://{BUCKET}/cond/_delta_log/00000000000000000001.json")
        lines = jvm.java.util.ArrayList()
        lines.add('{"mine":1}')
        with pytest.raises(Exception, match=r"java\.nio\.file\.FileAlreadyExistsException"):
            store.write(taken, lines.iterator(), False, conf)
        assert (
            s3.get_object(Bucket=BUCKET, Key="cond/_delta_log/00000000000000000001.json")["Body"].read()
            == b'{"theirs":1}\n'
        )
    finally:
        spark.stop()


def test_s3a_reads_through_the_classic_stream_that_keeps_nothing_per_object(s3, tmp_path):
    """hadoop-aws 3.5 reads through the S3 analytics accelerator by default, which keeps an entry for
    every distinct object a file system has read until the file system closes (HADOOP-20058): a Spark
    JVM's heap then grows with every commit it reads. The engine's sessions read through the classic
    stream (docs/operations/spark-and-storage.md)."""
    from cq_engine.config import load_settings
    from cq_engine.spark import local_session

    s3.put_object(Bucket=BUCKET, Key="objs/a.json", Body=b'{"a":1}\n')
    settings = load_settings(environ={"CQ_WAREHOUSE": f"s3://{BUCKET}/wh"}, config_file="/nonexistent")
    spark = local_session(settings=settings, master="local[1]")
    try:
        jvm, conf = spark._jvm, spark._jsc.hadoopConfiguration()
        path = jvm.org.apache.hadoop.fs.Path(f"s3a://{BUCKET}/objs/a.json")

        def stream_class(configuration) -> str:
            fs = jvm.org.apache.hadoop.fs.FileSystem.newInstance(path.toUri(), configuration)
            try:
                stream = fs.open(path)
                try:
                    assert stream.read() == ord("{")
                    return stream.getWrappedStream().getClass().getName()
                finally:
                    stream.close()
            finally:
                fs.close()

        assert conf.get("fs.s3a.input.stream.type") == "classic"
        assert stream_class(conf) == "org.apache.hadoop.fs.s3a.S3AInputStream"
        default = jvm.org.apache.hadoop.conf.Configuration(conf)
        default.unset("fs.s3a.input.stream.type")
        assert "Analytics" in stream_class(default)  # what hadoop-aws would use without the setting
    finally:
        spark.stop()


def test_compactions_racing_on_the_object_store_keep_every_row_once(s3):
    # storage.maintain's claim on S3: its empty commits are conditional PUTs like any other.
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake
    from test_compaction import compact_in_rounds, race

    uri = f"s3://{BUCKET}/compacted"
    for i in range(6):
        write_deltalake(uri, pa.table({"i": [i]}), mode="append")
    workers, rounds = 3, 5
    race(compact_in_rounds, uri, rounds, workers=workers)  # the children read the fixture's AWS variables
    data = pa.RecordBatchReader.from_stream(DeltaTable(uri).scan()).read_all()
    assert sorted(data["i"].to_pylist()) == sorted(
        [*range(6), *(1000 * w + r for w in range(workers) for r in range(rounds))]
    )
    commits = _log_actions(s3, "compacted")
    optimized = [
        v for v, acts in commits.items() if any(a.get("commitInfo", {}).get("operation") == "OPTIMIZE" for a in acts)
    ]
    assert optimized, sorted(commits)
