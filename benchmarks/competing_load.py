"""A busy machine: `warmpath serve` while another process takes a core (a pure-Python busy loop, one
thread: what a build, a test run or a second service does to a 2-core box). For each configuration,
with and without the competing process, N clients at concurrency 1 / 4 / 16 send real-code
completions (256-token prompts, 64 tokens out, each prompt different) for --seconds; reported:
requests completed and output tokens/s.

    python benchmarks/competing_load.py [--configs plan,bf16] [--seconds 45]

`plan` is warmpath as it ships (the plan measured on this machine, with thread tuning: one thread
while another process holds a core); `plan-fixed` is `--no-thread-tuning` (every core always);
`bf16` is `--dtype bfloat16` (torch in bf16: the default before plans on a CPU with bf16); `fp32` is
`--dtype float32`.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

import httpx
from common import code_windows, machine, write_json

from warmpath.models.registry import load_tokenizer

CONFIGS = {"plan": [], "plan-fixed": ["--no-thread-tuning"], "bf16": ["--dtype", "bfloat16"],
           "fp32": ["--dtype", "float32"]}
HOG = "while True: pass"


def serve(flags: list[str], port: int) -> subprocess.Popen:
    exe = Path(sys.executable).parent / "warmpath"
    proc = subprocess.Popen([str(exe), "serve", "--model", "smollm2", "--port", str(port), *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 300
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"warmpath serve {flags} exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("server not ready")


async def load(url: str, prompts: list[str], concurrency: int, seconds: float) -> dict:
    """concurrency clients, each sending its next prompt when its last answer is complete."""
    done, tokens, errors = 0, 0, 0
    end = time.monotonic() + seconds
    queue = iter(prompts)

    async def client(c: httpx.AsyncClient) -> None:
        nonlocal done, tokens, errors
        while time.monotonic() < end:
            body = {"prompt": next(queue), "max_tokens": 64, "temperature": 0}
            try:
                r = await c.post(f"{url}/v1/completions", json=body,
                                 timeout=max(1.0, end - time.monotonic()))
                if r.status_code == 200:
                    done += 1
                    tokens += r.json()["usage"]["completion_tokens"]
                else:
                    errors += 1
            except httpx.TimeoutException:
                return  # cut off by the end of the run
            except httpx.HTTPError:
                errors += 1

    t = time.monotonic()
    async with httpx.AsyncClient() as c:
        await asyncio.gather(*(client(c) for _ in range(concurrency)))
    return {"completed": done, "tokens_per_s": tokens / (time.monotonic() - t), "errors": errors}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default="plan,bf16")
    p.add_argument("--seconds", type=float, default=45.0)
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--port", type=int, default=8470)
    p.add_argument("--out", default="benchmarks/results/competing_load.json")
    a = p.parse_args()
    tok = load_tokenizer("smollm2")
    prompts = [tok.decode(ids) for ids in code_windows(tok, 256, 4000)]
    levels = [int(x) for x in a.concurrency.split(",")]
    results: dict[str, dict] = {}
    print(f"{machine()}; {a.seconds:.0f} s per cell; requests completed (output tok/s)")
    print("| config | competing process | " + " | ".join(f"concurrency {c}" for c in levels) + " |")
    print("|---|---|" + "---|" * len(levels))
    offset = 0
    for name in a.configs.split(","):
        proc = serve(CONFIGS[name], a.port)
        try:
            url = f"http://127.0.0.1:{a.port}"
            httpx.post(f"{url}/v1/completions", json={"prompt": prompts[-1], "max_tokens": 4},
                       timeout=120)
            for hog in (False, True):
                busy = subprocess.Popen([sys.executable, "-c", HOG]) if hog else None
                try:
                    cells = {}
                    for c in levels:
                        cells[c] = asyncio.run(load(url, prompts[offset:], c, a.seconds))
                        offset += cells[c]["completed"] + cells[c]["errors"] + c
                finally:
                    if busy is not None:
                        busy.kill()
                        busy.wait()
                results[f"{name}{' + busy core' if hog else ''}"] = cells
                print(
                    f"| {name} | {'yes' if hog else 'no'} | " +
                    " | ".join(f"{cells[c]['completed']} ({cells[c]['tokens_per_s']:.1f})"
                               for c in levels) + " |", flush=True)
        finally:
            proc.terminate()
            proc.wait()
    write_json(
        a.out, {
            "command": " ".join(["python", *sys.argv]), "machine": machine(), "seconds": a.seconds,
            "results": results
        })
    return 0


if __name__ == "__main__":
    sys.exit(main())
