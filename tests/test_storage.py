"""DeltaRsStorage against real Delta tables on disk and the shared Spark session."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from cq_engine.errors import AlreadyCommitted, CQError, TableError
from cq_engine.model import Column, SourceLocation, TableDecl
from cq_engine.storage.base import Storage
from cq_engine.storage.delta import DeltaRsStorage, arrow_type, range_predicate

T0 = datetime(2024, 1, 1, tzinfo=UTC)
TS = pa.timestamp("us", tz="UTC")
US = timedelta(microseconds=1)


def decl(name: str, *columns: tuple[str, str]) -> TableDecl:
    return TableDecl(
        name=name,
        columns=tuple(Column(n, t) for n, t in columns),
        time_column="ts",
        if_not_exists=True,
        location=SourceLocation("t.sql", 1, 1),
    )


def rows(times: list[datetime], values: list[float] | None = None, device: str = "d1") -> pa.Table:
    values = values if values is not None else [float(i) for i in range(len(times))]
    return pa.table({"ts": pa.array(times, TS), "device": [device] * len(times), "v": values})


def table_rows(storage: DeltaRsStorage, table: str) -> list[tuple]:
    """All rows through delta-rs' own scan (not Spark), sorted."""
    data = pa.table(DeltaTable(storage.uri(table)).scan())
    return sorted(zip(*(data.column(n).to_pylist() for n in ("ts", "device", "v"))))


def spark_rows(df) -> list[tuple]:
    data = df.toArrow()
    return sorted(zip(*(data.column(n).to_pylist() for n in ("ts", "device", "v"))))


@pytest.fixture
def storage(tmp_path) -> DeltaRsStorage:
    return DeltaRsStorage(warehouse=str(tmp_path / "warehouse"))


@pytest.fixture
def minutes(storage) -> DeltaRsStorage:
    """Table 'm': 30 appends, append i holding 6 rows in minute i (every 10 s)."""
    for i in range(30):
        storage.append(
            "m",
            rows([T0 + timedelta(minutes=i, seconds=10 * k) for k in range(6)], [float(i * 10 + k) for k in range(6)]),
        )
    return storage


def test_arrow_types():
    assert arrow_type("DOUBLE") == pa.float64()
    assert arrow_type("bigint") == arrow_type("long") == pa.int64()
    assert arrow_type("int") == arrow_type("integer") == pa.int32()
    assert arrow_type("smallint") == pa.int16() and arrow_type("tinyint") == pa.int8()
    assert arrow_type("float") == pa.float32() and arrow_type("boolean") == pa.bool_()
    assert arrow_type("varchar(64)") == arrow_type("string") == pa.string()
    assert arrow_type("binary") == pa.binary() and arrow_type("date") == pa.date32()
    assert arrow_type("timestamp") == TS
    assert arrow_type("decimal(10, 2)") == pa.decimal128(10, 2)
    with pytest.raises(TableError, match="unknown column type 'geometry'"):
        arrow_type("geometry")


def test_storage_interface_and_paths(storage):
    implements: Storage = storage  # checked by type checkers against the Protocol
    assert implements.uri("t").endswith("/warehouse/t")
    assert DeltaRsStorage(warehouse="relative/wh").warehouse.startswith("/")


def test_create_append_version_schema(storage):
    d = decl(
        "ln", ("ts", "timestamp"), ("device", "string"), ("v", "double"), ("n", "bigint"), ("price", "decimal(10,2)")
    )
    assert not storage.exists("ln")
    assert storage.create_table(d) is True
    assert storage.exists("ln") and storage.version("ln") == 0
    schema = storage.schema("ln")
    assert schema.names == ["ts", "device", "v", "n", "price"]
    assert schema.field("ts").type == TS and schema.field("price").type == pa.decimal128(10, 2)
    # Columns in another order and a narrower int type are conformed to the table's schema.
    data = pa.table({"v": [1.5], "ts": pa.array([T0], TS), "device": ["a"], "n": pa.array([3], pa.int32())})
    assert storage.append("ln", data, metadata={"source": "test"}) == 1
    assert storage.version("ln") == 1
    assert DeltaTable(storage.uri("ln")).history(1)[0]["source"] == "test"
    assert pa.table(DeltaTable(storage.uri("ln")).scan()).to_pylist() == [
        {"ts": T0, "device": "a", "v": 1.5, "n": 3, "price": None}
    ]


