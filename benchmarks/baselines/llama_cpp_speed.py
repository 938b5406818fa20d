"""Runs inside the llama-cpp-python venv (see llama_cpp_python.py, whose offline() runs it by path):
the compare_cpu.py rows for llama.cpp, through its Python API on the same GGUF and token ids. Reads
a JSON job on stdin, prints JSON timings. Imports nothing from the baselines package (it runs under
that venv's python).

Cold prefill = time to the first generated token of a fresh context; warm TTFT = the same
4,000-token context again plus 20 new tokens (llama.cpp reuses the matching prefix of its context);
decode = tokens/s of one greedy stream after a 512-token prompt."""

import json
import statistics
import sys
import time

from llama_cpp import Llama


def first_token_s(llm: Llama, ids: list[int], reset: bool = True) -> float:
    t = time.perf_counter()
    for _ in llm.generate(ids, top_k=1, temp=0.0, reset=reset):
        return time.perf_counter() - t
    raise RuntimeError("no token")


def main() -> None:
    job = json.load(sys.stdin)
    llm = Llama(job["model"], n_threads=job["threads"], n_threads_batch=job["threads"], n_ctx=8192,
                n_batch=512, verbose=False)
    out = {}
    first_token_s(llm, job["warmup"])
    for n, windows in job["prefill"].items():
        times = []
        for ids in windows:
            llm.reset()
            llm._ctx.kv_cache_clear()
            times.append(first_token_s(llm, ids))
        out[f"prefill_{n}_s"] = statistics.median(times)
    warm = []
    for ctx, new in job["warm"]:
        llm.reset()
        llm._ctx.kv_cache_clear()
        first_token_s(llm, ctx)
        # generate() keeps the matching prefix of its context
        warm.append(first_token_s(llm, ctx + new))
    out["warm_ttft_s"] = statistics.median(warm)
    rates = []
    for ids in job["decode"]:
        llm.reset()
        llm._ctx.kv_cache_clear()
        stamps = []
        for _ in llm.generate(ids, top_k=1, temp=0.0, reset=True):
            stamps.append(time.perf_counter())
            if len(stamps) == job["decode_tokens"] + 1:
                break
        rates.append(job["decode_tokens"] / (stamps[-1] - stamps[0]))
    out["decode_tps"] = statistics.median(rates)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
