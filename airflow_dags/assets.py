"""Warehouse tables as Airflow assets: a sink is a task's outlet, its sources the task's inlets."""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import Asset

from cq_engine.config import Settings


def table_asset(table: str, *, settings: Settings) -> Asset:
    """A warehouse table as an Airflow asset named after it, its URI the table's location."""
    uri = settings.table_uri(table)
    if "://" not in uri:
        uri = Path(uri).resolve().as_uri()
    return Asset(name=table, uri=uri)
