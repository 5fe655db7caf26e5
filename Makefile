# Two commands on a fresh machine (Python 3.11+ and Java 17+ required):
#   make dev    set everything up, then run the main job: Dagster UI + daemon + Spark Connect + a sensor feed
#   (make demo  the scripted, UI-less demo)
#   make test   set everything up, then run the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup dev demo test bench clean

$(BIN)/cq: pyproject.toml
	@command -v java >/dev/null || { echo "Java 17+ is required (Spark 4): install e.g. openjdk-17-jre-headless" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test]"
	@touch $@

setup: $(BIN)/cq

dev: setup
	$(BIN)/cq dev

demo: setup
	$(BIN)/cq demo

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python -m benchmarks

clean:
	rm -rf warehouse .cq .pytest_cache
