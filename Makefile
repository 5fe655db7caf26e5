# Two commands on a fresh machine (Python 3.11+ and Java 17+ required):
#   make dev    set everything up, then run the main job: Dagster UI + daemon + Spark Connect + a sensor feed
#   (make dev-airflow  the same sql/ under Airflow 3: its UI on http://127.0.0.1:8080)
#   (make demo  the scripted, UI-less demo)
#   make test   set everything up, then run the whole test suite
#   make check  the quick loop: lint, format check, types, every test that needs no Spark (about a minute)
#   make docs   the documentation site (docs/, mkdocs.yml) built with --strict into site/
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup jars dev dev-airflow demo test check lint format docs cluster-setup cluster-test chaos-test bench clean versitygw

# The JVM jars Spark loads from the local Maven repository, as cq_engine/jars.py names them: Delta's at
# the installed delta-spark package's version (one pin in pyproject.toml), and hadoop-aws matching
# pyspark's bundled Hadoop with its AWS SDK bundle (s3a:// warehouses). Fetched once; offline
# afterwards. No mvn: the engine falls back to the delta-rs storage and says so. With a JDK (javac), the
# engine's Delta log store for s3:// warehouses is compiled too (cq_engine/jvm/; otherwise on first use).
M2     ?= $(HOME)/.m2/repository

jars: $(BIN)/cq
	@if ! command -v mvn >/dev/null; then \
	  echo "mvn not found: Delta runs on the delta-rs storage (install maven for delta-spark)" >&2; \
	else coords=$$($(BIN)/python -m cq_engine.jars --coordinates) || exit 1; for a in $$coords; do \
	  g=$${a%%:*}; rest=$${a#*:}; n=$${rest%%:*}; v=$${rest#*:}; \
	  f="$(M2)/$$(echo $$g | tr . /)/$$n/$$v/$$n-$$v.jar"; \
	  [ -f "$$f" ] || mvn -B -q dependency:get -Dtransitive=false -Dartifact=$$a || exit 1; \
	done; \
	if command -v javac >/dev/null; then $(BIN)/python -m cq_engine.jars --build >/dev/null || exit 1; fi; fi

$(BIN)/cq: pyproject.toml
	@command -v java >/dev/null || { echo "Java 17+ is required (Spark 4): install e.g. openjdk-17-jre-headless" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test,airflow]"
	@touch $@

setup: $(BIN)/cq jars

dev: setup
	$(BIN)/cq dev

# The same sql/ under Airflow 3 (airflow_dags/dev.py): scheduler, DAG processor, triggerer and API server
# (UI on http://127.0.0.1:8080, its login printed), AIRFLOW_HOME in .cq/airflow; Ctrl-C stops all.
dev-airflow: setup
	$(BIN)/python -m airflow_dags.dev

demo: setup
	$(BIN)/cq demo

# The 25 slowest tests are listed at the end: where the suite's time goes (issue: under 15 minutes).
test: setup
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=25

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The site under docs/ (MkDocs + Material): --strict fails on a broken link or anchor. Its hook
# (docs/hooks.py) generates the CLI reference and the settings table from the code.
docs: setup
	$(BIN)/pip install --quiet -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

check: lint
	CQ_TEST_QUICK=1 $(BIN)/python -m pytest -q -n 2 -m "not spark and not dagster_e2e and not ui"

# The one-machine cluster of the docs' Deployment page (docs/operations/deployment.md): PostgreSQL
# from Debian, dagster-postgres and moto's S3 server from PyPI, Spark standalone from the pip pyspark package, delta-spark and
# hadoop-aws through Maven. Missing Debian packages are installed when running as root; otherwise
# this stops and names them (the test needs them: it is never skipped).
CLUSTER_DEBS := postgresql:/usr/lib/postgresql/*/bin/initdb maven:mvn openjdk-17-jdk-headless:javac

cluster-setup:
	@missing=""; for d in $(CLUSTER_DEBS); do \
	  pkg=$${d%%:*}; probe=$${d#*:}; \
	  ls $$probe >/dev/null 2>&1 || command -v $$probe >/dev/null || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing || exit 1; \
	  else \
	    echo "make cluster-setup: missing Debian package(s):$$missing; install them as root (apt-get install$$missing)" >&2; \
	    exit 1; \
	  fi; \
	fi
	$(MAKE) --no-print-directory setup
	$(BIN)/pip install --quiet -e ".[test,cluster]"

# The soak's object store (benchmarks/README.md, soak): versitygw, an S3 gateway over a directory that
# honours If-None-Match, built from the Go module proxy into .tools/bin (about 3 minutes, once).
VERSITYGW_VERSION ?= v1.8.0
versitygw: .tools/bin/versitygw
.tools/bin/versitygw:
	@command -v go >/dev/null || { echo "make versitygw: needs the go command (https://go.dev/doc/install)" >&2; exit 1; }
	GOBIN=$(CURDIR)/.tools/bin go install github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VERSION)

# The cluster test, then Airflow 3 (scheduler, DAG processor, triggerer, API server) over its PostgreSQL
# running the adapter's DAGs, cq --via-airflow and a backfill (tests/test_airflow_stack.py, about 4 min).
cluster-test: cluster-setup
	$(BIN)/python -m pytest -q -m cluster tests/test_s3_commits.py tests/test_cluster.py tests/test_airflow_stack.py tests/test_airflow_batched_stack.py

# The same cluster under faults (docs/operations/guarantees.md, Faults on the deployed topology): the
# runs that ride out a Connect server restart and a PostgreSQL outage (tests/test_recovery.py, about 5
# min), then a Spark worker, the Connect server, PostgreSQL and the object store each fail once while
# runs are in flight (tests/test_chaos.py, about 8 min at a load average of 7-12).
chaos-test: cluster-setup
	$(BIN)/python -m pytest -q -s -m cluster tests/test_recovery.py tests/test_chaos.py

bench: setup
	$(BIN)/python -m benchmarks

clean:
	rm -rf warehouse .cq .pytest_cache site
