#!/usr/bin/env bash
# Issue 33's table: the editor trace with the suffix after the cursor (what editors send), one trace replayed
# against fresh servers one after the other on the same code model:
#   warmpath /infill (the anchored FIM layout, the default) · warmpath /v1/completions with `suffix` · warmpath
#   /infill with --fim-layout cursor (the plain layout) · llama.cpp's llama-server /infill (same file, same threads)
# then the same trace without the suffix on warmpath (--no-fim: what the cache alone gives).
# Usage: MODEL=qwen2.5-coder-0.5b DEVELOPERS=4 benchmarks/fim_editor.sh [extra `warmpath bench` flags]
# CURSOR=0 leaves the cursor-layout server out (the "before" of tokens computed per request).
# Writes benchmarks/results/fim_editor_${TAG}.json and fim_editor_${TAG}_nofim.json (TAG defaults to the model).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
MODEL=${MODEL:-qwen2.5-coder-0.5b}
TAG=${TAG:-$MODEL}
THREADS=$(nproc)
BENCH=(--workload editor --duration "${DURATION:-120}" --rate 30 --seed "${SEED:-3}" --developers "${DEVELOPERS:-4}")  # DEVS below: the same
$BIN/python benchmarks/baselines/llama_server.py install
logs=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
serve() { exec $BIN/warmpath serve --model "$MODEL" --num-threads "$THREADS" --port "$@"; }
ready() { for _ in $(seq 600); do curl -sf "http://127.0.0.1:$1/v1/models" >/dev/null && return; sleep 0.5; done; }
# The first start on a machine measures the plan and the prompt speed (the FIM suffix's budget): alone, then kept
serve 8100 >"$logs/anchored.log" 2>&1 & pids+=($!)
ready 8100
serve 8101 >"$logs/openai.log" 2>&1 & pids+=($!)
if [ "${CURSOR:-1}" = 1 ]; then serve 8102 --fim-layout cursor >"$logs/cursor.log" 2>&1 & pids+=($!); fi
# llama-server: a slot per developer (its cache is per slot), a unified KV of ~2,500 tokens a slot, and
# --cache-reuse 256 as llama.vim's README runs it for FIM (reuses shifted chunks of the cached prompt)
DEVS=${DEVELOPERS:-4}
$BIN/python benchmarks/baselines/llama_server.py serve --model "$MODEL" --port 8103 --threads "$THREADS" --parallel "$DEVS" \
  --ctx $((DEVS * 2560 > 8192 ? DEVS * 2560 : 8192)) --cache-reuse 256 >"$logs/llama.log" 2>&1 &
pids+=($!)
targets=(--target http://127.0.0.1:8100 --baseline http://127.0.0.1:8101)
protocols=infill,openai names=warmpath-infill,warmpath-openai-suffix ports="8100 8101 8103"
if [ "${CURSOR:-1}" = 1 ]; then
  targets+=(--baseline http://127.0.0.1:8102) protocols+=,infill names+=,warmpath-cursor-layout ports+=" 8102"
fi
targets+=(--baseline http://127.0.0.1:8103) protocols+=,infill names+=,llama-server-infill
for port in $ports; do ready "$port"; done
$BIN/warmpath bench "${BENCH[@]}" --fim "${targets[@]}" --protocols "$protocols" --names "$names" \
  --json "benchmarks/results/fim_editor_${TAG}.json" --markdown "$@"
for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
wait 2>/dev/null || true
pids=()
serve 8100 >"$logs/nofim.log" 2>&1 & pids+=($!)
ready 8100
$BIN/warmpath bench "${BENCH[@]}" --no-fim --target http://127.0.0.1:8100 --protocols infill --names warmpath-no-suffix \
  --json "benchmarks/results/fim_editor_${TAG}_nofim.json" --markdown "$@"
