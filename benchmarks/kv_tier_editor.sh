#!/usr/bin/env bash
# Issue 30's editor bench with idle gaps: developers type, leave for ~30 minutes (compressed by --rate) and come back
# to the same files, while the others' files fill a RAM pool too small for everyone. One trace against two fresh
# servers on the same model, one after the other: the KV tier on disk on, and off.
# Usage: MODEL=qwen2.5-coder-0.5b DEVELOPERS=8 BLOCKS=400 [TIER_BYTES=4GiB] benchmarks/kv_tier_editor.sh [extra
# `warmpath bench` flags]. The simulator's answer to check it against: `warmpath simulate --profile cpu-<model>
# --developers N --duration 240 --rate 30 --seed 3 --num-kv-blocks BLOCKS --sweep kv-tier`.
# Writes benchmarks/results/kv_tier_editor_${TAG}.json (TAG defaults to the model and the developers).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
MODEL=${MODEL:-qwen2.5-coder-0.5b}
DEVS=${DEVELOPERS:-8}
TAG=${TAG:-${MODEL}_${DEVS}dev}
THREADS=$(nproc)
tier=$(mktemp -d)
logs=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tier"; }
trap cleanup EXIT
serve() { local port=$1; shift
  $BIN/warmpath serve --model "$MODEL" --num-threads "$THREADS" --num-kv-blocks "${BLOCKS:-400}" --port "$port" "$@" \
    >"$logs/$port.log" 2>&1 &
  pids+=($!); }
serve 8320 --kv-offload-dir "$tier" --kv-offload-bytes "${TIER_BYTES:-4GiB}"
serve 8321
for port in 8320 8321; do
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && break; sleep 0.5; done
done
$BIN/warmpath bench --workload editor --developers "$DEVS" --duration "${DURATION:-240}" --rate 30 --seed "${SEED:-3}" \
  --fim --target http://127.0.0.1:8320 --baseline http://127.0.0.1:8321 --protocols infill,infill \
  --names "tier-on,tier-off" --json "benchmarks/results/kv_tier_editor_${TAG}.json" --markdown "$@"
curl -s http://127.0.0.1:8320/metrics | grep -E '^warmpath_(prefix_cache_(tier_)?hit_tokens|kv_tier_)' || true
