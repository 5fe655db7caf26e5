"""The JVM jars the engine adds to Spark, found in the local Maven repository (``make setup`` fetches
them there with ``mvn dependency:get``), and the Spark confs that enable them.

Jars are passed as files (``spark.jars`` / ``--jars``), not as ``spark.jars.packages`` coordinates: the
ivy resolver would ask remote repositories for parent POMs on every session start, which costs tens of
seconds (minutes offline). Nothing here imports pyspark or starts a JVM.
"""

from __future__ import annotations

import os
from pathlib import Path

# delta-spark 4.0.x is built against Spark 4.0.x / Scala 2.13 (pyspark 4.0.1's jars/).
DELTA_VERSION = "4.0.1"
# hadoop-aws must match pyspark's bundled Hadoop (jars/hadoop-client-api-3.4.1.jar); 3.4.1 declares
# the AWS SDK v2 bundle 2.24.6.
HADOOP_AWS_VERSION = "3.4.1"
AWS_SDK_VERSION = "2.24.6"

DELTA_ARTIFACTS = (f"io.delta:delta-spark_2.13:{DELTA_VERSION}", f"io.delta:delta-storage:{DELTA_VERSION}")
S3A_ARTIFACTS = (
    f"org.apache.hadoop:hadoop-aws:{HADOOP_AWS_VERSION}",
    f"software.amazon.awssdk:bundle:{AWS_SDK_VERSION}",
)

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # Small batch tables: rebuilding a snapshot's state in 50 tasks (the default) dominates a firing.
    "spark.databricks.delta.snapshotPartitions": "2",
    # Engine writes already say which rows they replace; no schema merging behind their back.
    "spark.databricks.delta.schema.autoMerge.enabled": "false",
}


def maven_repo() -> Path:
    """The local Maven repository (``CQ_MAVEN_REPO``, else ``~/.m2/repository``)."""
    return Path(os.environ.get("CQ_MAVEN_REPO") or Path.home() / ".m2" / "repository")


def _jar(coordinate: str) -> Path:
    group, artifact, version = coordinate.split(":")
    return maven_repo().joinpath(*group.split("."), artifact, version, f"{artifact}-{version}.jar")


def jar_paths(artifacts: tuple[str, ...]) -> list[str] | None:
    """The jar files of ``artifacts`` in the local Maven repository, or None if one is missing."""
    paths = [_jar(a) for a in artifacts]
    return [str(p) for p in paths] if all(p.is_file() for p in paths) else None


def missing(artifacts: tuple[str, ...]) -> list[str]:
    return [a for a in artifacts if not _jar(a).is_file()]


def spark_conf(*, delta: bool, s3a: bool = False) -> dict[str, str]:
    """Confs adding the Delta (and, when available and asked for, s3a) jars; {} if Delta's are missing."""
    jars = jar_paths(DELTA_ARTIFACTS) if delta else None
    if jars is None:
        return {}
    extra = jar_paths(S3A_ARTIFACTS) if s3a else None
    return {"spark.jars": ",".join(jars + (extra or [])), **DELTA_CONF}
