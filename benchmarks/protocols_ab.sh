#!/usr/bin/env bash
# The same editor trace through every editor protocol (OpenAI completions with the suffix, llama.cpp's /infill,
# Mistral FIM, Ollama's generate, Tabby) against two running servers, A and B (before and after a change): one
# `warmpath bench` per protocol, the two servers in alternating order from one protocol to the next.
# Usage: benchmarks/protocols_ab.sh URL_A URL_B [NAME_A NAME_B]; TAG, DEVELOPERS, DURATION as in the other scripts.
# Writes benchmarks/results/protocols_ab_${TAG}_${protocol}.json.
set -euo pipefail
cd "$(dirname "$0")/.."
A=$1 B=$2 NA=${3:-A} NB=${4:-B}
TAG=${TAG:-ab}
i=0
for proto in openai infill mistral ollama tabby; do
  if (( i % 2 )); then urls=("$B" "$A"); names="$NB,$NA"; else urls=("$A" "$B"); names="$NA,$NB"; fi
  i=$((i + 1))
  .venv/bin/warmpath bench --workload editor --developers "${DEVELOPERS:-4}" --duration "${DURATION:-60}" --rate 30 \
    --seed "${SEED:-3}" --fim --target "${urls[0]}" --baseline "${urls[1]}" --protocols "$proto,$proto" \
    --names "$names" --json "benchmarks/results/protocols_ab_${TAG}_${proto}.json" --markdown --no-progress
done
