"""Typing through a suggestion: how long a server takes to answer a keystroke that types the first
characters of the suggestion it just gave (server/type_through.py), against llama-server on the same
GGUF file in the same run. Each of --n real-code cursor positions (standard-library files, the
cursor inside a line) is sent to /infill as llama.vscode sends it (greedy, 32 tokens, no session:
one developer per server); then the same request with half of that server's own answer typed into
the cursor's line. Server time is the answer's `timings` (prompt_ms + predicted_ms); the client's
wall time beside it. warmpath's typed answers must be the rest of its first answer and compute no
token (its /metrics).

    warmpath serve --model qwen2.5-coder-0.5b --port 8000 &
    python benchmarks/baselines/llama_server.py serve --model qwen2.5-coder-0.5b --port 8003 \\
        --threads 2 &
    python benchmarks/type_through.py --url http://127.0.0.1:8000 \\
        --baseline http://127.0.0.1:8003 [--n 30]
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import time

import httpx
from common import machine, write_json

from warmpath.workloads import stdlib_files


def infill(url: str, prefix: str, line: str, suffix: str) -> tuple[dict, float]:
    body = {"input_prefix": prefix, "input_suffix": suffix, "input_extra": [], "prompt": line,
            "n_predict": 32, "temperature": 0, "samplers": [], "cache_prompt": True,
            "t_max_prompt_ms": 5000, "t_max_predict_ms": 5000}
    t = time.perf_counter()
    r = httpx.post(f"{url}/infill", json=body, timeout=120)
    r.raise_for_status()
    return r.json(), time.perf_counter() - t


def server_ms(answer: dict) -> float:
    t = answer.get("timings") or {}
    return float(t.get("prompt_ms", 0.0)) + float(t.get("predicted_ms", 0.0))


def computed(url: str) -> float | None:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    m = re.search(r"^warmpath_computed_tokens_total (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def holes(n: int) -> list[tuple[str, str, str]]:
    """(text before the cursor's line, the line up to the cursor, the text after the cursor)."""
    rng, files, out = random.Random(0), stdlib_files(), []
    while len(out) < n:
        text = rng.choice(files).read_text(encoding="utf-8")
        cursor = rng.randrange(2000, len(text) - 1000)
        start = text.rfind("\n", 0, cursor) + 1
        if not text[start:cursor].strip():
            continue
        out.append((text[max(0, start - 3000):start], text[start:cursor],
                    text[cursor:cursor + 800]))
    return out


def run(url: str, cases: list[tuple[str, str, str]]) -> dict:
    rows = []
    for prefix, line, suffix in cases:
        first, _ = infill(url, prefix, line, suffix)
        answer = first.get("content", "")
        if len(answer) < 2:
            continue
        half = len(answer) // 2
        before = computed(url)
        typed, wall = infill(url, prefix, line + answer[:half], suffix)
        after = computed(url)
        rows.append({"server_ms": server_ms(typed), "wall_ms": 1e3 * wall,
                     "rest_of_answer": typed.get("content") == answer[half:],
                     "tokens_computed": None if before is None else after - before})
    ms = [r["server_ms"] for r in rows]
    wall = [r["wall_ms"] for r in rows]
    q = statistics.quantiles(ms, n=10) if len(ms) > 1 else ms * 9
    return {"n": len(rows), "server_ms_p50": statistics.median(ms), "server_ms_p90": q[8],
            "server_ms_max": max(ms), "wall_ms_p50": statistics.median(wall),
            "rest_of_answer": sum(r["rest_of_answer"] for r in rows),
            "tokens_computed": [r["tokens_computed"] for r in rows], "rows": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--baseline", default=None, help="llama-server on the same GGUF file")
    p.add_argument("--n", type=int, default=30)
    p.add_argument("--out", default="benchmarks/results/type_through.json")
    a = p.parse_args()
    cases = holes(a.n)
    results = {"machine": machine(), "warmpath": run(a.url, cases)}
    if a.baseline:
        results["llama-server"] = run(a.baseline, cases)
    print("| server | typed keystrokes | server ms p50 | p90 | max | client ms p50 | rest of "
          "its answer |\n|---|---|---|---|---|---|---|")
    for name in ("warmpath", "llama-server"):
        if name in results:
            r = results[name]
            print(f"| {name} | {r['n']} | {r['server_ms_p50']:.2f} | {r['server_ms_p90']:.2f} | "
                  f"{r['server_ms_max']:.2f} | {r['wall_ms_p50']:.1f} | {r['rest_of_answer']} |")
    if "llama-server" in results:
        ratio = results["llama-server"]["server_ms_p50"] / results["warmpath"]["server_ms_p50"]
        results["llama_server_over_warmpath_p50"] = ratio
        print(f"llama-server / warmpath, server time p50: {ratio:.0f}x")
    write_json(a.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
