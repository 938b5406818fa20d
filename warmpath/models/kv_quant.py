"""The int8 KV row (EngineConfig.kv_cache_dtype="int8"): one token's K (or V) for one KV head is
head_dim int8 values then their fp16 scale, two bytes, in the same tensor. A scale per row, not per
block: a row's bytes then depend on that row alone, never on which tokens share its block or its
step, so outputs stay independent of batching and chunking. The native kernel (kernels/cpu/kv.h)
writes and reads the same bytes."""

from __future__ import annotations

import torch

from warmpath.config import KV_INT8_SCALE_BYTES as SCALE_BYTES


def row_width(head_dim: int, dtype: torch.dtype) -> int:
    """Elements in the last dimension of a KV cache of dtype: head_dim, plus the scale's two bytes
    for int8."""
    return head_dim + SCALE_BYTES if dtype == torch.int8 else head_dim


def quantize(x: torch.Tensor) -> torch.Tensor:
    """[..., head_dim] floats -> [..., head_dim + 2] int8: scale = amax / 127 rounded to fp16,
    values x / scale rounded to nearest even and clamped to +-127."""
    x = x.float()
    scale = (x.abs().amax(-1, keepdim=True) / 127).to(torch.float16)
    s = scale.float()
    q = torch.where(s > 0, x / s, 0).round().clamp(-127, 127)
    return torch.cat([q.to(torch.int8), scale.view(torch.int8)], -1)


def dequantize(rows: torch.Tensor) -> torch.Tensor:
    """[..., head_dim + 2] int8 -> [..., head_dim] float32, each value times its row's scale."""
    scale = rows[..., -SCALE_BYTES:].contiguous().view(torch.float16).float()
    return rows[..., :-SCALE_BYTES].float() * scale
