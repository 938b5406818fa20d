"""GGUF tensors -> the blocks the native kernel multiplies (models/quant.py), converted at load
where needed.

With int8 activations the kernel multiplies a file's Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K
blocks as they are (its resident weights take the file's bytes). Its other types (Q5_1, Q2_K, Q3_K)
are requantized to Q8_0 once, here, from the exact fp32 values (llama.cpp's Q8_0 rounding: d =
max|x| / 127, q = round(x / d); an error of at most d / 2 a weight, 8.5 bits a weight); F32 / F16 /
BF16 matrices are read as fp32 (exact). fp32 activations have products for Q4_1 and Q8_0 blocks only
(for_fp32_activations): Q4_0 -> Q4_1 and Q5_0 -> Q8_0 exact (the same d, m = -8 d; q - 16 as int8),
Q4_K -> Q4_1 (each 32-value sub-block keeps its 4-bit q; its scale d * sc and offset -dmin * m
rounded to fp16: relative 2^-11 on a sub-block's scale, far below Q4_K's own step), Q5_K / Q6_K ->
Q8_0 requantized. The fp32 weights the torch model computes with are always the file's exact values
(models/ggml_blocks.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from warmpath.models.ggml_blocks import K_TYPES, decode, q4_k_parts, q5_quants
from warmpath.models.quant import BLOCK, FILE_KINDS, QuantizedMatrix

Q = GGMLQuantizationType
# the file's bytes
AS_IS = {t: t.name.lower() for t in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K)}
REQUANTIZED = {Q.Q5_1: "q8_0", **{t: "q8_0" for t in K_TYPES if t not in AS_IS}}
# for fp32 activations (for_fp32_activations)
FP32_KINDS = {"q4_0": "q4_1", "q5_0": "q8_0", "q4_k": "q4_1", "q5_k": "q8_0", "q6_k": "q8_0"}


def kernel_kind(qtype: GGMLQuantizationType) -> str | None:
    """The kernel's block kind a tensor of this type is read as (None: fp32)."""
    return AS_IS.get(qtype) or REQUANTIZED.get(qtype)


def _f16_bytes(x: torch.Tensor) -> torch.Tensor:
    """fp32 [n, 1] -> [n, 2] bytes of its fp16 rounding."""
    return x.to(torch.float16).view(torch.uint8).reshape(-1, 2)


def q4_1_blocks(scale: torch.Tensor, q: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """Q4_1 blocks [n, 20] from 32-value sub-blocks: fp16 d, fp16 m, byte i = q[i] | q[i + 16] <<
    4."""
    qi = q.to(torch.uint8)
    return torch.cat([_f16_bytes(scale), _f16_bytes(offset), qi[:, :16] | (qi[:, 16:] << 4)], dim=1)


def q8_0_blocks(d: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Q8_0 blocks [n, 34]: fp16 d, then 32 int8 q."""
    return torch.cat([_f16_bytes(d), q.to(torch.int8).view(torch.uint8)], dim=1)


def quantize_q8_0(values: torch.Tensor) -> torch.Tensor:
    """fp32 values (a multiple of 32) -> Q8_0 blocks [n, 34], rounded as llama.cpp's
    quantize_row_q8_0."""
    x = values.reshape(-1, BLOCK).float()
    low, high = torch.aminmax(x, dim=1, keepdim=True)
    d = torch.maximum(high, -low).abs_() / 127  # abs: max(0, -0) may be -0, and d must be +0
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = x * inv
    q.add_(torch.copysign(torch.tensor(0.5), q)).trunc_()  # C roundf: halves away from zero
    return q8_0_blocks(d, q)


def kernel_kinds(types: dict[str, GGMLQuantizationType]) -> dict[str, str | None]:
    """HF name -> the kernel kind its tensor is read as. Fused members may differ (Q4_K_M: Q4_K q/k
    beside a Q6_K v): the kernel chains parts of different kinds (kernels/native.py)."""
    return {name: kernel_kind(t) for name, t in types.items()}


def convert(raw: torch.Tensor, qtype: GGMLQuantizationType, values: Callable[[], torch.Tensor],
            rows: int, cols: int, kind: str | None) -> QuantizedMatrix | None:
    """A tensor's raw blocks (uint8 [n_blocks, bytes]) -> the kernel's blocks of `kind`
    (kernel_kinds()), or None where the kernel reads fp32. values() gives its exact fp32 values,
    called only where blocks are requantized."""
    if kind is None or cols % BLOCK:
        return None
    if qtype in AS_IS and kind == AS_IS[qtype]:
        data = raw
    elif qtype == Q.Q4_0 and kind == "q4_1":
        # w = d (q - 8) = d q + (-8 d): -8 d is exact in fp16, so is every sum
        sub = decode(raw, qtype)
        data = q4_1_blocks(sub.scale, sub.q + 8.0, -8.0 * sub.scale)
    elif qtype == Q.Q5_0 and kind == "q8_0":  # the same d; q - 16 as int8 (uint8 arithmetic wraps)
        data = torch.cat([raw[:, 0:2], q5_quants(raw, 2) - 16], dim=1)
    elif qtype == Q.Q4_K and kind == "q4_1":
        scale, q, offset = q4_k_parts(raw)
        data = q4_1_blocks(scale, q, offset)
    else:
        data = quantize_q8_0(values())
    return QuantizedMatrix(kind, rows, cols, data.reshape(rows, -1).contiguous())


def for_fp32_activations(q: QuantizedMatrix) -> QuantizedMatrix:
    """q in blocks the fp32-activation products read (Q4_1 / Q8_0 / fp32): the file kinds
    converted."""
    if q.kind not in FP32_KINDS:
        return q
    qtype, parts = FILE_KINDS[q.kind], []
    for c in q.row_chunks():  # rows convert on their own
        raw = c.data.reshape(-1, GGML_QUANT_SIZES[qtype][1])
        out = convert(raw, qtype, lambda c=c: c.dequantize().reshape(-1), c.rows, c.cols,
                      FP32_KINDS[q.kind])
        assert out is not None
        parts.append(out.data)
    return QuantizedMatrix(out.kind, q.rows, q.cols,
                           torch.cat(parts) if len(parts) > 1 else parts[0])
