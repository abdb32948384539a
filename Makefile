# funsim: two commands on a fresh machine.
#   make demo   build .venv if missing, install, run the quickstart offline, print where the report is
#   make test   same setup, then the fast test suite (what CI runs)
#   make bench  run the side-by-side benchmarks (installs the peer libraries first)

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# pytest-xdist: one worker per core (JAX compiles dominate the suite's time).
PYTEST_WORKERS ?= auto

.PHONY: demo test test-slow bench clean venv

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -e ".[test,data]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/funsim quickstart

test: $(STAMP)
	$(PY) -m pytest -n $(PYTEST_WORKERS) -m "not slow" $(PYTEST_ARGS) tests similarity models experiments

test-slow: $(STAMP)
	$(PY) -m pytest -n $(PYTEST_WORKERS) -m slow $(PYTEST_ARGS) tests

bench: $(STAMP)
	$(PY) -m pip install -e ".[bench]"
	$(PY) -m benchmarks.run_all

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
