"""Paged attention, torch backend (CPU and CUDA).

The KV cache of one layer is two tensors [num_blocks, block_size, num_kv_heads, head_dim]. A token's K/V
lives at a flat *slot* = block_id * block_size + offset. The runner builds an AttentionMetadata once per step;
every layer uses it to write the step's new K/V into their slots and to read each sequence's whole context.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PrefillSpan:
    """A sequence computing several new tokens (a prompt or a prompt chunk), maybe over cached context."""

    start: int  # first row of its new tokens in the flat batch
    end: int
    kv_slots: torch.Tensor  # [context_len] slots of the whole context, new tokens included
    mask: torch.Tensor | None  # [q_len, context_len] bool; None when nothing is cached (plain causal)


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] where each new token's K/V is written
    prefills: list[PrefillSpan]
    # Single-token decodes are batched into one call over padded contexts.
    decode_rows: torch.Tensor | None = None  # [D] rows of the decode tokens in the flat batch
    decode_slots: torch.Tensor | None = None  # [D, L] context slots, padded
    decode_mask: torch.Tensor | None = None  # [D, 1, 1, L] True where the key is real


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor):
    """The cache has a dtype of its own (EngineConfig.kv_cache_dtype): K/V are rounded to it on the way in."""
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, v.to(v_cache.dtype))


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
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    out = torch.empty_like(q)
    for span in meta.prefills:
        qs = q[span.start : span.end].transpose(0, 1).unsqueeze(0)  # [1, H, q, D]
        ks = k_flat[span.kv_slots].transpose(0, 1).unsqueeze(0).to(q.dtype)  # [1, Hkv, L, D]
        vs = v_flat[span.kv_slots].transpose(0, 1).unsqueeze(0).to(q.dtype)
        o = F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=span.mask, is_causal=span.mask is None, scale=scale, enable_gqa=True
        )
        out[span.start : span.end] = o[0].transpose(0, 1)
    if meta.decode_rows is not None:
        qd = q[meta.decode_rows].unsqueeze(2)  # [D, H, 1, D]
        kd = k_flat[meta.decode_slots].transpose(1, 2).to(q.dtype)  # [D, Hkv, L, D]
        vd = v_flat[meta.decode_slots].transpose(1, 2).to(q.dtype)
        o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=meta.decode_mask, scale=scale, enable_gqa=True)
        out[meta.decode_rows] = o.squeeze(2)
    return out
