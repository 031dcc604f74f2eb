# Rookery: one Makefile for the broker, the console and the pipeline.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NPM_STAMP := node_modules/.installed

.PHONY: setup test test-fast run lint bench clean

setup: $(STAMP) $(NPM_STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

# htmx, htmx-ext-ws and uPlot, exactly as package-lock.json pins them.
$(NPM_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $(NPM_STAMP)

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The unit tests alone (nothing that starts a process: the integration marker).
test-fast: setup
	$(PY) -m pytest -q -m "not integration" $(PYTEST_ARGS)

# Console, Redis, Celery and a four-broker cluster; environment knobs in deploy/README.md.
run: setup
	$(PY) deploy/quickstart.py

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m tests.support.docnames

bench: setup
	$(PY) -m brokerd.bench --help

clean:
	rm -rf $(VENV) node_modules var .pytest_cache .ruff_cache
