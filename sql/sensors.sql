-- A sample sensor table: one row per device reading.
CREATE TABLE IF NOT EXISTS sensors (
  ts TIMESTAMP,
  device STRING,
  temperature DOUBLE,
  humidity DOUBLE
);
