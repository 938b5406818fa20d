r"""warmpath vs llama.cpp's `llama-server` on the same GGUF file, through the same HTTP API, in one
run (issue 29's rows): cold prefill of 512 / 2,000 tokens (time to the first token of a fresh window
of real code), warm 2,000 + 20 (the same window again with 20 new tokens: what the prefix cache
buys), one stream's decode (64 tokens after a 512-token prompt, greedy, `ignore_eos`), and 4 / 16
concurrent streams (256-token prompts, 64 tokens each: aggregate tokens/s). Each server runs alone,
with every core; llama-server at its serving settings (continuous batching, prompt cache, one
unified KV buffer, slots for 16); warmpath as `warmpath serve` ships, plus its decode with
speculation off (the row that compares the kernels); `--systems warmpath,kv-int8,llama.cpp` adds the
int8 KV cache (issue 30).

    python benchmarks/baselines/llama_server.py install       # once
    python benchmarks/server_compare.py --model qwen2.5-coder-0.5b [--repeats 3] [--systems ...] \
        [--out ...]
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

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).parent))

from baselines.llama_server import binary as llama_server_binary  # noqa: E402
from common import code_windows, machine, write_json  # noqa: E402
from fim_quality import wait_ready  # noqa: E402
from first_start import free_port  # noqa: E402

from warmpath.client.completion import RequestRecord, Target, discover_model, stream_completion  # noqa: E402
from warmpath.models.registry import load_tokenizer, resolve_model  # noqa: E402

WARMPATH = str(Path(sys.executable).with_name("warmpath"))
COLD, WARM, WARM_NEW, DECODE_CTX, OUT, CONC_PROMPT = (512, 2000), 2000, 20, 512, 64, 256


async def _streams(url: str, prompts: list[list[int]], max_tokens: int) -> list[RequestRecord]:
    target = Target(url)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0, connect=10.0)) as http:
        target.model = await discover_model(http, target)
        start = time.monotonic()

        def clock() -> float:
            return time.monotonic() - start

        recs = [RequestRecord("bench", "agent", 0.0) for _ in prompts]
        body = {"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
        await asyncio.gather(*(stream_completion(http, target, {**body, "prompt": p}, r, clock)
                               for p, r in zip(prompts, recs, strict=True)))
    if any(r.error for r in recs):
        raise RuntimeError(f"{url}: {next(r.error for r in recs if r.error)}")
    return recs


def ttft(url: str, prompt: list[int]) -> float:
    return asyncio.run(_streams(url, [prompt], 1))[0].ttft


def decode_tps(url: str, prompt: list[int]) -> float:
    rec = asyncio.run(_streams(url, [prompt], OUT))[0]
    return (len(rec.chunk_times) - 1) / (rec.chunk_times[-1] - rec.chunk_times[0])


def concurrent_tps(url: str, prompts: list[list[int]]) -> float:
    recs = asyncio.run(_streams(url, prompts, OUT))
    return sum(r.tokens for r in recs) / max(r.done for r in recs)


def measure(url: str, windows: dict, repeats: int) -> dict:
    asyncio.run(_streams(url, [windows["warmup"]], 8))
    rows: dict[str, float] = {}
    for n in COLD:
        rows[f"cold_{n}_s"] = statistics.median(ttft(url, w) for w in windows[f"cold_{n}"])
    warm = []
    for w in windows["warm"]:
        ttft(url, w[:WARM])  # cache the window, then come back with 20 more tokens
        warm.append(ttft(url, w))
    rows["warm_2000_20_s"] = statistics.median(warm)
    rows["decode_tps"] = statistics.median(decode_tps(url, w) for w in windows["decode"])
    for n in (4, 16):
        rows[f"concurrent{n}_tps"] = statistics.median(
            concurrent_tps(url, windows[f"conc{n}"][r * n:(r + 1) * n]) for r in range(repeats))
    return rows


def serve(cmd: list[str], url: str):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(url, proc)
    return proc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--systems", default="warmpath,speculation-off,llama.cpp",
                    help="of warmpath, speculation-off, kv-int8 (the int8 KV cache), llama.cpp")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model, threads = str(resolve_model(args.model)), str(os.cpu_count() or 2)
    if not llama_server_binary().exists():
        sys.exit("llama-server is not built: python benchmarks/baselines/llama_server.py install")
    tok = load_tokenizer(model)
    r = args.repeats
    # distinct windows: nothing warm by accident
    pool = iter(code_windows(tok, WARM + WARM_NEW, 4 * r + 40))
    windows = {
        "warmup": next(pool)[:64], "cold_512": [next(pool)[:512] for _ in range(r)],
        "cold_2000": [next(pool)[:2000] for _ in range(r)], "warm": [next(pool) for _ in range(r)],
        "decode": [next(pool)[:DECODE_CTX] for _ in range(r)]
    }
    conc = [w[i * CONC_PROMPT:(i + 1) * CONC_PROMPT] for w in pool for i in range(8)]
    windows["conc4"], windows["conc16"] = conc[:4 * r], conc[4 * r:4 * r + 16 * r]
    warmpath = [WARMPATH, "serve", "--model", model, "--num-threads", threads]
    systems = {
        "warmpath": warmpath,
        "warmpath, speculation off": [*warmpath, "--speculative-method", "none"],
        "warmpath, int8 KV": [*warmpath, "--kv-cache-dtype", "int8"],
        "llama.cpp llama-server": [
            str(llama_server_binary()), "--model", model, "--host", "127.0.0.1", "--threads",
            threads, "--threads-batch", threads, "--ctx-size",
            str(16 * 2600), "--parallel", "16", "--kv-unified", "--cont-batching", "--cache-prompt",
            "--no-webui"
        ],
    }
    keys = {
        "warmpath": "warmpath", "speculation-off": "warmpath, speculation off",
        "kv-int8": "warmpath, int8 KV", "llama.cpp": "llama.cpp llama-server"
    }
    systems = {keys[k]: systems[keys[k]] for k in args.systems.split(",")}
    results = {}
    for name, cmd in systems.items():
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = serve([*cmd, "--port", str(port)], url)
        try:
            results[name] = measure(url, windows, r)
        finally:
            proc.terminate()
            proc.wait(60)
        print(name, {k: round(v, 3) for k, v in results[name].items()}, flush=True)
    base = results["llama.cpp llama-server"]
    print(f"\n| row ({Path(model).name}) | " + " | ".join(results) + " | warmpath / llama.cpp |")
    print("|---" * (len(results) + 2) + "|")
    for row in base:
        vals = " | ".join(f"{res[row]:.3f}" for res in results.values())
        ours = [res[row] for name, res in results.items() if name.startswith("warmpath")]
        best = max(ours) if row.endswith("tps") else min(ours)
        ratio = best / base[row] if row.endswith("tps") else base[row] / best
        print(f"| {row} | {vals} | {ratio:.2f}x |")
    if args.out:
        write_json(args.out, {"machine": machine(), "model": Path(model).name, "threads": threads,
                              "repeats": r, "systems": {n: " ".join(c) for n, c in systems.items()},
                              "rows": results})


if __name__ == "__main__":
    main()
