"""The kernel over a GGUF file's own blocks (Q5_0 / Q4_K / Q6_K, cpu/kquants.h) against the same
file converted to Q4_1 / Q8_0 as the kernel read it before (Q4_K -> Q4_1, Q5_0 / Q6_K -> Q8_0, a
fused group of mixed kinds requantized to Q8_0): resident weights and step times, both in one
process, call after call (the VM's swings land on both alike), int8 activations over a bf16 cache as
the plan's native-int8 runs them.

    python benchmarks/file_blocks_ab.py --model qwen2.5-coder-0.5b [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from common import machine, write_json
from kernel_ab import alternate

from warmpath.engine import plan_timing
from warmpath.engine.runner import ModelRunner
from warmpath.kernels.native import NativeForward
from warmpath.models.kernel_blocks import for_fp32_activations, quantize_q8_0
from warmpath.models.kv_cache import allocate_kv_cache
from warmpath.models.loader import load_checkpoint
from warmpath.models.quant import QuantizedMatrix
from warmpath.models.registry import resolve_model

# seqs, new, cached
SHAPES = [(1, 1, 512), (1, 1, 2048), (4, 1, 512), (16, 1, 512), (1, 128, 2048), (1, 512, 0)]
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def converted(quantized) -> dict[str, QuantizedMatrix]:
    """The blocks as the kernel read them before it had the file's kinds."""
    out = {n: for_fp32_activations(quantized[n]) for n in quantized}
    for name in list(out):
        for group in FUSED:
            if name.endswith(f"{group[0]}.weight"):
                names = [name.replace(group[0], g) for g in group]
                if len({out[n].kind for n in names}) > 1:  # one kind for a fused product: all Q8_0
                    for n in names:
                        q = out[n]
                        out[n] = QuantizedMatrix("q8_0", q.rows, q.cols,
                                                 quantize_q8_0(q.dequantize()).reshape(q.rows, -1))
    return out


def runner(ckpt, quantized) -> ModelRunner:
    blocks = plan_timing.CONTEXT_BLOCKS + plan_timing.TAIL_BLOCKS
    kv = allocate_kv_cache(ckpt.config, blocks, plan_timing.BLOCK, torch.bfloat16, "cpu")
    native = NativeForward(ckpt.config, ckpt.weights, quantized, kv, plan_timing.BLOCK,
                           activations="int8")
    return ModelRunner(None, kv, plan_timing.BLOCK, native, plan=plan_timing.single("native-int8"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    path = resolve_model(args.model)
    ckpt = load_checkpoint(path, torch.float32)
    file_bytes = Path(path).stat().st_size
    base, new = runner(ckpt, converted(ckpt.quantized)), runner(ckpt, ckpt.quantized)
    sizes = {k: r.native.weight_bytes for k, r in (("converted", base), ("file", new))}
    print(
        f"{Path(path).name}: file {file_bytes / 1e6:.0f} MB; resident weights: converted "
        f"{sizes['converted'] / 1e6:.0f} MB ({sizes['converted'] / file_bytes:.3f}x the file), "
        "file blocks "
        f"{sizes['file'] / 1e6:.0f} MB ({sizes['file'] / file_bytes:.3f}x); kinds "
        f"{new.native.weight_kinds}"
    )
    rows = alternate(base, new, SHAPES, args.rounds, ("converted", "file"))
    if args.json:
        write_json(
            args.json, {
                "machine": machine(), "model": Path(path).name, "file_bytes": file_bytes,
                "resident_bytes": sizes, "kinds": new.native.weight_kinds, "rows": rows
            })


if __name__ == "__main__":
    main()
