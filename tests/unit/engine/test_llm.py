"""LLM.generate on the tiny model: prompt forms, batching, chunking, stops, limits, blocks
returned."""

import pytest

from warmpath import LLM, SamplingParams
from warmpath.config import SchedulerConfig
from warmpath.engine.request import FinishReason, PromptTooLongError

CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "import sys\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n",
    "x = [1, 2, 3]\nfor v in x:\n    print(v)\n" * 3,
]
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(str(tiny_llama_dir), dtype="float32", num_kv_blocks=256)


def test_str_and_token_id_prompts_agree(llm):
    ids = llm.get_tokenizer().encode(CODE[0])
    a = llm.generate(CODE[0], GREEDY)[0]
    b = llm.generate({"prompt_token_ids": ids}, GREEDY)[0]
    assert a.prompt_token_ids == ids and a.token_ids == b.token_ids and len(a.token_ids) == 12
    assert a.text == llm.get_tokenizer().decode(a.token_ids)
    assert a.finish_reason == FinishReason.LENGTH
    m = a.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finish_time
    assert m.ttft > 0 and m.tpot > 0 and m.num_output_tokens == 12


def test_batch_equals_one_at_a_time_and_chunking_changes_nothing(llm, tiny_llama_dir):
    alone = [llm.generate(p, GREEDY)[0].token_ids for p in CODE]
    batched = [o.token_ids for o in llm.generate(CODE, GREEDY)]
    chunked_llm = LLM(str(tiny_llama_dir), dtype="float32", num_kv_blocks=256,
                      scheduler=SchedulerConfig(max_num_batched_tokens=7))
    chunked = [o.token_ids for o in chunked_llm.generate(CODE, GREEDY)]
    assert alone == batched == chunked
    assert llm.stats()["free_blocks"] == llm.stats()["num_blocks"]  # every block came back


def test_seeded_sampling_is_reproducible_in_any_batch(llm):
    p = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.95, top_k=20, seed=42,
                       ignore_eos=True)
    alone = llm.generate(CODE[2], p)[0].token_ids
    greedy = SamplingParams(max_tokens=5, temperature=0)
    batched = llm.generate([CODE[0], CODE[2], CODE[1]], [greedy, p, greedy])[1].token_ids
    assert alone == batched


def test_stop_token_ids_and_eos(llm):
    first = llm.generate(CODE[0], GREEDY)[0].token_ids
    stop_at = first[3]
    out = llm.generate(CODE[0], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                                               stop_token_ids=[stop_at]))[0]
    assert out.finish_reason == FinishReason.STOP
    assert out.token_ids == first[: first.index(stop_at) + 1]
    assert out.text == llm.get_tokenizer().decode(out.token_ids[:-1])


def test_limits_give_clear_errors(llm, tiny_llama_dir):
    with pytest.raises(PromptTooLongError):
        llm.generate({"prompt_token_ids": [5] * 600}, GREEDY)  # max_position_embeddings is 512
    with pytest.raises(ValueError, match="empty"):
        llm.generate("", GREEDY)
    with pytest.raises(ValueError, match="prompt_token_ids"):
        llm.generate({"prompt_token_ids": [10**6]}, GREEDY)
    small = LLM(str(tiny_llama_dir), dtype="float32", num_kv_blocks=2)
    with pytest.raises(PromptTooLongError, match="KV pool"):  # can never fit: refused up front
        small.generate({"prompt_token_ids": [5] * 40}, GREEDY)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    grows = small.generate({"prompt_token_ids": [5] * 20}, params)[0]
    assert grows.finish_reason == FinishReason.ERROR and "KV pool holds 32" in grows.error
    assert len(grows.token_ids) == 32 - 20 + 1
    assert small.stats()["free_blocks"] == 2


def test_max_tokens_clipped_to_context(llm):
    out = llm.generate({"prompt_token_ids": [7] * 505},
                       SamplingParams(max_tokens=50, temperature=0, ignore_eos=True))
    assert len(out[0].token_ids) == 7 and out[0].finish_reason == FinishReason.LENGTH
