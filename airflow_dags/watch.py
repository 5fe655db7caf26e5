"""``DeltaCommitTrigger``: the watcher of a trigger table's asset (Airflow's event-driven scheduling).

It runs in Airflow's triggerer, one per table however many streams it drives, and follows the table's
Delta log with ``cq_engine.storage.log.latest_version`` (pyarrow's file systems: local paths and
``s3://``, configured from the triggerer's environment as the engine's delta-rs storage is): each poll
checks whether the commit file after the last version it reported exists (two existence checks while
nothing changes; new commits are found by galloping forward from there), never the older log, and no
Spark or delta-rs runs in the triggerer. Each new latest version is one event, its payload
``{"table", "uri", "version", "previous"}``; commits that land between two polls are one event.

Airflow rebuilds the trigger from its keyword arguments after a triggerer restart: the last version
reported is kept in Airflow's asset state store (``asset_state_store``, key :data:`STATE_KEY`), so a
restarted watcher reports what was committed while none ran. Without a stored version (its first
start) it reports the table's current version once: the stream DAGs' first runs set up their cursors.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

CLASSPATH = "airflow_dags.watch.DeltaCommitTrigger"
STATE_KEY = "cq_delta_version"
POLL_SECONDS = 1.0


class DeltaCommitTrigger(BaseEventTrigger):
    """Fires when ``uri`` (a Delta table: a local path, ``file://`` or ``s3://`` URI) has a new version.

    ``after_version``: the version already reported (a test, or a watcher resumed by hand); None: the
    asset state store's, else the table's current version, reported once at start."""

    def __init__(
        self, *, table: str, uri: str, poll_seconds: float = POLL_SECONDS, after_version: int | None = None, **_: Any
    ) -> None:
        super().__init__()
        self.table = table
        self.uri = uri
        self.poll_seconds = float(poll_seconds)
        self.after_version = after_version

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {
            "table": self.table,
            "uri": self.uri,
            "poll_seconds": self.poll_seconds,
            "after_version": self.after_version,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        reported = self.after_version
        if reported is None:
            reported = await self._stored()
        if reported is None:
            reported = -1  # nothing reported yet: the current version, if any, is news
        while True:
            version = await self._latest(reported)
            if version is not None and version != reported:  # newer, or lower: the table was re-created
                self.log.info("%s: version %s committed (last reported %s)", self.table, version, reported)
                yield TriggerEvent({"table": self.table, "uri": self.uri, "version": version, "previous": reported})
                reported = version
                await self._store(version)
            await asyncio.sleep(self.poll_seconds)

    async def _latest(self, known: int) -> int | None:
        """The table's latest version, probing from ``known`` (None: no Delta table there yet)."""
        from cq_engine.storage.log import latest_version  # pyarrow: loaded in the triggerer, not at parse time

        try:
            return await asyncio.to_thread(latest_version, self.uri, known=known if known >= 0 else None)
        except Exception as exc:  # a store that did not answer, a torn read: said, and asked again next poll
            self.log.warning("%s: cannot read the Delta log at %s: %s", self.table, self.uri, exc)
            return None

    async def _stored(self) -> int | None:
        store = getattr(self, "asset_state_store", None)
        if store is None:
            return None
        try:
            value = await store.aget(STATE_KEY)
        except Exception as exc:  # an Airflow without the store's API: start as on a first start
            self.log.warning("%s: no stored version (%s): reporting the current one", self.table, exc)
            return None
        return value if isinstance(value, int) else None

    async def _store(self, version: int) -> None:
        store = getattr(self, "asset_state_store", None)
        if store is None:
            return
        try:
            await store.aset(STATE_KEY, version)
        except Exception as exc:  # the next restart then reports the current version again: a spare run
            self.log.warning("%s: version %s not stored: %s", self.table, version, exc)
