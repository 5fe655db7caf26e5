"""A BEFORE INSERT trigger refusing out-of-range values: PESSIMISTIC by default, so a batch holding
one bad value is not written at all (IoTDB's triggers do not change the data; they can refuse it).

    CREATE STATELESS TRIGGER humidity_range BEFORE INSERT ON sensors
    AS 'examples.triggers.guard:RangeGuard' WITH ("column" = "humidity", "min" = "0", "max" = "100");

``"failure_strategy" = "OPTIMISTIC"`` only logs the bad batch and lets it through."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from cq_engine.triggers import FailureStrategy, Trigger, TriggerAttributes


class RangeGuard(Trigger):
    failure_strategy = FailureStrategy.PESSIMISTIC

    def validate(self, attributes: TriggerAttributes) -> None:
        attributes.string("column")
        low, high = attributes.float("min", float("-inf")), attributes.float("max", float("inf"))
        if low > high:
            raise attributes.error(f"min ({low:g}) is above max ({high:g})")
        strategy = attributes.string("failure_strategy", "PESSIMISTIC").upper()
        if strategy not in FailureStrategy.__members__:
            raise attributes.error(f"failure_strategy must be OPTIMISTIC or PESSIMISTIC, got {strategy!r}")

    def on_create(self, attributes: TriggerAttributes) -> None:
        self.column = attributes.string("column")
        self.low, self.high = attributes.float("min", float("-inf")), attributes.float("max", float("inf"))
        self.failure_strategy = FailureStrategy[attributes.string("failure_strategy", "PESSIMISTIC").upper()]

    def fire(self, batch: pa.Table) -> bool:
        names = {n.lower(): n for n in batch.column_names}
        if self.column.lower() not in names:
            return True  # a matching table without that column has nothing to check
        values = batch.column(names[self.column.lower()])
        bad = pc.or_(pc.less(values, self.low), pc.greater(values, self.high))
        if not pc.any(bad).as_py():
            return True
        row = pc.index(bad, True).as_py()
        raise ValueError(
            f"column {self.column!r}: value {values[row].as_py()!r} in row {row + 1} is outside "
            f"[{self.low:g}, {self.high:g}]"
        )
