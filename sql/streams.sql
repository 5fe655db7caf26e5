-- TDengine's smart meters as one super table (a tbname column plus tags); `cq dev` feeds it.
CREATE TABLE IF NOT EXISTS meters (
  ts TIMESTAMP,
  current FLOAT,
  voltage INT,
  phase FLOAT,
  status INT
) TAGS (location VARCHAR(64), groupid INT);

-- New form, interval windows: 1-minute average current per meter, every 30 s.
CREATE STREAM IF NOT EXISTS current_1m INTERVAL(1m) SLIDING(30s) FROM meters PARTITION BY tbname
  OPTIONS(WATERMARK(5s))
  INTO current_1m AS SELECT _twstart, _twend, avg(current) AS avg_current, _twrownum AS readings FROM %%trows;

-- Old form: seed 000's avg_vol_s.
CREATE STREAM avg_vol_s TRIGGER WINDOW_CLOSE WATERMARK 5s INTO avg_vol AS
  SELECT _wstart, count(*), avg(voltage) FROM meters PARTITION BY tbname INTERVAL(1m) SLIDING(30s);

-- Event windows: episodes of high current.
CREATE STREAM high_current EVENT_WINDOW(START WITH current > 11 END WITH current < 10) FROM meters
  PARTITION BY tbname
  INTO high_current AS SELECT _twstart, _twend, max(current) AS peak, _twrownum AS readings FROM %%trows;

-- State windows on status, kept when they last at least 20 s.
CREATE STREAM status_runs STATE_WINDOW(status) TRUE_FOR(20s) FROM meters PARTITION BY tbname
  INTO status_runs AS SELECT _twstart, _twend, min(status) AS status, count(*) AS readings FROM %%trows;

-- Count windows: every 12 readings of a meter.
CREATE STREAM voltage_12 COUNT_WINDOW(12) FROM meters PARTITION BY tbname
  INTO voltage_12 AS SELECT _twstart, avg(voltage) AS avg_voltage FROM %%trows;

-- Session windows over the high-current readings only: bursts at most 30 s apart.
CREATE STREAM meter_sessions SESSION(ts, 30s) FROM meters PARTITION BY tbname OPTIONS(PRE_FILTER(current > 11))
  INTO meter_sessions AS SELECT _twstart, _twend, count(*) AS readings, max(current) AS peak FROM %%trows;

-- PERIOD: every minute, how many readings were committed since the previous tick.
CREATE STREAM readings_per_minute PERIOD(1m) FROM meters
  INTO readings_per_minute AS SELECT _tlocaltime, count(*) AS readings FROM %%trows;

-- Output shaping: one output subtable per meter, its location as a tag; a row even when no reading
-- exceeds 11 A in the minute (FORCE_OUTPUT keeps the window start, the rest is NULL).
CREATE STREAM hot_minutes INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname, location
  OPTIONS(FORCE_OUTPUT | DELETE_OUTPUT_TABLE)
  INTO hot_minutes OUTPUT_SUBTABLE(CONCAT('hot_', %%tbname)) TAGS (site VARCHAR(64) AS %%2)
  AS SELECT _twstart, count(*) AS hot_readings, max(current) AS peak FROM %%trows WHERE current > 11;

-- A query reading a table instead of %%trows: per meter and minute, the whole fleet's average voltage
-- in that minute (every meter's rows), next to the meter (one Spark range join for all windows).
CREATE STREAM fleet_voltage INTERVAL(1m) SLIDING(1m) FROM meters PARTITION BY tbname
  INTO fleet_voltage AS SELECT _twstart, avg(voltage) AS fleet_avg_voltage, count(*) AS fleet_readings
  FROM meters WHERE ts >= _twstart AND ts < _twend;

-- Notifications: run `cq listen` in another terminal to watch them (undelivered ones are dropped).
CREATE STREAM status_changes STATE_WINDOW(status) FROM meters PARTITION BY tbname
  NOTIFY('ws://127.0.0.1:8765/notify') ON (WINDOW_OPEN|WINDOW_CLOSE)
  INTO status_changes AS SELECT _twstart, _twend, count(*) AS readings FROM %%trows;
