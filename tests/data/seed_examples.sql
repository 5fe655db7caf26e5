-- A few worked examples of the seed documents (TDengine streams, eKuiper windows), kept here so the
-- parser fuzz test (tests/test_fuzz.py) mutates them without reading the documents at test time.
CREATE TABLE IF NOT EXISTS meters (ts TIMESTAMP, current FLOAT, voltage INT, phase FLOAT)
  TAGS (groupid INT, location VARCHAR(24));

CREATE STREAM avg_vol_s INTO avg_vol AS
SELECT _wstart, count(*), avg(voltage) FROM meters PARTITION BY tbname INTERVAL(1m) SLIDING(30s);

CREATE STREAM streams0 INTO streamt0 AS
SELECT _wstart, count(*), avg(voltage) from meters PARTITION BY tbname EVENT_WINDOW START WITH voltage < 0 END WITH voltage > 9;

CREATE STREAM streams1 IGNORE EXPIRED 1 WATERMARK 100s INTO streamt1 AS
SELECT _wstart, count(*), avg(voltage) from meters PARTITION BY tbname COUNT_WINDOW(10);

CREATE STREAM demo (ID STRING, temperature FLOAT, revenue FLOAT, ts BIGINT)
  WITH (DATASOURCE="demo", FORMAT="json", TIMESTAMP="ts");

CREATE RULE tumbling INTO tumbling_out AS SELECT ID, count(*) AS c FROM demo GROUP BY ID, TUMBLINGWINDOW(ss, 10);
CREATE RULE hopping INTO hopping_out AS SELECT ID, count(*) AS c FROM demo GROUP BY ID, HOPPINGWINDOW(ss, 10, 5);
CREATE RULE sliding INTO sliding_out AS SELECT ID, count(*) AS c FROM demo GROUP BY ID, SLIDINGWINDOW(ss, 5, 5);
CREATE RULE session INTO session_out AS SELECT ID, count(*) AS c FROM demo GROUP BY ID, SESSIONWINDOW(mi, 2, 1);
CREATE RULE counted INTO counted_out AS SELECT count(*) AS c FROM demo WHERE temperature > 20
  GROUP BY COUNTWINDOW(5, 1) HAVING COUNT(*) > 2;
CREATE RULE filtered INTO filtered_out AS SELECT count(*) AS c FROM demo
  GROUP BY SlidingWindow(ss, 1) FILTER(where revenue > 100) OVER(when revenue > 200);
