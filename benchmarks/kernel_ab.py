r"""Two builds of the native kernel in one process, step by step: the A/B for a kernel change on a
VM whose speed swings by more than the change within seconds (two separate runs, even alternating,
drift by ±15% on a shape whose code did not change).

    git worktree add /tmp/base <rev>
    python benchmarks/kernel_ab.py --base /tmp/base [--backend native-int8] [--rounds 7] \
        [--json out.json]

Both kernels are built from their checkout's `kernels/cpu/forward.c` (this checkout's Python drives
both) and run the plan's step shapes (`engine/plan_timing.py`: KV of zeros, shared context blocks)
alternately, call after call: a swing of the VM lands on both alike. Reported per shape: each
kernel's fastest step and the median of the per-call ratios new / base. Shapes whose code did not
change are the noise floor.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

import torch
from common import machine, write_json

from warmpath.engine import plan_timing
from warmpath.kernels import build
from warmpath.models.loader import load_checkpoint
from warmpath.models.registry import resolve_model

SHAPES = [(1, 512, 0), (1, 512, 2048), (1, 128, 2048), (1, 32, 6144), (1, 8, 6144), (1, 1, 2048),
          (16, 1, 2048), (64, 1, 512)]  # (sequences, new tokens each, cached tokens)


def runner_from(source: Path, ckpt, backend: str):
    build.SOURCE = source  # the library is cached by its path, which the source's digest names
    return plan_timing._runner(ckpt, backend)


def alternate(base, new, shapes, rounds: int, names: tuple[str, str] = ("base", "new")) -> dict:
    """Each step shape on both runners, call after call (a swing of the VM lands on both alike):
    every call's ms and the median of the per-call ratios new / base, printed as a table as it
    goes."""
    clock = time.perf_counter
    for r in (base, new):
        plan_timing._once(r, plan_timing._seqs(1, 8, 0), clock)  # first calls allocate
    rows = {}
    print(
        f"| step | {names[0]} ms | {names[1]} ms | {names[1]} / {names[0]} (median of calls) "
        "|\n|---|---|---|---|"
    )
    for seqs_n, new_tokens, cached in shapes:
        seqs = plan_timing._seqs(seqs_n, new_tokens, cached)
        a, b = [], []
        for _ in range(rounds):
            a.append(plan_timing._once(base, seqs, clock))
            b.append(plan_timing._once(new, seqs, clock))
        name = f"{seqs_n} x {new_tokens} @ {cached}"
        rows[name] = {f"{names[0]}_ms": a, f"{names[1]}_ms": b,
                      "ratio_median": statistics.median(y / x for x, y in zip(a, b, strict=True))}
        print(f"| {name} | {min(a):.1f} | {min(b):.1f} | {rows[name]['ratio_median']:.3f} |",
              flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the checkout whose kernel is the baseline")
    ap.add_argument("--backend", default="native-int8", choices=["native-int8", "native-fp32"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ckpt = load_checkpoint(resolve_model("smollm2"), torch.float32)
    new_source = build.SOURCE
    base = runner_from(
        Path(args.base).resolve() / "warmpath/kernels/cpu/forward.c", ckpt, args.backend)
    new = runner_from(new_source, ckpt, args.backend)
    if base.native.lib._name == new.native.lib._name:
        raise SystemExit("both checkouts build the same kernel: nothing to compare")
    rows = alternate(base, new, SHAPES, args.rounds)
    if args.json:
        revs = {
            k: subprocess.run(["git", "-C", t, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
            for k, t in (("base", args.base), ("new", "."))
        }
        write_json(
            args.json, {
                "machine": machine(), "backend": args.backend, "revisions": revs, "dirty_new": bool(
                    subprocess.run(["git", "status", "--porcelain", "warmpath"],
                                   capture_output=True, text=True).stdout.strip()), "rows": rows
            })


if __name__ == "__main__":
    main()
