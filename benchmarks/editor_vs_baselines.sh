#!/usr/bin/env bash
# The README's side-by-side: one editor trace replayed against fresh servers, one after the other, on this machine:
#   warmpath (defaults) · warmpath with no prefix cache · llama.cpp's server (llama-cpp-python, same GGUF, same threads)
# Usage: benchmarks/editor_vs_baselines.sh [extra `warmpath bench` flags, e.g. --developers 8 --duration 600]
# Writes benchmarks/results/editor_vs_baselines.{json,png}. Builds llama-cpp-python once (~12 min on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
THREADS=$(nproc)
$BIN/python benchmarks/baselines/llama_cpp_python.py install
logs=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
$BIN/warmpath serve --model smollm2 --port 8100 --num-threads "$THREADS" >"$logs/warmpath.log" 2>&1 & pids+=($!)
$BIN/warmpath serve --model smollm2 --port 8101 --num-threads "$THREADS" --no-enable-prefix-caching >"$logs/nocache.log" 2>&1 & pids+=($!)
$BIN/python benchmarks/baselines/llama_cpp_python.py serve --port 8102 --threads "$THREADS" >"$logs/llama.log" 2>&1 & pids+=($!)
for port in 8100 8101 8102; do  # model loads take 10-30 s
  for _ in $(seq 240); do curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && break; sleep 0.5; done
done
# --no-fim: llama-cpp-python 0.3.36 builds a FIM prompt from token id 0 when given a suffix for a model without FIM
# tokens (its source: "TODO: Fix"), so both servers get the same prefix-only prompts.
$BIN/warmpath bench --workload editor --developers 4 --duration 300 --rate 30 --seed 0 --no-fim \
  --target http://127.0.0.1:8100 --baseline http://127.0.0.1:8101 --baseline http://127.0.0.1:8102 \
  --names warmpath,warmpath-no-cache,llama.cpp \
  --json benchmarks/results/editor_vs_baselines.json --plot benchmarks/results/editor_vs_baselines.png "$@"
