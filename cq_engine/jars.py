"""The JVM jars the engine adds to Spark, found in the local Maven repository (``make setup`` fetches
them there with ``mvn dependency:get``), and the Spark confs that enable them.

Jars are passed as files (``spark.jars`` / ``--jars``), not as ``spark.jars.packages`` coordinates: the
ivy resolver would ask remote repositories for parent POMs on every session start, which costs tens of
seconds (minutes offline). Nothing here imports pyspark or starts a JVM.
"""

from __future__ import annotations

import argparse
import os
from functools import cache
from importlib.metadata import version
from pathlib import Path

# hadoop-aws must match pyspark's bundled Hadoop (its jars/hadoop-client-api-<version>.jar;
# tests/test_jars.py checks), and the AWS artifacts are the ones that hadoop-aws version's pom names:
# 3.5.0 (pyspark 4.2) needs the S3 analytics accelerator too (a Delta load fails with
# NoClassDefFoundError without it). 3.4.1 is pyspark 4.0/4.1's, kept so the previous stack still builds
# (`python -m benchmarks.stacks` measures the two side by side).
_S3A_BY_HADOOP = {
    "3.5.0": (
        "software.amazon.awssdk:bundle:2.35.4",
        "software.amazon.s3.analyticsaccelerator:analyticsaccelerator-s3:1.3.1",
    ),
    "3.4.1": ("software.amazon.awssdk:bundle:2.24.6",),
}
# delta-spark's runtime dependencies besides Scala, which pyspark ships (its pom; their own
# dependencies, Jackson, Parquet, Hadoop's client, RoaringBitmap, are in pyspark's jars/ too). Delta
# 4.0 needed only delta-storage and published one artifact per Scala version, not per Spark line.
_DELTA_MODULES = ("delta-storage", "delta-kernel-api", "delta-kernel-defaults", "delta-kernel-unitycatalog")


def _line(package: str) -> tuple[int, int]:
    major, minor = version(package).split(".")[:2]
    return int(major), int(minor)


@cache
def delta_artifacts() -> tuple[str, ...]:
    """The Delta jars, at the version of the installed ``delta-spark`` package (one pin in pyproject.toml
    decides the Python API and the jars) and built for the installed pyspark's line, as Delta publishes
    them (``delta-spark_<spark major.minor>_2.13``, what delta's own ``configure_spark_with_delta_pip``
    asks for)."""
    delta = version("delta-spark")
    if _line("delta-spark") < (4, 1):
        return (f"io.delta:delta-spark_2.13:{delta}", f"io.delta:delta-storage:{delta}")
    spark = ".".join(map(str, _line("pyspark")))
    return (f"io.delta:delta-spark_{spark}_2.13:{delta}", *(f"io.delta:{m}:{delta}" for m in _DELTA_MODULES))


@cache
def s3a_artifacts() -> tuple[str, ...]:
    """hadoop-aws at the version of pyspark's bundled Hadoop, with the AWS artifacts its pom names."""
    hadoop = "3.5.0" if _line("pyspark") >= (4, 2) else "3.4.1"
    return (f"org.apache.hadoop:hadoop-aws:{hadoop}", *_S3A_BY_HADOOP[hadoop])


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
    """Those of ``artifacts`` whose jar is not in the local Maven repository."""
    return [a for a in artifacts if not _jar(a).is_file()]


def spark_conf(*, delta: bool, s3a: bool = False) -> dict[str, str]:
    """Confs adding the Delta (and, when available and asked for, s3a) jars; {} if Delta's are missing."""
    jars = jar_paths(delta_artifacts()) if delta else None
    if jars is None:
        return {}
    extra = jar_paths(s3a_artifacts()) if s3a else None
    return {"spark.jars": ",".join(jars + (extra or [])), **DELTA_CONF}


def main(argv: list[str] | None = None) -> None:
    """``python -m cq_engine.jars --coordinates``: the Maven coordinates ``make jars`` fetches, one a line."""
    parser = argparse.ArgumentParser(prog="python -m cq_engine.jars", description="The jars `make jars` fetches.")
    parser.add_argument("--coordinates", action="store_true", required=True, help="print every jar's coordinates")
    parser.parse_args(argv)
    print("\n".join(delta_artifacts() + s3a_artifacts()))


if __name__ == "__main__":
    main()
