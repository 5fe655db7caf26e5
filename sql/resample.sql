-- Sample IoTDB continuous queries over `sensors` (see sensors.sql).

-- Per-minute max/avg/count per device, each minute computed once when it ends.
CREATE CONTINUOUS QUERY temperature_1m
RESAMPLE EVERY 1m
BEGIN
  SELECT max_value(temperature) AS temperature_max, avg(temperature) AS temperature_avg,
         count(temperature) AS samples
  INTO sensors_1m
  FROM sensors
  GROUP BY (1m), device
END;

-- Humidity every 10 s over the last 30 s (late rows get two more chances), gaps carried forward.
CREATE CONTINUOUS QUERY humidity_10s
RESAMPLE EVERY 10s RANGE 30s
TIMEOUT POLICY DISCARD
BEGIN
  SELECT avg(humidity) AS humidity_avg
  INTO humidity_10s
  FROM sensors
  GROUP BY (10s), device
  FILL(PREVIOUS)
END;

-- Row-wise conversion, as seed 004's cq5: no GROUP BY, so EVERY is required.
CREATE CQ temperature_fahrenheit
RESAMPLE EVERY 30s
BEGIN
  SELECT temperature * 9 / 5 + 32 AS temperature_f
  INTO sensors_fahrenheit
  FROM sensors
  WHERE temperature IS NOT NULL
  ALIGN BY DEVICE
END;
