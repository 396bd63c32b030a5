# The two commands of the README's quick start: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-extras lint typecheck unit bench soak clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,redis]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/strata demo

lint: $(STAMP)
	$(BIN)/ruff check stratastore numba_kernels tests fuzz tools
	$(BIN)/ruff format --check stratastore numba_kernels tests fuzz tools

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/python -m pytest -q --benchmark-skip

# The full suite, with the benchmarks run once each (they print their ratios, never assert time).
# The remote level's tests start real redis-server processes: tools/ensure_redis.sh installs
# Debian's redis-server first when it is missing (as root; else it says how, and they skip).
test: lint typecheck $(STAMP)
	bash tools/ensure_redis.sh
	$(BIN)/python -m pytest -q --benchmark-disable

# The adapter tests with the transformers and lmcache extras installed into .venv (CPU wheels
# of torch): the transformers adapter and the LMCache storage plugin (issue 16, the real lmcache
# package on the CPU). `make test` runs them too when the extras are there, and skips them,
# naming the extra, when they are not. The reliability floors apply to the full run of
# `make test`, not to this one.
test-extras: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[transformers,lmcache]'
	STRATA_RELIABILITY_ENFORCE=0 $(BIN)/python -m pytest -q tests/adapters

# The reliability suite at 10x the work of a CI run (and 10x its floors); prints the counts.
soak: $(STAMP)
	STRATA_SOAK=10 STRATA_RELIABILITY_ENFORCE=1 HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest -q \
		tests/reliability tests/crash tests/property tests/unit/test_fuzz_targets.py

# The benchmarks, with the scaling one at 1k, 10k and 100k stored conversations (make test runs
# it at 1k and 4k only).
bench: $(STAMP)
	STRATA_BENCH_SCALE=full $(BIN)/python -m pytest tests/bench -q -s --benchmark-only

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .benchmarks
