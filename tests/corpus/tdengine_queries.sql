-- TDengine new-form stream queries (docs/dialects/tdengine.md, A stream's query): GROUP BY / PARTITION BY,
-- HAVING, CASE, ORDER BY ... LIMIT / SLIMIT, a row's own time as the sink's time column, over %%trows and a
-- table. tests/test_tdengine_query.py runs them against hand-computed results; tests/test_fuzz.py mutates them.
CREATE TABLE meters (ts TIMESTAMP, current DOUBLE, voltage INT, status INT) TAGS (location STRING);
CREATE TABLE limits (ts TIMESTAMP, status INT, cap DOUBLE);
CREATE STREAM having INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname
  INTO o_having AS
  SELECT _twstart, avg(current) a, count(*) n
  FROM %%trows HAVING avg(current) > 10;
CREATE STREAM grouped INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname
  INTO o_grouped AS
  SELECT _twstart, status, count(*) n, max(current) m
  FROM %%trows GROUP BY status HAVING count(current) >= 1;
CREATE STREAM case INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname
  INTO o_case AS
  SELECT _twstart, CASE WHEN max(current) > 12 THEN 'high' WHEN max(current) IS NULL THEN 'none' ELSE 'low' END lvl
  FROM %%trows;
CREATE STREAM top INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname
  INTO o_top AS
  SELECT ts, current, voltage
  FROM %%trows ORDER BY current DESC LIMIT 2;
CREATE STREAM last_per_status INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname
  INTO o_lps AS
  SELECT ts, status, current
  FROM %%trows PARTITION BY status ORDER BY ts DESC LIMIT 1;
CREATE STREAM slimit INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname
  INTO o_slimit AS
  SELECT _twstart, status, count(*) n
  FROM %%trows GROUP BY status SLIMIT 1 SOFFSET 1;
CREATE STREAM fleet INTERVAL(10s) SLIDING(10s) FROM meters
  INTO o_fleet AS
  SELECT _twstart, tbname, count(*) n, sum(voltage) v
  FROM meters WHERE ts >= _twstart AND ts < _twend PARTITION BY tbname;
CREATE STREAM session_top SESSION(ts, 5s) FROM meters PARTITION BY tbname
  INTO o_session_top AS
  SELECT ts, current
  FROM %%trows ORDER BY current DESC NULLS LAST LIMIT 1;
CREATE STREAM count_grouped COUNT_WINDOW(3) FROM meters PARTITION BY tbname
  INTO o_count_grouped AS
  SELECT last(ts) t, status, count(*) n
  FROM %%trows GROUP BY status ORDER BY n DESC, status LIMIT 1;
CREATE STREAM outside INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname
  INTO o_outside AS
  SELECT ts, current
  FROM meters WHERE ts >= _twstart - 5s AND ts < _twend AND tbname = %%1;
CREATE STREAM ties_low INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname
  INTO o_ties_low AS
  SELECT ts, voltage
  FROM %%trows ORDER BY voltage LIMIT 2;
CREATE STREAM ties_high INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname
  INTO o_ties_high AS
  SELECT ts, voltage
  FROM %%trows ORDER BY voltage DESC LIMIT 1;
CREATE STREAM sub_max INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname
  INTO o_sub_max AS
  SELECT _twstart, max(a) m, count(a) n, last(a) l
  FROM (SELECT current a FROM %%trows WHERE voltage > 215);
CREATE STREAM sub_grouped INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname
  INTO o_sub_grouped AS
  SELECT _twstart, max(g.a) m, count(*) k
  FROM (SELECT status, avg(current) a FROM %%trows GROUP BY status) AS g;
CREATE STREAM sub_top INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname
  INTO o_sub_top AS
  SELECT ts, c
  FROM (SELECT ts, current c FROM %%trows UNION ALL SELECT ts, voltage FROM %%trows) ORDER BY c DESC LIMIT 2;
CREATE STREAM sub_fleet INTERVAL(10s) SLIDING(10s) FROM meters
  INTO o_sub_fleet AS
  SELECT _twstart, count(*) n, sum(v) s
  FROM (SELECT tbname, sum(voltage) v FROM meters WHERE ts >= _twstart AND ts < _twend PARTITION BY tbname);
CREATE STREAM unioned INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname
  INTO o_unioned AS
  SELECT _twstart, 'own' src, count(*) n FROM %%trows
  UNION ALL SELECT _twstart, 'others', count(*) FROM meters WHERE ts >= _twstart AND ts < _twend AND tbname <> %%1;
CREATE STREAM unioned_rows SESSION(ts, 5s) FROM meters PARTITION BY tbname
  INTO o_unioned_rows AS
  SELECT ts, current FROM %%trows WHERE current > 12
  UNION ALL SELECT ts, current FROM %%trows WHERE current IS NULL;
CREATE STREAM count_union COUNT_WINDOW(3) FROM meters PARTITION BY tbname
  INTO o_count_union AS
  SELECT last(ts) t, 'max' k, max(current) m FROM %%trows
  UNION ALL SELECT last(ts), 'min', min(current) FROM %%trows;
CREATE STREAM j_over INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname
  INTO o_j_over AS
  SELECT _twstart, count(*) n, max(m.current - l.cap) over_cap
  FROM %%trows m JOIN limits l ON m.status = l.status WHERE m.current > l.cap;
CREATE STREAM j_rows INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname
  INTO o_j_rows AS
  SELECT m.ts, m.current, l.cap
  FROM %%trows AS m LEFT OUTER JOIN limits AS l ON m.status = l.status;
CREATE STREAM j_grouped SESSION(ts, 5s) FROM meters PARTITION BY tbname
  INTO o_j_grouped AS
  SELECT _twstart, l.cap, count(*) n
  FROM %%trows m INNER JOIN limits l ON m.status = l.status GROUP BY l.cap;
CREATE STREAM j_same INTERVAL(10s) SLIDING(10s) FROM meters PARTITION BY tbname
  INTO o_j_same AS
  SELECT _twstart, count(*) n, max(o.current) other
  FROM %%trows m JOIN meters o ON m.ts = o.ts AND m.tbname <> o.tbname;
CREATE STREAM sub_interval INTERVAL(20s) SLIDING(20s) FROM meters PARTITION BY tbname
  INTO o_sub_interval AS
  SELECT _wstart, _wend we, status, count(*) n, max(current) m
  FROM %%trows PARTITION BY status INTERVAL(5s);
CREATE STREAM sub_sliding INTERVAL(20s) SLIDING(20s) FROM meters PARTITION BY tbname
  INTO o_sub_sliding AS
  SELECT _twstart, _wstart ws, count(*) n, avg(current) a
  FROM %%trows INTERVAL(10s) SLIDING(5s) HAVING count(*) > 1;
CREATE STREAM fill_null INTERVAL(20s) SLIDING(20s) FROM meters PARTITION BY tbname
  INTO o_fill_null AS
  SELECT _wstart, count(*) n, avg(current) a
  FROM %%trows INTERVAL(5s) FILL(NULL);
CREATE STREAM fill_value INTERVAL(20s) SLIDING(20s) FROM meters PARTITION BY tbname
  INTO o_fill_value AS
  SELECT _wstart, count(*) n, max(current) a
  FROM %%trows INTERVAL(5s) FILL(VALUE, 0, -1.5);
CREATE STREAM fill_prev INTERVAL(20s) SLIDING(20s) FROM meters PARTITION BY tbname
  INTO o_fill_prev AS
  SELECT _wstart, avg(current) n, max(current) a
  FROM %%trows INTERVAL(5s) FILL(PREV);
CREATE STREAM fill_next INTERVAL(20s) SLIDING(20s) FROM meters PARTITION BY tbname
  INTO o_fill_next AS
  SELECT _wstart, avg(current) n, max(current) a
  FROM %%trows INTERVAL(5s) FILL(NEXT);
CREATE STREAM fill_linear INTERVAL(20s) SLIDING(20s) FROM meters PARTITION BY tbname
  INTO o_fill_linear AS
  SELECT _wstart, avg(current) n, max(current) a
  FROM %%trows INTERVAL(5s) FILL(LINEAR);