def test_append_creates_missing_table(storage):
    assert storage.append("new", rows([T0])) == 0
    assert storage.schema("new").field("ts").type == TS


def test_create_table_idempotent_and_mismatch(storage):
    d = decl("ln", ("ts", "timestamp"), ("v", "double"), ("n", "bigint"))
    assert storage.create_table(d) is True
    assert storage.create_table(d) is False
    assert storage.create_table(decl("ln", ("TS", "timestamp"), ("v", "double"), ("n", "long"))) is False
    assert storage.version("ln") == 0
    other = decl("ln", ("ts", "timestamp"), ("v", "int"), ("extra", "string"))
    with pytest.raises(TableError) as err:
        storage.create_table(other)
    message = str(err.value)
    assert "table 'ln' exists with a different schema" in message
    assert "column 'v' is double, declared int" in message
    assert "column 'extra' is missing" in message and "column 'n' is not declared" in message


def test_read_range_edges_half_open(spark, storage):
    lo, hi = T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)
    # One file per row, so the millisecond-truncated statistics are exercised at both edges.
    edge_times = [lo - US, lo - timedelta(microseconds=500), lo, lo + timedelta(microseconds=500), hi - US, hi, hi + US]
    for i, t in enumerate(edge_times):
        storage.append("e", rows([t], [float(i)]))
    df, scan = storage.read_range(spark, "e", time_column="ts", time_range=(lo, hi))
    assert [r[0] for r in spark_rows(df)] == [lo, lo + timedelta(microseconds=500), hi - US]
    assert scan.table == "e" and scan.version == 6 and scan.files_total == 7
    # lo - 1us and lo - 500us can only be excluded by the exact filter: their stats truncate to
    # lo - 1 ms, whose 1 ms slack does not reach lo, so both are skipped; hi and hi + 1us are skipped.
    assert scan.files_read == 3


def test_read_range_skips_files(spark, minutes):
    lo, hi = T0 + timedelta(minutes=10), T0 + timedelta(minutes=12)
    df, scan = minutes.read_range(spark, "m", time_column="ts", time_range=(lo, hi))
    got = spark_rows(df)
    assert [r[2] for r in got] == [float(i * 10 + k) for i in (10, 11) for k in range(6)]
    assert scan.files_total == 30 and scan.files_read <= 3
    # An unaligned range touches three minutes.
    lo, hi = lo + timedelta(seconds=30), hi + timedelta(seconds=30)
    df, scan = minutes.read_range(spark, "m", time_column="ts", time_range=(lo, hi))
    assert [r[0] for r in spark_rows(df)] == [lo + timedelta(seconds=10 * k) for k in range(12)]
    assert scan.files_read == 3


def test_read_range_whole_table_version_and_empty(spark, minutes):
    df, scan = minutes.read_range(spark, "m", time_column="ts", time_range=None)
    assert df.count() == 180 and scan.files_read == 30 and scan.version == 29
    df, scan = minutes.read_range(spark, "m", time_column="TS", time_range=None, version=4)
    assert df.count() == 30 and scan.version == 4 and scan.files_total == 5
    far = (T0 + timedelta(days=1), T0 + timedelta(days=2))
    df, scan = minutes.read_range(spark, "m", time_column="ts", time_range=far)
    assert scan.files_read == 0 and df.count() == 0
    assert df.schema.fieldNames() == ["ts", "device", "v"]
    with pytest.raises(TableError, match="has no version 99"):
        minutes.read_range(spark, "m", time_column="ts", time_range=None, version=99)


def test_read_range_errors(spark, storage):
    with pytest.raises(TableError, match=r"table 'nope' does not exist \(create it with CREATE TABLE"):
        storage.read_range(spark, "nope", time_column="ts", time_range=None)
    storage.append("x", rows([T0]))
    with pytest.raises(TableError, match="table 'x' has no time column 'time'"):
        storage.read_range(spark, "x", time_column="time", time_range=None)
    with pytest.raises(TableError, match="table 'x', column 'v' is double, not a timestamp"):
        storage.read_range(spark, "x", time_column="v", time_range=None)
    with pytest.raises(TableError, match="does not exist"):
        storage.version("nope")


