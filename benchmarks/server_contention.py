"""Do the HTTP event loop and the engine's step thread contend on this machine?

    python benchmarks/server_contention.py [--dtype auto]

1. One stream's decode tokens/s (median of --repeats): offline (Engine in this process) vs through
   `warmpath serve` (SSE, measured by the client from first to last token, and by the server's own
   TPOT histogram) — same prompt, same machine, one after the other. --num-threads /
   --num-decode-threads set torch threads.
2. The event loop's responsiveness: GET /health latency p50 / p99 on an idle server and while the
   server prefills a 4,000-token prompt and decodes 8 streams.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time

import httpx
from common import code_windows, machine, write_json

from warmpath import LLM, SamplingParams
from warmpath.stats import percentile

DECODE = 64


def offline_decode_tps(dtype: str, prompt: list[int], threads: int | None, repeats: int) -> float:
    llm = LLM("smollm2", dtype=dtype, num_threads=threads)
    llm.generate({"prompt_token_ids": prompt[:32]}, SamplingParams(max_tokens=2, temperature=0))
    rates = []
    for _ in range(repeats):
        m = llm.generate({"prompt_token_ids": prompt},
                         SamplingParams(max_tokens=DECODE + 1, temperature=0,
                                        ignore_eos=True))[0].metrics
        rates.append(DECODE / (m.finish_time - m.first_token_time))
    return statistics.median(rates)


def _tpot_sum_count(url: str) -> tuple[float, float]:
    text = httpx.get(f"{url}/metrics").text
    value = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
             if line.startswith("warmpath_time_per")}
    return (value["warmpath_time_per_output_token_seconds_sum"],
            value["warmpath_time_per_output_token_seconds_count"])


async def served_decode_tps(url: str, prompt: list[int]) -> tuple[float, float]:
    """(tokens/s seen by the client, tokens/s by the server's own TPOT histogram)."""
    body = {"prompt": prompt, "max_tokens": DECODE + 1, "temperature": 0, "stream": True}
    times = []
    async with httpx.AsyncClient(timeout=300) as http:
        await http.post(f"{url}/v1/completions", json={"prompt": prompt[:32], "max_tokens": 2})
        s0, c0 = _tpot_sum_count(url)
        async with http.stream("POST", f"{url}/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                    times.append(time.perf_counter())
        s1, c1 = _tpot_sum_count(url)
    return (len(times) - 1) / (times[-1] - times[0]), (c1 - c0) / (s1 - s0)


async def health_latency(url: str, busy: list[list[int]] | None, big: list[int] | None) -> dict:
    async with httpx.AsyncClient(timeout=300) as http:
        work = []
        if busy:
            work = [
                asyncio.create_task(
                    http.post(
                        f"{url}/v1/completions",
                        json={"prompt": p, "max_tokens": 200, "temperature": 0,
                              "ignore_eos": True})) for p in busy
            ]
            work.append(
                asyncio.create_task(
                    http.post(f"{url}/v1/completions", json={"prompt": big, "max_tokens": 1})))
            # let the burst arrive before probing (a benchmark, not a test)
            await asyncio.sleep(1.0)
        lat = []
        for _ in range(40):
            t = time.perf_counter()
            await http.get(f"{url}/health")
            lat.append(time.perf_counter() - t)
            await asyncio.sleep(0.05)
        for w in work:
            w.cancel()
        await asyncio.gather(*work, return_exceptions=True)
    return {"p50_ms": percentile(lat, 50) * 1000, "p99_ms": percentile(lat, 99) * 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-threads", type=int, default=None,
                    help="torch threads, offline and in the server")
    ap.add_argument("--num-decode-threads", type=int, default=None,
                    help="the server's decode-only steps")
    ap.add_argument("--json", default="benchmarks/results/server_contention.json")
    args = ap.parse_args()
    llm_tok = LLM("smollm2", dtype="float32", num_kv_blocks=4).get_tokenizer()
    prompt = code_windows(llm_tok, 512, 1)[0]
    busy = code_windows(llm_tok, 256, 8)
    big = code_windows(llm_tok, 4000, 2)[1]
    offline = offline_decode_tps(args.dtype, prompt, args.num_threads, args.repeats)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "warmpath.cli", "--log-level", "warning", "serve", "--port",
            str(port), "--dtype", args.dtype
        ] + (["--num-threads", str(args.num_threads)] if args.num_threads else []) +
        (["--num-decode-threads", str(args.num_decode_threads)] if args.num_decode_threads else []),
        stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        runs = [asyncio.run(served_decode_tps(url, prompt)) for _ in range(args.repeats)]
        served = statistics.median(r[0] for r in runs)
        served_own = statistics.median(r[1] for r in runs)
        idle = asyncio.run(health_latency(url, None, None))
        loaded = asyncio.run(health_latency(url, busy, big))
    finally:
        proc.terminate()
        proc.wait()
    print(f"machine: {machine()}\n")
    print("| figure | offline engine | through the server | ratio |")
    print("|---|---|---|---|")
    print(f"| 1-stream decode tokens/s, as the client sees it | {offline:.1f} | {served:.1f} "
          f"| {served / offline:.2f} |")
    print(
        f"| same, by the server's own TPOT | {offline:.1f} | {served_own:.1f} | "
        f"{served_own / offline:.2f} |"
    )
    print("\n| GET /health latency | p50 | p99 |")
    print("|---|---|---|")
    print(f"| idle server | {idle['p50_ms']:.1f} ms | {idle['p99_ms']:.1f} ms |")
    print(
        f"| 4k prefill + 8 decoding streams | {loaded['p50_ms']:.1f} ms | {loaded['p99_ms']:.1f} "
        "ms |"
    )
    write_json(
        args.json, {
            "machine": machine(), "offline_decode_tps": offline, "served_decode_tps": served,
            "served_decode_tps_server_side": served_own, "health_idle": idle,
            "health_loaded": loaded
        })


if __name__ == "__main__":
    main()
