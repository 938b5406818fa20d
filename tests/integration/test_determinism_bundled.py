"""A user expects `temperature: 0` to repeat: through `warmpath serve` on the bundled model, with
each deterministic plan (and over the int8 KV cache), the same 40 real-code prompts give the same
text at concurrency 8 with a cold cache, at concurrency 1 with every prefix warm, and at concurrency
8 warm (batch composition and cache state both move)."""

import asyncio
import inspect
import json
import pathlib
import textwrap

import httpx
import pytest
from server_harness import serve_process

from warmpath.engine.plan import DETERMINISTIC
from warmpath.kernels.native import bf16_attention

pytestmark = [pytest.mark.server, pytest.mark.slow]


def real_code_prompts(n: int = 40) -> list[str]:
    sources = [
        inspect.getsource(m) for m in (json.decoder, json.encoder, pathlib, textwrap, inspect)
    ]
    lines = "\n".join(sources).split("\n")
    step = len(lines) // n
    return ["\n".join(lines[i * step: i * step + 12 + (i % 5) * 4]) + "\n" for i in range(n)]


async def complete_all(url: str, prompts: list[str], concurrency: int) -> list[str]:
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=300) as http:
        async def one(prompt: str) -> str:
            async with gate:
                r = await http.post(f"{url}/v1/completions",
                                    json={"prompt": prompt, "max_tokens": 12, "temperature": 0})
                r.raise_for_status()
                return r.json()["choices"][0]["text"]

        return await asyncio.gather(*(one(p) for p in prompts))


@pytest.mark.parametrize(("plan", "kv_dtype"),
                         [*((p, "auto") for p in DETERMINISTIC), ("native-int8", "int8")])
def test_greedy_text_repeats_whatever_the_batch_and_the_cache(plan, kv_dtype):
    if plan == "native-int8-bf16attn" and not bf16_attention():
        pytest.skip("no bf16 attention on this CPU (AMX or AVX512-BF16)")
    prompts = real_code_prompts()
    with serve_process("--model", "smollm2", "--plan", plan, "--kv-cache-dtype",
                       kv_dtype) as (url, _):
        cold8 = asyncio.run(complete_all(url, prompts, 8))
        warm1 = asyncio.run(complete_all(url, prompts, 1))
        warm8 = asyncio.run(complete_all(url, list(reversed(prompts)), 8))[::-1]
        cached = httpx.get(f"{url}/metrics").text
    assert sum(1 for t in cold8 if t.strip()) > 30  # real suggestions, not empty answers
    assert warm1 == cold8 and warm8 == cold8
    hits = [
        ln for ln in cached.splitlines() if ln.startswith("warmpath_prefix_cache_hit_tokens_total")
    ]
    # the warm passes really were served from the cache
    assert hits and float(hits[0].split()[-1]) > 0
