"""Seed 004's alerting example in Python: a STATEFUL trigger raising alerts when readings cross a
threshold, written to a Delta table (default ``alerts``) in the warehouse.

    CREATE STATEFUL TRIGGER meter_alerts AFTER INSERT ON meters
    AS 'examples.triggers.alert:ThresholdAlert'
    WITH ("columns" = "current", "warning" = "11.5", "critical" = "12", "labels" = "tbname, location");

A series is (table, column, label values). Its state is its current severity: ``ok``, ``warning``
(value > warning) or ``critical`` (value > critical); every change of severity writes one alert row
(``resolved`` when the series goes back to ok), so a series above its threshold for an hour raises
one alert, not one per reading. With ``"hysteresis" = "h"`` a series only steps down once it is at
least ``h`` under the threshold it crossed, so noise around a threshold does not flap. ``restore()`` rebuilds the state from the alerts already written.

AFTER INSERT batches carry their Delta version: the alerts of a version are committed with a Delta
application transaction ``(cq-trigger/<trigger>/<table>, version)``, and a version already committed
is not written again, so a redelivery after a crash leaves no duplicate."""

from __future__ import annotations

import json
import logging

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from cq_engine.triggers import Trigger, TriggerAttributes, batch_info

log = logging.getLogger(__name__)

ALERTS = pa.schema(
    [
        ("ts", pa.timestamp("us", tz="UTC")),
        ("trigger", pa.string()),
        ("source", pa.string()),
        ("series", pa.string()),
        ("labels", pa.string()),
        ("value", pa.float64()),
        ("severity", pa.string()),
        ("version", pa.int64()),
    ]
)


_RANK = {"ok": 0, "warning": 1, "critical": 2}


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


class ThresholdAlert(Trigger):
    def validate(self, attributes: TriggerAttributes) -> None:
        warning = attributes.float("warning")
        critical = attributes.float("critical", float("inf"))
        if warning > critical:
            raise attributes.error(f"warning ({warning:g}) must not be above critical ({critical:g})")

    def on_create(self, attributes: TriggerAttributes) -> None:
        self.name = attributes.name
        self.warning = attributes.float("warning")
        self.critical = attributes.float("critical", float("inf"))
        self.hysteresis = attributes.float("hysteresis", 0.0)
        self.columns = _names(attributes.string("columns", ""))  # default: every floating-point column
        self.labels = _names(attributes.string("labels", ""))  # default: every string column
        self.uri = f"{attributes.warehouse.rstrip('/')}/{attributes.string('sink', 'alerts')}"
        self.state: dict[tuple, str] = {}

    def restore(self) -> None:
        if not DeltaTable.is_deltatable(self.uri):
            return
        rows = [r for r in pa.table(DeltaTable(self.uri).scan()).to_pylist() if r["trigger"] == self.name]
        for row in sorted(rows, key=lambda r: (r["ts"], r["version"] or -1)):
            key = (row["source"], row["series"], row["labels"])
            self.state[key] = "ok" if row["severity"] == "resolved" else row["severity"]
        log.info("%s: restored %d series from %s", self.name, len(self.state), self.uri)

    def _severity(self, value: float, old: str) -> str:
        new = "critical" if value > self.critical else "warning" if value > self.warning else "ok"
        threshold = {"critical": self.critical, "warning": self.warning}.get(old)
        if _RANK[new] < _RANK[old] and value > threshold - self.hysteresis:
            return old
        return new

    def fire(self, batch: pa.Table) -> bool:
        info = batch_info(batch)
        time_column = next(f.name for f in batch.schema if pa.types.is_timestamp(f.type))
        columns = self.columns or [f.name for f in batch.schema if pa.types.is_floating(f.type)]
        labels = self.labels or [f.name for f in batch.schema if pa.types.is_string(f.type)]
        present = {n.lower(): n for n in batch.column_names}
        labels = [present[n.lower()] for n in labels if n.lower() in present]
        alerts = []
        for row in batch.sort_by(time_column).to_pylist():
            tags = json.dumps({n: row[n] for n in labels}, sort_keys=True)
            for column in (present[c.lower()] for c in columns if c.lower() in present):
                if row[column] is None:
                    continue
                key = (info.table, column, tags)
                old = self.state.get(key, "ok")
                new = self._severity(row[column], old)
                if new != old:
                    self.state[key] = new
                    alerts.append(
                        {
                            "ts": row[time_column],
                            "trigger": self.name,
                            "source": info.table,
                            "series": column,
                            "labels": tags,
                            "value": float(row[column]),
                            "severity": "resolved" if new == "ok" else new,
                            "version": info.version,
                        }
                    )
        for a in alerts:
            log.info(
                "%s: %s %s %s = %s (%s)", self.name, a["severity"], a["source"], a["series"], a["value"], a["labels"]
            )
        if alerts:
            self._write(pa.Table.from_pylist(alerts, schema=ALERTS), info)
        return True

    def _write(self, alerts: pa.Table, info) -> None:
        if info.version is None:  # BEFORE INSERT: no version to make the write idempotent with
            write_deltalake(self.uri, alerts, mode="append")
            return
        app_id = f"cq-trigger/{self.name}/{info.table}"
        done = DeltaTable(self.uri).transaction_version(app_id) if DeltaTable.is_deltatable(self.uri) else None
        if done is not None and done >= info.version:
            return  # this version's alerts are already committed: a redelivery
        write_deltalake(
            self.uri,
            alerts,
            mode="append",
            commit_properties=CommitProperties(app_transactions=[Transaction(app_id=app_id, version=info.version)]),
        )
