"""GGML block formats decoded in torch: every tensor type of the GGUF files people run (F32, F16,
BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) -> fp32, bit for bit what
`gguf.quants.dequantize` computes (the same fp32 products and sums in the same order;
tests/unit/models/test_gguf_types.py checks each type).

Every quantized type decodes to sub-blocks: `value = scale * q + offset`, q small integers (as
fp32), one scale (and offset) per sub-block. That form is also what converting to the native
kernel's blocks reads (models/kernel_blocks.py). Vectorised over all blocks at once in torch (gguf's
numpy path is far slower).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
K_TYPES = (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)
BLOCK_TYPES = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, *K_TYPES)
FLOAT_TYPES = (Q.F32, Q.F16, Q.BF16)
SUPPORTED_TENSOR_TYPES = frozenset((*FLOAT_TYPES, *BLOCK_TYPES))


@dataclass
class SubBlocks:
    """A block-quantized tensor as [n_sub, sub] integers q with a scale (and offset) per
    sub-block."""

    scale: torch.Tensor  # fp32 [n_sub, 1]
    q: torch.Tensor  # fp32 [n_sub, sub]: integer values
    offset: torch.Tensor | None  # fp32 [n_sub, 1] (added), or None

    def values(self) -> torch.Tensor:
        v = self.scale * self.q
        return (v if self.offset is None else v + self.offset).reshape(-1)


def block_bytes(qtype: Q) -> tuple[int, int]:
    """(values per block, bytes per block)."""
    return GGML_QUANT_SIZES[qtype]


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[n, 2] bytes -> [n, 1] fp32 (an fp16 field)."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, 16 * k] bytes -> [n, k, 32]: each run of 16 bytes gives its low nibbles, then its high
    ones."""
    qs = qs.reshape(qs.shape[0], -1, 1, 16)
    return torch.cat([qs & 0x0F, qs >> 4], dim=2).reshape(qs.shape[0], -1, 32)


def _bits(b: torch.Tensor, width: int, count: int) -> torch.Tensor:
    """[..., m] bytes -> [..., count, m]: field j (width bits, from the low end) of every byte."""
    shifts = torch.arange(count, dtype=torch.uint8).view(count, 1) * width
    return (b.unsqueeze(-2) >> shifts) & ((1 << width) - 1)


def _high_bits32(qh: torch.Tensor) -> torch.Tensor:
    """Q5_0 / Q5_1: 4 bytes (a little-endian uint32) -> [n, 32] bits, bit j for value j (bit j % 8
    of byte j // 8)."""
    return _bits(qh.contiguous(), 1, 8).transpose(-1, -2).reshape(qh.shape[0], 32)


def q5_quants(raw: torch.Tensor, at: int) -> torch.Tensor:
    """Q5_0 (at=2) / Q5_1 (at=4) blocks -> uint8 [n, 32], the 5-bit q of each value."""
    return _nibbles(raw[:, at + 4:]).reshape(raw.shape[0],
                                             32) | (_high_bits32(raw[:, at:at + 4]) << 4)


