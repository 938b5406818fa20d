"""GGUF metadata without the tensors: the model's shape and its tokenizer (no torch needed to read
them)."""

from __future__ import annotations

from collections import Counter

from warmpath.config import ModelConfig
from warmpath.models.gguf_file import GGUFFile
from warmpath.models.tokenizer import Tokenizer

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")


def read_config(reader: GGUFFile) -> ModelConfig:
    arch = reader.field("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"unsupported GGUF architecture {arch!r} (supported: {SUPPORTED_ARCHITECTURES})")
    scaling = reader.field(f"{arch}.rope.scaling.type", "none")
    factor = float(reader.field(f"{arch}.rope.scaling.factor", 1.0) or 1.0)
    if scaling not in ("none", None) and factor != 1.0:  # e.g. DeepSeek-Coder 1.3B/6.7B: linear, 4x
        raise ValueError(
            f"RoPE scaling {scaling!r} x{factor:g} is not supported yet: its logits would be wrong")
    hidden = int(reader.field(f"{arch}.embedding_length"))
    heads = int(reader.field(f"{arch}.attention.head_count"))
    names = {t.name for t in reader.tensors}
    vocab = reader.field(f"{arch}.vocab_size") or len(reader.field("tokenizer.ggml.tokens"))
    return ModelConfig(
        architecture=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(reader.field(f"{arch}.feed_forward_length")),
        num_layers=int(reader.field(f"{arch}.block_count")),
        num_heads=heads,
        num_kv_heads=int(reader.field(f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(reader.field(f"{arch}.rope.dimension_count", hidden // heads)),
        rope_theta=float(reader.field(f"{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(reader.field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        max_position_embeddings=int(reader.field(f"{arch}.context_length", 2048)),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
    )


def read_tokenizer(reader: GGUFFile) -> Tokenizer:
    kind = reader.field("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"unsupported GGUF tokenizer model {kind!r} (byte-level BPE 'gpt2' only)")
    merges = reader.field("tokenizer.ggml.merges")
    if merges is None:
        raise ValueError("GGUF file has no tokenizer.ggml.merges")
    return Tokenizer.from_gguf_vocab(
        tokens=list(reader.field("tokenizer.ggml.tokens")),
        token_types=[int(t) for t in reader.field("tokenizer.ggml.token_type")],
        merges=list(merges),
        pre=reader.field("tokenizer.ggml.pre", "default"),
        eos_token_id=reader.field("tokenizer.ggml.eos_token_id"),
        bos_token_id=reader.field("tokenizer.ggml.bos_token_id"),
        add_bos=bool(reader.field("tokenizer.ggml.add_bos_token", False)),
        chat_template=reader.field("tokenizer.chat_template"),
    )


def tensor_type_counts(reader: GGUFFile) -> dict[str, int]:
    """The file's quant mix: tensors per GGUF type, e.g. {"Q4_K": 12, "Q5_0": 133, "F32": 121}."""
    return dict(sorted(Counter(t.tensor_type.name for t in reader.tensors).items()))
