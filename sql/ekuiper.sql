-- eKuiper (seed 003): the `demo` stream over the Delta table `demo` (`cq dev` feeds it), and rules.
CREATE STREAM demo (ID STRING, temperature DOUBLE, revenue DOUBLE, ts BIGINT)
  WITH (DATASOURCE="demo", FORMAT="json", KEY="ts", TIMESTAMP="ts");

-- The seed's tumbling window: per device, every 10 s.
CREATE RULE demo_counts INTO demo_counts AS
  SELECT count(*) AS readings, avg(temperature) AS avg_temperature FROM demo GROUP BY ID, TUMBLINGWINDOW(ss, 10);

-- Hopping: 1-minute windows every 20 s.
CREATE RULE demo_hops INTO demo_hops AS
  SELECT sum(revenue) AS revenue FROM demo GROUP BY ID, HOPPINGWINDOW(ss, 60, 20);

-- The last 5 readings above 20 degrees, at every reading, when more than 2 of them are.
CREATE RULE demo_warm INTO demo_warm AS
  SELECT count(*) AS warm FROM demo WHERE temperature > 20 GROUP BY ID, COUNTWINDOW(5, 1) HAVING COUNT(*) > 2;

-- For each revenue spike (> 200), the revenue above 100 in the 30 s before it.
CREATE RULE demo_spikes INTO demo_spikes AS
  SELECT count(*) AS big_sales, max(revenue) AS peak FROM demo
  GROUP BY ID, SLIDINGWINDOW(ss, 30) FILTER(WHERE revenue > 100) OVER(WHEN revenue > 200);

-- Sessions of warm readings at most 10 s apart, cut every minute.
CREATE RULE demo_sessions INTO demo_sessions AS
  SELECT count(*) AS readings, window_end() AS ended FROM demo
  GROUP BY ID, SESSIONWINDOW(ss, 10, 60) FILTER(WHERE temperature > 21);