def q4_k_parts(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K blocks -> its 32-value sub-blocks: scale d * sc and offset -dmin * m (fp32 [n * 8, 1])
    and the 4-bit q (uint8 [n * 8, 32])."""
    n = raw.shape[0]
    d, dmin = _f16(raw[:, 0:2]), _f16(raw[:, 2:4])
    sc, mn = _scale_min_k4(raw[:, 4:16])
    qs = raw[:, 16:144]
    q = torch.cat([(qs.reshape(n, 4, 1, 32) >> s) & 0x0F for s in (0, 4)], dim=2).reshape(n * 8, 32)
    return (d * sc.float()).reshape(-1, 1), q, -(dmin * mn.float()).reshape(-1, 1)


def _scale_min_k4(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K: 12 bytes -> eight 6-bit scales and eight 6-bit mins ([n, 8] each)."""
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc, mn


def decode(raw: torch.Tensor, qtype: Q) -> SubBlocks:
    """raw: uint8 [n_blocks, bytes per block] of a block-quantized type."""
    n = raw.shape[0]
    if qtype == Q.Q8_0:
        return SubBlocks(_f16(raw[:, 0:2]), raw[:, 2:].contiguous().view(torch.int8).float(), None)
    if qtype == Q.Q4_0:
        return SubBlocks(_f16(raw[:, 0:2]), _nibbles(raw[:, 2:]).reshape(n, 32).float() - 8.0, None)
    if qtype == Q.Q4_1:
        return SubBlocks(_f16(raw[:, 0:2]),
                         _nibbles(raw[:, 4:]).reshape(n, 32).float(), _f16(raw[:, 2:4]))
    if qtype in (Q.Q5_0, Q.Q5_1):
        q = q5_quants(raw, 2 if qtype == Q.Q5_0 else 4)
        if qtype == Q.Q5_0:
            return SubBlocks(_f16(raw[:, 0:2]), q.float() - 16.0, None)
        return SubBlocks(_f16(raw[:, 0:2]), q.float(), _f16(raw[:, 2:4]))
    if qtype == Q.Q2_K:  # scales 16, qs 64, d, dmin; sub-blocks of 16
        s, qs = raw[:, 0:16], raw[:, 16:80]
        d, dmin = _f16(raw[:, 80:82]), _f16(raw[:, 82:84])
        q = _bits(qs.reshape(n, 2, 32), 2, 4).reshape(n, 2, 4, 32)  # [n, half, shift, byte]
        q = q.reshape(n * 16, 16).float()
        scale = (d * (s & 0x0F).float()).reshape(-1, 1)
        offset = -(dmin * (s >> 4).float()).reshape(-1, 1)
        return SubBlocks(scale, q, offset)
    if qtype == Q.Q3_K:  # hmask 32, qs 64, scales 12, d; sub-blocks of 16
        hmask, qs, s, d = raw[:, 0:32], raw[:, 32:96], raw[:, 96:108], _f16(raw[:, 108:110])
        low = torch.cat([s[:, 0:8] & 0x0F, s[:, 0:8] >> 4], dim=1)  # [n, 16]
        high = _bits(s[:, 8:12], 2, 4).reshape(n, 16)
        sc = (low | (high << 4)).float() - 32.0
        ql = _bits(qs.reshape(n, 2, 32), 2, 4).reshape(n, 256)  # value h*128 + s*32 + l
        qh = _bits(hmask, 1, 8).reshape(n, 256)  # value b*32 + l: bit b of hmask[l]
        q = ql.to(torch.int16) - ((qh ^ 1).to(torch.int16) << 2)
        return SubBlocks((d * sc).reshape(-1, 1), q.reshape(n * 16, 16).float(), None)
    if qtype == Q.Q4_K:  # d, dmin, scales 12, qs 128; sub-blocks of 32
        scale, q, offset = q4_k_parts(raw)
        return SubBlocks(scale, q.float(), offset)
    if qtype == Q.Q5_K:  # d, dmin, scales 12, qh 32, qs 128; sub-blocks of 32
        d, dmin = _f16(raw[:, 0:2]), _f16(raw[:, 2:4])
        sc, mn = _scale_min_k4(raw[:, 4:16])
        qs = raw[:, 48:176]
        low = torch.cat([(qs.reshape(n, 4, 1, 32) >> s) & 0x0F for s in (0, 4)],
                        dim=2).reshape(n, 8, 32)
        q = low | (_bits(raw[:, 16:48], 1, 8) << 4)
        scale = (d * sc.float()).reshape(-1, 1)
        offset = -(dmin * mn.float()).reshape(-1, 1)
        return SubBlocks(scale, q.reshape(n * 8, 32).float(), offset)
    if qtype == Q.Q6_K:  # ql 128, qh 64, scales 16 (int8), d; sub-blocks of 16
        ql, qh, s, d = raw[:, 0:128], raw[:, 128:192], raw[:, 192:208], _f16(raw[:, 208:210])
        low = _bits(ql.reshape(n, 2, 64), 4, 2).reshape(n, 2, 2, 64)  # value h*128 + s*64 + l
        high = _bits(qh.reshape(n, 2, 32), 2, 4).reshape(n, 2, 4, 32)  # value h*128 + s*32 + l
        q = (low.reshape(n, 256) | (high.reshape(n, 256) << 4)).float() - 32.0
        sc = s.contiguous().view(torch.int8).float()
        return SubBlocks((d * sc).reshape(-1, 1), q.reshape(n * 16, 16), None)
    raise ValueError(f"not a block-quantized type: {qtype.name}")


def raw_blocks(data: np.ndarray, qtype: Q) -> torch.Tensor:
    """A GGUF tensor's raw bytes -> uint8 [n_blocks, bytes per block] (a copy: the file's map stays
    read-only)."""
    _, size = block_bytes(qtype)
    return torch.from_numpy(np.ascontiguousarray(data).reshape(-1).view(np.uint8).copy()).view(
        -1, size)


def dequantize(data: np.ndarray, qtype: Q) -> torch.Tensor:
    """A GGUF tensor's raw data -> flat fp32 values."""
    if qtype == Q.F32:
        return torch.from_numpy(np.ascontiguousarray(data).reshape(-1).view(np.float32).copy())
    if qtype == Q.F16:
        return torch.from_numpy(np.ascontiguousarray(data).reshape(-1).view(
            np.float16).copy()).float()
    if qtype == Q.BF16:
        return torch.from_numpy(np.ascontiguousarray(data).reshape(-1).view(np.int16).copy()).view(
            torch.bfloat16).float()
    if qtype not in BLOCK_TYPES:
        raise ValueError(f"unsupported GGUF tensor type {qtype.name}")
    return decode(raw_blocks(data, qtype), qtype).values()
