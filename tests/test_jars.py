"""The jar coordinates come from the installed packages: one pin decides the Python API and the jars."""

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pyspark

from cq_engine import jars


def test_delta_jars_follow_the_installed_delta_spark_and_pyspark():
    delta, spark_line = version("delta-spark"), ".".join(pyspark.__version__.split(".")[:2])
    artifacts = jars.delta_artifacts()
    assert artifacts[0] == f"io.delta:delta-spark_{spark_line}_2.13:{delta}"
    assert {a.rsplit(":", 1)[1] for a in artifacts} == {delta}
    assert "io.delta:delta-storage:" + delta in artifacts


def test_hadoop_aws_matches_the_hadoop_pyspark_bundles():
    bundled = sorted(Path(pyspark.__file__).parent.joinpath("jars").glob("hadoop-client-api-*.jar"))
    hadoop_aws = jars.s3a_artifacts()[0]
    assert hadoop_aws.startswith("org.apache.hadoop:hadoop-aws:")
    assert [p.name for p in bundled] == [f"hadoop-client-api-{hadoop_aws.rsplit(':', 1)[1]}.jar"]


def test_coordinates_entry_point_prints_what_make_jars_fetches():
    out = subprocess.run(
        [sys.executable, "-m", "cq_engine.jars", "--coordinates"], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == [*jars.delta_artifacts(), *jars.s3a_artifacts()]
    makefile = (Path(__file__).parents[1] / "Makefile").read_text()
    assert "python -m cq_engine.jars --coordinates" in makefile
    assert not any(a.rsplit(":", 1)[1] in makefile for a in out.split()), "a jar version is duplicated in the Makefile"
