r"""The KV tier's first keystroke after an idle gap (issue 30): a developer's 2,000-token file is
cached, other sessions push it out of the RAM pool while the developer is away, then the developer
types again (20 new tokens); and the same after `warmpath serve` restarts. Tier off vs on, one run,
same windows of real code, each server alone with every core, its RAM pool sized so one other
2,000-token-plus file evicts the first.

    python benchmarks/kv_tier.py --model qwen2.5-coder-1.5b \
        [--out benchmarks/results/kv_tier_....json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).parent))

from common import code_windows, machine, write_json  # noqa: E402
from first_start import free_port  # noqa: E402
from server_compare import WARMPATH, _streams, serve  # noqa: E402

from warmpath.models.registry import load_tokenizer  # noqa: E402

# 2,560 tokens of RAM pool: the other file (2,480) evicts the first
CONTEXT, NEW, POOL_BLOCKS = 2000, 20, 160


def first_token(url: str, prompt: list[int]) -> dict:
    rec = asyncio.run(_streams(url, [prompt], 1))[0]
    return {
        "ttft_s": rec.ttft, "cached_tokens": rec.cached_tokens, "prompt_tokens": rec.prompt_tokens
    }


def stop(proc) -> None:
    proc.send_signal(signal.SIGTERM)  # a clean shutdown: the tier's queued writes are flushed
    proc.wait(timeout=120)


def run(model: str, tier: str | None, windows: dict) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        WARMPATH, "serve", "--model", model, "--port",
        str(port), "--num-threads",
        str(os.cpu_count() or 2), "--num-kv-blocks",
        str(POOL_BLOCKS)
    ] + (["--kv-offload-dir", tier] if tier else [])
    proc = serve(cmd, url)
    try:
        asyncio.run(_streams(url, [windows["warmup"]], 4))
        mine, other = windows["mine"], windows["other"]
        rows = {"cold": first_token(url, mine[:CONTEXT])}
        # while the developer is away: evicts the first from RAM
        rows["other_file"] = first_token(url, other)
        rows["after_gap"] = first_token(url, mine[:CONTEXT + NEW])
    finally:
        stop(proc)
    proc = serve(cmd, url)  # the restart: an empty RAM pool
    try:
        rows["after_restart"] = first_token(url, mine[:CONTEXT + 2 * NEW])
    finally:
        stop(proc)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--out", help="JSON file for the results")
    args = ap.parse_args()
    tok = load_tokenizer(args.model)
    mine, other, warmup = code_windows(tok, CONTEXT + 2 * NEW, 3)
    windows = {
        "mine": mine, "other": other + code_windows(tok, POOL_BLOCKS * 16, 5)[4][:480],
        "warmup": warmup[:64]
    }
    results = {}
    for name in ("tier off", "tier on"):
        with tempfile.TemporaryDirectory(prefix="kv-tier-") as d:
            t = time.monotonic()
            results[name] = run(args.model, d if name == "tier on" else None, windows)
            print(f"{name}: {results[name]} ({time.monotonic() - t:.0f} s)", file=sys.stderr,
                  flush=True)
    print(f"\nmodel: {args.model}; machine: {machine()}\n")
    print("| first token of | tier off | tier on | ratio |\n|---|---|---|---|")
    for row, label in (("cold", f"a cold {CONTEXT}-token file"),
                       ("after_gap", f"{CONTEXT} + {NEW} after another "
                        "file evicted it from RAM"), ("after_restart",
                                                      f"{CONTEXT} + {2 * NEW} after a restart")):
        off, on = results["tier off"][row], results["tier on"][row]
        print(
            f"| {label} | {off['ttft_s']:.3f} s ({off['cached_tokens']} cached) | "
            f"{on['ttft_s']:.3f} s "
            f"({on['cached_tokens']} cached) | {off['ttft_s'] / on['ttft_s']:.1f}x |")
    if args.out:
        write_json(
            args.out, {
                "command": " ".join(["python", *sys.argv]), "machine": machine(),
                "model": args.model, "context": CONTEXT, "new_tokens": NEW,
                "pool_blocks": POOL_BLOCKS, "results": results
            })


if __name__ == "__main__":
    main()