def test_range_predicate_syntax():
    predicate = range_predicate("ts", (T0, T0 + timedelta(seconds=1, microseconds=5)))
    assert predicate == ("\"ts\" >= '2024-01-01T00:00:00.000000Z' AND \"ts\" < '2024-01-01T00:00:01.000005Z'")


def test_replace_range_replaces_exactly_and_records_transaction(spark, minutes):
    lo, hi = T0 + timedelta(minutes=5, seconds=10), T0 + timedelta(minutes=7, seconds=20)
    before = table_rows(minutes, "m")
    new = rows([lo, lo + timedelta(seconds=1), hi - US], [-1.0, -2.0, -3.0], device="new")
    version = minutes.replace_range(
        "m", new, time_column="ts", time_range=(lo, hi), app_id="cq:m", app_version=42, metadata={"range": "x"}
    )
    assert version == 30 == minutes.version("m")
    assert minutes.transaction_version("m", "cq:m") == 42
    assert minutes.transaction_version("m", "other") is None
    kept = [r for r in before if not lo <= r[0] < hi]
    assert table_rows(minutes, "m") == sorted(
        [*kept, (lo, "new", -1.0), (lo + timedelta(seconds=1), "new", -2.0), (hi - US, "new", -3.0)]
    )
    assert len(kept) == 180 - 13
    assert DeltaTable(minutes.uri("m")).history(1)[0]["range"] == "x"
    # Running the same replace again leaves the same rows (idempotent firing) and a newer transaction.
    minutes.replace_range("m", new, time_column="ts", time_range=(lo, hi), app_id="cq:m", app_version=43)
    assert len(table_rows(minutes, "m")) == 180 - 13 + 3
    assert minutes.transaction_version("m", "cq:m") == 43
    df, _ = minutes.read_range(spark, "m", time_column="ts", time_range=(lo, hi))
    assert [r[2] for r in spark_rows(df)] == [-1.0, -2.0, -3.0]


def test_replace_range_empty_data_deletes_range(minutes):
    lo, hi = T0, T0 + timedelta(minutes=1)
    minutes.replace_range("m", rows([]), time_column="ts", time_range=(lo, hi), app_id="a", app_version=1)
    assert len(table_rows(minutes, "m")) == 174


def test_replace_range_rejects_rows_outside(minutes):
    lo, hi = T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)
    before = table_rows(minutes, "m")
    for bad in (hi, lo - US):
        with pytest.raises(CQError, match="outside the replaced range"):
            minutes.replace_range(
                "m", rows([lo, bad]), time_column="ts", time_range=(lo, hi), app_id="a", app_version=1
            )
    assert minutes.version("m") == 29 and table_rows(minutes, "m") == before


def test_replace_range_streams_reader_and_casts(minutes):
    lo, hi = T0 + timedelta(minutes=3), T0 + timedelta(minutes=4)
    schema = pa.schema([("ts", TS), ("device", pa.large_string()), ("v", pa.float32())])
    batches = [
        pa.record_batch(
            [
                pa.array([lo + timedelta(seconds=i)], TS),
                pa.array(["r"], pa.large_string()),
                pa.array([float(i)], pa.float32()),
            ],
            schema=schema,
        )
        for i in range(3)
    ]
    reader = pa.RecordBatchReader.from_batches(schema, iter(batches))
    minutes.replace_range("m", reader, time_column="ts", time_range=(lo, hi), app_id="r", app_version=1)
    got = [r for r in table_rows(minutes, "m") if lo <= r[0] < hi]
    assert got == [(lo + timedelta(seconds=i), "r", float(i)) for i in range(3)]


class Boom(Exception):
    pass


def test_replace_range_reader_failure_leaves_table_unchanged(minutes):
    lo, hi = T0 + timedelta(minutes=3), T0 + timedelta(minutes=4)
    before, version = table_rows(minutes, "m"), minutes.version("m")

    def failing():
        yield rows([lo], [1.0]).to_batches()[0]
        raise Boom("lost the Spark connection")

    reader = pa.RecordBatchReader.from_batches(rows([]).schema, failing())
    with pytest.raises(Boom, match="lost the Spark connection"):
        minutes.replace_range("m", reader, time_column="ts", time_range=(lo, hi), app_id="r", app_version=1)

    def out_of_range():
        yield rows([lo], [1.0]).to_batches()[0]
        yield rows([hi], [2.0]).to_batches()[0]

    reader = pa.RecordBatchReader.from_batches(rows([]).schema, out_of_range())
    with pytest.raises(CQError, match="outside the replaced range"):
        minutes.replace_range("m", reader, time_column="ts", time_range=(lo, hi), app_id="r", app_version=1)
    assert minutes.version("m") == version and table_rows(minutes, "m") == before
    assert minutes.transaction_version("m", "r") is None


