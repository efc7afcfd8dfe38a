# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install test test-random lint demo e2e bench bench-quick bench-planner fuzz soak clean image ray-matrix

# PYTHONWARNINGS=ignore: setuptools' editable-install banner (printed once per package, the same
# every time, nothing to act on) would be all a newcomer sees for the first minute.
$(STAMP): pyproject.toml standins/pyproject.toml
	@echo "== installing kuberay-scaler, the stand-ins and the test tools into $(VENV) (first time: 1-3 min) =="
	$(PYTHON) -m venv $(VENV)
	PYTHONWARNINGS=ignore $(BIN)/pip install --quiet --upgrade pip
	PYTHONWARNINGS=ignore $(BIN)/pip install --quiet -e '.[test]' -e ./standins
	touch $(STAMP)
	@echo "== installed: the CLI is $(BIN)/kuberay-scaler (or: . $(BIN)/activate) =="

install: $(STAMP)

test: install
	$(BIN)/pytest -q

# The same suite in a random order (pytest-randomly; SEED=n repeats an order, printed at the start).
ifndef SEED
SEED := $(shell python3 -c 'import random; print(random.randrange(10**6))')
endif
test-random: install
	@echo "== random order, seed $(SEED) (make test-random SEED=$(SEED) repeats it) =="
	$(BIN)/pytest -q -p randomly -p no:cacheprovider --randomly-seed=$(SEED)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/mypy bench  # scripts, not a package: checked on their own (same strict settings)
	$(BIN)/lint-imports

demo: install
	$(BIN)/kuberay-scaler-demo

e2e: install
	scripts/build-control-plane.sh >/dev/null
	$(BIN)/pytest -q -m e2e tests/e2e

# Planner fuzzing through parse -> plan -> patch (hypothesis); CI runs FUZZ_EXAMPLES=500.
FUZZ_EXAMPLES ?= 5000
fuzz: install
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/pytest -q -p no:cacheprovider tests/fuzz

# The demo harness under a random workload and random faults; every write is checked, and the run
# must judge >= 10 daemon writes a minute (scale-ups, scale-downs, a replacement, drains).
MINUTES ?= 2
soak: install
	$(BIN)/python -m tests.soak --minutes $(MINUTES)

# Builds the image without Docker (podman + an mmdebstrap base cached in ~/.cache/kuberay-scaler),
# then runs it: version, check-config, and the daemon against the stand-ins for one scale-up.
image: install
	scripts/build-image.sh
	$(BIN)/pytest -q -m image tests/image

# GCS client core tests against the newest (.venv) and older Ray heads (cached venvs).
ray-matrix: install
	scripts/ray-matrix.sh

# Ours vs Ray v1/v2 side by side (docs/benchmarks.md); QUICK=1 (or bench-quick): ≤ 5 min.
bench: install
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python bench/run.py $(if $(QUICK),--quick,)

bench-quick:
	$(MAKE) bench QUICK=1

bench-planner: install
	$(BIN)/python bench/bench_planner.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
