-- Seed 004's worked examples cq1-cq5 in the table model: one `ln` table with a `device` column
-- instead of the root.ln.*.* paths; each query writes its own sink table.
CREATE TABLE IF NOT EXISTS ln (time TIMESTAMP, device STRING, temperature DOUBLE);

CREATE CONTINUOUS QUERY cq1
RESAMPLE EVERY 20s
BEGIN
  SELECT max_value(temperature)
  INTO cq1_out(temperature_max)
  FROM ln
  GROUP BY(10s), device
END;

CREATE CONTINUOUS QUERY cq2
RESAMPLE RANGE 40s
BEGIN
  SELECT max_value(temperature)
  INTO cq2_out(temperature_max)
  FROM ln
  GROUP BY(10s), device
END;

CREATE CONTINUOUS QUERY cq3
RESAMPLE EVERY 20s RANGE 40s
BEGIN
  SELECT max_value(temperature)
  INTO cq3_out(temperature_max)
  FROM ln
  GROUP BY(10s), device
  FILL(100.0)
END;

CREATE CONTINUOUS QUERY cq4
RESAMPLE EVERY 20s RANGE 40s, 20s
BEGIN
  SELECT max_value(temperature)
  INTO cq4_out(temperature_max)
  FROM ln
  GROUP BY(10s), device
  FILL(100.0)
END;

CREATE CONTINUOUS QUERY cq5
RESAMPLE EVERY 20s
BEGIN
  SELECT temperature + 1
  INTO cq5_out(temperature)
  FROM ln
  align by device
END;
