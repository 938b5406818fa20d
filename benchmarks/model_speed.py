"""Cold prefill and single-stream decode: warmpath vs transformers, same GGUF, same prompts, same
run.

    python benchmarks/model_speed.py [--dtypes float32,bfloat16] [--repeats 3] [--json out.json]

Prompts are windows of real standard-library code (a different window each repeat, so nothing is
warm). Prefill = time to the first token of a fresh prompt (transformers: one forward keeping only
the last logits). Decode = tokens/s of one stream after a 512-token prompt (64 tokens, greedy).
"""

from __future__ import annotations

import argparse
import statistics
import sys

from baselines import DECODE_CONTEXT, DECODE_TOKENS, PREFILL_SIZES
from baselines.transformers_hf import Transformers
from common import code_windows, machine, write_json

from warmpath import LLM, SamplingParams
from warmpath.models.registry import load_tokenizer


class Warmpath:
    name = "warmpath"

    def __init__(self, dtype: str):
        self.llm = LLM("smollm2", dtype=dtype, enable_prefix_caching=False)  # every prefill cold

    def prefill(self, ids: list[int]) -> float:
        out = self.llm.generate({"prompt_token_ids": ids},
                                SamplingParams(max_tokens=1, temperature=0))[0]
        return out.metrics.ttft

    def decode_tps(self, ids: list[int]) -> float:
        sp = SamplingParams(max_tokens=DECODE_TOKENS + 1, temperature=0, ignore_eos=True)
        m = self.llm.generate({"prompt_token_ids": ids}, sp)[0].metrics
        return DECODE_TOKENS / (m.finish_time - m.first_token_time)


def measure(system, windows: dict[int, list[list[int]]], repeats: int) -> dict:
    system.prefill(windows[PREFILL_SIZES[0]][-1][:64])  # warm-up: allocator, thread pool, kernels
    row = {}
    for n in PREFILL_SIZES:
        row[f"prefill_{n}_s"] = statistics.median(
            system.prefill(windows[n][r]) for r in range(repeats))
        print(f"  {system.name:12s} prefill {n:5d}: {row[f'prefill_{n}_s']:.3f} s", file=sys.stderr)
    row["decode_tps"] = statistics.median(
        system.decode_tps(windows[DECODE_CONTEXT][r]) for r in range(repeats))
    print(f"  {system.name:12s} decode: {row['decode_tps']:.1f} tok/s", file=sys.stderr)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--systems", default="warmpath,transformers")
    ap.add_argument("--json", default="benchmarks/results/model_speed.json")
    args = ap.parse_args()
    results = []
    tok = load_tokenizer("smollm2")
    windows = {n: code_windows(tok, n, args.repeats + 1) for n in (*PREFILL_SIZES, DECODE_CONTEXT)}
    for dtype in args.dtypes.split(","):
        for cls in [c for c in (Warmpath, Transformers) if c.name in args.systems.split(",")]:
            print(f"{cls.name} {dtype}: loading", file=sys.stderr)
            system = cls(dtype)
            results.append(
                {"system": cls.name, "dtype": dtype, **measure(system, windows, args.repeats)})
            del system

    print(f"\nmachine: {machine()}; medians of {args.repeats}\n")
    head = "| system | dtype | " + " | ".join(f"prefill {n}"
                                              for n in PREFILL_SIZES) + " | decode tok/s |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in results:
        cells = " | ".join(f"{r[f'prefill_{n}_s']:.3f} s" for n in PREFILL_SIZES)
        print(f"| {r['system']} | {r['dtype']} | {cells} | {r['decode_tps']:.1f} |")
    base = {r["dtype"]: r for r in results if r["system"] == "transformers"}
    for r in results:
        b = base.get(r["dtype"])
        if r["system"] == "warmpath" and b:
            ratios = ", ".join(f"prefill {n} {r[f'prefill_{n}_s'] / b[f'prefill_{n}_s']:.2f}x time"
                               for n in PREFILL_SIZES)
            decode = r["decode_tps"] / b["decode_tps"]
            print(f"warmpath/transformers {r['dtype']}: {ratios}, decode {decode:.2f}x tok/s")
    write_json(args.json, {"machine": machine(), "repeats": args.repeats, "results": results})


if __name__ == "__main__":
    main()
