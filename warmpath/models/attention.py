"""Paged attention, torch backend (CPU and CUDA).

The KV cache of one layer is two tensors [num_blocks, block_size, num_kv_heads, head_dim (+2: int8
rows carry their scale, models/kv_quant.py)]. A token's K/V lives at a flat *slot* = block_id *
block_size + offset. The runner builds an AttentionMetadata once per step; every layer uses it to
write the step's new K/V into their slots and to read each sequence's whole context.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from warmpath.models import kv_quant


@dataclass
class PrefillSpan:
    """A sequence computing several new tokens (a prompt or a prompt chunk), maybe over cached
    context."""

    start: int  # first row of its new tokens in the flat batch
    end: int
    kv_slots: torch.Tensor  # [context_len] slots of the whole context, new tokens included
    # [q_len, context_len] bool; None when nothing is cached (plain causal)
    mask: torch.Tensor | None


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] where each new token's K/V is written
    prefills: list[PrefillSpan]
    # Single-token decodes are batched into one call over padded contexts.
    decode_rows: torch.Tensor | None = None  # [D] rows of the decode tokens in the flat batch
    decode_slots: torch.Tensor | None = None  # [D, L] context slots, padded
    decode_mask: torch.Tensor | None = None  # [D, 1, 1, L] True where the key is real


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: torch.Tensor):
    """The cache has a dtype of its own (EngineConfig.kv_cache_dtype): K/V are rounded to it on the
    way in (int8: quantized, models/kv_quant.py)."""
    num_kv_heads, width = k.shape[1], k_cache.shape[-1]
    if k_cache.dtype == torch.int8:
        k, v = kv_quant.quantize(k), kv_quant.quantize(v)
    k_cache.view(-1, num_kv_heads, width).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, width).index_copy_(0, slots, v.to(v_cache.dtype))


def read_kv(flat: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The cache's rows at slots ([..., num_kv_heads, head_dim]) in dtype."""
    rows = flat[slots]
    return (kv_quant.dequantize(rows) if flat.dtype == torch.int8 else rows).to(dtype)


def paged_attention(
    q: torch.Tensor,  # [T, num_heads, head_dim]
    k: torch.Tensor,  # [T, num_kv_heads, head_dim]
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Write the new K/V into the cache, then attend each new token over its sequence's context."""
    write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
    k_flat = k_cache.view(-1, *k_cache.shape[-2:])
    v_flat = v_cache.view(-1, *v_cache.shape[-2:])
    out = torch.empty_like(q)
    for span in meta.prefills:
        qs = q[span.start : span.end].transpose(0, 1).unsqueeze(0)  # [1, H, q, D]
        ks = read_kv(k_flat, span.kv_slots, q.dtype).transpose(0, 1).unsqueeze(0)  # [1, Hkv, L, D]
        vs = read_kv(v_flat, span.kv_slots, q.dtype).transpose(0, 1).unsqueeze(0)
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=span.mask, is_causal=span.mask
                                           is None, scale=scale, enable_gqa=True)
        out[span.start : span.end] = o[0].transpose(0, 1)
    if meta.decode_rows is not None:
        qd = q[meta.decode_rows].unsqueeze(2)  # [D, H, 1, D]
        kd = read_kv(k_flat, meta.decode_slots, q.dtype).transpose(1, 2)  # [D, Hkv, L, D]
        vd = read_kv(v_flat, meta.decode_slots, q.dtype).transpose(1, 2)
        o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=meta.decode_mask, scale=scale,
                                           enable_gqa=True)
        out[meta.decode_rows] = o.squeeze(2)
    return out