def test_replace_range_creates_missing_table(storage):
    lo, hi = T0, T0 + timedelta(minutes=1)
    version = storage.replace_range(
        "sink", rows([T0]), time_column="ts", time_range=(lo, hi), app_id="s", app_version=7
    )
    assert storage.exists("sink") and storage.transaction_version("sink", "s") == 7
    assert version == storage.version("sink") and table_rows(storage, "sink") == [(T0, "d1", 0.0)]
    with pytest.raises(TableError, match="no timestamp column 'time'"):
        storage.replace_range("sink2", rows([T0]), time_column="time", time_range=(lo, hi), app_id="s", app_version=7)
    assert not storage.exists("sink2")


def test_replace_range_concurrent_writers_retry(minutes):
    lo, hi = T0 + timedelta(minutes=1), T0 + timedelta(minutes=3)
    errors: list[BaseException] = []
    versions: dict[int, int] = {}

    def writer(n: int) -> None:
        try:
            versions[n] = minutes.replace_range(
                "m",
                rows([lo + timedelta(seconds=n)], [100.0 + n], device=f"w{n}"),
                time_column="ts",
                time_range=(lo, hi),
                app_id=f"w{n}",
                app_version=1,
            )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    in_range = [r for r in table_rows(minutes, "m") if lo <= r[0] < hi]
    # Every writer committed; the last one's replace holds the range alone.
    assert len(in_range) == 1 and in_range[0][1].startswith("w")
    assert minutes.version("m") == 32
    assert sorted(versions.values()) == [30, 31, 32]
    for n, version in versions.items():  # each writer learns its own commit's version
        assert DeltaTable(minutes.uri("m"), version=version).transaction_version(f"w{n}") == 1
        assert DeltaTable(minutes.uri("m"), version=version - 1).transaction_version(f"w{n}") is None


def test_concurrent_streamed_replaces_on_disjoint_ranges_all_land(minutes):
    """Firings stream their output (a RecordBatchReader, not replayable): a commit conflict with a
    concurrent firing of the same sink must still be retried, for disjoint ranges and for the same
    firing run twice."""
    n = 8
    errors: list[BaseException] = []
    barrier = threading.Barrier(n + 2)

    def reader(minute: int, value: float) -> pa.RecordBatchReader:
        data = rows([T0 + timedelta(minutes=minute, seconds=s) for s in (0, 30)], [value, value], device="new")
        return pa.RecordBatchReader.from_batches(data.schema, iter(data.to_batches()))

    def writer(minute: int) -> None:
        try:
            data = reader(minute, 1000.0 + minute)
            barrier.wait()
            minutes.replace_range(
                "m",
                data,
                time_column="ts",
                app_id=f"f{minute}",
                app_version=1,
                time_range=(T0 + timedelta(minutes=minute), T0 + timedelta(minutes=minute + 1)),
            )
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(m,)) for m in range(n)] + [
        threading.Thread(target=writer, args=(3,)) for _ in range(2)
    ]  # the same firing twice more
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    got = table_rows(minutes, "m")
    for m in range(n):
        in_minute = [r for r in got if T0 + timedelta(minutes=m) <= r[0] < T0 + timedelta(minutes=m + 1)]
        assert in_minute == [(T0 + timedelta(minutes=m, seconds=s), "new", 1000.0 + m) for s in (0, 30)]
    assert len(got) == 6 * 30 - 6 * n + 2 * n


