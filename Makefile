# funsim: two commands on a fresh machine.
#   make demo   build .venv if missing, install, run the quickstart offline, print where the report is
#   make test   same setup, then the fast test suite (what CI runs)
#   make test-f32  the float32 leg: the marked tests with x64 off, as users run (CI runs it too)
#   make test-f32-newest  the float32 leg and the batched-LAPACK tests on the newest jax/jaxlib/flax
#                  (a second venv, .venv-newest), with XLA's default optimisation (CI runs it)
#   make lint   ruff check (config in pyproject.toml; CI runs it)
#   make bench  run the side-by-side benchmarks (installs the peer libraries first)
#   make data   install the optional offline Fashion-MNIST (Debian package dataset-fashion-mnist)

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# pytest-xdist: one worker per core (JAX compiles dominate the suite's time).
PYTEST_WORKERS ?= auto

# .venv holds the lowest jax the package supports (pyproject.toml's lower bound; pip picks the flax
# that fits it), so make test checks that end of the range.
LOWEST_JAX  ?= 0.9.2
# The other end of the supported range (pyproject.toml has lower bounds only): the newest releases,
# pinned here so that a CI run is reproducible; raise them when new ones come out.
NEWEST_JAX  ?= 0.10.2
NEWEST_FLAX ?= 0.12.8
VENV_NEW    := .venv-newest
PY_NEW      := $(VENV_NEW)/bin/python
STAMP_NEW   := $(VENV_NEW)/.installed-stamp

.PHONY: demo test test-f32 test-f32-newest test-slow lint bench clean venv data

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip

$(STAMP): pyproject.toml Makefile | $(PY)
	$(PY) -m pip install -e ".[test,data]" "jax==$(LOWEST_JAX)" "jaxlib==$(LOWEST_JAX)"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/funsim quickstart

test: $(STAMP)
	$(PY) -m pytest -n $(PYTEST_WORKERS) -m "not slow" $(PYTEST_ARGS) tests

# x64 off (FUNSIM_TEST_X64=0): float32, the precision users get by default, against float64
# references; only the tests marked float32 run (the x64 suite skips them).
test-f32: $(STAMP)
	FUNSIM_TEST_X64=0 $(PY) -m pytest -n $(PYTEST_WORKERS) -m float32 $(PYTEST_ARGS) tests/test_float32.py

# jax/jaxlib/flax first, then funsim: pip must keep them (the install a user with the newest JAX gets).
$(PY_NEW):
	$(PYTHON) -m venv $(VENV_NEW)
	$(PY_NEW) -m pip install --upgrade pip

$(STAMP_NEW): pyproject.toml Makefile | $(PY_NEW)
	$(PY_NEW) -m pip install "jax==$(NEWEST_JAX)" "jaxlib==$(NEWEST_JAX)" "flax==$(NEWEST_FLAX)"
	$(PY_NEW) -m pip install -e ".[test,data]"
	$(PY_NEW) -c "import flax, jax, jaxlib; v = (jax.__version__, jaxlib.__version__, flax.__version__); \
	  assert v == ('$(NEWEST_JAX)', '$(NEWEST_JAX)', '$(NEWEST_FLAX)'), f'pip replaced the newest jax/jaxlib/flax: {v}'"
	touch $(STAMP_NEW)

# FUNSIM_TEST_XLA_OPT=1: XLA's default pipeline (every other leg turns LLVM optimisation off to compile
# faster). tests/test_lapack_batching.py runs the old batched-LAPACK deadlock's reproducer here.
test-f32-newest: $(STAMP_NEW)
	FUNSIM_TEST_XLA_OPT=1 FUNSIM_TEST_X64=0 $(PY_NEW) -m pytest -n $(PYTEST_WORKERS) -m float32 $(PYTEST_ARGS) tests/test_float32.py
	FUNSIM_TEST_XLA_OPT=1 $(PY_NEW) -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS) tests/test_lapack_batching.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test-slow: $(STAMP)
	$(PY) -m pytest -n $(PYTEST_WORKERS) -m slow $(PYTEST_ARGS) tests

bench: $(STAMP)
	$(PY) -m pip install -e ".[bench]"
	$(PY) -m benchmarks.run_all

# Optional offline data: Fashion-MNIST's IDX files from Debian (30 MB) for `funsim zoo`.
# Everything runs without it; where apt is missing this says so and stops.
FASHION_DIR := /usr/share/datasets/fashion-mnist
data:
	@if [ -d $(FASHION_DIR) ]; then \
	  echo "make data: Fashion-MNIST is already installed in $(FASHION_DIR)."; \
	elif command -v apt-get >/dev/null 2>&1; then \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update && $$SUDO apt-get install -y dataset-fashion-mnist \
	  && echo "make data: installed Fashion-MNIST in $(FASHION_DIR); funsim zoo --config default now trains on it too."; \
	else \
	  echo "make data: apt-get is not available here, so the Debian package dataset-fashion-mnist was NOT installed."; \
	  echo "  Fashion-MNIST is optional: funsim zoo trains on mnist5k and digits without it and says so in its summary."; \
	  echo "  To add it by hand: put the four IDX files in a directory and load it with idx_dir=..., or use tfds with internet."; \
	fi

clean:
	rm -rf $(VENV) $(VENV_NEW) build *.egg-info .pytest_cache .hypothesis
