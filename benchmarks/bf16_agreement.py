"""How far reduced-precision greedy decoding agrees with the fp32 transformers reference on the 8
real-code prompts: bf16 (where the CPU has it), or the native kernel's int8 activations.

    python benchmarks/bf16_agreement.py [--dtype bfloat16]
    python benchmarks/bf16_agreement.py --dtype float32 --kernel-activations int8

For each prompt: tokens identical before the first divergence, and whether the divergence happened
at a position where the reference's top-1/top-2 margin was small (bf16 or int8 rounding legitimately
flips those).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from warmpath import LLM, SamplingParams

DATA = Path(__file__).parents[1] / "tests" / "data" / "greedy_reference.json"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument(
        "--kernel-activations", default="fp32", choices=["fp32", "int8", "auto"], help=
        "auto with --dtype auto: the default configuration, i.e. the plan measured on this machine")
    ap.add_argument(
        "--plan", default="auto",
        help="a named plan (native-int8, native-int8-bf16attn, ...) instead "
        "of the one measured here; with --dtype auto --kernel-activations auto")
    ap.add_argument("--json", default=None,
                    help="default: benchmarks/results/{bf16,int8,plan}_agreement.json")
    args = ap.parse_args()
    planned = args.dtype == "auto" and args.kernel_activations == "auto"
    mode = ("the plan" if planned else
            "int8 activations" if args.kernel_activations == "int8" else args.dtype)
    kind = "plan" if planned else "int8" if args.kernel_activations == "int8" else "bf16"
    json_path = args.json or f"benchmarks/results/{kind}_agreement.json"
    cases = json.loads(DATA.read_text())["cases"]
    llm = LLM("smollm2", dtype=args.dtype, kernel_activations=args.kernel_activations,
              plan=args.plan)
    if args.kernel_activations == "int8" and (llm.engine.runner.native is None):
        raise SystemExit("int8 activations need the native kernel (a float32 model on the CPU)")
    if planned:
        plan = llm.engine.plan
        mode = f"the plan ({plan.native or ''}{' + ' + plan.torch if plan.torch else ''})"
    sp = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": c["prompt_ids"]} for c in cases], sp)
    rows = []
    print(
        "| prompt | prompt tokens | identical prefix (of 32) | margin at divergence | tokens equal "
        "overall |"
    )
    print("|---|---|---|---|---|")
    for c, o in zip(cases, outs, strict=True):
        ref = c["greedy_ids"]
        first = next((i for i, (a, b) in enumerate(zip(ref, o.token_ids, strict=True)) if a != b),
                     32)
        margin = c["top1_minus_top2_logit"][first] if first < 32 else None
        equal = sum(a == b for a, b in zip(ref, o.token_ids, strict=True))
        rows.append({
            "name": c["name"], "prompt_tokens": len(c["prompt_ids"]), "identical_prefix": first,
            "margin_at_divergence": margin, "equal_positions": equal
        })
        m = "—" if margin is None else f"{margin:.3f}"
        print(f"| {c['name']} | {len(c['prompt_ids'])} | {first} | {m} | {equal}/32 |")
    full = sum(r["identical_prefix"] == 32 for r in rows)
    mean = sum(r["identical_prefix"] for r in rows) / len(rows)
    print(f"\n{mode}: {full}/{len(rows)} prompts identical for all 32 tokens; "
          f"mean identical prefix {mean:.1f} tokens")
    out = Path(json_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"dtype": args.dtype, "kernel_activations": args.kernel_activations, "cases": rows},
            indent=2))


if __name__ == "__main__":
    main()
