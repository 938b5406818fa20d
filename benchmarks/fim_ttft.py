"""Does a streamed FIM completion show its first token as early as a plain one? Against a running
server, the same real-code cursor positions sent streamed with the suffix and without, alternating,
each over a prompt the server has cached (a warm keystroke, what ghost text is): TTFT measured by
the client, from the request to the first text.

    warmpath serve &  python benchmarks/fim_ttft.py [--url http://127.0.0.1:8000] [--n 40]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

import httpx
from common import machine, write_json

from warmpath.workloads import stdlib_files


def first_token_s(url: str, body: dict) -> float | None:
    t = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True},
                      timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                if any(c.get("text") for c in event.get("choices", [])):
                    return time.perf_counter() - t
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--n", type=int, default=40)
    p.add_argument("--out", default="benchmarks/results/fim_ttft.json")
    a = p.parse_args()
    rng = random.Random(0)
    files = stdlib_files()
    ttft: dict[str, list[float]] = {"fim": [], "plain": []}
    for i in range(a.n):
        text = rng.choice(files).read_text(encoding="utf-8")
        cursor = rng.randrange(1500, len(text) - 1500)
        prefix, suffix = text[cursor - 1500 : cursor], text[cursor : cursor + 600]
        base = {"prompt": prefix, "max_tokens": 16, "temperature": 0}
        # the warm prefix
        httpx.post(f"{a.url}/v1/completions", json={**base, "max_tokens": 1}, timeout=60)
        order = ("fim", "plain") if i % 2 == 0 else ("plain", "fim")
        for kind in order:
            got = first_token_s(a.url, {**base, "suffix": suffix} if kind == "fim" else base)
            if got is not None:
                ttft[kind].append(got)
    rows = {
        k: {
            "n": len(v), "p50_ms": 1e3 * statistics.median(v), "mean_ms": 1e3 * statistics.fmean(v)
        }
        for k, v in ttft.items()
    }
    print(f"{machine()}; warm prompts of 1,500 characters, 16 tokens")
    for k, r in rows.items():
        print(f"{k}: TTFT p50 {r['p50_ms']:.1f} ms, mean {r['mean_ms']:.1f} ms over {r['n']}")
    write_json(a.out,
               {"command": " ".join(["python", *sys.argv]), "machine": machine(), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
