"""Llama-family decoder (Llama, SmolLM2, Qwen2) over a paged KV cache.

One forward call takes the flattened new tokens of many sequences (prefill chunks and decodes
mixed), their positions and the step's AttentionMetadata, and returns fp32 logits only for the rows
that need sampling. Q/K/V and gate/up are fused into one matmul each: fewer, larger matmuls per
step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from warmpath.config import ModelConfig
from warmpath.models.attention import AttentionMetadata, paged_attention


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Normalise in fp32 like the reference implementation, scale in the model dtype.
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rope_table(head_dim: int, theta: float, max_positions: int) -> torch.Tensor:
    """[max_positions, head_dim] cos and sin tables (fp32), rotate-half layout."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return torch.stack([emb.cos(), emb.sin()])


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
           half: dict | None) -> torch.Tensor:
    """x @ w.T (+ b), on w's half-width copy when the caller passes the copies (the runner decides
    which steps use them: EngineConfig.gemv_dtype)."""
    if half is not None:
        w_half = half[id(w)]
        return F.linear(x.to(w_half.dtype), w_half,
                        None if b is None else b.to(w_half.dtype)).to(x.dtype)
    return F.linear(x, w, b)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.split = (q_size, kv_size, kv_size)
        self.input_norm = nn.Parameter(torch.empty(cfg.hidden_size), requires_grad=False)
        self.post_attention_norm = nn.Parameter(torch.empty(cfg.hidden_size), requires_grad=False)
        self.qkv_weight = nn.Parameter(torch.empty(sum(self.split), cfg.hidden_size),
                                       requires_grad=False)
        self.qkv_bias = nn.Parameter(torch.empty(sum(self.split)),
                                     requires_grad=False) if cfg.attention_bias else None
        self.o_weight = nn.Parameter(torch.empty(cfg.hidden_size, q_size), requires_grad=False)
        self.gate_up_weight = nn.Parameter(torch.empty(2 * cfg.intermediate_size, cfg.hidden_size),
                                           requires_grad=False)
        self.down_weight = nn.Parameter(torch.empty(cfg.hidden_size, cfg.intermediate_size),
                                        requires_grad=False)
        self.scale = cfg.head_dim**-0.5
        self.half: dict | None = None  # half-width weight copies (keep_half_width_copies)

    def forward(self, x, cos, sin, k_cache, v_cache, meta: AttentionMetadata,
                half_width: bool) -> torch.Tensor:
        cfg, half = self.cfg, (self.half if half_width else None)
        h = rms_norm(x, self.input_norm, cfg.rms_norm_eps)
        q, k, v = linear(h, self.qkv_weight, self.qkv_bias, half).split(self.split, dim=-1)
        q = apply_rope(q.view(-1, cfg.num_heads, cfg.head_dim), cos, sin)
        k = apply_rope(k.view(-1, cfg.num_kv_heads, cfg.head_dim), cos, sin)
        v = v.view(-1, cfg.num_kv_heads, cfg.head_dim)
        attn = paged_attention(q, k, v, k_cache, v_cache, meta, self.scale)
        x = x + linear(attn.reshape(-1, cfg.num_heads * cfg.head_dim), self.o_weight, None, half)
        h = rms_norm(x, self.post_attention_norm, cfg.rms_norm_eps)
        gate, up = linear(h, self.gate_up_weight, None, half).chunk(2, dim=-1)
        return x + linear(F.silu(gate) * up, self.down_weight, None, half)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size), requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = nn.Parameter(torch.empty(cfg.hidden_size), requires_grad=False)
        # Tied models reuse the embedding as the LM head (no second copy in memory).
        self.lm_head = None if cfg.tie_word_embeddings else nn.Parameter(
            torch.empty(cfg.vocab_size, cfg.hidden_size), requires_grad=False
        )
        rope = rope_table(cfg.head_dim, cfg.rope_theta, cfg.max_position_embeddings)
        self.register_buffer("rope", rope, persistent=False)
        self.half: dict | None = None

    @property
    def has_half_width_copies(self) -> bool:
        return self.half is not None

    def keep_half_width_copies(self, dtype: torch.dtype) -> None:
        """Keep a `dtype` copy of every matrix beside it, for the steps the runner sends there
        (forward's half_width): a few-row step is bound by reading weights, and half the bytes are
        read."""
        head = self.embed if self.lm_head is None else self.lm_head
        for layer in self.layers:
            layer.half = {
                id(w): w.detach().to(dtype).contiguous()
                for w in (layer.qkv_weight, layer.o_weight, layer.gate_up_weight, layer.down_weight)
            }
        self.half = {id(head): head.detach().to(dtype).contiguous()}

    @classmethod
    def from_weights(cls, cfg: ModelConfig, weights: dict[str, torch.Tensor], dtype,
                     device) -> LlamaForCausalLM:
        """Build from HF-named weights, fusing q/k/v and gate/up."""
        with torch.device("meta"):
            model = cls(cfg)
        model.rope = rope_table(cfg.head_dim, cfg.rope_theta, cfg.max_position_embeddings)
        missing = [n for n in _required_names(cfg) if n not in weights]
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")

        def param(t: torch.Tensor) -> nn.Parameter:
            return nn.Parameter(t.to(device=device, dtype=dtype).contiguous(), requires_grad=False)

        model.embed = param(weights["model.embed_tokens.weight"])
        model.norm = param(weights["model.norm.weight"])
        if not cfg.tie_word_embeddings:
            model.lm_head = param(weights["lm_head.weight"])
        for i, layer in enumerate(model.layers):
            p = f"model.layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            layer.input_norm = param(weights[p + "input_layernorm.weight"])
            layer.post_attention_norm = param(weights[p + "post_attention_layernorm.weight"])
            layer.qkv_weight = param(torch.cat([weights[a + f"{x}_proj.weight"] for x in "qkv"]))
            if cfg.attention_bias:
                layer.qkv_bias = param(torch.cat([weights[a + f"{x}_proj.bias"] for x in "qkv"]))
            layer.o_weight = param(weights[a + "o_proj.weight"])
            layer.gate_up_weight = param(
                torch.cat([weights[m + "gate_proj.weight"], weights[m + "up_proj.weight"]]))
            layer.down_weight = param(weights[m + "down_proj.weight"])
        model.rope = model.rope.to(device)
        return model.eval()

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        meta: AttentionMetadata,
        kv_cache: torch.Tensor,  # [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
        logits_rows: torch.Tensor,  # [N] rows whose next-token logits are wanted
        half_width: bool = False,  # compute on the half-width weight copies
    ) -> torch.Tensor:
        x = F.embedding(input_ids, self.embed)
        dtype = x.dtype
        # [T, 1, head_dim], broadcast over heads
        cos = self.rope[0][positions].to(dtype).unsqueeze(1)
        sin = self.rope[1][positions].to(dtype).unsqueeze(1)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, kv_cache[i, 0], kv_cache[i, 1], meta, half_width)
        h = rms_norm(x[logits_rows], self.norm, self.cfg.rms_norm_eps)
        head = self.embed if self.lm_head is None else self.lm_head
        return linear(h, head, None, self.half if half_width else None).float()


def _required_names(cfg: ModelConfig) -> list[str]:
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not cfg.tie_word_embeddings:
        names.append("lm_head.weight")
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        names += [p + f"self_attn.{x}_proj.weight" for x in ("q", "k", "v", "o")]
        names += [p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
        if cfg.attention_bias:
            names += [p + f"self_attn.{x}_proj.bias" for x in "qkv"]
    return names
