"""GGUF loading: metadata -> config, dequantisation, Q/K row un-permutation, vocabulary ->
tokenizer."""

import json

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from safetensors.torch import save_file
from tiny_model import permute_for_gguf, tiny_config, tiny_tokenizer, write_tiny_gguf

from warmpath import LLM, SamplingParams
from warmpath.models.ggml_blocks import dequantize as dequantize_tensor
from warmpath.models.gguf import unpermute_rope_rows


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.F16, Q.BF16])
def test_dequantize_matches_gguf_reference(qtype):
    x = np.random.default_rng(0).normal(size=(48, 64)).astype(np.float32)
    raw = quantize(x, qtype)
    ours = dequantize_tensor(np.asarray(raw), qtype).numpy()
    ref = np.asarray(dequantize(raw, qtype), dtype=np.float32).reshape(-1)
    np.testing.assert_array_equal(ours, ref)


def test_unpermute_inverts_the_converter():
    w = torch.randn(4 * 16, 64)
    assert not torch.equal(permute_for_gguf(w, 4), w)
    torch.testing.assert_close(unpermute_rope_rows(permute_for_gguf(w, 4), 4), w, atol=0, rtol=0)


def test_gguf_model_matches_hf_weights(tiny_gguf, tmp_path):
    """The model loaded from GGUF computes the same logits as one built from the HF-layout
    weights."""
    path, decoded = tiny_gguf
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text(json.dumps(tiny_config("llama", tie_word_embeddings=True)))
    save_file({k: v.contiguous() for k, v in decoded.items()}, str(hf_dir / "model.safetensors"))
    tiny_tokenizer().save(str(hf_dir / "tokenizer.json"))

    from_gguf = LLM(str(path), dtype="float32", num_kv_blocks=32)
    from_hf = LLM(str(hf_dir), dtype="float32", num_kv_blocks=32)
    cfg = from_gguf.model_config
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads,
            cfg.head_dim) == (2, 64, 4, 2, 16)
    assert cfg.tie_word_embeddings and cfg.architecture == "llama"
    for name, p in from_hf.engine.model.named_parameters():
        torch.testing.assert_close(
            dict(from_gguf.engine.model.named_parameters())[name], p, atol=0, rtol=0, msg=name)
    prompt = {"prompt_token_ids": from_gguf.get_tokenizer().encode("def f(x):\n    return x + 1\n")}
    sp = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    assert from_gguf.generate(prompt, sp)[0].token_ids == from_hf.generate(prompt, sp)[0].token_ids


def test_gguf_tokenizer(tiny_gguf):
    llm = LLM(str(tiny_gguf[0]), dtype="float32", num_kv_blocks=8)
    tok = llm.get_tokenizer()
    assert tok.eos_token_id == 2 and not tok.add_bos
    assert tok.stop_token_ids == {0, 2}  # <|endoftext|> and <|im_end|> both end a generation
    ids = tok.encode("x = 42\ndef f(): return 7")
    assert tok.decode(ids) == "x = 42\ndef f(): return 7"
    assert tok.encode("42") == tok.encode("4") + tok.encode("2")  # smollm: digits split one by one
    assert tok.token_to_id("def") in ids  # merges were applied
    assert tok.encode("<|im_start|>user") == [1] + tok.encode("user")
