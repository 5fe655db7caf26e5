"""Warehouse tables as Airflow assets: a sink is a task's outlet, its sources the task's inlets, a
window-triggered stream's trigger table its DAG's schedule."""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import Asset, AssetWatcher

from cq_engine.config import Settings

from .watch import DeltaCommitTrigger


def table_asset(table: str, *, settings: Settings) -> Asset:
    """A warehouse table as an Airflow asset named after it, its URI the table's location, watched by
    a ``DeltaCommitTrigger`` on its Delta log. Every DAG names the table by this same asset: Airflow
    keeps one definition per asset (the last parsed), so one without the watcher would drop it; the
    triggerer runs a watcher only for an asset some DAG is scheduled on."""
    location = settings.table_uri(table)
    if "://" not in location:  # the triggerer's working directory is not the parser's
        location = str(Path(location).resolve())
    uri = location if "://" in location else Path(location).as_uri()
    watcher = AssetWatcher(name=f"{table}_commits", trigger=DeltaCommitTrigger(table=table, uri=location))
    return Asset(name=table, uri=uri, watchers=[watcher])
