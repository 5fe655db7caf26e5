-- IoTDB-style triggers (seed 004) with the Python classes in examples/triggers/.

-- Alerts where a meter's current crosses 11.5 A (warning) or 12 A (critical), and when it is back
-- 1 A under: one row per change in the `alerts` table. AFTER INSERT: the `meter_alerts_trigger` sensor
-- fires it on every new version of `meters` (`cq dev` feeds it), once each, in order.
CREATE TABLE IF NOT EXISTS alerts (
  ts TIMESTAMP, trigger STRING, source STRING, series STRING, labels STRING, value DOUBLE, severity STRING,
  version BIGINT
);
CREATE STATEFUL TRIGGER meter_alerts
AFTER INSERT
ON meters
AS 'examples.triggers.alert:ThresholdAlert'
WITH ("columns" = "current", "warning" = "11.5", "critical" = "12", "hysteresis" = "1",
      "labels" = "tbname, location");

-- BEFORE INSERT: `cq ingest` refuses a file with a humidity outside [0, 100] into sensors* tables,
-- and writes nothing of it (PESSIMISTIC).
CREATE STATELESS TRIGGER humidity_range
BEFORE INSERT
ON sensors*
AS 'examples.triggers.guard:RangeGuard'
WITH ("column" = "humidity", "min" = "0", "max" = "100");
