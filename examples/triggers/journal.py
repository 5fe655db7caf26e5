"""Forwarding data (seed 004's other use of triggers): every batch a trigger sees, as one JSON line
(trigger, table, event, Delta version, rows) appended to a file; ``restore`` and ``on_drop`` are logged
too, so the file shows the trigger's whole life.

    CREATE STATEFUL TRIGGER meters_journal AFTER INSERT ON meter* AS 'examples.triggers.journal:Journal'
    WITH ("path" = "meters.jsonl");"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pyarrow as pa

from cq_engine.triggers import Trigger, TriggerAttributes, batch_info

_LOCK = threading.Lock()


class Journal(Trigger):
    def validate(self, attributes: TriggerAttributes) -> None:
        attributes.string("path")

    def on_create(self, attributes: TriggerAttributes) -> None:
        self.path = Path(attributes.string("path"))
        self.restored = False

    def _write(self, record: dict) -> None:
        line = json.dumps({**record, "pid": os.getpid()}, default=str)
        with _LOCK, self.path.open("a") as f:
            f.write(line + "\n")

    def restore(self) -> None:
        self.restored = True
        self._write({"event": "restore"})

    def on_drop(self) -> None:
        self._write({"event": "drop"})

    def fire(self, batch: pa.Table) -> bool:
        info = batch_info(batch)
        self._write(
            {
                "event": info.event,
                "trigger": info.trigger,
                "table": info.table,
                "version": info.version,
                "restored": self.restored,
                "rows": batch.to_pylist(),
            }
        )
        return True
