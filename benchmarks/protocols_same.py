"""The same editor requests through every protocol to two servers (A and B: before and after a change), one at a
time, greedy, no deadline: whether each protocol's answers and prompt token counts are the same on both. The
timing side of the comparison is benchmarks/protocols_ab.sh.

    python benchmarks/protocols_same.py URL_A URL_B [--requests 40] [--out benchmarks/results/....json]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).parent))

from common import machine, write_json  # noqa: E402

from warmpath.client.completion import PROTOCOLS, RequestRecord, Target, discover_model, stream_completion  # noqa: E402
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--requests", type=int, default=40)
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
        a, b = asyncio.run(answers(args.a, protocol, bodies)), asyncio.run(answers(args.b, protocol, bodies))
        same = sum(x == y for x, y in zip(a, b, strict=True))
        rows[protocol] = {"requests": len(bodies), "same_answer_and_prompt_tokens": same,
                          "differ": [{"a": x, "b": y} for x, y in zip(a, b, strict=True) if x != y]}
        print(f"{protocol}: {same} of {len(bodies)} the same", flush=True)
    if args.out:
        write_json(args.out, {"machine": machine(), "a": args.a, "b": args.b, "rows": rows})


if __name__ == "__main__":
    main()