def test_unsafe_rename_on_an_s3_warehouse_is_said_once(monkeypatch, caplog):
    """delta-rs commits on S3 with a conditional PUT unless AWS_S3_ALLOW_UNSAFE_RENAME asks for its
    rename backend: the engine says so once, and not for a local warehouse."""
    from cq_engine.config import load_settings
    from cq_engine.storage import factory

    monkeypatch.setattr(factory, "_warned", set())
    monkeypatch.setenv("AWS_S3_ALLOW_UNSAFE_RENAME", "true")
    local = load_settings(environ={"CQ_STORAGE": "deltars", "CQ_WAREHOUSE": "/tmp/wh"}, config_file="/nonexistent")
    s3 = load_settings(environ={"CQ_STORAGE": "deltars", "CQ_WAREHOUSE": "s3://b/wh"}, config_file="/nonexistent")
    with caplog.at_level("WARNING", logger="cq_engine.storage"):
        factory.make_storage(local, session=lambda: None)
        assert not caplog.records
        for _ in range(2):
            factory.make_storage(s3, session=lambda: None)
    assert [r.getMessage() for r in caplog.records if "AWS_S3_ALLOW_UNSAFE_RENAME" in r.getMessage()] == [
        caplog.records[0].getMessage()
    ]
    assert "conditional PUT" in caplog.records[0].getMessage()


# -- a firing committed once (upsert_cells(once=True)) ------------------------------------------------
def _points(values: list, *, start: datetime = T0) -> pa.Table:
    return pa.table(
        {
            "ts": pa.array([start + timedelta(seconds=i) for i in range(len(values))], pa.timestamp("us", tz="UTC")),
            "device": ["d1"] * len(values),
            "v": pa.array(values, pa.float64()),
        }
    )


def _upsert(
    s: DeltaRsStorage, values: list, version: int, *, start: datetime = T0, span: timedelta = timedelta(minutes=1), **kw
) -> int:
    return s.upsert_cells(
        "sink",
        _points(values, start=start),
        time_column="ts",
        keys=("device",),
        time_range=(start, start + span),
        app_id="cq-engine/q/firing#abc",
        app_version=version,
        **kw,
    )


def _values(s: DeltaRsStorage) -> list[float]:
    return DeltaTable(s.uri("sink")).to_pyarrow_table().sort_by("ts").column("v").to_pylist()


def test_a_firing_committed_once_is_refused_to_a_second_run_and_to_an_earlier_firing(tmp_path):
    first, other = DeltaRsStorage(warehouse=str(tmp_path)), DeltaRsStorage(warehouse=str(tmp_path))
    v = _upsert(first, [1.0, 2.0], 100, once=True)
    for version in (100, 50):  # the same firing, or one before the last committed, by another process
        with pytest.raises(AlreadyCommitted) as err:
            _upsert(other, [9.0, 9.0], version, once=True)
        assert err.value.version == v and "cq-engine/q/firing#abc" in str(err.value)
    assert DeltaTable(first.uri("sink")).version() == v
    assert _values(first) == [1.0, 2.0]
    assert _upsert(other, [3.0], 200, once=True) == v + 1  # the next firing commits
    assert _upsert(other, [4.0], 100) == v + 2  # without once (a recalculation) it always writes


def test_a_firing_a_concurrent_writer_commits_first_is_skipped_after_the_conflict(tmp_path):
    from cq_engine.storage.upsert import merge_deltars

    winner, loser = DeltaRsStorage(warehouse=str(tmp_path)), DeltaRsStorage(warehouse=str(tmp_path))
    base = _upsert(winner, [0.0], 1, once=True)
    calls: list[int] = []

    def race(dt, data, **kw):  # the winner commits the same firing between the loser's check and commit
        calls.append(dt.version())
        if len(calls) == 1:
            _upsert(winner, [1.0, 2.0], 100, once=True)
        merge_deltars(dt, data, **kw)

    with pytest.raises(AlreadyCommitted) as err:
        loser._upsert(
            "sink",
            _points([9.0, 9.0]),
            time_column="ts",
            keys=("device",),
            time_range=(T0, T0 + timedelta(minutes=1)),
            app_id="cq-engine/q/firing#abc",
            app_version=100,
            metadata=None,
            txn=("cq-engine/q/firing#abc", 100),
            once=True,
            merge=race,
        )
    # delta-rs refused the commit (ConcurrentTransaction); the second attempt saw the winner's identity.
    assert calls == [base] and err.value.version == base + 1
    assert _values(winner) == [1.0, 2.0]


