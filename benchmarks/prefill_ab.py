r"""Cold prefill of two checkouts of warmpath, alternating, in one run: the A/B for a kernel change
on a VM whose speed drifts by more than the change between two runs minutes apart.

    git worktree add /tmp/base <rev> && ln -s $PWD/.venv /tmp/base/.venv
    python benchmarks/prefill_ab.py --a /tmp/base --b . [--tokens 512,2048] [--rounds 3] \
        [--json out.json]

Each round runs each checkout in a fresh process (its own kernel build, its own plan): the default
LLM, a warm-up, then `--repeats` cold prompts (real code, the prefix cache reset before each) per
size; the fastest of them is the round's figure (the least disturbed by the VM), and the table gives
every round's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from common import machine, write_json

CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[1] + "/benchmarks")
from common import code_windows
from warmpath import LLM, SamplingParams
sizes, repeats = [int(n) for n in sys.argv[2].split(",")], int(sys.argv[3])
llm = LLM("smollm2")
tok = llm.get_tokenizer()  # (older checkouts have no registry.load_tokenizer)
sp = SamplingParams(max_tokens=1, temperature=0)
def ttft(ids):
    return llm.generate({"prompt_token_ids": ids}, sp)[0].metrics.ttft
ttft(code_windows(tok, 64, 1)[0])
out = {}
for n in sizes:
    times = []
    for ids in code_windows(tok, n, repeats):
        llm.engine.pool.reset_prefix_cache()
        times.append(ttft(ids))
    out[n] = min(times)
print(json.dumps(out))
"""


def run(tree: str, sizes: str, repeats: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": tree}
    done = subprocess.run([sys.executable, "-c", CHILD, tree, sizes,
                           str(repeats)], env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="checkout A (e.g. the base revision's worktree)")
    ap.add_argument("--b", default=".", help="checkout B")
    ap.add_argument("--tokens", default="512,2048")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    trees = {"a": str(Path(args.a).resolve()), "b": str(Path(args.b).resolve())}
    rounds = []
    for r in range(args.rounds):
        got = {name: run(tree, args.tokens, args.repeats) for name, tree in trees.items()}
        rounds.append(got)
        print(
            f"round {r + 1}: " + "; ".join(f"{k} " + ", ".join(f"{n}: {s:.3f} s"
                                                               for n, s in v.items())
                                           for k, v in got.items()), flush=True)
    print("\n| tokens | A (each round) | B (each round) | B / A, median round |\n|---|---|---|---|")
    for n in args.tokens.split(","):
        a = [g["a"][n] for g in rounds]
        b = [g["b"][n] for g in rounds]
        ratio = sorted(y / x for x, y in zip(a, b, strict=True))[len(a) // 2]
        print(
            f"| {n} | {' / '.join(f'{x:.3f}' for x in a)} s | {' / '.join(f'{y:.3f}' for y in b)} "
            f"s | {ratio:.2f}× |"
        )
    if args.json:
        revs = {
            k: subprocess.run(["git", "-C", t, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
            for k, t in trees.items()
        }
        write_json(
            args.json,
            {"machine": machine(), "revisions": revs, "repeats": args.repeats, "rounds": rounds})


if __name__ == "__main__":
    main()
