# Rookery: one Makefile for the broker, the console and the pipeline.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NPM_STAMP := node_modules/.installed
# make test's workers per phase (pytest-xdist). Two, for two cores: a third
# made the first phase CPU-bound (100 % busy) and won about 10 %, while every
# timing in it stretched (docs/benchmarks.md, "Test suite").
TEST_WORKERS ?= 2
SERIAL_WORKERS ?= 2

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

# Two phases. Every test not marked `serial` runs on TEST_WORKERS workers, one
# module per worker at a time (module-scoped brokers and clusters stay shared;
# the pipeline tests share one worker and one Spark session: tests/conftest.py).
# Then the `serial` ones (fault runs, failover timings, floods), SERIAL_WORKERS
# modules at a time, so their timing sees no browser, Spark or unit test beside
# it. Both phases run even if the first fails; a phase that PYTEST_ARGS leaves
# empty (pytest's exit 5) is no failure. Each phase's output is kept in var/ and,
# at the end, the first phase's outcome lines are repeated, so a log that keeps only
# its tail (CI's) still says what failed in either phase.
# PYTHONDONTWRITEBYTECODE (set on some machines, this one included) would make
# pytest rewrite every test module's asserts afresh in each worker: 14 s of CPU
# per process here. Unset for the tests, the rewritten modules are cached.
test: setup
	@mkdir -p var; rc=0; export PYTHONDONTWRITEBYTECODE=; \
	{ $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not serial" $(PYTEST_ARGS); echo $$? > var/test-phase1.rc; } 2>&1 | tee var/test-phase1.log; \
	r=$$(cat var/test-phase1.rc); [ $$r -eq 0 ] || [ $$r -eq 5 ] || rc=$$r; \
	$(PY) -m pytest -q -n $(SERIAL_WORKERS) --dist loadfile -m serial $(PYTEST_ARGS) || { r=$$?; [ $$r -eq 5 ] || rc=$$r; }; \
	echo "== first phase (not serial): exit $$(cat var/test-phase1.rc) =="; \
	grep -aE '^(FAILED|ERROR) |Interrupted|INTERNALERROR|crashed|keyboard-interrupt|[0-9]+ (passed|failed|errors?)([ ,]|$$)' var/test-phase1.log | tail -40; \
	exit $$rc

# The unit tests alone (nothing that starts a process: the integration marker).
test-fast: setup  # PYTHONDONTWRITEBYTECODE unset: see test
	PYTHONDONTWRITEBYTECODE= ROOKERY_TEST_FAST=1 $(PY) -m pytest -q -n 2 -m "not integration" $(PYTEST_ARGS)

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
