"""device="cuda": the same model on the GPU gives the CPU's logits and greedy tokens (skipped
without a GPU)."""

import pytest
import torch

from warmpath import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_cuda_matches_cpu(tiny_llama_dir):
    prompts = ["def f(x):\n    return x * 2\n", "import os\n" * 5]
    sp = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    cpu = LLM(str(tiny_llama_dir), dtype="float32", num_kv_blocks=64)
    gpu = LLM(str(tiny_llama_dir), dtype="float32", num_kv_blocks=64, device="cuda")
    assert gpu.engine.runner.kv_cache.is_cuda
    assert [o.token_ids
            for o in gpu.generate(prompts, sp)] == [o.token_ids for o in cpu.generate(prompts, sp)]
    seeded = SamplingParams(max_tokens=8, temperature=1.0, seed=3, ignore_eos=True)
    assert gpu.generate(prompts[0], seeded)[0].token_ids == gpu.generate(prompts[0],
                                                                         seeded)[0].token_ids
