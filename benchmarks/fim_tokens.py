r"""Prompt tokens a keystroke computes under each FIM layout, on the editor trace (issue 33): every
keystroke of `warmpath bench --workload editor` (same seed, developers, duration, rate) rendered as
the server renders it, and the tokens after the longest block-aligned prefix it shares with the same
developer's previous prompt counted, as a prefix cache of 16-token blocks that evicts nothing would
compute them. No server: the layouts' own cost, exactly.

    python benchmarks/fim_tokens.py --model qwen2.5-coder-0.5b \
        [--developers 4 --duration 120 --rate 30 --seed 3]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from warmpath.api.fim import detect_fim  # noqa: E402
from warmpath.models.registry import load_tokenizer  # noqa: E402
from warmpath.workloads import editor_document, make_trace  # noqa: E402


def computed(prev: list[int] | None, ids: list[int], block: int = 16) -> int:
    if prev is None:
        return len(ids)
    same = next((i for i, (a, b) in enumerate(zip(prev, ids)) if a != b), min(len(prev), len(ids)))  # noqa: B905
    return len(ids) - same // block * block


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--developers", type=int, default=4)
    ap.add_argument("--duration", type=float, default=120)
    ap.add_argument("--rate", type=float, default=30)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    tok, template = load_tokenizer(args.model), detect_fim(model=args.model)
    trace = make_trace("editor", args.developers, args.duration, args.seed, args.rate)
    layouts = {"cursor": lambda p, s: template.build(p, s, layout="cursor"),
               "anchored": lambda p, s: template.build(p, s, layout="anchored"),
               "no suffix": lambda p, s: p}
    counts: dict[str, list[int]] = {name: [] for name in layouts}
    last: dict[tuple[str, str], list[int]] = {}
    for key in (e for e in trace.events if e["type"] == "key"):
        prefix, suffix, _ = editor_document(trace, key)
        for name, render in layouts.items():
            ids = tok.encode(render(prefix, suffix))
            counts[name].append(computed(last.get((name, key["session"])), ids))
            last[(name, key["session"])] = ids
    rows = {}
    print(
        f"| layout ({args.model}, {len(counts['cursor'])} keystrokes) | p50 | p90 | share > 64 "
        "|\n|---|---|---|---|"
    )
    for name, v in counts.items():
        v = sorted(v)
        rows[name] = {
            "p50": v[len(v) // 2], "p90": v[int(0.9 * len(v))],
            "over_64": sum(x > 64 for x in v) / len(v)
        }
        print(
            f"| {name} | {rows[name]['p50']} | {rows[name]['p90']} | "
            f"{100 * rows[name]['over_64']:.1f}% |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
