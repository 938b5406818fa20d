"""Half-width weight copies for few-row steps (EngineConfig.gemv_dtype): used only at or below
gemv_max_rows, never changing a larger step; a clear error for a bad setting."""

import pytest
import torch
import torch.nn.functional as F

from warmpath import LLM, SamplingParams
from warmpath.engine.runner import SeqInput
from warmpath.models.llama import linear


def test_the_half_copy_computes_when_passed_and_the_fp32_weights_otherwise():
    torch.manual_seed(0)
    w, b = torch.randn(96, 64), torch.randn(96)
    half = {id(w): w.half()}
    x = torch.randn(4, 64)
    assert torch.equal(linear(x, w, b, half), F.linear(x.half(), w.half(), b.half()).float())
    assert torch.equal(linear(x, w, b, None), F.linear(x, w, b))
    assert torch.allclose(linear(x, w, b, half), F.linear(x, w, b), rtol=2e-2, atol=5e-2)


def test_steps_of_at_most_gemv_max_rows_tokens_run_on_the_half_copies(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", gemv_dtype="float16", gemv_max_rows=2,
              kernel="torch")
    route = llm.engine.runner.route
    assert route([SeqInput([1], 5, [0]), SeqInput([2], 5, [1])]).half_width
    assert not route([SeqInput([1], 5, [0]),
                      SeqInput([2], 5, [1]),
                      SeqInput([3], 5, [2])]).half_width
    assert not route([SeqInput([1, 2, 3], 0, [0])]).half_width  # a prompt chunk: the fp32 weights
    plain = LLM(str(tiny_llama_dir), dtype="float32", kernel="torch")
    assert not plain.engine.runner.route([SeqInput([1], 5, [0])]).half_width  # no copies kept


def test_engine_keeps_half_copies_and_decodes(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", gemv_dtype="float16", gemv_max_rows=2,
              kernel="torch")
    model = llm.engine.runner.model
    layer = model.layers[0]
    assert layer.half[id(layer.qkv_weight)].dtype == torch.float16
    assert layer.qkv_weight.dtype == torch.float32  # the fp32 weights stay for larger steps
    out = llm.generate("def add(a, b):\n",
                       SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
    assert len(out.token_ids) == 8


@pytest.mark.parametrize("kwargs",
                         [{"gemv_dtype": "int8"}, {"gemv_dtype": "float16", "dtype": "bfloat16"}])
def test_bad_gemv_settings_are_refused(tiny_llama_dir, kwargs):
    with pytest.raises(ValueError, match="gemv_dtype"):
        LLM(str(tiny_llama_dir), **{"dtype": "float32", **kwargs})
