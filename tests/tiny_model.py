"""A tiny randomly initialised Llama/Qwen2 checkpoint written to disk in HF layout (and as GGUF),
for unit tests.

Weights are scaled so that logits are far from ties: greedy comparisons between code paths are then
exact.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("d", "e"), ("de", "f"), ("Ġ", "x"), ("r", "e"), ("re", "t"), ("Ġ", "Ġ"), ("ĠĠ", "ĠĠ")]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_level_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    vocab = {t: i for i, t in enumerate(SPECIAL)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    return vocab, MERGES


def tiny_config(arch: str = "llama", **overrides) -> dict:
    vocab, _ = byte_level_vocab()
    cfg = {
        "architectures": ["LlamaForCausalLM" if arch == "llama" else "Qwen2ForCausalLM"],
        "model_type": arch,
        "vocab_size": len(vocab) + 3,  # a few unused ids past the tokenizer, as real models have
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 512,
        "tie_word_embeddings": arch == "qwen2",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }
    cfg.update(overrides)
    return cfg


def tiny_weights(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h, inter, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def rand(*shape, scale):
        return torch.randn(*shape, generator=g) * scale

    w = {"model.embed_tokens.weight": rand(cfg["vocab_size"], h, scale=1.0),
         "model.norm.weight": 1 + rand(h, scale=0.1)}
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = rand(cfg["vocab_size"], h, scale=0.5)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + rand(h, scale=0.1)
        w[p + "post_attention_layernorm.weight"] = 1 + rand(h, scale=0.1)
        w[p + "self_attn.q_proj.weight"] = rand(nq * hd, h, scale=0.4)
        w[p + "self_attn.k_proj.weight"] = rand(nkv * hd, h, scale=0.4)
        w[p + "self_attn.v_proj.weight"] = rand(nkv * hd, h, scale=h**-0.5)
        w[p + "self_attn.o_proj.weight"] = rand(h, nq * hd, scale=(nq * hd) ** -0.5)
        w[p + "mlp.gate_proj.weight"] = rand(inter, h, scale=h**-0.5)
        w[p + "mlp.up_proj.weight"] = rand(inter, h, scale=h**-0.5)
        w[p + "mlp.down_proj.weight"] = rand(h, inter, scale=inter**-0.5)
        if cfg["architectures"][0] == "Qwen2ForCausalLM":
            for x, n in (("q", nq), ("k", nkv), ("v", nkv)):
                w[p + f"self_attn.{x}_proj.bias"] = rand(n * hd, scale=0.1)
    return w


def tiny_tokenizer() -> Tokenizer:
    vocab, merges = byte_level_vocab()
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False)
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    return tok


def write_tiny_hf(path: Path, arch: str = "llama", seed: int = 0, **overrides) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    cfg = tiny_config(arch, **overrides)
    (path / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous()
               for k, v in tiny_weights(cfg, seed).items()}, str(path / "model.safetensors"))
    tiny_tokenizer().save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {"eos_token": "<|im_end|>", "add_bos_token": False, "chat_template": CHAT_TEMPLATE}))
    return path


def permute_for_gguf(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """What llama.cpp's HF->GGUF converter does to Q/K rows (llama architecture)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2,
                     *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, seed: int = 0, **overrides) -> tuple[Path, dict[str, torch.Tensor]]:
    """A tiny llama GGUF as llama.cpp's converter writes one: permuted Q/K rows, F32 norms, Q8_0
    embedding, Q4_1 / Q4_0 / F16 matrices, byte-level BPE vocabulary with the `smollm`
    pre-tokenizer.

    Returns the path and the HF-layout weights the file decodes to (gguf's reference
    dequantization).
    """
    import gguf
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize, quantize

    cfg = tiny_config("llama", tie_word_embeddings=True, hidden_size=64, intermediate_size=128,
                      **overrides)
    hf = tiny_weights(cfg, seed)
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(nq)
    w.add_head_count_kv(nkv)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_vocab_size(cfg["vocab_size"])
    vocab, merges = byte_level_vocab()
    tokens = list(vocab) + [f"<unused{i}>" for i in range(cfg["vocab_size"] - len(vocab))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIAL else 1 for t in tokens])
    w.add_token_merges([f"{a} {b}" for a, b in merges])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    decoded: dict[str, torch.Tensor] = {}
    qtypes = {
        "token_embd": Q.Q8_0, "ffn_gate": Q.Q4_1, "ffn_up": Q.Q4_1, "ffn_down": Q.Q4_0,
        "attn_output": Q.F16
    }
    names = {
        "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"
    }
    gg = {
        "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down"
    }
    for i in range(cfg["num_hidden_layers"]):
        for h, g in gg.items():
            names[f"model.layers.{i}.{h}.weight"] = f"blk.{i}.{g}.weight"
    for hf_name, g_name in names.items():
        t = hf[hf_name]
        stored = t
        if g_name.endswith("attn_q.weight"):
            stored = permute_for_gguf(t, nq)
        elif g_name.endswith("attn_k.weight"):
            stored = permute_for_gguf(t, nkv)
        kind = g_name.split(".")[-2]
        qtype = qtypes.get(kind, Q.F32)
        arr = stored.numpy().astype(np.float32)
        if qtype == Q.F32:
            w.add_tensor(g_name, arr)
            decoded[hf_name] = t
        elif qtype == Q.F16:
            w.add_tensor(g_name, arr.astype(np.float16))
            decoded[hf_name] = torch.from_numpy(arr.astype(np.float16).astype(np.float32))
        else:
            q = quantize(arr, qtype)
            w.add_tensor(g_name, q, raw_dtype=qtype)
            deq = torch.from_numpy(
                np.asarray(dequantize(q, qtype), dtype=np.float32).reshape(arr.shape).copy())
            decoded[hf_name] = deq
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, decoded
