"""The JVM jars the engine adds to Spark, found in the local Maven repository (``make setup`` fetches
them there with ``mvn dependency:get``), and the Spark confs that enable them.

Jars are passed as files (``spark.jars`` / ``--jars``), not as ``spark.jars.packages`` coordinates: the
ivy resolver would ask remote repositories for parent POMs on every session start, which costs tens of
seconds (minutes offline). Nothing here imports pyspark or starts a JVM.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from functools import cache
from importlib.metadata import version
from pathlib import Path

from cq_engine.errors import SparkError

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
    """Confs adding the Delta (and, when available and asked for, s3a) jars; {} if Delta's are missing.
    With s3a, Delta commits through the engine's conditional-put log store (``logstore_jar``) on
    ``s3://`` and ``s3a://`` paths."""
    jars = jar_paths(delta_artifacts()) if delta else None
    if jars is None:
        return {}
    extra = jar_paths(s3a_artifacts()) if s3a else None
    if extra is None:
        return {"spark.jars": ",".join(jars), **DELTA_CONF}
    store = {f"spark.delta.logStore.{scheme}.impl": LOGSTORE_CLASS for scheme in ("s3", "s3a")}
    return {"spark.jars": ",".join([*jars, *extra, str(logstore_jar())]), **DELTA_CONF, **store}


# The engine's Delta log store for S3 (cq_engine/jvm/, ARCHITECTURE.md, Commits on an object store):
# a commit is one PUT with If-None-Match, the primitive delta-rs commits with, so Spark's and
# delta-rs' writers of one table are coordinated by the store itself.
LOGSTORE_CLASS = "io.cqengine.ConditionalPutLogStore"
_LOGSTORE_SOURCE = Path(__file__).parent / "jvm" / "ConditionalPutLogStore.java"


def _jar_cache() -> Path:
    """Where built jars are kept (``CQ_JAR_CACHE``, else ``$XDG_CACHE_HOME/cq-engine``, ``~/.cache/cq-engine``)."""
    if os.environ.get("CQ_JAR_CACHE"):
        return Path(os.environ["CQ_JAR_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cq-engine"


def _compile_classpath() -> list[Path]:
    """Hadoop's client API from pyspark's own jars and delta-storage from the local Maven repository."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise SparkError("pyspark is not installed: cannot build the engine's Delta log store")
    hadoop = sorted((Path(spec.origin).parent / "jars").glob("hadoop-client-api-*.jar"))
    storage = [_jar(a) for a in delta_artifacts() if a.split(":")[1] == "delta-storage"]
    if not hadoop or not storage or not storage[0].is_file():
        raise SparkError(
            "the engine's Delta log store needs pyspark's hadoop-client-api jar and delta-storage: run `make jars`"
        )
    return [hadoop[-1], storage[0]]


def logstore_jar() -> Path:
    """The engine's log store jar, built from ``cq_engine/jvm`` with ``javac`` on first use (about a
    second) and kept under ``_jar_cache()`` by the digest of its source and classpath."""
    source = _LOGSTORE_SOURCE.read_bytes()
    classpath = _compile_classpath()
    digest = hashlib.sha256(source + b"\0" + ":".join(p.name for p in classpath).encode()).hexdigest()[:16]
    target = _jar_cache() / f"cq-logstore-{digest}.jar"
    if target.is_file():
        return target
    javac = shutil.which("javac")
    if javac is None:
        raise SparkError(
            "an s3:// warehouse needs the engine's Delta log store, compiled once with javac: install a JDK 17+ "
            "(e.g. Debian's openjdk-17-jdk-headless) or run `make jars` where one is installed"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = subprocess.run(
            [
                javac,
                "--release",
                "17",
                "-nowarn",
                "-cp",
                ":".join(map(str, classpath)),
                "-d",
                tmp,
                str(_LOGSTORE_SOURCE),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if out.returncode != 0:
            raise SparkError(f"javac failed on {_LOGSTORE_SOURCE.name}: {(out.stdout + out.stderr).strip()[-2000:]}")
        staged = Path(tmp) / target.name
        with zipfile.ZipFile(staged, "w") as jar:
            for cls in sorted(Path(tmp).rglob("*.class")):
                jar.write(cls, cls.relative_to(tmp).as_posix())
        staged.replace(target)  # atomic: a concurrent builder's jar is the same bytes
    return target


def main(argv: list[str] | None = None) -> None:
    """``python -m cq_engine.jars --coordinates``: the Maven coordinates ``make jars`` fetches, one a line."""
    parser = argparse.ArgumentParser(prog="python -m cq_engine.jars", description="The jars `make jars` fetches.")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--coordinates", action="store_true", help="print every jar's coordinates")
    what.add_argument("--build", action="store_true", help="build the engine's Delta log store jar and print its path")
    args = parser.parse_args(argv)
    if args.coordinates:
        print("\n".join(delta_artifacts() + s3a_artifacts()))
        return
    try:
        print(logstore_jar())
    except SparkError as exc:
        raise SystemExit(f"python -m cq_engine.jars: {exc}") from None


if __name__ == "__main__":
    main()
