"""GGUF checkpoints: metadata -> ModelConfig, tensors dequantized -> HF-named weights, vocabulary -> Tokenizer."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from warmpath.models.checkpoint import Checkpoint
from warmpath.models.gguf_meta import read_config, read_tokenizer
from warmpath.models.quant import QuantizedMatrix, from_gguf_blocks

log = logging.getLogger(__name__)

SUPPORTED_TENSOR_TYPES = {
    GGMLQuantizationType.F32,
    GGMLQuantizationType.F16,
    GGMLQuantizationType.BF16,
    GGMLQuantizationType.Q8_0,
    GGMLQuantizationType.Q4_0,
    GGMLQuantizationType.Q4_1,
}

# GGUF tensor name -> HF name ("{i}" is the layer index).
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# GGUF block formats the native kernel reads as they are (warmpath/models/quant.py).
_QUANT_KINDS = {GGMLQuantizationType.Q4_1: "q4_1", GGMLQuantizationType.Q8_0: "q8_0"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    return None


def unpermute_rope_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's converter permutation of Q/K rows (interleaved RoPE pairs -> HF's rotate-half halves).

    The converter does w.reshape(n, 2, d/2, ...).swapaxes(1, 2); the inverse swaps back.
    """
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _dequantize_blocks(raw: np.ndarray, qtype: GGMLQuantizationType) -> torch.Tensor:
    """Q8_0 / Q4_0 / Q4_1 blocks of 32 values -> fp32, vectorised in torch (gguf's numpy path is far slower)."""
    size = {GGMLQuantizationType.Q8_0: 34, GGMLQuantizationType.Q4_0: 18, GGMLQuantizationType.Q4_1: 20}[qtype]
    blocks = torch.from_numpy(raw.reshape(-1).copy()).view(-1, size)
    d = blocks[:, 0:2].contiguous().view(torch.float16).float()  # one fp16 scale per block
    if qtype == GGMLQuantizationType.Q8_0:
        return d * blocks[:, 2:].contiguous().view(torch.int8).float()
    start = 2 if qtype == GGMLQuantizationType.Q4_0 else 4
    qs = blocks[:, start:]
    q = torch.cat([qs & 0x0F, qs >> 4], dim=1).float()  # low nibbles are values 0..15, high 16..31
    if qtype == GGMLQuantizationType.Q4_0:
        return d * (q - 8.0)
    m = blocks[:, 2:4].contiguous().view(torch.float16).float()
    return d * q + m


def dequantize_tensor(raw: np.ndarray, qtype: GGMLQuantizationType) -> torch.Tensor:
    """A GGUF tensor's raw data -> flat fp32 values."""
    if qtype in (GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1):
        return _dequantize_blocks(raw, qtype).reshape(-1)
    if qtype == GGMLQuantizationType.BF16:
        return torch.from_numpy(raw.reshape(-1).copy().view(np.int16)).view(torch.bfloat16).float()
    return torch.from_numpy(np.asarray(dequantize(raw, qtype), dtype=np.float32).reshape(-1).copy())


def load_gguf(path: Path, dtype: torch.dtype) -> Checkpoint:
    reader = GGUFReader(path)
    config = read_config(reader)
    weights: dict[str, torch.Tensor] = {}
    quantized: dict[str, QuantizedMatrix] = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            log.debug("skipping GGUF tensor %s", t.name)
            continue
        if t.tensor_type not in SUPPORTED_TENSOR_TYPES:
            raise ValueError(f"tensor {t.name}: unsupported GGUF type {t.tensor_type.name}")
        shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists dimensions innermost first
        w = dequantize_tensor(np.asarray(t.data), t.tensor_type).reshape(shape)
        q = None
        kind = _QUANT_KINDS.get(t.tensor_type)
        if kind and len(shape) == 2:  # keep the blocks too: the native kernel reads them (models/quant.py)
            q = from_gguf_blocks(torch.from_numpy(np.asarray(t.data).reshape(-1).view(np.uint8).copy()), kind, *shape)
        # llama.cpp's converter permutes Q/K rows for its RoPE layout only for the llama architecture.
        heads = None
        if config.architecture == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            heads = config.num_heads
        elif config.architecture == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            heads = config.num_kv_heads
        if heads:
            w = unpermute_rope_rows(w, heads)
            q = q and q.map_rows(lambda r, h=heads: unpermute_rope_rows(r, h))
        weights[name] = w.to(dtype)
        if q is not None:
            quantized[name] = q
    log.info(
        "loaded %s: %s, %d layers, hidden %d, %d/%d heads, vocab %d, %.1f M params",
        path.name,
        config.architecture,
        config.num_layers,
        config.hidden_size,
        config.num_heads,
        config.num_kv_heads,
        config.vocab_size,
        sum(w.numel() for w in weights.values()) / 1e6,
    )
    return Checkpoint(config, weights, read_tokenizer(reader), str(path), quantized)
