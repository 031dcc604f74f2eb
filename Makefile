# Rookery: one Makefile for the broker, the console and the pipeline.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test run lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

run: setup
	$(PY) -m brokerd --port $${BROKERD_PORT:-5680} --data-dir var/brokerd --log-level info

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check brokerd tests

bench: setup
	$(PY) -m brokerd.bench --help

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
