"""GGUF checkpoints: metadata -> ModelConfig, tensors dequantized -> HF-named weights (every type of
models/ggml_blocks.py, bit for bit gguf's dequantization), the native kernel's blocks (models/kernel_blocks.py),
vocabulary -> Tokenizer."""

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
from warmpath.models.quant import QuantizedMatrix

log = logging.getLogger(__name__)

PROGRESS_BYTES = 256 << 20  # files from this size on log their loading progress

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
    """Undo llama.cpp's converter permutation of Q/K rows (interleaved RoPE pairs -> HF's rotate-half halves).

    The converter does w.reshape(n, 2, d/2, ...).swapaxes(1, 2); the inverse swaps back.
    """
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


class _Progress:
    """A log line every tenth of a large file's tensor bytes (a 1.5B model takes seconds, not silence)."""

    def __init__(self, path: Path, total: int):
        self.name, self.total, self.done, self.next = path.name, max(total, 1), 0, 0.1
        self.start = time.perf_counter()
        self.show = total >= PROGRESS_BYTES

    def add(self, nbytes: int) -> None:
        self.done += nbytes
        if self.show and self.done / self.total >= self.next:
            log.info("loading %s: %3.0f%% of %.0f MB (%.1f s)", self.name, 100 * self.done / self.total,
                     self.total / 1e6, time.perf_counter() - self.start)
            self.next += 0.1


class GGUFWeights(Mapping[str, torch.Tensor]):
    """A GGUF file's tensors in HF naming, dequantized each time one is read (from the mapped file).

    The native kernel reads its matrices' blocks (Checkpoint.quantized) and from here only the norms, biases and
    what it packs from fp32: a native plan never holds fp32 copies of the matrices. A torch model reads all."""

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


def hf_shape(t: GGUFTensor) -> tuple[int, ...]:
    return tuple(reversed(t.shape))  # GGUF lists dimensions innermost first


def _rope_heads(config: ModelConfig, name: str) -> int | None:
    """llama.cpp's converter permutes Q/K rows for its RoPE layout only for the llama architecture."""
    if config.architecture != "llama":
        return None
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        return config.num_heads
    if name.endswith(("k_proj.weight", "k_proj.bias")):
        return config.num_kv_heads
    return None


def load_gguf(path: Path, dtype: torch.dtype) -> Checkpoint:
    file = read_gguf(path)
    config = read_config(file)
    tensors: dict[str, GGUFTensor] = {}
    for t in file.tensors:
        name = hf_name(t.name)
        if name is None:
            log.debug("skipping GGUF tensor %s", t.name)
            continue
        if t.tensor_type not in SUPPORTED_TENSOR_TYPES:
            raise ValueError(f"tensor {t.name}: unsupported GGUF type {t.tensor_type.name} (supported: "
                             f"{', '.join(sorted(q.name for q in SUPPORTED_TENSOR_TYPES))})")
        tensors[name] = t
    kinds = kernel_kinds({name: t.tensor_type for name, t in tensors.items() if len(t.shape) == 2})
    progress = _Progress(path, sum(t.n_bytes for t in tensors.values()))
    quantized: dict[str, QuantizedMatrix] = {}
    for name, t in tensors.items():
        if len(t.shape) == 2 and kinds.get(name) and t.tensor_type in BLOCK_TYPES:
            # The native kernel's blocks of this matrix (models/kernel_blocks.py: the file's own, or converted;
            # the fp32 values are computed only where blocks are requantized from them)
            q = convert(raw_blocks(t.data, t.tensor_type), t.tensor_type,
                        lambda t=t: dequantize(t.data, t.tensor_type), *hf_shape(t), kinds[name])
            heads = _rope_heads(config, name)
            if q is not None:
                quantized[name] = q.map_rows(lambda r, h=heads: unpermute_rope_rows(r, h)) if heads else q
        progress.add(t.n_bytes)
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
        time.perf_counter() - progress.start,
    )
    return Checkpoint(config, weights, read_tokenizer(file), str(path), quantized, types)
