"""The KV cache has a dtype of its own (EngineConfig.kv_cache_dtype): a 16-bit cache holds twice the tokens in
the same memory, K/V are rounded to it as they are written, and the model still computes in its own dtype."""

import pytest
import torch

from warmpath import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


@pytest.mark.parametrize("kv", ["bfloat16", "float16"])
def test_a_16_bit_cache_beside_an_fp32_model(tiny_llama_dir, kv):
    exact = LLM(str(tiny_llama_dir), dtype="float32", kernel="torch", kv_cache_memory=1 << 22)
    half = LLM(str(tiny_llama_dir), dtype="float32", kernel="torch", kv_cache_memory=1 << 22, kv_cache_dtype=kv)
    assert half.engine.kv_dtype == getattr(torch, kv) and half.engine.runner.kv_cache.dtype == getattr(torch, kv)
    assert half.engine.pool.num_blocks == 2 * exact.engine.pool.num_blocks
    prompt = "def fibonacci(n):\n    if n < 2:\n        return n\n"
    a, b = exact.generate(prompt, GREEDY)[0], half.generate(prompt, GREEDY)[0]
    assert len(b.token_ids) == GREEDY.max_tokens
    # The same first tokens: the rounding of K/V is small next to the tiny model's logit gaps early on.
    assert b.token_ids[:4] == a.token_ids[:4]
    # Cached blocks hold rounded K/V, and a warm request reads them: the same tokens again.
    assert half.generate(prompt, GREEDY)[0].token_ids == b.token_ids


def test_auto_is_the_models_dtype_and_bad_values_are_refused(tiny_llama_dir):
    assert LLM(str(tiny_llama_dir), dtype="float32").engine.kv_dtype == torch.float32
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM(str(tiny_llama_dir), dtype="float32", kv_cache_dtype="int4")


def test_a_native_plan_holds_twice_the_blocks_of_the_fp32_native_path_and_reports_its_memory(tmp_path):
    from tiny_model import write_tiny_gguf

    path, _ = write_tiny_gguf(tmp_path / "tiny.gguf")
    fp32 = LLM(str(path), dtype="float32", kernel_activations="int8", kv_cache_memory=1 << 22).engine
    planned = LLM(str(path), plan="native-int8", kv_cache_memory=1 << 22).engine
    assert planned.pool.num_blocks == 2 * fp32.pool.num_blocks
    stats = planned.stats()
    assert stats["weight_bytes"] == planned.runner.native.weight_bytes  # no torch model beside the kernel
    assert stats["kv_cache_bytes"] <= 1 << 22 and fp32.stats()["weight_bytes"] > stats["weight_bytes"]
