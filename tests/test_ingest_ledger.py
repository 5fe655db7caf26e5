"""Reading and conforming input files, and the firing ledger, on real files and Delta tables."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cq_engine.config import Settings
from cq_engine.errors import CQError, TableError
from cq_engine.ingest import conform, read_input
from cq_engine.storage.delta import DeltaRsStorage
from cq_engine.storage.ledger import Ledger, LedgerEntry

SHANGHAI = ZoneInfo("Asia/Shanghai")
TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema(
    [
        pa.field("ts", TS),
        pa.field("device", pa.string()),
        pa.field("temperature", pa.float64()),
        pa.field("status", pa.bool_()),
    ]
)
T = datetime(2021, 5, 11, 14, 18, 40, tzinfo=UTC)  # 2021-05-11T22:18:40+08:00


def ln(data: pa.Table, tz=SHANGHAI) -> pa.Table:
    return conform(data, SCHEMA, table="ln", time_column="ts", tz=tz)


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_csv_time_formats_and_types(tmp_path):
    path = write(
        tmp_path,
        "ln.csv",
        "TS,Device,temperature\n"
        "2021-05-11T22:18:40+08:00,001,36.5\n"  # offset
        "2021-05-11 22:18:41,002,\n"  # naive: Asia/Shanghai
        "1620742722000,003,37\n"  # epoch milliseconds
        "2021-05-11T14:18:43.250Z,004,-1e1\n",
    )
    out = ln(read_input(path))
    assert out.schema == SCHEMA
    assert out.column("ts").to_pylist() == [
        T,
        T + timedelta(seconds=1),
        T + timedelta(seconds=2),
        T + timedelta(seconds=3, milliseconds=250),
    ]
    # CSV values are read as text, so leading zeros survive into a string column.
    assert out.column("device").to_pylist() == ["001", "002", "003", "004"]
    assert out.column("temperature").to_pylist() == [36.5, None, 37.0, -10.0]
    assert out.column("status").to_pylist() == [None] * 4


def test_jsonl_time_formats(tmp_path):
    lines = [
        {"ts": "2021-05-11T22:18:40+08:00", "device": "a", "temperature": 1, "status": True},
        {"ts": "2021-05-11T22:18:41", "device": "b", "temperature": 2.5},
        {"ts": "2021-05-11T14:18:42.5Z", "device": "c"},
    ]
    for ext in (".jsonl", ".json", ".ndjson"):
        path = write(tmp_path, "ln" + ext, "\n".join(json.dumps(line) for line in lines) + "\n")
        out = ln(read_input(path))
        assert out.column("ts").to_pylist() == [T, T + timedelta(seconds=1), T + timedelta(seconds=2, milliseconds=500)]
        assert out.column("temperature").to_pylist() == [1.0, 2.5, None]
        assert out.column("status").to_pylist() == [True, None, None]
    path = write(tmp_path, "ms.jsonl", '{"ts": 1620742720000, "temperature": 3}\n')
    assert ln(read_input(path)).column("ts").to_pylist() == [T]


def test_parquet_timestamps(tmp_path):
    naive = pa.table(
        {
            "ts": pa.array([datetime(2021, 5, 11, 22, 18, 40)], pa.timestamp("ms")),
            "temperature": pa.array([1.0], pa.float32()),
        }
    )
    aware = pa.table({"ts": pa.array([T], pa.timestamp("ns", tz="Asia/Shanghai")), "device": ["x"]})
    pq.write_table(naive, tmp_path / "naive.parquet")
    pq.write_table(aware, tmp_path / "aware.parquet")
    assert ln(read_input(str(tmp_path / "naive.parquet"))).column("ts").to_pylist() == [T]
    assert ln(read_input(str(tmp_path / "naive.parquet")), tz=UTC).column("ts").to_pylist() == [T + timedelta(hours=8)]
    out = ln(read_input(str(tmp_path / "aware.parquet")))
    assert out.column("ts").to_pylist() == [T] and out.schema == SCHEMA


def test_bad_values_and_columns(tmp_path):
    bad = write(tmp_path, "bad.csv", "ts,temperature\n" + "2021-05-11T22:18:40,1\n" * 50 + "2021-05-11T22:18:40,abc\n")
    with pytest.raises(TableError, match="table 'ln', column 'temperature': cannot read 'abc' as double"):
        ln(read_input(bad))
    bad_time = write(tmp_path, "bad_time.csv", "ts,temperature\n2021-05-11T22:18:40,1\nyesterday,2\n")
    with pytest.raises(TableError, match="table 'ln', column 'ts': cannot read 'yesterday' as timestamp"):
        ln(read_input(bad_time))
    unknown = write(tmp_path, "unknown.csv", "ts,humidity\n2021-05-11T22:18:40,1\n")
    with pytest.raises(TableError, match="table 'ln' has no column 'humidity'"):
        ln(read_input(unknown))
    no_time = write(tmp_path, "no_time.csv", "device,temperature\na,1\n")
    with pytest.raises(TableError, match="table 'ln': the data has no time column 'ts'"):
        ln(read_input(no_time))
    missing_time = write(tmp_path, "missing_time.csv", "ts,temperature\n2021-05-11T22:18:40,1\n,2\n")
    with pytest.raises(TableError, match="table 'ln', column 'ts': row 2 has no value"):
        ln(read_input(missing_time))
    with pytest.raises(TableError, match="cannot read 'maybe' as boolean"):
        ln(pa.table({"ts": ["2021-05-11T22:18:40"], "status": ["maybe"]}))
    with pytest.raises(TableError, match="cannot read 300 as tinyint"):
        conform(
            pa.table({"ts": [1620742720000], "n": [300]}),
            pa.schema([("ts", TS), ("n", pa.int8())]),
            table="t",
            time_column="ts",
            tz=UTC,
        )


def test_non_finite_numbers_and_far_epochs_are_refused(tmp_path):
    # 1e400 overflows a double to inf: refused, naming row, column and value; NaN/Infinity spelled out are kept.
    path = write(tmp_path, "big.csv", "ts,temperature\n2021-05-11T22:18:40,1\n2021-05-11T22:18:41,1e400\n")
    with pytest.raises(TableError, match=r"column 'temperature': row 2 holds '1e400', which is not a finite number"):
        ln(read_input(path))
    path = write(tmp_path, "named.csv", "ts,temperature\n2021-05-11T22:18:40,NaN\n2021-05-11T22:18:41,-Infinity\n")
    values = ln(read_input(path)).column("temperature").to_pylist()
    assert values[0] != values[0] and values[1] == float("-inf")
    path = write(tmp_path, "big.jsonl", '{"ts": "2021-05-11T22:18:40", "temperature": 1e400}\n')
    with pytest.raises(CQError, match=r"big\.jsonl: cannot read the file: .*Number too big"):  # Arrow refuses it
        ln(read_input(path))
    # Epoch seconds read as milliseconds would land in 1970; microseconds in the year 53000.
    now = datetime(2026, 11, 23, tzinfo=UTC)
    for value, unit in ((1620742720, "seconds"), (1620742720000000, "microseconds")):
        path = write(tmp_path, "epoch.csv", f"ts,temperature\n1620742720000,1\n{value},2\n")
        message = (
            rf"column 'ts': row 2 holds {value}, which as epoch milliseconds is "
            rf".*more than 30 years from now \(as epoch {unit} it would be 2021-05-11"
        )
        with pytest.raises(TableError, match=message):
            conform(read_input(path), SCHEMA, table="ln", time_column="ts", tz=UTC, now=now)
    assert ln(pa.table({"ts": [1620742720000]})).column("ts").to_pylist() == [T]


def test_ingest_refuses_an_empty_file_and_names_it(tmp_path):
    from cq_engine.engine import Engine
    from cq_engine.ingest import ingest

    sql = tmp_path / "sql"
    sql.mkdir()
    (sql / "t.sql").write_text("CREATE TABLE ln (ts TIMESTAMP, temperature DOUBLE);")
    engine = Engine(settings=Settings(sql_dir=str(sql), warehouse=str(tmp_path / "wh"), home=str(tmp_path / ".cq")))
    for name, text, message in (
        (
            "header.csv",
            "ts,temperature\n",
            r"the file holds no rows \(a header only\?\); "
            "nothing was written to 'ln'",
        ),
        ("empty.jsonl", "", "Empty JSON file"),
        ("empty.csv", "", "no header row"),
    ):
        path = write(tmp_path, name, text)
        with pytest.raises(CQError, match=rf"{name}: .*{message}"):
            ingest(table="ln", data=path, engine=engine)
    assert engine.storage.version("ln") == 0  # created empty by its declaration, no empty commit after
    bad = write(tmp_path, "bad.csv", "ts,temperature\n2021-05-11T22:18:40,1e999\n")
    with pytest.raises(TableError, match=rf"^{bad}: table 'ln', column 'temperature': row 1 holds '1e999'"):
        ingest(table="ln", data=bad, engine=engine)
    assert (
        ingest(
            table="ln", data=write(tmp_path, "ok.csv", "ts,temperature\n2021-05-11T22:18:40,1\n"), engine=engine
        ).rows
        == 1
    )


def test_read_input_errors(tmp_path):
    with pytest.raises(CQError, match=r"data\.xlsx: unknown file type '\.xlsx'"):
        read_input(str(tmp_path / "data.xlsx"))
    with pytest.raises(CQError, match=r"missing\.csv: cannot read the file"):
        read_input(str(tmp_path / "missing.csv"))
    broken = write(tmp_path, "broken.parquet", "not parquet")
    with pytest.raises(CQError, match=r"broken\.parquet: cannot read the file"):
        read_input(broken)
    broken = write(tmp_path, "broken.jsonl", "{not json\n")
    with pytest.raises(CQError, match=r"broken\.jsonl: cannot read the file"):
        read_input(broken)


def test_ingested_data_appends_to_a_declared_table(tmp_path):
    storage = DeltaRsStorage(warehouse=str(tmp_path / "wh"))
    storage.append("ln", pa.Table.from_pylist([], schema=SCHEMA))
    path = write(tmp_path, "ln.csv", "ts,temperature\n2021-05-11T22:18:40+08:00,1.5\n")
    data = conform(read_input(path), storage.schema("ln"), table="ln", time_column="ts", tz=SHANGHAI)
    assert storage.append("ln", data) == 1


def entry(definition: str, minute: int, *, status: str = "succeeded", **changes) -> LedgerEntry:
    start = T + timedelta(minutes=minute)
    values = dict(
        definition=definition,
        kind="firing",
        fire_time=start + timedelta(seconds=20),
        range_start=start - timedelta(seconds=40),
        range_end=start,
        source_versions={"ln": minute},
        rows_written=minute * 2,
        sink_version=minute,
        status=status,
        started_at=start,
        finished_at=start + timedelta(seconds=1),
    )
    values.update(changes)
    return LedgerEntry(**values)


def test_ledger_record_and_read(tmp_path):
    settings = Settings(warehouse=str(tmp_path / "wh"))
    ledger = Ledger(store=DeltaRsStorage(warehouse=settings.warehouse))
    assert ledger.entries() == [] and ledger.last("cq1") is None and ledger.last_by_definition() == {}
    assert ledger.to_arrow().num_rows == 0
    # Recorded out of order; read back ordered by started_at.
    ledger.record(entry("cq1", 2))
    ledger.record(entry("cq1", 1))
    ledger.record(entry("cq2", 0, status="failed", error="boom", sink_version=None, rows_written=0))
    shanghai_start = (T + timedelta(minutes=3)).astimezone(SHANGHAI)
    ledger.record(entry("cq2", 3, kind="recalculate", fire_time=None, started_at=shanghai_start))
    assert (tmp_path / "wh" / "_cq" / "firings" / "_delta_log").is_dir()
    assert [(e.definition, e.started_at) for e in ledger.entries()] == [
        ("cq2", T),
        ("cq1", T + timedelta(minutes=1)),
        ("cq1", T + timedelta(minutes=2)),
        ("cq2", T + timedelta(minutes=3)),
    ]
    assert ledger.entries("cq1") == [entry("cq1", 1), entry("cq1", 2)]
    assert ledger.last("cq1") == entry("cq1", 2)
    last = ledger.last_by_definition()
    assert set(last) == {"cq1", "cq2"}
    assert last["cq2"].kind == "recalculate" and last["cq2"].fire_time is None
    assert last["cq2"].started_at.tzinfo == UTC and last["cq2"].source_versions == {"ln": 3}
    failed = ledger.entries("cq2")[0]
    assert failed.status == "failed" and failed.error == "boom" and failed.sink_version is None
    assert ledger.last("nope") is None
    table = ledger.to_arrow()
    assert table.num_rows == 4 and json.loads(table.column("source_versions")[0].as_py())["ln"] in range(4)


def test_ledger_entry_validation():
    with pytest.raises(CQError, match="kind 'run'"):
        entry("cq", 0, kind="run")
    with pytest.raises(CQError, match="status 'ok'"):
        entry("cq", 0, status="ok")
    with pytest.raises(CQError, match="started_at must be a timezone-aware time"):
        entry("cq", 0, started_at=datetime(2021, 5, 11))
