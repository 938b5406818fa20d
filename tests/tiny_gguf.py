"""Tiny random `llama` / `qwen2` GGUF files with any GGUF tensor type per matrix, written the way
llama.cpp's converter writes them (llama: permuted Q/K rows; qwen2: q/k/v biases, an untied
output.weight), and vocabularies with a code model's FIM special tokens. Rows are 256 values wide so
that every K-quant fits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from kquants import QUANTIZERS
from tiny_model import CHAT_TEMPLATE, MERGES, SPECIAL, permute_for_gguf, tiny_config, tiny_weights
from tokenizers import pre_tokenizers

EVERY_TYPE = (Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K,
              Q.Q6_K)
MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
QWEN_FIM = [
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>",
    "<|file_sep|>"
]
STARCODER_FIM = [
    "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<repo_name>", "<file_sep>"
]
_HF = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj"
}

TypeRule = Callable[[str, int], Q]  # (GGUF tensor kind, layer index or -1) -> its type


def every_type(kind: str, layer: int) -> Q:
    """Every type at least once over two layers' 14 matrices, the embedding and the head."""
    if layer < 0:
        return Q.Q6_K if kind == "output" else Q.Q4_K
    return EVERY_TYPE[(layer * len(MATRICES) + MATRICES.index(kind)) % len(EVERY_TYPE)]


def uniform(qtype: Q) -> TypeRule:
    return lambda kind, layer: qtype


def q4_k_m(num_layers: int) -> TypeRule:
    """llama.cpp's Q4_K_M mix: Q4_K, with Q6_K for attn_v / ffn_down in the layers that get more
    bits (the first and last eighth, every third between) and for the head."""
    def more_bits(i: int) -> bool:
        return i < num_layers // 8 or i >= 7 * num_layers // 8 or (i - num_layers // 8) % 3 == 2

    def rule(kind: str, layer: int) -> Q:
        if kind == "output":
            return Q.Q6_K
        if kind in ("attn_v", "ffn_down") and more_bits(layer):
            return Q.Q6_K
        return Q.Q4_K
    return rule


@dataclass
class Vocab:
    pre: str = "smollm"
    extra_special: tuple[str, ...] = ()
    eos: str = "<|endoftext|>"

    def tokens(self) -> tuple[list[str], list[str]]:
        tokens = list(SPECIAL) + list(self.extra_special)
        tokens += sorted(pre_tokenizers.ByteLevel.alphabet())
        tokens += [a + b for a, b in MERGES]
        return tokens, [*SPECIAL, *self.extra_special]


QWEN_VOCAB = Vocab("qwen2", tuple(QWEN_FIM))
STARCODER_VOCAB = Vocab("starcoder", tuple(STARCODER_FIM))


def _encode(arr: np.ndarray, qtype: Q) -> tuple[np.ndarray, np.ndarray]:
    """(what the file stores, what gguf's reader decodes it to)."""
    if qtype == Q.F32:
        return arr, arr
    if qtype == Q.F16:
        return arr.astype(np.float16), arr.astype(np.float16).astype(np.float32)
    if qtype.name in QUANTIZERS:
        raw, _ = QUANTIZERS[qtype.name](arr)
        raw = raw.reshape(arr.shape[0], -1)
    else:
        raw = quantize(arr, qtype)
    return raw, np.asarray(dequantize(raw, qtype), dtype=np.float32).reshape(arr.shape)


def write_gguf(path: Path, arch: str = "llama", types: TypeRule = every_type,
               vocab: Vocab | None = None, seed: int = 0, num_layers: int = 2,
               edit: Callable[[dict[str, torch.Tensor], list[str]], None] | None = None,
               **overrides) -> tuple[Path, dict[str, torch.Tensor], dict]:
    """Write the file; returns it, the HF-named weights it decodes to (gguf's reference
    dequantization, Q/K rows un-permuted) and the HF config. edit(weights, tokens) may change the
    HF-layout weights first."""
    vocab = vocab or Vocab()
    tokens, special = vocab.tokens()
    hf_arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[arch]
    cfg = tiny_config(arch, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=64, num_hidden_layers=num_layers,
                      tie_word_embeddings=arch == "llama", vocab_size=len(tokens) + 3,
                      rope_theta=1e6 if arch == "qwen2" else 10000.0,
                      rms_norm_eps=1e-6 if arch == "qwen2" else 1e-5, max_position_embeddings=1024,
                      architectures=[hf_arch], **overrides)
    tokens += [f"<unused{i}>" for i in range(cfg["vocab_size"] - len(tokens))]
    hf = tiny_weights(cfg, seed)
    for name in hf:
        # 256-wide rows: smaller q/k keep attention from saturating (logits far from chaos)
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            hf[name] = hf[name] * 0.25
    if edit is not None:
        edit(hf, tokens)
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(num_layers)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(nq)
    w.add_head_count_kv(nkv)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])
    w.add_token_merges([f"{a} {b}" for a, b in MERGES])
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index(vocab.eos))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    names = {"model.embed_tokens.weight": ("token_embd.weight", "token_embd", -1),
             "model.norm.weight": ("output_norm.weight", "output_norm", -1)}
    if "lm_head.weight" in hf:
        names["lm_head.weight"] = ("output.weight", "output", -1)
    for i in range(num_layers):
        for g, h in _HF.items():
            names[f"model.layers.{i}.{h}.weight"] = (f"blk.{i}.{g}.weight", g, i)
            if f"model.layers.{i}.{h}.bias" in hf:
                names[f"model.layers.{i}.{h}.bias"] = (f"blk.{i}.{g}.bias", g, i)
    decoded: dict[str, torch.Tensor] = {}
    for hf_name, (g_name, kind, layer) in names.items():
        t = hf[hf_name]
        heads = {"attn_q": nq, "attn_k": nkv}.get(kind) if arch == "llama" else None
        stored = permute_for_gguf(t, heads) if heads else t
        matrix = t.dim() == 2
        qtype = types(kind, layer) if matrix else Q.F32
        arr = stored.numpy().astype(np.float32)
        if qtype == Q.BF16:
            raw = (torch.from_numpy(arr).to(torch.bfloat16).view(torch.int16).numpy()).view(
                np.uint8)
            raw = raw.reshape(arr.shape[0], -1)
            deq = np.asarray(dequantize(raw, qtype), dtype=np.float32).reshape(arr.shape)
        else:
            raw, deq = _encode(arr, qtype)
        if qtype in (Q.F32, Q.F16):
            w.add_tensor(g_name, raw)
        else:
            w.add_tensor(g_name, raw, raw_dtype=qtype)
        value = torch.from_numpy(deq.copy())
        decoded[hf_name] = permute_back(value, heads) if heads else value
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, decoded, cfg


def permute_back(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of permute_for_gguf (written here on its own, not the loader's)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1,
                                                                               2).reshape(w.shape)
