"""A request's numbers do not depend on where its prompt was cut: by the step's token budget (a
chunk of one prompt token), by the cached prefix (a hit that leaves the last token alone), or by
which of its tokens were decoded earlier (a follow-up turn whose cached blocks hold a previous
answer's K/V, computed as decode rows). The native kernel gives a row the same numbers alone, in a
chunk or as a decode, so the scheduler cuts prompts anywhere."""

from tiny_model import write_tiny_gguf

from warmpath import LLM, EngineRequest, SamplingParams
from warmpath.config import SchedulerConfig

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=2)


def run(llm: LLM, prompts: list[list[int]]) -> list[tuple[list[int], list]]:
    """Each prompt's tokens and every token's logprobs (the floats: any change of a logit shows)."""
    engine, got = llm.engine, {}
    for ids in prompts:
        llm._next_id += 1
        engine.add_request(EngineRequest(f"cut-{llm._next_id}", ids, GREEDY))
        got[f"cut-{llm._next_id}"] = ([], [])
    while engine.has_unfinished_requests():
        for out in engine.step():
            got[out.request_id][0].extend(out.new_token_ids)
            got[out.request_id][1].extend(out.new_logprobs or [])
            if out.finished:
                cached[out.request_id] = out.num_cached_tokens
    return list(got.values())


cached: dict[str, int] = {}


def test_prompts_cut_anywhere_give_the_same_logprobs(tmp_path):
    path, _ = write_tiny_gguf(tmp_path / "tiny.gguf", max_position_embeddings=4096)
    llm = LLM(str(path), plan="native-int8", scheduler=SchedulerConfig(max_num_batched_tokens=33),
              num_kv_blocks=256)
    engine, lone = llm.engine, []

    def watched(batch):
        lone.extend(
            c.num_tokens == 1 and c.request.num_computed_tokens < len(c.request.prompt_token_ids)
            for c in batch.chunks)

    engine.scheduler.add_listener(watched)
    prompts = [[(7 * i + j) % 200 + 1 for j in range(16 * i + 1)] for i in range(2, 7)]
    cold = [run(llm, [p])[0] for p in prompts]  # one at a time: 33-token steps
    # warm: each hit leaves the last token alone; five share the 33-token steps
    together = run(llm, prompts)
    assert together == cold
    assert any(lone)  # prompt tokens were computed alone, in chunks of one
    # A follow-up turn: a prompt and its answer, then more. Warm, a cached block holds the answer's
    # first seven tokens' K/V, computed as decode rows; cold, the same tokens are a chunk's rows.
    first = [(3 * j) % 200 + 1 for j in range(41)]
    follow = first + run(llm, [first])[0][0] + [5, 6, 7] * 6
    warm = run(llm, [follow])[0]
    assert list(cached.values())[-1] == 48
    engine.pool.reset_prefix_cache()
    assert run(llm, [follow])[0] == warm and list(cached.values())[-1] == 0
