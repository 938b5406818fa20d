"""Half-width weight copies for few-row steps (EngineConfig.gemv_dtype): used only at or below
gemv_max_rows, never changing a larger step; a clear error for a bad setting."""

import pytest
import torch
import torch.nn.functional as F

from warmpath import LLM, SamplingParams
from warmpath.models.llama import linear


def test_few_rows_use_the_half_copy_and_more_rows_the_fp32_weights():
    torch.manual_seed(0)
    w, b = torch.randn(96, 64), torch.randn(96)
    small = {"max_rows": 4, id(w): w.half()}
    few, many = torch.randn(4, 64), torch.randn(5, 64)
    assert torch.equal(linear(few, w, b, small), F.linear(few.half(), w.half(), b.half()).float())
    assert torch.equal(linear(many, w, b, small), F.linear(many, w, b))  # untouched above the threshold
    assert torch.equal(linear(few, w, b, None), F.linear(few, w, b))
    assert torch.allclose(linear(few, w, b, small), F.linear(few, w, b), rtol=2e-2, atol=5e-2)


def test_engine_keeps_half_copies_and_decodes(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", gemv_dtype="float16", gemv_max_rows=2, decode_kernel="torch")
    model = llm.engine.runner.model
    layer = model.layers[0]
    assert layer.small[id(layer.qkv_weight)].dtype == torch.float16 and layer.small["max_rows"] == 2
    assert layer.qkv_weight.dtype == torch.float32  # the fp32 weights stay for larger steps
    out = llm.generate("def add(a, b):\n", SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
    assert len(out.token_ids) == 8


@pytest.mark.parametrize("kwargs", [{"gemv_dtype": "int8"}, {"gemv_dtype": "float16", "dtype": "bfloat16"}])
def test_bad_gemv_settings_are_refused(tiny_llama_dir, kwargs):
    with pytest.raises(ValueError, match="gemv_dtype"):
        LLM(str(tiny_llama_dir), **{"dtype": "float32", **kwargs})
