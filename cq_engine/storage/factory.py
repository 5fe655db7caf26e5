"""The storage the settings choose: Spark's Delta connector by default (``CQ_STORAGE=spark``), delta-rs
with ``CQ_STORAGE=deltars`` (and, with one log line, when delta-spark's jars are not in the local Maven repository)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from cq_engine import jars
from cq_engine.config import Settings
from cq_engine.storage.base import Storage
from cq_engine.storage.delta import DeltaRsStorage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOG = logging.getLogger("cq_engine.storage")
_warned: set[str] = set()


def spark_delta_available(settings: Settings) -> bool:
    """Can this engine's Spark load delta-spark? A remote Connect server is trusted to have it (the
    Deployment page's server command loads it); a local session needs the jars in the local Maven repository."""
    if settings.storage != "spark":
        return False
    if settings.spark_remote:
        return True
    gone = jars.missing(jars.delta_artifacts())
    if gone and str(jars.maven_repo()) not in _warned:
        _warned.add(str(jars.maven_repo()))
        LOG.warning(
            "delta-spark jars not found in %s (%s): using the delta-rs storage (run `make setup`, "
            "or set CQ_STORAGE=deltars to silence this)",
            jars.maven_repo(),
            ", ".join(gone),
        )
    return not gone


def make_storage(settings: Settings, *, session: Callable[[], SparkSession]) -> Storage:
    """``SparkDeltaStorage`` when ``spark_delta_available``, else ``DeltaRsStorage``."""
    _warn_unsafe_rename(settings)
    if spark_delta_available(settings):
        from cq_engine.storage.spark_delta import SparkDeltaStorage

        return SparkDeltaStorage(
            warehouse=settings.warehouse, session=session, executor_write_bytes=settings.spark_write_bytes
        )
    return DeltaRsStorage(warehouse=settings.warehouse)


def _warn_unsafe_rename(settings: Settings) -> None:
    """Say once that ``AWS_S3_ALLOW_UNSAFE_RENAME`` weakens an ``s3://`` warehouse's commits: delta-rs
    then commits through its rename backend instead of the conditional PUT every other writer of the
    table uses (ARCHITECTURE.md, Commits on an object store)."""
    unsafe = os.environ.get("AWS_S3_ALLOW_UNSAFE_RENAME", "").strip().lower() in ("1", "true", "yes")
    if unsafe and settings.warehouse.startswith(("s3://", "s3a://")) and "unsafe-rename" not in _warned:
        _warned.add("unsafe-rename")
        LOG.warning(
            "AWS_S3_ALLOW_UNSAFE_RENAME is set: delta-rs commits by rename, not by the conditional PUT that "
            "orders this warehouse's writers; unset it (S3 and S3-compatible stores with If-None-Match need nothing)"
        )
