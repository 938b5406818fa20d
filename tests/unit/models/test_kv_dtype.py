"""The KV cache has a dtype of its own (EngineConfig.kv_cache_dtype): a 16-bit cache holds twice the
tokens in the same memory, an int8 one nearly twice that again, K/V are rounded (or quantized) to it
as they are written, and the model still computes in its own dtype."""

import pytest
import torch

from warmpath import LLM, SamplingParams
from warmpath.config import ModelConfig
from warmpath.models import kv_quant

GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


@pytest.mark.parametrize("kv", ["bfloat16", "float16"])
def test_a_16_bit_cache_beside_an_fp32_model(tiny_llama_dir, kv):
    exact = LLM(str(tiny_llama_dir), dtype="float32", kernel="torch", kv_cache_memory=1 << 22)
    half = LLM(str(tiny_llama_dir), dtype="float32", kernel="torch", kv_cache_memory=1 << 22,
               kv_cache_dtype=kv)
    assert half.engine.kv_dtype == getattr(
        torch, kv) and half.engine.runner.kv_cache.dtype == getattr(torch, kv)
    assert half.engine.pool.num_blocks == 2 * exact.engine.pool.num_blocks
    prompt = "def fibonacci(n):\n    if n < 2:\n        return n\n"
    a, b = exact.generate(prompt, GREEDY)[0], half.generate(prompt, GREEDY)[0]
    assert len(b.token_ids) == GREEDY.max_tokens
    # The same first tokens: the rounding of K/V is small next to the tiny model's logit gaps early
    # on.
    assert b.token_ids[:4] == a.token_ids[:4]
    # Cached blocks hold rounded K/V, and a warm request reads them: the same tokens again.
    assert half.generate(prompt, GREEDY)[0].token_ids == b.token_ids


def test_auto_is_the_models_dtype_and_bad_values_are_refused(tiny_llama_dir):
    assert LLM(str(tiny_llama_dir), dtype="float32").engine.kv_dtype == torch.float32
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM(str(tiny_llama_dir), dtype="float32", kv_cache_dtype="int4")


def test_a_native_plan_holds_twice_the_blocks_of_the_fp32_native_path_and_reports_its_memory(
        tmp_path):
    from tiny_model import write_tiny_gguf

    path, _ = write_tiny_gguf(tmp_path / "tiny.gguf")
    fp32 = LLM(str(path), dtype="float32", kernel_activations="int8",
               kv_cache_memory=1 << 22).engine
    planned = LLM(str(path), plan="native-int8", kv_cache_memory=1 << 22).engine
    assert planned.pool.num_blocks == 2 * fp32.pool.num_blocks
    stats = planned.stats()
    # no torch model beside the kernel
    assert stats["weight_bytes"] == planned.runner.native.weight_bytes
    assert stats["kv_cache_bytes"] <= 1 << 22
    # int8 activations compute every sequence natively: the fp32-named configuration loads no torch
    # model either
    assert fp32.model is None and fp32.stats()["weight_bytes"] == stats["weight_bytes"]


def test_an_int8_cache_on_the_torch_path(tiny_llama_dir):
    """int8 rows with their scale: the blocks the byte budget pays for, K/V stored as kv_quant
    writes them, the first tokens of an fp32 cache's answer, and a warm request reading the
    quantized blocks gets the same tokens."""
    exact = LLM(str(tiny_llama_dir), dtype="float32", kernel="torch", kv_cache_memory=1 << 22)
    small = LLM(str(tiny_llama_dir), dtype="float32", kernel="torch", kv_cache_memory=1 << 22,
                kv_cache_dtype="int8")
    cfg, kv = small.engine.model_config, small.engine.runner.kv_cache
    assert kv.dtype == torch.int8 and kv.shape[-1] == cfg.head_dim + 2
    per_block = cfg.kv_bytes_per_token("int8") * small.config.block_size
    assert (small.engine.pool.num_blocks == (1 << 22) // per_block
            and kv.numel() == small.engine.pool.num_blocks * per_block)
    prompt = "def fibonacci(n):\n    if n < 2:\n        return n\n"
    a, b = exact.generate(prompt, GREEDY)[0], small.generate(prompt, GREEDY)[0]
    assert b.token_ids[:4] == a.token_ids[:4]
    assert small.generate(prompt, GREEDY)[0].token_ids == b.token_ids
    written = kv[0, 0].view(-1, cfg.num_kv_heads, cfg.head_dim + 2)[: len(b.prompt_token_ids)]
    assert torch.equal(kv_quant.quantize(kv_quant.dequantize(written)), written)  # well-formed rows


@pytest.mark.parametrize(("layers", "head_dim", "ratio"), [(24, 64, 1.93), (28, 128, 1.96)])
def test_int8_holds_about_twice_the_bf16_blocks_on_the_coder_models(layers, head_dim, ratio):
    """Qwen2.5-Coder-0.5B (24 layers, head_dim 64) and -1.5B (28, 128), 2 KV heads: the scale costs
    2 bytes a row."""
    cfg = ModelConfig("qwen2", 151936, 896, 4864, layers, 14, 2, head_dim)
    assert cfg.kv_bytes_per_token("bfloat16") / cfg.kv_bytes_per_token("int8") > ratio
