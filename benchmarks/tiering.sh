#!/usr/bin/env bash
# Issue 29 point 7's tiering table: the editor trace with the suffix after the cursor, one trace replayed against
#   `warmpath route` with two model tiers (line completions to the small model, everything else to the large one)
#   · the large model alone · the small model alone
# each a fresh `warmpath serve` on this machine's threads (the two tier nodes share the cores: only one is busy at a
# time unless a block and a line request overlap). The router's response cache is off, so every answer is computed.
# Usage: SMALL=qwen2.5-coder-0.5b LARGE=qwen2.5-coder-1.5b DEVELOPERS=4 benchmarks/tiering.sh [extra bench flags]
# Writes benchmarks/results/tiering_${TAG}.json (TAG defaults to ${DEVELOPERS}dev).
# Each tier's pass@1 comes from `warmpath eval` against each model (see docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
SMALL=${SMALL:-qwen2.5-coder-0.5b}
LARGE=${LARGE:-qwen2.5-coder-1.5b}
DEVS=${DEVELOPERS:-4}
TAG=${TAG:-${DEVS}dev}
THREADS=$(nproc)
BENCH=(--workload editor --duration "${DURATION:-120}" --rate 30 --seed "${SEED:-3}" --developers "$DEVS")
logs=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
serve() { local model=$1 port=$2; shift 2
  $BIN/warmpath serve --model "$model" --num-threads "$THREADS" --port "$port" "$@" >"$logs/$port.log" 2>&1 &
  pids+=($!); }
serve "$SMALL" 8310
serve "$LARGE" 8311
serve "$LARGE" 8312
serve "$SMALL" 8313
for port in 8310 8311 8312 8313; do  # a first start measures the plan: up to a minute or two
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && break; sleep 0.5; done
done
$BIN/warmpath route --port 8314 --cache-entries 0 \
  --tier "small=http://127.0.0.1:8310" --tier "large=http://127.0.0.1:8311" >"$logs/route.log" 2>&1 &
pids+=($!)
for _ in $(seq 120); do curl -sf "http://127.0.0.1:8314/health" >/dev/null && break; sleep 0.5; done
$BIN/warmpath bench "${BENCH[@]}" --fim --target http://127.0.0.1:8314 \
  --baseline http://127.0.0.1:8312 --baseline http://127.0.0.1:8313 --protocols openai,openai,openai \
  --names "tiers:$SMALL-lines+$LARGE-rest,$LARGE-alone,$SMALL-alone" \
  --json "benchmarks/results/tiering_${TAG}.json" --markdown "$@"
curl -s http://127.0.0.1:8314/metrics | grep '^warmpath_router_tier_requests_total' || true
