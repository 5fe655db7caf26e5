# Two commands on a fresh machine (Python 3.11+ and Java 17+ required):
#   make demo   set everything up, then run the main job (the scripted demo)
#   make test   set everything up, then run the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup demo test bench clean

$(BIN)/cq: pyproject.toml
	@command -v java >/dev/null || { echo "Java 17+ is required (Spark 4): install e.g. openjdk-17-jre-headless" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test]"
	@touch $@

setup: $(BIN)/cq

demo: setup
	$(BIN)/cq demo

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python -m benchmarks

clean:
	rm -rf warehouse .cq .pytest_cache
