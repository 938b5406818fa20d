"""GGUF checkpoints: metadata -> ModelConfig, tensors dequantized -> HF-named weights, vocabulary -> Tokenizer."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from warmpath.config import ModelConfig
from warmpath.models.quant import QuantizedMatrix, from_gguf_blocks
from warmpath.models.registry import Checkpoint
from warmpath.models.tokenizer import Tokenizer

log = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")
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
# GGUF block formats the native decode kernel reads as they are (warmpath/models/quant.py).
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
    """Q8_0 / Q4_0 / Q4_1 blocks of 32 values -> fp32, vectorised in torch (gguf's numpy path is ~10x slower)."""
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


def _field(reader: GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def read_config(reader: GGUFReader) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"unsupported GGUF architecture {arch!r} (supported: {SUPPORTED_ARCHITECTURES})")
    hidden = int(_field(reader, f"{arch}.embedding_length"))
    heads = int(_field(reader, f"{arch}.attention.head_count"))
    names = {t.name for t in reader.tensors}
    vocab = _field(reader, f"{arch}.vocab_size") or len(_field(reader, "tokenizer.ggml.tokens"))
    return ModelConfig(
        architecture=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(_field(reader, f"{arch}.feed_forward_length")),
        num_layers=int(_field(reader, f"{arch}.block_count")),
        num_heads=heads,
        num_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(_field(reader, f"{arch}.rope.dimension_count", hidden // heads)),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        max_position_embeddings=int(_field(reader, f"{arch}.context_length", 2048)),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
    )


def read_tokenizer(reader: GGUFReader) -> Tokenizer:
    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"unsupported GGUF tokenizer model {kind!r} (byte-level BPE 'gpt2' only)")
    merges = _field(reader, "tokenizer.ggml.merges")
    if merges is None:
        raise ValueError("GGUF file has no tokenizer.ggml.merges")
    return Tokenizer.from_gguf_vocab(
        tokens=list(_field(reader, "tokenizer.ggml.tokens")),
        token_types=[int(t) for t in _field(reader, "tokenizer.ggml.token_type")],
        merges=list(merges),
        pre=_field(reader, "tokenizer.ggml.pre", "default"),
        eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        add_bos=bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        chat_template=_field(reader, "tokenizer.chat_template"),
    )


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
        if kind and len(shape) == 2:  # keep the blocks too: the native decode kernel reads them (models/quant.py)
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
