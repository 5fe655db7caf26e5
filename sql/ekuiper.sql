-- eKuiper (seed 003): the `demo` stream over the Delta table `demo` (`cq dev` feeds it), and rules.
-- As in eKuiper, a rule's windows are the whole stream's; GROUP BY ID splits each window's rows.
CREATE STREAM demo (ID STRING, temperature FLOAT, revenue FLOAT, ts BIGINT)
  WITH (DATASOURCE="demo", FORMAT="json", KEY="ts", TIMESTAMP="ts");

-- The seed's tumbling window: every 10 s, one row per device.
CREATE RULE demo_counts INTO demo_counts AS
  SELECT ID, count(*) AS readings, avg(temperature) AS avg_temperature FROM demo
  GROUP BY ID, TUMBLINGWINDOW(ss, 10);

-- Hopping: 1-minute windows every 20 s.
CREATE RULE demo_hops INTO demo_hops AS
  SELECT ID, sum(revenue) AS revenue FROM demo GROUP BY ID, HOPPINGWINDOW(ss, 60, 20);

-- At every reading, the stream's last 5: per device, those above 20 degrees, when more than 2 are.
CREATE RULE demo_warm INTO demo_warm AS
  SELECT ID, count(*) AS warm FROM demo WHERE temperature > 20
  GROUP BY ID, COUNTWINDOW(5, 1) HAVING warm > 2;

-- For each revenue spike (> 200), per device the revenue above 100 in the 30 s up to it.
CREATE RULE demo_spikes INTO demo_spikes AS
  SELECT ID, count(*) AS big_sales, max(revenue) AS peak FROM demo
  GROUP BY ID, SLIDINGWINDOW(ss, 30) FILTER(WHERE revenue > 100) OVER(WHEN revenue > 200);

-- Sessions of warm readings at most 10 s apart, cut at a whole minute once longer than a minute
-- (SESSIONWINDOW(unit, max_duration, timeout)).
CREATE RULE demo_sessions INTO demo_sessions AS
  SELECT ID, count(*) AS readings, window_end() AS ended FROM demo
  GROUP BY ID, SESSIONWINDOW(ss, 60, 10) FILTER(WHERE temperature > 21);
