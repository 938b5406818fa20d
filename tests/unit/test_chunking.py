"""A prompt token is never computed alone (only a decode is a one-token chunk): the native kernel attends a lone
row by another summation than a chunk's rows, so a greedy request's tokens would otherwise depend on where the
budget or the cached prefix cut its prompt."""

import pytest
from tiny_model import write_tiny_gguf

from warmpath import LLM, SamplingParams
from warmpath.engine.scheduler import chunk_size

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


@pytest.mark.parametrize("remaining, budget, n", [(1, 512, 1), (2, 512, 2), (600, 512, 512), (513, 512, 511),
                                                   (3, 2, 0), (2, 1, 0), (5, 1, 0), (5, 3, 3), (4, 3, 2)])
def test_chunk_size_never_leaves_or_takes_a_single_prompt_token(remaining, budget, n):
    assert chunk_size(remaining, budget) == n


def test_no_step_computes_one_prompt_token_alone(tmp_path):
    path, _ = write_tiny_gguf(tmp_path / "tiny.gguf", max_position_embeddings=4096)
    llm = LLM(str(path), plan="native-int8", max_num_batched_tokens=33, num_kv_blocks=256)
    engine, seen = llm.engine, []
    schedule = engine.scheduler.schedule

    def watched():
        plan = schedule()
        seen.extend((c.num_tokens, c.request.num_computed_tokens < len(c.request.prompt_token_ids))
                    for c in plan.chunks)
        return plan

    engine.scheduler.schedule = watched
    prompts = [{"prompt_token_ids": [(7 * i + j) % 200 + 1 for j in range(16 * i + 1)]} for i in range(2, 7)]
    cold = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    warm = [llm.generate(p, GREEDY)[0] for p in prompts]
    assert [o.token_ids for o in warm] == cold
    # A prompt of 16k + 1 tokens has 16k cached: the last block is recomputed so two tokens are.
    assert [o.num_cached_tokens for o in warm] == [16 * (i - 1) for i in range(2, 7)]
    assert all(n >= 2 for n, prompt in seen if prompt)
