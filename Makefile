# Two commands on a fresh machine (Python 3.11+ and Java 17+ required):
#   make dev    set everything up, then run the main job: Dagster UI + daemon + Spark Connect + a sensor feed
#   (make demo  the scripted, UI-less demo)
#   make test   set everything up, then run the whole test suite
#   make check  the quick loop: lint, format check, types, every test that needs no Spark (about a minute)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup dev demo test check lint format bench clean

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

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

check: lint
	CQ_TEST_QUICK=1 $(BIN)/python -m pytest -q -m "not spark and not dagster_e2e and not ui"

bench: setup
	$(BIN)/python -m benchmarks

clean:
	rm -rf warehouse .cq .pytest_cache
