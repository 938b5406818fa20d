"""GGUF tensors -> the blocks the native kernel multiplies (Q4_1, Q8_0; models/quant.py), converted at load.

The kernel has products for Q4_1 and Q8_0 blocks (and fp32). A file's other types are converted once, here:
- Q4_1, Q8_0: the file's bytes as they are.
- Q4_0 -> Q4_1 and Q5_0 -> Q8_0: exact (the same d, m = -8 d, or q - 16 as int8: the same values bit for bit).
- Q4_K -> Q4_1: each 32-value sub-block keeps its 4-bit q; its scale d * sc and offset -dmin * m are rounded
  to fp16 (the only change: relative 2^-11 on a sub-block's scale, far below Q4_K's own step; 5.0 bits a weight).
- Q5_1, Q2_K, Q3_K, Q5_K, Q6_K -> Q8_0 requantized from the exact fp32 values (llama.cpp's Q8_0 rounding:
  d = max|x| / 127, q = round(x / d); an error of at most d / 2 a weight, 8.5 bits a weight).
- F32 / F16 / BF16: none (the kernel reads the fp32 weights: exact).
The fp32 weights the torch model computes with are always the file's exact values (models/ggml_blocks.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from gguf import GGMLQuantizationType

from warmpath.models.ggml_blocks import K_TYPES, decode, q4_k_parts, q5_quants
from warmpath.models.quant import BLOCK, QuantizedMatrix

Q = GGMLQuantizationType
EXACT = {Q.Q4_1: "q4_1", Q.Q8_0: "q8_0", Q.Q4_0: "q4_1", Q.Q5_0: "q8_0"}  # kernel kind, no change to a value
NEAR_EXACT = {Q.Q4_K: "q4_1"}
REQUANTIZED = {Q.Q5_1: "q8_0", **{t: "q8_0" for t in K_TYPES if t != Q.Q4_K}}


def kernel_kind(qtype: GGMLQuantizationType) -> str | None:
    """The kernel's block kind a tensor of this type is read as (None: fp32)."""
    return EXACT.get(qtype) or NEAR_EXACT.get(qtype) or REQUANTIZED.get(qtype)


def _f16_bytes(x: torch.Tensor) -> torch.Tensor:
    """fp32 [n, 1] -> [n, 2] bytes of its fp16 rounding."""
    return x.to(torch.float16).view(torch.uint8).reshape(-1, 2)


def q4_1_blocks(scale: torch.Tensor, q: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """Q4_1 blocks [n, 20] from 32-value sub-blocks: fp16 d, fp16 m, byte i = q[i] | q[i + 16] << 4."""
    qi = q.to(torch.uint8)
    return torch.cat([_f16_bytes(scale), _f16_bytes(offset), qi[:, :16] | (qi[:, 16:] << 4)], dim=1)


def q8_0_blocks(d: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Q8_0 blocks [n, 34]: fp16 d, then 32 int8 q."""
    return torch.cat([_f16_bytes(d), q.to(torch.int8).view(torch.uint8)], dim=1)


def quantize_q8_0(values: torch.Tensor) -> torch.Tensor:
    """fp32 values (a multiple of 32) -> Q8_0 blocks [n, 34], rounded as llama.cpp's quantize_row_q8_0."""
    x = values.reshape(-1, BLOCK).float()
    low, high = torch.aminmax(x, dim=1, keepdim=True)
    d = torch.maximum(high, -low).abs_() / 127  # abs: max(0, -0) may be -0, and d must be +0
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = x * inv
    q.add_(torch.copysign(torch.tensor(0.5), q)).trunc_()  # C roundf: halves away from zero
    return q8_0_blocks(d, q)


# The matrices the kernel fuses into one product (kernels/native.py NativeForward): one kind for all of them.
FUSED = (("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
         ("mlp.gate_proj.weight", "mlp.up_proj.weight"))


def kernel_kinds(types: dict[str, GGMLQuantizationType]) -> dict[str, str | None]:
    """HF name -> the kernel kind its tensor is converted to. Where a fused group's members would come out in
    different kinds (Q4_K_M: Q4_K q/k beside a Q6_K v), all are read as Q8_0 (requantized from their exact
    values), so the kernel still reads blocks rather than fp32; a group with an fp32 member is read as fp32 (its
    members get no blocks: the kernel would not read them)."""
    kinds = {name: kernel_kind(t) for name, t in types.items()}
    for name in list(kinds):
        for group in FUSED:
            if not name.endswith(group[0]):
                continue
            names = [name.removesuffix(group[0]) + g for g in group]
            members = {kinds.get(n) for n in names}
            if len(members) > 1:
                kinds.update({n: None if None in members else "q8_0" for n in names})
    return kinds


def convert(raw: torch.Tensor, qtype: GGMLQuantizationType, values: Callable[[], torch.Tensor], rows: int,
            cols: int, kind: str | None) -> QuantizedMatrix | None:
    """A tensor's raw blocks (uint8 [n_blocks, bytes]) -> the kernel's blocks of `kind` (kernel_kinds()), or None
    where the kernel reads fp32. values() gives its exact fp32 values, called only where blocks are requantized."""
    if kind is None or cols % BLOCK:
        return None
    if kind != kernel_kind(qtype):  # a fused group's common kind
        data = quantize_q8_0(values())
    elif qtype in (Q.Q4_1, Q.Q8_0):
        data = raw
    elif qtype == Q.Q4_0:  # w = d (q - 8) = d q + (-8 d): -8 d is exact in fp16, so is every sum
        sub = decode(raw, qtype)
        data = q4_1_blocks(sub.scale, sub.q + 8.0, -8.0 * sub.scale)
    elif qtype == Q.Q5_0:  # the same d; q - 16 as int8 (uint8 arithmetic wraps to its two's complement)
        data = torch.cat([raw[:, 0:2], q5_quants(raw, 2) - 16], dim=1)
    elif qtype == Q.Q4_K:
        scale, q, offset = q4_k_parts(raw)
        data = q4_1_blocks(scale, q, offset)
    else:
        data = quantize_q8_0(values())
    return QuantizedMatrix(kind, rows, cols, data.reshape(rows, -1).contiguous())
