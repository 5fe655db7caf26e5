"""Cell upserts: IoTDB's write of a continuous query's firing (README, IoTDB continuous queries).

IoTDB's ``SELECT ... INTO`` writes the non-NULL cells a firing computed and deletes nothing, so a
firing is one Delta MERGE keyed on the time column and the group columns: a row of the result whose
key the sink holds overwrites that row's columns where the result's cell is not NULL (``coalesce``),
a row whose key it lacks is inserted, every other row stays. Restricted to the firing's range on the
target side, so only the files that can hold it are read. One commit, carrying the same idempotent
write identity as a range replace (``txnAppId``/``txnVersion``): a retry on the same source version
is skipped, and a repeated MERGE of the same cells would leave the same table anyway.

``merge_deltars`` commits through delta-rs (``DeltaTable.merge``, its ``TableMerger``);
``merge_spark`` through Spark's Delta connector, as SQL ``MERGE INTO delta.`path` ... USING`` a
temporary view of the result: SQL, not ``delta.tables.DeltaTable``, because a Spark Connect server
answers that API only with Delta's Connect plugin and parses the SQL with the session extension
every engine server has. The DML takes the identity from the session's
``spark.databricks.delta.write.txnAppId``/``txnVersion``.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

import pyarrow as pa

from cq_engine.storage.predicates import _literal, quote_ident

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_SOURCE, _TARGET = "s", "t"
# The session confs a Spark MERGE takes its identity from are the session's: one MERGE sets them at a time.
_SPARK_TXN = threading.Lock()
_TXN_CONFS = ("spark.databricks.delta.write.txnAppId", "spark.databricks.delta.write.txnVersion")
_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def _spark_ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _spark_ts(t: datetime) -> str:
    return "TIMESTAMP " + _literal(t)


def merge_condition(
    time_column: str, keys: Sequence[str], time_range: tuple[datetime, datetime], *, spark: bool
) -> str:
    """The MERGE's ON: the time column equal, the group columns equal or both NULL, and the target
    row in the range (so only the files that can hold it are read)."""
    ident = _spark_ident if spark else quote_ident
    same = "<=>" if spark else "IS NOT DISTINCT FROM"
    lo, hi = time_range
    t, s = f"{_TARGET}.{ident(time_column)}", f"{_SOURCE}.{ident(time_column)}"
    lit = _spark_ts if spark else _literal
    parts = [f"{t} = {s}", f"{t} >= {lit(lo)}", f"{t} < {lit(hi)}"]
    parts += [f"{_TARGET}.{ident(k)} {same} {_SOURCE}.{ident(k)}" for k in keys]
    return " AND ".join(parts)


def cell_updates(columns: Sequence[str], keys: Sequence[str], time_column: str, *, spark: bool) -> dict[str, str]:
    """Target column → its new value: the result's cell where it is not NULL, else the row's own."""
    ident = _spark_ident if spark else quote_ident
    fixed = {time_column.lower(), *(k.lower() for k in keys)}
    return {
        (ident(c) if spark else c): f"coalesce({_SOURCE}.{ident(c)}, {_TARGET}.{ident(c)})"
        for c in columns
        if c.lower() not in fixed
    }


def insert_values(columns: Sequence[str], *, spark: bool) -> dict[str, str]:
    ident = _spark_ident if spark else quote_ident
    return {(ident(c) if spark else c): f"{_SOURCE}.{ident(c)}" for c in columns}


def merge_deltars(
    dt,
    data: pa.Table,
    *,
    time_column: str,
    keys: Sequence[str],
    time_range: tuple[datetime, datetime],
    commit_properties,
    post_commithook_properties,
) -> None:
    """One delta-rs MERGE of ``data`` (already in the table's schema) into the snapshot ``dt``."""
    columns = data.column_names
    merger = dt.merge(
        source=data,
        predicate=merge_condition(time_column, keys, time_range, spark=False),
        source_alias=_SOURCE,
        target_alias=_TARGET,
        commit_properties=commit_properties,
        post_commithook_properties=post_commithook_properties,
    )
    updates = cell_updates(columns, keys, time_column, spark=False)
    if updates:
        merger = merger.when_matched_update(updates=updates)
    merger.when_not_matched_insert(updates=insert_values(columns, spark=False)).execute()


def merge_spark(
    spark: SparkSession,
    path: str,
    frame: DataFrame,
    *,
    time_column: str,
    keys: Sequence[str],
    time_range: tuple[datetime, datetime],
    txn: tuple[str, int] | None,
    metadata: Mapping[str, str],
) -> None:
    """One MERGE of ``frame`` (in the table's schema) into the Delta table at ``path`` by Spark's
    connector, with the idempotent-write identity ``txn`` and the commit's user metadata."""
    columns = frame.columns
    view = f"__cq_upsert_{uuid.uuid4().hex}"
    updates = cell_updates(columns, keys, time_column, spark=True)
    values = insert_values(columns, spark=True)
    statement = (
        f"MERGE INTO delta.{_spark_ident(path)} AS {_TARGET} USING {view} AS {_SOURCE} "
        f"ON {merge_condition(time_column, keys, time_range, spark=True)} "
        + (f"WHEN MATCHED THEN UPDATE SET {', '.join(f'{c} = {v}' for c, v in updates.items())} " if updates else "")
        + f"WHEN NOT MATCHED THEN INSERT ({', '.join(values)}) VALUES ({', '.join(values.values())})"
    )
    with _SPARK_TXN:
        confs = {_USER_METADATA: json.dumps(dict(metadata))}
        if txn is not None:
            confs.update({_TXN_CONFS[0]: txn[0], _TXN_CONFS[1]: str(txn[1])})
        for key, value in confs.items():
            spark.conf.set(key, value)
        frame.createOrReplaceTempView(view)
        try:
            spark.sql(statement).collect()
        finally:
            spark.catalog.dropTempView(view)
            for key in confs:
                spark.conf.unset(key)
