r"""The same editor requests through every protocol to two servers (A and B: before and after a
change), one at a time, greedy, no deadline: whether each protocol's answers and prompt token counts
are the same on both. With --keystrokes N, then the request path's own time: N warm keystrokes of
one file per protocol (each a character more of a line typed), one at a time, A and B alternating,
median TTFT each. The loaded side of the comparison is benchmarks/protocols_ab.sh.

    python benchmarks/protocols_same.py URL_A URL_B [--requests 40] [--keystrokes 25] \
        [--out results/....json]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).parent))

from common import machine, write_json  # noqa: E402

from warmpath.client.completion import (  # noqa: E402
    PROTOCOLS,
    RequestRecord,
    Target,
    discover_model,
    stream_completion,
)
from warmpath.workloads import editor_prompt, make_trace  # noqa: E402


async def answers(url: str, protocol: str, bodies: list[dict]) -> list[tuple[str, int | None]]:
    async with httpx.AsyncClient(timeout=600) as http:
        target = Target(url, protocol=protocol)
        target.model = await discover_model(http, target)
        out = []
        for i, body in enumerate(bodies):
            rec = RequestRecord(f"same-{i}", "agent", 0.0)
            await stream_completion(http, target, body, rec, lambda: 0.0)
            out.append((rec.error or rec.text, rec.prompt_tokens))
        return out


async def keystroke_ttfts(urls: list[str], protocol: str, prefix: str, suffix: str,
                          n: int) -> list[float]:
    """Median TTFT (ms) per server of n keystrokes typing one line at the cursor, the servers
    alternating."""
    line = "        total = sum(len(r.prompt_token_ids) for r in self.waiting)\n"
    times: list[list[float]] = [[] for _ in urls]
    async with httpx.AsyncClient(timeout=600) as http:
        targets = [Target(url, protocol=protocol) for url in urls]
        for t in targets:
            t.model = await discover_model(http, t)
        for i in range(-1, n):  # -1: each server's cache warmed with the file first
            body = {
                "prompt": prefix + line[:max(0, i) * len(line) // n], "suffix": suffix,
                "max_tokens": 8, "temperature": 0
            }
            order = range(len(urls)) if i % 2 else reversed(range(len(urls)))
            for k in order:
                rec = RequestRecord(f"key-{i}", "editor", time.monotonic())
                await stream_completion(http, targets[k], body, rec, time.monotonic)
                if i >= 0 and rec.ttft is not None:
                    times[k].append(1000 * rec.ttft)
    return [round(statistics.median(t), 1) for t in times]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--keystrokes", type=int, default=0)
    ap.add_argument("--out")
    args = ap.parse_args()
    trace = make_trace("editor", 4, 60, seed=3, rate=30)
    keys = [e for e in trace.events if e["type"] == "key"]
    picked = keys[:: max(1, len(keys) // args.requests)][: args.requests]
    bodies = []
    for key in picked:
        prefix, suffix = editor_prompt(trace, key)
        bodies.append({"prompt": prefix, "suffix": suffix, "max_tokens": 16, "temperature": 0})
    rows = {}
    for protocol in PROTOCOLS:
        a, b = asyncio.run(answers(args.a, protocol,
                                   bodies)), asyncio.run(answers(args.b, protocol, bodies))
        same = sum(x == y for x, y in zip(a, b, strict=True))
        rows[protocol] = {"requests": len(bodies), "same_answer_and_prompt_tokens": same,
                          "differ": [{"a": x, "b": y} for x, y in zip(a, b, strict=True) if x != y]}
        print(f"{protocol}: {same} of {len(bodies)} the same", flush=True)
    timed = {}
    if args.keystrokes:
        prefix, suffix = editor_prompt(trace, keys[len(keys) // 2])
        for protocol in PROTOCOLS:
            a, b = asyncio.run(
                keystroke_ttfts([args.a, args.b], protocol, prefix, suffix, args.keystrokes))
            timed[protocol] = {"a_ttft_ms_p50": a, "b_ttft_ms_p50": b}
            print(f"{protocol}: {args.keystrokes} warm keystrokes, median TTFT A {a} ms, B {b} ms",
                  flush=True)
    if args.out:
        write_json(
            args.out,
            {"machine": machine(), "a": args.a, "b": args.b, "rows": rows, "keystrokes": timed})


if __name__ == "__main__":
    main()