def test_a_warmed_sink_is_committed_without_opening_or_reading_its_log_again(tmp_path, monkeypatch):
    from conftest import record_paths

    from cq_engine.storage import log

    writer = DeltaRsStorage(warehouse=str(tmp_path))
    for version in (100, 200):
        _upsert(writer, [1.0], version, once=True)
    runner = DeltaRsStorage(warehouse=str(tmp_path))  # another process: nothing known of the sink yet
    runner.warm("sink", app_id="cq-engine/q/firing#abc")
    runner.warm("missing")  # not created yet: nothing to open
    assert not runner.exists("missing")
    opened = []
    real = DeltaTable.__init__

    def counting(self, *args, **kwargs):
        opened.append(args[0] if args else kwargs.get("table_uri"))
        real(self, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "__init__", counting)
    reads = record_paths(monkeypatch, log, "_read")
    assert _upsert(runner, [2.0], 300, once=True) == 3
    # Its snapshot was kept by warm (no load) and its txn map read by it (no commit read by name).
    assert opened == [] and reads == []
    with pytest.raises(AlreadyCommitted):
        _upsert(DeltaRsStorage(warehouse=str(tmp_path)), [9.0], 300, once=True)


def test_an_upsert_into_a_range_no_file_holds_is_a_replace_and_merges_where_rows_are(tmp_path):
    s = DeltaRsStorage(warehouse=str(tmp_path))

    def upsert(offset: float, values: list, version: int) -> str:
        start = T0 + timedelta(seconds=offset)
        _upsert(s, values, version, start=start, span=timedelta(seconds=10), once=True)
        return DeltaTable(s.uri("sink")).history(1)[0]["operation"]

    assert upsert(0, [1.0, 2.0], 1) == "WRITE"  # the table's creation
    assert upsert(10.0004, [3.0], 2) == "WRITE"  # [10.0004 s, 20.0004 s): no file holds a row there
    # The same range again: a MERGE, whose NULL cell keeps the row's value and whose new row is added.
    assert upsert(0, [None, 5.0, 6.0], 3) == "MERGE"
    # [10.0002 s, ...) holds the row at 10.0004 s, which a file's statistics may keep as 10.000 s (Delta
    # truncates them to milliseconds): still a MERGE, so that row stays.
    assert upsert(10.0002, [8.0], 4) == "MERGE"
    table = DeltaTable(s.uri("sink")).to_pyarrow_table().sort_by("ts")
    offsets = [round((t - T0).total_seconds(), 4) for t in table.column("ts").to_pylist()]
    assert list(zip(offsets, table.column("v").to_pylist())) == [
        (0, 1.0),
        (1, 5.0),
        (2, 6.0),
        (10.0002, 8.0),
        (10.0004, 3.0),
    ]


# -- a state row appended once (append_state(once=...)) ---------------------------------------------
def test_a_state_row_appended_once_is_appended_by_one_of_two_writers_even_at_the_same_moment(tmp_path, monkeypatch):
    """Two runs of one PERIOD tick record its %%trows versions: the first append stands, the second
    (after it, or racing it) appends nothing and says so, so both read the first's row."""
    from cq_engine.storage import state

    def row(until: int) -> pa.Table:
        return pa.table({"tick": pa.array([5], pa.int64()), "until": pa.array([until], pa.int64())})

    a, b = DeltaRsStorage(warehouse=str(tmp_path)), DeltaRsStorage(warehouse=str(tmp_path))
    assert a.append_state("ticks", row(1), once=("t", 5)) is True
    assert b.append_state("ticks", row(2), once=("t", 5)) is False  # after it
    assert b.append_state("ticks", row(3), once=("t", 4)) is False  # an earlier one, after a later
    assert b.append_state("ticks", row(4)) is True  # without once: always
    assert sorted(b.read_state("ticks").column("until").to_pylist()) == [1, 4]

    # At the same moment: both have checked the table before either commits.
    barrier, real = threading.Barrier(2), state.write_deltalake
    monkeypatch.setattr(state, "write_deltalake", lambda *args, **kw: (barrier.wait(timeout=60), real(*args, **kw))[1])
    results: list[bool] = []
    writers = [
        threading.Thread(target=lambda s=s, u=u: results.append(s.append_state("ticks", row(u), once=("t", 6))))
        for s, u in ((a, 10), (b, 20))
    ]
    for t in writers:
        t.start()
    for t in writers:
        t.join(timeout=120)
    assert sorted(results) == [False, True]
    untils = sorted(a.read_state("ticks").column("until").to_pylist())
    assert untils in ([1, 4, 10], [1, 4, 20]), untils
