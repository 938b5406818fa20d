"""GGUF checkpoints: metadata -> ModelConfig, tensors dequantized -> HF-named weights (every type of
models/ggml_blocks.py, bit for bit gguf's dequantization), the native kernel's blocks
(models/kernel_blocks.py), vocabulary -> Tokenizer."""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from warmpath.config import ModelConfig
from warmpath.models.checkpoint import Checkpoint
from warmpath.models.ggml_blocks import BLOCK_TYPES, SUPPORTED_TENSOR_TYPES, dequantize, raw_blocks
from warmpath.models.gguf_file import GGUFTensor, read_gguf
from warmpath.models.gguf_meta import read_config, read_tokenizer, tensor_type_counts
from warmpath.models.kernel_blocks import convert, kernel_kinds
from warmpath.models.quant import BLOCK, QuantizedMatrix

log = logging.getLogger(__name__)

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
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    return None


def unpermute_rope_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's converter permutation of Q/K rows (interleaved RoPE pairs -> HF's
    rotate-half halves).

    The converter does w.reshape(n, 2, d/2, ...).swapaxes(1, 2); the inverse swaps back.
    """
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1,
                                                                               2).reshape(w.shape)


class GGUFWeights(Mapping[str, torch.Tensor]):
    """A GGUF file's tensors in HF naming, dequantized each time one is read (from the mapped file).

    The native kernel reads its matrices' blocks (Checkpoint.quantized) and from here only the
    norms, biases and what it packs from fp32: a native plan never holds fp32 copies of the
    matrices. A torch model reads all."""

    def __init__(self, tensors: dict[str, GGUFTensor], config: ModelConfig, dtype: torch.dtype):
        self._tensors, self._config, self._dtype = tensors, config, dtype

    def __getitem__(self, name: str) -> torch.Tensor:
        t = self._tensors[name]
        w = dequantize(t.data, t.tensor_type).reshape(hf_shape(t))
        heads = _rope_heads(self._config, name)
        if heads:
            w = unpermute_rope_rows(w, heads)
        return w.to(self._dtype)

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def numel(self) -> int:
        return sum(math.prod(t.shape) for t in self._tensors.values())


class GGUFBlocks(Mapping):
    """The native kernel's blocks of a GGUF file's matrices by HF name (models/kernel_blocks.py: the
    file's own, or converted), converted when first read and kept: a kernel whose packed matrices
    are on disk (kernels/packed_cache.py) reads none, and a restart converts nothing."""

    def __init__(self, tensors: dict[str, GGUFTensor], kinds: dict[str, str | None],
                 config: ModelConfig):
        self._tensors, self._kinds, self._config = tensors, kinds, config
        self._done: dict[str, QuantizedMatrix] = {}

    def __getitem__(self, name: str) -> QuantizedMatrix:
        if name not in self._done:
            t = self._tensors[name]
            q = convert(raw_blocks(t.data, t.tensor_type), t.tensor_type,
                        lambda: dequantize(t.data, t.tensor_type), *hf_shape(t), self._kinds[name])
            assert q is not None, name  # eligible by kind and shape (load_gguf)
            heads = _rope_heads(self._config, name)
            self._done[name] = q.map_rows(lambda r: unpermute_rope_rows(r, heads)) if heads else q
        return self._done[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def hf_shape(t: GGUFTensor) -> tuple[int, ...]:
    return tuple(reversed(t.shape))  # GGUF lists dimensions innermost first


def _rope_heads(config: ModelConfig, name: str) -> int | None:
    """llama.cpp's converter permutes Q/K rows for its RoPE layout only for the llama
    architecture."""
    if config.architecture != "llama":
        return None
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        return config.num_heads
    if name.endswith(("k_proj.weight", "k_proj.bias")):
        return config.num_kv_heads
    return None


def load_gguf(path: Path, dtype: torch.dtype) -> Checkpoint:
    start = time.perf_counter()
    file = read_gguf(path)
    config = read_config(file)
    tensors: dict[str, GGUFTensor] = {}
    for t in file.tensors:
        name = hf_name(t.name)
        if name is None:
            log.debug("skipping GGUF tensor %s", t.name)
            continue
        if t.tensor_type not in SUPPORTED_TENSOR_TYPES:
            raise ValueError(
                f"tensor {t.name}: unsupported GGUF type {t.tensor_type.name} (supported: "
                f"{', '.join(sorted(q.name for q in SUPPORTED_TENSOR_TYPES))})")
        tensors[name] = t
    kinds = kernel_kinds({name: t.tensor_type for name, t in tensors.items() if len(t.shape) == 2})
    quantized = GGUFBlocks(
        {
            name: t
            for name, t in tensors.items() if len(t.shape) == 2 and kinds.get(name) and
            t.tensor_type in BLOCK_TYPES and hf_shape(t)[1] % BLOCK == 0
        }, kinds, config)
    weights = GGUFWeights(tensors, config, dtype)
    types = tensor_type_counts(file)
    log.info(
        "loaded %s: %s, %d layers, hidden %d, %d/%d heads, vocab %d, %.1f M params, %s in %.1f s",
        path.name,
        config.architecture,
        config.num_layers,
        config.hidden_size,
        config.num_heads,
        config.num_kv_heads,
        config.vocab_size,
        weights.numel() / 1e6,
        " ".join(f"{n}x{k}" for k, n in sorted(types.items())),
        time.perf_counter() - start,
    )
    return Checkpoint(config, weights, read_tokenizer(file), str(path), quantized, types)
