"""``Storage`` through Spark's own Delta connector (delta-spark): the default wherever Spark has its jars.

Sources with reader features (deletion vectors, column mapping) are read with
``spark.read.format("delta")`` at the pinned version with the range filter, so Delta applies them;
sources without any are read as the parquet files of the snapshot delta-rs has open (the same rows,
without delta-spark replaying the log in the JVM). A large result (``writes_frame``), or any result
for a sink delta-rs cannot write (deletion vectors, column mapping, other writer features), is written
by Spark's executors with ``replaceWhere`` in one commit; a small one, or one already in Arrow, is
committed by delta-rs from this process (``executor_write_bytes`` = 0: the executors write them all).
Both may write one table, from any number of processes: on an object store each claims a version
with one conditional PUT (delta-rs natively, Spark through the engine's log store, ``jars.LOGSTORE_CLASS``),
so the store itself orders their commits (ARCHITECTURE.md, Commits on an object store).
With the run's source versions given, either commit carries the idempotent-write identity
``txnAppId``/``txnVersion``, so a retried run on unchanged inputs adds no second commit.
Metadata (exists, schema, version, table creation) and the log reads the sensors make stay on delta-rs (``DeltaRsStorage``, the base class): they need no JVM. Engine state tables (ledger,
frontier, outbox) are not written through this class at all and stay on delta-rs: they are small,
written by the Dagster process itself, and must be readable where no Spark session exists (sensors).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake.exceptions import DeltaError

from cq_engine.errors import CQError
from cq_engine.storage import log
from cq_engine.storage.base import ArrowData, Scan, TimeRange
from cq_engine.storage.delta import (
    COMMIT_ID_KEY,
    MAX_ATTEMPTS,
    DeltaRsStorage,
    _cast_to,
    _check_in_range,
    kept_bytes,
    range_mask,
    snapshot_columns,
    where_in_range,
)
from cq_engine.storage.maintain import Retention, TableReport, delete_files, maintain_table, vacuum_due
from cq_engine.storage.predicates import _range_bounds, range_predicate

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

LOG = logging.getLogger(__name__)
# delta-spark's optimistic-concurrency failures: another writer committed first; the write is redone.
_CONFLICT = re.compile(r"Concurrent(Append|DeleteRead|DeleteDelete|Transaction|Write)Exception|DELTA_CONCURRENT")
_MISMATCH = re.compile(
    r"DELTA_REPLACE_WHERE_MISMATCH|DELTA_VIOLATE_CONSTRAINT"
    r"|does not conform to partial table overwrite condition"
)
# Reader features a plain parquet read of the data files would get wrong.
_NEEDS_DELTA_READ = {"deletionVectors", "columnMapping"}


# A comparison of an identifier with a ``storage.predicates`` timestamp literal, as ``spark_predicate`` emits it.
_TS_COMPARISON = re.compile(r"(`(?:[^`]|``)+`)(\s*(?:>=|<=|<>|!=|=|<|>)\s*)$")
_TS_LITERAL = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def spark_predicate(predicate: str, *, timestamp_columns: frozenset[str] = frozenset()) -> str:
    """A ``storage.predicates`` (delta-rs SQL) predicate in Spark SQL: "ident" becomes `ident`;
    single-quoted literals are left alone, except a timestamp literal compared with one of
    ``timestamp_columns`` (lower-case names of timezone-aware timestamp columns), which becomes
    ``TIMESTAMP '...'``. Same rows either way, but delta-spark checks every written row against a
    ``replaceWhere`` condition without folding constants: a string literal is parsed again per row
    (write_heavy: 5,184,000 rows written in about 23 s instead of 8)."""
    out: list[str] = []
    i = 0
    while i < len(predicate):
        ch = predicate[i]
        if ch in "'\"":
            j = i + 1
            while j < len(predicate):
                if predicate[j] == ch and predicate[j + 1 : j + 2] == ch:
                    j += 2
                    continue
                if predicate[j] == ch:
                    break
                j += 1
            body = predicate[i + 1 : j]
            if ch == "'":
                compared = _TS_COMPARISON.search("".join(out[-8:])) if _TS_LITERAL.fullmatch(body) else None
                typed = compared and compared.group(1)[1:-1].replace("``", "`").lower() in timestamp_columns
                out.append(f"TIMESTAMP '{body}'" if typed else f"'{body}'")
            else:
                out.append("`" + body.replace('""', '"').replace("`", "``") + "`")
            i = j + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


class SparkDeltaStorage(DeltaRsStorage):
    """Delta tables under ``warehouse`` read and written by Spark's Delta connector; ``session``
    gives the Spark session for writes of Arrow data (a DataFrame brings its own)."""

    def __init__(
        self,
        *,
        warehouse: str,
        session: Callable[[], SparkSession],
        storage_options: dict[str, str] | None = None,
        executor_write_bytes: int = 16 * 1024 * 1024,
    ):
        super().__init__(warehouse=warehouse, storage_options=storage_options)
        self._session = session
        self.executor_write_bytes = executor_write_bytes
        # table -> can delta-rs write it, as of the last snapshot this process wrote on or opened
        self._delta_rs_writable: dict[str, bool] = {}

    def writes_frame(self, table: str, *, input_bytes: int) -> bool:
        """Is a Spark result computed from ``input_bytes`` of input (-1: unknown) handed to
        ``replace_range`` as a DataFrame, for the executors to write? If not, the caller collects it
        and it is committed from this process by delta-rs: a result of less input than
        ``executor_write_bytes`` (a firing's few rows; a Spark write costs several jobs) into a table
        delta-rs can write."""
        small = 0 <= input_bytes < self.executor_write_bytes
        return not (small and self._driver_writes(table))

    def _driver_writes(self, table: str) -> bool:
        """Are Arrow data for ``table`` committed by delta-rs (rather than handed to the executors)?
        Asked of the log once per table and process, then answered from memory: a firing asks at
        plan time, and on an object store every look at the log is a request. The commit checks the
        snapshot it writes on (``_check_delta_rs_writes``), so a table whose protocol changed since
        goes to Spark's connector there."""
        if self.executor_write_bytes == 0:
            return False
        known = self._delta_rs_writable.get(table)
        if known is None:
            dt = self._open_existing(table)
            if dt is None:
                return True  # not created yet: delta-rs creates it
            known = self._delta_rs_writable[table] = _delta_rs_writes(dt)
            self.open_tables.give(self.uri(table), dt, storage_options=self.storage_options)  # for the write
        return known

    def _warmed(self, table: str, dt) -> None:
        if self.executor_write_bytes:
            self._delta_rs_writable.setdefault(table, _delta_rs_writes(dt))

    def _check_delta_rs_writes(self, table: str, dt) -> None:
        ok = self._delta_rs_writable[table] = _delta_rs_writes(dt)
        if not ok:
            self.open_tables.give(self.uri(table), dt, storage_options=self.storage_options)
            raise _SparkWrites(table)

    def spark_uri(self, table: str) -> str:
        # Hadoop's S3 connector (what Spark reads with) answers to s3a://, delta-rs to s3://.
        uri = self.uri(table)
        return "s3a://" + uri[5:] if uri.startswith("s3://") else uri

    # -- reads ------------------------------------------------------------------------------------

    def read_range(
        self,
        spark: SparkSession,
        table: str,
        *,
        time_column: str,
        time_range: TimeRange | None,
        version: int | None = None,
    ) -> tuple[DataFrame, Scan]:
        """Rows with ``time_column`` in ``time_range`` (None: all rows) at a pinned version, read by
        delta-spark (data skipping on the range filter; deletion vectors and column mapping honoured).
        ``Scan`` counts the files whose statistics overlap the range (what Delta's skipping reads).
        A table without reader features (no deletion vectors, no column mapping) is read as its
        parquet files, listed from the snapshot delta-rs already has open: the same rows without
        delta-spark replaying the log in the JVM (seconds per firing on a fresh session)."""
        with self._snapshot(table, version) as dt:
            if not _reader_features(dt):
                return self._read_snapshot(spark, table, dt, time_column, time_range)
            column = self._time_field(table, dt, time_column)
            df = spark.read.format("delta").option("versionAsOf", dt.version()).load(self.spark_uri(table))
            actions = log.arrow_table(dt.get_add_actions(flatten=True))
            mask = range_mask(actions, column, time_range)
            return where_in_range(df, column, time_range), Scan(
                table=table,
                version=dt.version(),
                files_total=actions.num_rows,
                files_read=sum(mask),
                columns=snapshot_columns(dt),
                bytes_read=kept_bytes(actions, mask),
            )

    def read_added(
        self,
        spark: SparkSession,
        table: str,
        *,
        after: int,
        until: int,
        time_column: str,
    ) -> tuple[DataFrame, Scan]:
        """``DeltaRsStorage.read_added``; for a table with deletion vectors or column mapping, the rows
        of version ``until`` (read by delta-spark) that lie in the files those commits added."""
        from pyspark.sql import functions as F

        with self._snapshot(table, until) as dt:
            features = _reader_features(dt)
            if _NEEDS_DELTA_READ & features:
                self._time_field(table, dt, time_column)
        if not _NEEDS_DELTA_READ & features:
            return super().read_added(spark, table, after=after, until=until, time_column=time_column)
        commits = self.read_commits(table, after=after, until=until, time_column=time_column)
        names = list(dict.fromkeys(f.path.rsplit("/", 1)[-1] for c in commits for f in c.added))
        df = spark.read.format("delta").option("versionAsOf", until).load(self.spark_uri(table))
        df = df.where(F.element_at(F.split(F.col("_metadata.file_path"), "/"), -1).isin(names))
        return df, Scan(table=table, version=until, files_total=len(names), files_read=len(names))

    # -- writes -----------------------------------------------------------------------------------

    def replace_range(
        self,
        table: str,
        data: ArrowData | DataFrame,
        *,
        time_column: str,
        time_range: TimeRange,
        app_id: str,
        app_version: int,
        metadata: Mapping[str, str] | None = None,
        source_versions: Mapping[str, int] | None = None,
    ) -> int:
        """Replace the rows with ``time_column`` in ``time_range`` by ``data`` (Arrow, or a Spark
        DataFrame written by the executors) in one commit. Rows outside the range are a ``CQError``."""
        lo, hi = _range_bounds(time_range)

        def check_for(column: str) -> Callable[[pa.Table], None]:
            return lambda part: _check_in_range(table, column, part.column(column), lo, hi)

        return self._write(
            table,
            data,
            predicate_for=lambda column: range_predicate(column, (lo, hi)),
            check_for=check_for,
            time_column=time_column,
            app_id=app_id,
            app_version=app_version,
            metadata=metadata,
            source_versions=source_versions,
            outside=f"outside the replaced range [{lo.isoformat()}, {hi.isoformat()})",
        )

    def replace_where(
        self,
        table: str,
        data: ArrowData | DataFrame,
        *,
        predicate: str,
        time_column: str,
        app_id: str,
        app_version: int,
        metadata: Mapping[str, str] | None = None,
        check: Callable[[pa.RecordBatch | pa.Table], None] | None = None,
        source_versions: Mapping[str, int] | None = None,
        once: bool = False,
    ) -> int:
        """Replace the rows matching ``predicate`` (``storage.predicates`` SQL) by ``data`` in one
        commit; ``check`` sees Arrow data (cast to the table's schema) before it is written;
        ``once`` as ``Storage.replace_where``'s."""
        return self._write(
            table,
            data,
            predicate_for=lambda _column: predicate,
            check_for=lambda _column: check,
            time_column=time_column,
            app_id=app_id,
            app_version=app_version,
            metadata=metadata,
            source_versions=source_versions,
            outside=f"not matching the replaced rows' condition {predicate}",
            once=once,
        )

    def _write(
        self,
        table: str,
        data,
        *,
        predicate_for,
        check_for,
        time_column: str,
        app_id: str,
        app_version: int,
        metadata: Mapping[str, str] | None,
        source_versions: Mapping[str, int] | None,
        outside: str,
        once: bool = False,
    ) -> int:
        arrow = not hasattr(data, "sparkSession")
        txn = (app_id, app_version) if once else _txn(app_id, app_version, source_versions)
        if arrow and self._driver_writes(table):
            # The rows are in this process already: shipping them to the JVM to write them there
            # only adds Spark jobs. delta-rs commits them with the same idempotent-write identity.
            with contextlib.suppress(_SparkWrites):  # its protocol changed since: Spark writes it
                return self._replace(
                    table,
                    data,
                    predicate_for=predicate_for,
                    check_for=check_for,
                    time_column=time_column,
                    app_id=app_id,
                    app_version=app_version,
                    metadata=metadata,
                    txn=txn,
                    once=once,
                )
        if isinstance(data, pa.RecordBatchReader):
            data = data.read_all()
        dt = self._open_or_create(table, lambda: data.schema if arrow else arrow_schema(data), time_column=time_column)
        if once and self._already_written(table, dt, txn):
            return self._skipped(table, dt, txn, once=once)  # Delta would skip it: no Spark job
        column = self._time_field(table, dt, time_column)
        target = pa.schema(dt.schema().to_arrow())
        if arrow:
            data = _cast_to(table, data, target)
            check = check_for(column)
            if check is not None:
                check(data)
            if data.num_rows:
                frame = self._session().createDataFrame(data)
            else:  # nothing to add (a tick without rows): Connect infers no schema from zero rows
                from pyspark.sql.pandas.types import from_arrow_schema

                frame = self._session().createDataFrame([], schema=from_arrow_schema(data.schema))
        else:
            frame = _spark_cast(table, data, target)
        commit_id = uuid.uuid4().hex
        stamps = frozenset(f.name.lower() for f in target if pa.types.is_timestamp(f.type) and f.type.tz)
        writer = (
            frame.write.format("delta")
            .mode("overwrite")
            .option("replaceWhere", spark_predicate(predicate_for(column), timestamp_columns=stamps))
            .option("userMetadata", json.dumps({**(metadata or {}), COMMIT_ID_KEY: commit_id}))
        )
        if txn is not None:
            writer = writer.option("txnAppId", txn[0]).option("txnVersion", str(txn[1]))
        for attempt in range(MAX_ATTEMPTS):
            try:
                writer.save(self.spark_uri(table))
                break
            except Exception as exc:  # pyspark raises py4j / Connect / analysis types here
                text = str(exc)
                if _MISMATCH.search(text):
                    raise CQError(f"table '{table}': rows to write on '{column}' are {outside}") from None
                if not _CONFLICT.search(text) or attempt == MAX_ATTEMPTS - 1:
                    raise
                LOG.info("table %s: concurrent commit, retrying the write (%d)", table, attempt + 1)
                time.sleep(0.05 * (attempt + 1))
                if once and self._written_meanwhile(table, dt, txn):
                    return self._skipped(table, dt, txn, once=once)
        self.open_tables.give(self.uri(table), dt, storage_options=self.storage_options)
        return self._committed_version(table, commit_id)

    def upsert_cells(
        self,
        table: str,
        data: ArrowData | DataFrame,
        *,
        time_column: str,
        keys: tuple[str, ...],
        time_range: TimeRange,
        app_id: str,
        app_version: int,
        metadata: Mapping[str, str] | None = None,
        source_versions: Mapping[str, int] | None = None,
        once: bool = False,
    ) -> int:
        """IoTDB's write of a firing (``storage.upsert``): the non-NULL cells of ``data`` overwrite or
        add the sink's rows keyed on ``time_column`` and ``keys``; nothing is deleted. One MERGE
        commit with Delta's idempotent-write identity (as ``replace_range``'s; ``once``: the
        application transaction itself, ``Storage.upsert_cells``): by delta-rs for Arrow data into a
        table it can write (the identity checked and recorded as delta-spark does), else by Spark's
        connector, the executors writing."""
        from cq_engine.storage.upsert import merge_deltars, merge_spark

        arrow = not hasattr(data, "sparkSession")
        txn = (app_id, app_version) if once else _txn(app_id, app_version, source_versions)
        if arrow and self._driver_writes(table):
            with contextlib.suppress(_SparkWrites):  # its protocol changed since: Spark writes it
                return self._upsert(
                    table,
                    data,
                    time_column=time_column,
                    keys=keys,
                    time_range=time_range,
                    app_id=app_id,
                    app_version=app_version,
                    metadata=metadata,
                    txn=txn,
                    once=once,
                    merge=merge_deltars,
                )
        lo, hi = _range_bounds(time_range)
        if isinstance(data, pa.RecordBatchReader):
            data = data.read_all()
        dt = self._open_or_create(table, lambda: data.schema if arrow else arrow_schema(data), time_column=time_column)
        if self._already_written(table, dt, txn):
            return self._skipped(table, dt, txn, once=once)  # Delta's skip, checked here: no Spark job
        column = self._time_field(table, dt, time_column)
        target = pa.schema(dt.schema().to_arrow())
        if arrow:
            arrow_data = _cast_to(table, data, target)
            assert isinstance(arrow_data, pa.Table)  # a reader was read whole above
            _check_in_range(table, column, arrow_data.column(column), lo, hi)
            if not arrow_data.num_rows:  # no cells: an empty commit records the run's identity, as delta-rs's
                from pyspark.sql.pandas.types import from_arrow_schema

                empty = self._session().createDataFrame([], schema=from_arrow_schema(arrow_data.schema))
                writer = empty.write.format("delta").mode("append")
                if txn is not None:
                    writer = writer.option("txnAppId", txn[0]).option("txnVersion", str(txn[1]))
                commit_id = uuid.uuid4().hex
                writer.option("userMetadata", json.dumps({**(metadata or {}), COMMIT_ID_KEY: commit_id})).save(
                    self.spark_uri(table)
                )
                return self._committed_version(table, commit_id)
            frame = self._session().createDataFrame(arrow_data)
        else:
            frame = _spark_cast(table, data, target)
        commit_id = uuid.uuid4().hex
        names = {f.name.lower(): f.name for f in target}
        spark = frame.sparkSession
        for attempt in range(MAX_ATTEMPTS):
            try:
                merge_spark(
                    spark,
                    self.spark_uri(table),
                    frame,
                    time_column=column,
                    keys=[names.get(k.lower(), k) for k in keys],
                    time_range=(lo, hi),
                    txn=txn,
                    metadata={**(metadata or {}), COMMIT_ID_KEY: commit_id},
                )
                break
            except Exception as exc:  # pyspark raises py4j / Connect / analysis types here
                if not _CONFLICT.search(str(exc)) or attempt == MAX_ATTEMPTS - 1:
                    raise
                LOG.info("table %s: concurrent commit, retrying the merge (%d)", table, attempt + 1)
                time.sleep(0.05 * (attempt + 1))
                if self._written_meanwhile(table, dt, txn):
                    return self._skipped(table, dt, txn, once=once)
        self.open_tables.give(self.uri(table), dt, storage_options=self.storage_options)
        return self._committed_version(table, commit_id)

    def _written_meanwhile(self, table: str, dt, txn: tuple[str, int] | None) -> bool:
        """After a conflict: does the table, brought up to date, hold ``txn`` (the winner may have
        written this identity, which Delta would skip)?"""
        if txn is None:
            return False
        dt.update_incremental()
        return self._already_written(table, dt, txn)

    def _commit_matches(self, commit: dict, commit_id: str) -> bool:
        return commit_id in str(commit.get("userMetadata", "")) or super()._commit_matches(commit, commit_id)

    def maintain(self, table: str, *, retention: Retention) -> TableReport:
        """``storage.maintain.maintain_table`` with Spark as the committer of the data path: properties by
        ``ALTER TABLE ... SET TBLPROPERTIES`` and compaction by ``OPTIMIZE`` in Spark SQL; VACUUM's files
        found by delta-rs and deleted without a commit (Spark SQL's ``VACUUM ... RETAIN n HOURS`` where
        delta-rs cannot read the table); the checkpoint and the log cleanup (no commit) by delta-rs.
        A table whose small commits delta-rs makes anyway (``executor_write_bytes`` > 0 and a table
        delta-rs can write) is maintained by delta-rs alone: Spark's OPTIMIZE reads small files one
        by one in one task (2,000 took over 7 minutes on the busy 2-core machine; delta-rs: a second)."""
        if self._driver_writes(table):
            return super().maintain(table, retention=retention)
        path = self.spark_uri(table).replace("`", "``")

        def sql(text: str) -> list:
            for attempt in range(MAX_ATTEMPTS):
                try:
                    return self._session().sql(text).collect()
                except Exception as exc:  # a concurrent writer won: Delta's conflict rules, redone
                    if not _CONFLICT.search(str(exc)) or attempt == MAX_ATTEMPTS - 1:
                        raise
                    time.sleep(0.05 * (attempt + 1))
            raise AssertionError("unreachable")

        def set_properties(props: dict[str, str]) -> None:
            pairs = ", ".join(f"'{k}' = '{v}'" for k, v in props.items())
            sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({pairs})")

        def compact(_dt) -> int:
            rows = sql(f"OPTIMIZE delta.`{path}`")
            metrics = rows[0]["metrics"] if rows else None
            return int(metrics["numFilesRemoved"]) if metrics is not None else 0

        def vacuum(dt) -> int:
            # delta-rs finds what is due (Spark's VACUUM lists and joins every file in Spark jobs: minutes
            # for a few thousand small files on a busy machine) and the files are deleted without a
            # commit; Spark SQL when delta-rs cannot read it.
            try:
                due = vacuum_due(dt, retention)
            except DeltaError:
                hours = math.ceil(retention.files.total_seconds() / 3600)
                due = sql(f"VACUUM delta.`{path}` RETAIN {hours} HOURS DRY RUN")
                if due:
                    sql(f"VACUUM delta.`{path}` RETAIN {hours} HOURS")
                return len(due)
            return delete_files(self.uri(table), due, self.storage_options)

        return maintain_table(
            self.uri(table),
            name=table,
            retention=retention,
            storage_options=self.storage_options,
            compact=compact,
            vacuum=vacuum,
            set_properties=set_properties,
        )

    def rows_written(self, table: str, version: int) -> int:
        """``numOutputRows`` of the commit at ``version`` (0 if that commit wrote none); a MERGE's
        rows inserted and updated (its output also counts the rows it copied)."""
        for commit in self._open(table).history(limit=100):
            if int(commit.get("version", -1)) == version:
                metrics = commit.get("operationMetrics") or {}
                if "numTargetRowsInserted" in metrics:
                    return int(metrics["numTargetRowsInserted"]) + int(metrics.get("numTargetRowsUpdated", 0))
                return int(metrics.get("numOutputRows", 0))
        return 0


def _reader_features(dt) -> set[str]:
    """The snapshot's reader features; reader version 2 is column mapping without a feature list."""
    protocol = dt.protocol()
    return set(protocol.reader_features or ()) | ({"columnMapping"} if protocol.min_reader_version == 2 else set())


# Writer features delta-rs (deltalake 1.x) honours when it writes; any other, and deletion vectors or
# column mapping on the read side, leave the table's writes to delta-spark.
_DELTA_RS_WRITER_FEATURES = {"appendOnly", "invariants", "checkConstraints", "timestampNtz"}


class _SparkWrites(Exception):
    """A table delta-rs cannot write: the write goes to Spark's connector."""


def _delta_rs_writes(dt) -> bool:
    """Can delta-rs write this snapshot's table exactly as delta-spark would?"""
    protocol = dt.protocol()
    if _NEEDS_DELTA_READ & _reader_features(dt):
        return False
    if protocol.min_writer_version < 7:
        return protocol.min_writer_version <= 3  # 4+: change data feed, generated columns, column mapping
    return set(protocol.writer_features or ()) <= _DELTA_RS_WRITER_FEATURES


def _txn(app_id: str, app_version: int, source_versions: Mapping[str, int] | None) -> tuple[str, int] | None:
    """Delta's idempotent-write identity: one application id per run range, versioned by the source
    version, so a retry on the same snapshot is skipped by Delta and a rerun after new source data
    (a higher version) is written. Without source versions (or with several) no skipping is asked for."""
    if not source_versions or len(source_versions) != 1:
        return None
    ((name, version),) = source_versions.items()
    return f"{app_id}@{app_version}/{name}", int(version)


def arrow_schema(frame: DataFrame) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    # Spark's TimestampType is an instant: Arrow's UTC timestamp, as the engine's tables hold them.
    return to_arrow_schema(frame.schema, timezone="UTC")


def _spark_cast(table: str, frame: DataFrame, schema: pa.Schema) -> DataFrame:
    """``frame`` with exactly ``schema``'s columns (matched case-insensitively) in its types."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_type

    from cq_engine.storage.base import align_columns

    names = frame.columns
    cols = []
    for field, i in align_columns(names, schema, table=table):
        spark_type = from_arrow_type(field.type)
        source = F.lit(None) if i is None else F.col(f"`{names[i]}`")
        cols.append(source.cast(spark_type).alias(field.name))
    return frame.select(*cols)
