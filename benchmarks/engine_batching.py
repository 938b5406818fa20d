r"""Continuous batching and chunked prefill on the bundled model.

    python benchmarks/engine_batching.py [--dtype auto] [--streams 1,4,16,32] \
        [--budgets 256,512,none]

1. Aggregate decode tokens/s with N concurrent streams (256-token real-code prompts, 64 tokens out):
   tokens generated while every stream is decoding (after the last prompt's prefill, until the first
   stream finishes), divided by that time.
2. Head-of-line: 8 streams decoding when a 4,000-token prompt arrives. Inter-token latency p50 / p99
   of the 8 streams while it prefills, and its TTFT, for several per-step token budgets ("none" =
   the whole prompt in one step: no chunking).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from common import code_windows, machine, write_json

from warmpath import LLM, EngineRequest, SamplingParams
from warmpath.stats import percentile


def decode_throughput(llm: LLM, prompts: list[list[int]]) -> dict:
    sp = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    engine = llm.engine
    for i, p in enumerate(prompts):
        engine.add_request(EngineRequest(f"s{i}", p, sp))
    while any(not r.output_token_ids for r in engine.requests.values()):
        engine.step()  # prefills (with the first decodes mixed in)
    start, tokens = time.perf_counter(), 0
    while True:
        outs = engine.step()
        if any(o.finished for o in outs):
            break
        tokens += sum(len(o.new_token_ids) for o in outs)
        end = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    return {"streams": len(prompts), "tokens_per_s": tokens / (end - start)}


def head_of_line(llm: LLM, streams: list[list[int]], big: list[int]) -> dict:
    engine = llm.engine
    sp = SamplingParams(max_tokens=10_000, temperature=0, ignore_eos=True)
    for i, p in enumerate(streams):
        engine.add_request(EngineRequest(f"d{i}", p, sp))
    while any(not engine.requests[f"d{i}"].output_token_ids for i in range(len(streams))):
        engine.step()
    engine.step()
    last_token = {f"d{i}": time.perf_counter() for i in range(len(streams))}
    engine.add_request(EngineRequest("big", big, SamplingParams(max_tokens=1, temperature=0)))
    arrival = time.perf_counter()
    gaps, ttft = [], None
    while ttft is None:
        outs = engine.step()
        now = time.perf_counter()
        for o in outs:
            if o.request_id == "big":
                ttft = now - arrival
            elif o.new_token_ids:
                gaps.append(now - last_token[o.request_id])
                last_token[o.request_id] = now
    for i in range(len(streams)):
        engine.abort(f"d{i}")
    engine.step()
    return {
        "itl_p50_s": percentile(gaps, 50), "itl_p99_s": percentile(gaps, 99),
        "itl_max_s": max(gaps), "big_ttft_s": ttft
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--streams", default="1,4,16,32")
    ap.add_argument("--budgets", default="256,512,none")
    ap.add_argument("--json", default="benchmarks/results/engine_batching.json")
    args = ap.parse_args()
    llm = LLM("smollm2", dtype=args.dtype, enable_prefix_caching=False)
    counts = [int(x) for x in args.streams.split(",")]
    windows = code_windows(llm.get_tokenizer(), 256, max(counts) + 9)
    big = code_windows(llm.get_tokenizer(), 4000, 1)[0]
    throughput = [decode_throughput(llm, windows[:n]) for n in counts]
    hol = []
    for b in args.budgets.split(","):
        engine, tokens = llm.engine, 8192 if b == "none" else int(b)
        # The scheduler reads its own (frozen) config: a new one, for both it and the engine's
        # config.
        engine.config.scheduler = engine.scheduler.config = replace(engine.config.scheduler,
                                                                    max_num_batched_tokens=tokens)
        hol.append({"budget": b, **head_of_line(llm, windows[:8], big)})

    print(f"machine: {machine()}; dtype {str(llm.dtype).removeprefix('torch.')}\n")
    print("| concurrent streams | aggregate decode tokens/s |")
    print("|---|---|")
    for r in throughput:
        print(f"| {r['streams']} | {r['tokens_per_s']:.1f} |")
    print("\n8 decoding streams, a 4,000-token prompt arrives:\n")
    print("| token budget per step | ITL p50 | ITL p99 | ITL max | 4k prompt TTFT |")
    print("|---|---|---|---|---|")
    for r in hol:
        print(
            f"| {r['budget']} | {r['itl_p50_s'] * 1000:.0f} ms | {r['itl_p99_s'] * 1000:.0f} ms | "
            f"{r['itl_max_s'] * 1000:.0f} ms | {r['big_ttft_s']:.2f} s |")
    write_json(args.json, {"machine": machine(), "dtype": str(llm.dtype), "throughput": throughput,
                           "head_of_line": hol})


if __name__ == "__main__":
    main()
