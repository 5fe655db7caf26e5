-- eKuiper rule forms (issue 21) that load and run end to end without a traceback: the GROUP BY key
-- selected with every window function, window_start() / window_end() selected, *, columns outside
-- aggregates, HAVING on a selected alias, FILTER and OVER together, lateTolerance.
-- tests/test_ekuiper_rules.py runs them; tests/test_fuzz.py mutates them.
CREATE STREAM demo (ID STRING, temperature FLOAT, revenue FLOAT, ts BIGINT)
    WITH (DATASOURCE="demo", FORMAT="json", KEY="ts", TIMESTAMP="ts");
CREATE RULE k_tumble INTO k_tumble AS SELECT ID, count(*) AS c, sum(temperature) AS t FROM demo
    GROUP BY ID, TUMBLINGWINDOW(ss, 10);
CREATE RULE k_hop INTO k_hop AS SELECT ID, count(*) AS c FROM demo GROUP BY ID, HOPPINGWINDOW(ss, 10, 5);
CREATE RULE k_slide INTO k_slide AS SELECT ID, count(*) AS c, sum(revenue) AS s FROM demo
    GROUP BY ID, SLIDINGWINDOW(ss, 10);
CREATE RULE k_session INTO k_session AS SELECT ID, count(*) AS c FROM demo GROUP BY ID, SESSIONWINDOW(ss, 60, 5);
CREATE RULE k_count INTO k_count AS SELECT ID, count(*) AS c FROM demo GROUP BY ID, COUNTWINDOW(3);
CREATE RULE k_bounds INTO k_bounds AS SELECT window_start() AS ws, window_end(), ID, count(*) AS c FROM demo
    GROUP BY ID, TUMBLINGWINDOW(ss, 10);
CREATE RULE k_star INTO k_star AS SELECT * FROM demo GROUP BY TUMBLINGWINDOW(ss, 10);
CREATE RULE k_first INTO k_first AS SELECT *, count(*) AS n FROM demo GROUP BY ID, TUMBLINGWINDOW(ss, 10);
CREATE RULE k_having INTO k_having AS SELECT ID, count(*) AS c FROM demo GROUP BY ID, TUMBLINGWINDOW(ss, 10)
    HAVING c > 1;
CREATE RULE k_over INTO k_over AS SELECT ID, count(*) AS c FROM demo
    GROUP BY ID, SLIDINGWINDOW(ss, 10) FILTER(WHERE revenue > 15) OVER(WHEN revenue > 35);
CREATE RULE k_late INTO k_late WITH (lateTolerance = 2000) AS SELECT ID, count(*) AS c FROM demo
    GROUP BY ID, TUMBLINGWINDOW(ss, 10);
CREATE RULE k_plain INTO k_plain AS SELECT ID, temperature FROM demo GROUP BY ID, TUMBLINGWINDOW(ss, 10);
CREATE RULE k_rows INTO k_rows AS SELECT * FROM demo WHERE revenue > 12 GROUP BY TUMBLINGWINDOW(ss, 10)
    HAVING COUNT(*) > 2;
