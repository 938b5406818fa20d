"""Cold vs warm time-to-first-token on the bundled model: what the prefix cache buys.

    python benchmarks/warm_ttft.py [--dtype auto] [--repeats 3]

Cold: a fresh window of real code (nothing cached). Warm: the same window again plus 20 new tokens,
as an editor sends after a developer types a few characters. Medians of --repeats distinct windows
per size.
"""

from __future__ import annotations

import argparse
import statistics

from common import code_windows, machine, write_json

from warmpath import LLM, SamplingParams
from warmpath.config import SchedulerConfig

SIZES = (512, 2048, 4000)
NEW_TOKENS = 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default="benchmarks/results/warm_ttft.json")
    args = ap.parse_args()
    one_step = SchedulerConfig(max_num_batched_tokens=8192)  # one prefill step: TTFT, not chunking
    llm = LLM("smollm2", dtype=args.dtype, scheduler=one_step)
    one = SamplingParams(max_tokens=1, temperature=0)
    llm.generate({"prompt_token_ids": list(range(100, 164))}, one)  # warm-up
    rows = []
    for n in SIZES:
        cold, warm, cached = [], [], []
        for window in code_windows(llm.get_tokenizer(), n, args.repeats, extra=NEW_TOKENS):
            c = llm.generate({"prompt_token_ids": window[:n]}, one)[0]
            w = llm.generate({"prompt_token_ids": window}, one)[0]
            cold.append(c.metrics.ttft)
            warm.append(w.metrics.ttft)
            cached.append(w.num_cached_tokens)
        row = {
            "context": n, "cold_ttft_s": statistics.median(cold),
            "warm_ttft_s": statistics.median(warm), "warm_cached_tokens": min(cached)
        }
        row["speedup"] = row["cold_ttft_s"] / row["warm_ttft_s"]
        rows.append(row)
    print(
        f"machine: {machine()}; dtype {str(llm.dtype).removeprefix('torch.')}; medians of "
        f"{args.repeats}\n"
    )
    print("| context | cold TTFT | warm TTFT (+20 tokens) | cached tokens | cold / warm |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['context']} | {r['cold_ttft_s'] * 1000:.0f} ms | {r['warm_ttft_s'] * 1000:.1f} "
            "ms | "
            f"{r['warm_cached_tokens']} | {r['speedup']:.0f}x |")
    write_json(args.json, {"machine": machine(), "dtype": str(llm.dtype), "rows": rows})


if __name__ == "__main__":
    main()
