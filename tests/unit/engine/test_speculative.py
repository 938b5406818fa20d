"""Speculative decoding: the proposers, the choice of how much to verify, and the engine's promise
that outputs are the model's own (greedy and seeded outputs identical with it on and off), blocks
exact, the prefix cache never holding a rejected guess's K/V."""

from pathlib import Path

import pytest
import torch
from engine_checks import FlatStepTimes, check_pool_invariants
from tiny_model import write_tiny_gguf

from warmpath import LLM, EngineRequest, SamplingParams
from warmpath.config import SchedulerConfig
from warmpath.engine.proposers import (
    NgramProposer,
    Speculation,
    StepTimes,
    SuffixProposer,
    choose_drafts,
)

# Prompts that repeat themselves (what prompt lookup feeds on) and ones that do not (non-speculating
# requests).
REPEATING = [[5, 6, 7, 8, 9] * 6, [11, 12, 13, 14] * 5 + [15, 16], list(range(20, 40)) * 2]
PLAIN = [[3, 90, 41, 77, 18, 60, 22], [101, 7, 55]]


def test_ngram_proposes_what_followed_the_longest_earlier_match():
    p, spec = NgramProposer(2, 4), Speculation()
    assert p.propose([1, 2, 3, 4, 9, 9, 1, 2, 3], spec, 3) == [4, 9, 9]
    assert p.propose([1, 2, 3, 4, 9, 9, 1, 2, 3, 4], spec, 2) == [9, 9]  # indexed incrementally
    assert NgramProposer(2, 4).propose([1, 2, 3, 4, 5], Speculation(), 3) == []


def test_suffix_guesses_from_the_sessions_earlier_requests_by_frequency():
    p = SuffixProposer(n_min=2, n_max=4)
    p.learn("s", [1, 2, 3, 7, 8])
    p.learn("s", [1, 2, 3, 7, 9])
    p.learn("s", [4, 2, 3, 7, 9])
    assert p.propose([5, 2, 3], Speculation(), 2, "s") == [7, 9]  # 9 followed "2 3 7" twice, 8 once
    assert p.propose([1, 2, 3], Speculation(), 2, "other") == []
    p.forget("s")
    assert p.propose([5, 2, 3], Speculation(), 2, "s") == [] and p.num_tokens == 0


def test_suffix_history_is_bounded():
    p = SuffixProposer(max_tokens=100)
    for i in range(20):
        p.learn(f"s{i}", list(range(i, i + 30)))
    assert p.num_tokens <= 100 and "s19" in p.sessions and "s0" not in p.sessions


def test_rows_are_verified_only_while_they_pay_for_themselves():
    flat, linear = StepTimes(), StepTimes()
    for n in range(1, 40):
        flat.record(n, 0.010)
        linear.record(n, 0.010 * n)
    assert choose_drafts(1, [0.9], [4], flat) == [4]  # extra rows cost nothing: verify every guess
    assert choose_drafts(1, [0.9], [4], linear) == [0]  # each row costs a decode: never worth it
    bent = StepTimes()
    for n in range(1, 40):
        bent.record(n, 0.010 * (1 + 0.2 * (n - 1)))
    assert choose_drafts(2, [0.9, 0.2], [4, 4], bent) == [4, 0]  # the likelier guesses first
    assert choose_drafts(1, [0.9], [4], StepTimes()) == [0]  # nothing measured yet


def test_a_draft_guesses_only_when_its_guessing_costs_less_than_it_saves():
    """A draft model's guesses are not free: each guessed position is one forward of the draft.
    Counted in the choice, a draft that costs more than a decode step of the model itself guesses
    nothing (never slower than off); a cheap one guesses as far as verifying pays."""
    flat = StepTimes()
    for n in range(1, 40):
        flat.record(n, 0.010)
    assert choose_drafts(1, [0.9], [4], flat, guess_seconds=0.020) == [0]
    assert choose_drafts(1, [0.9], [4], flat, guess_seconds=0.001) == [4]
    # likelier first guesses only
    assert 0 < choose_drafts(1, [0.6], [4], flat, guess_seconds=0.003)[0] < 4


def _engine_llm(model: str, method: str, **kw) -> LLM:
    llm = LLM(model, speculative_method=method, speculative_max_seqs=8, **kw)
    if method != "none":  # verifying always pays: the decision is tested above, the exactness here
        llm.engine.speculator.decode_times = FlatStepTimes()
    return llm


def _run(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    check_pool_invariants(llm.engine)
    assert llm.engine.pool.num_free == llm.engine.pool.num_blocks
    return [o.token_ids for o in outs]


def _spec_totals(llm: LLM) -> tuple[int, int]:
    return llm.engine.speculator.proposed, llm.engine.speculator.accepted


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("spec") / "tiny.gguf")[0]


GREEDY = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)

CONFIGS = {
    "exact": dict(dtype="float32"),  # the correctness configuration: fp32, native kernel and torch
    "torch": dict(dtype="float32", kernel="torch"),
    "default plan": dict(plan="native-int8"),
    "no prefix cache": dict(plan="native-int8", enable_prefix_caching=False),
    "preempting pool": dict(dtype="float32", num_kv_blocks=14, block_size=4,
                            scheduler=SchedulerConfig(max_num_batched_tokens=24)),
}


@pytest.mark.parametrize("method", ["ngram", "suffix"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_greedy_outputs_are_identical_with_speculation_on_and_off(tiny_gguf, method, config):
    kw = {"num_kv_blocks": 256, **CONFIGS[config]}
    prompts = REPEATING + PLAIN  # one batch: speculating requests beside ones with nothing to guess
    params = [GREEDY] * len(prompts)
    off = _run(_engine_llm(str(tiny_gguf), "none", **kw), prompts, params)
    llm = _engine_llm(str(tiny_gguf), method, **kw)
    assert _run(llm, prompts, params) == off
    assert _run(llm, prompts, params) == off  # warm: over prefixes cached by verified steps
    proposed, accepted = _spec_totals(llm)
    assert 0 < accepted <= proposed, (proposed, accepted)
    if config == "exact":
        assert accepted < proposed  # guesses were rejected too
    if config == "preempting pool":
        assert llm.engine.stats()["num_preemptions"] > 0


def test_seeded_sampling_is_identical_with_speculation_on_and_off(tiny_gguf):
    """Each position is sampled from the model's distribution with the request's own generator, one
    draw per token kept: a seeded request gives the same tokens, so the distribution is the same
    too."""
    params = [
        SamplingParams(max_tokens=30, temperature=0.8, top_p=0.95, seed=s, ignore_eos=True)
        for s in range(8)
    ]
    prompts = [REPEATING[s % len(REPEATING)] for s in range(8)]
    off = _run(_engine_llm(str(tiny_gguf), "none", dtype="float32"), prompts, params)
    llm = _engine_llm(str(tiny_gguf), "ngram", dtype="float32")
    assert _run(llm, prompts, params) == off
    assert _spec_totals(llm)[1] > 0


def test_the_prefix_cache_holds_only_verified_kv(tiny_gguf):
    """Every block the prefix cache registered under a speculating engine holds the K/V the same
    tokens have without speculation, bit for bit: no rejected guess's K/V is ever served."""
    kw = dict(dtype="float32", num_kv_blocks=256)
    ref, llm = _engine_llm(str(tiny_gguf), "none", **kw), _engine_llm(str(tiny_gguf), "ngram", **kw)
    for x in (ref, llm):
        _run(x, REPEATING + PLAIN, [GREEDY] * (len(REPEATING) + len(PLAIN)))
    assert _spec_totals(llm)[0] > _spec_totals(llm)[1] > 0
    cached, ref_cached = llm.engine.pool.cached, ref.engine.pool.cached
    assert set(cached) == set(ref_cached) and cached
    kv, ref_kv = llm.engine.runner.kv_cache, ref.engine.runner.kv_cache
    for h, b in cached.items():
        assert torch.equal(kv[:, :, b], ref_kv[:, :, ref_cached[h]])


def _logprobs(llm: LLM, prompt: list[int], params: SamplingParams) -> tuple[list[int], list]:
    llm.engine.add_request(EngineRequest("lp", prompt, params))
    tokens, logprobs = [], []
    while llm.engine.has_unfinished_requests():
        for out in llm.engine.step():
            tokens += out.new_token_ids
            logprobs += out.new_logprobs
    return tokens, logprobs


def test_logprobs_follow_the_kept_tokens(tiny_gguf):
    params = SamplingParams(max_tokens=30, temperature=0, logprobs=2, ignore_eos=True)
    off = _logprobs(LLM(str(tiny_gguf), dtype="float32"), REPEATING[0], params)
    llm = _engine_llm(str(tiny_gguf), "ngram", dtype="float32")
    on = _logprobs(llm, REPEATING[0], params)
    assert on == off and len(on[1]) == len(on[0]) == 30
    assert _spec_totals(llm)[1] > 0


def test_the_counters_are_exported_by_method(tiny_gguf):
    from prometheus_client import generate_latest

    from warmpath.server.metrics import Metrics

    llm = _engine_llm(str(tiny_gguf), "ngram", dtype="float32")
    _run(llm, REPEATING, [GREEDY] * len(REPEATING))
    text = generate_latest(Metrics(llm.engine.stats).registry).decode()
    proposed, accepted = _spec_totals(llm)
    assert f'warmpath_spec_draft_tokens_total{{method="ngram"}} {float(proposed)}' in text
    assert f'warmpath_spec_accepted_tokens_total{{method="ngram"}} {float(accepted)}' in text


@pytest.mark.parametrize("draft", ["same", "other"])
def test_a_draft_model_guesses_and_outputs_stay_the_models_own(tiny_gguf, tmp_path, draft):
    """`draft`: a second model with the same tokenizer guesses. Drafting with the model itself keeps
    (nearly) every guess, which only holds if the draft's own KV cache follows each request exactly
    through kept and rejected guesses; another model's guesses are kept only in part; outputs are
    the same as without speculation in both, and the draft's pool gets every block back."""
    model = tiny_gguf if draft == "same" else write_tiny_gguf(tmp_path / "other.gguf", seed=7)[0]
    kw = {"num_kv_blocks": 256, "dtype": "float32", "kernel": "torch"}
    prompts = REPEATING + PLAIN
    params = [GREEDY] * len(prompts)
    off = _run(_engine_llm(str(tiny_gguf), "none", **kw), prompts, params)
    llm = _engine_llm(str(tiny_gguf), "draft", speculative_draft_model=str(model),
                      speculative_draft_blocks=64, block_size=4, **kw)
    assert _run(llm, prompts, params) == off
    proposed, accepted = _spec_totals(llm)
    if draft == "same":
        assert accepted >= 0.95 * proposed > 0, (proposed, accepted)
    else:
        # some kept, some rejected (rolled past)
        assert 0 < accepted < proposed, (proposed, accepted)
    proposer = llm.engine.speculator.proposer
    assert sorted(proposer.free) == list(range(64)) and not proposer.states


def test_a_draft_model_must_share_the_tokenizer(tiny_gguf, tmp_path):
    other = write_tiny_gguf(tmp_path / "big-vocab.gguf", vocab_size=1000)[0]
    with pytest.raises(ValueError, match="share the model's tokenizer"):
        LLM(str(tiny_gguf), speculative_method="draft", speculative_draft_model=str(other))
    with pytest.raises(ValueError, match="needs speculative_draft_model"):
        LLM(str(tiny_gguf), speculative_method="draft")


def test_no_guesses_while_a_prompt_waits_or_is_computed(tiny_gguf):
    """A step that carries someone's prompt is their time to first token: it verifies no guesses
    (they would make it longer); guessing resumes once every running request decodes and nothing
    waits."""
    llm = _engine_llm(str(tiny_gguf), "ngram", dtype="float32", num_kv_blocks=256,
                      scheduler=SchedulerConfig(max_num_batched_tokens=16))
    engine, steps = llm.engine, []

    def watched(batch):
        prompts = [
            c for c in batch.chunks
            if c.request.num_computed_tokens < len(c.request.prompt_token_ids)
        ]
        steps.append(
            (sum(c.num_drafts for c in batch.chunks), len(prompts), engine.scheduler.num_waiting))
    engine.scheduler.add_listener(watched)
    # the long one takes several 16-token chunks
    prompts = [REPEATING[0], REPEATING[1] * 3, REPEATING[2]]
    _run(llm, prompts, [GREEDY] * len(prompts))
    assert any(drafts for drafts, _, _ in steps)
    assert all(prompts == 0 for drafts, prompts, _ in steps if drafts)


def test_the_draft_computes_only_a_long_prompts_last_window(tiny_gguf, monkeypatch):
    """The draft starts a request from its last WINDOW tokens, not its whole prompt (a long prompt
    would cost the draft a prefill longer than the decode it shortens); outputs stay the model's
    own."""
    from warmpath.engine import draft

    monkeypatch.setattr(draft, "WINDOW", 16)
    # 90 tokens
    prompt, params = REPEATING[0] * 3, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    kw = {"num_kv_blocks": 256, "dtype": "float32", "kernel": "torch", "block_size": 4}
    off = _run(_engine_llm(str(tiny_gguf), "none", **kw), [prompt], [params])
    llm = _engine_llm(str(tiny_gguf), "draft", speculative_draft_model=str(tiny_gguf),
                      speculative_draft_blocks=64, **kw)
    engine, seen = llm.engine, []
    engine.add_request(EngineRequest("long", prompt, params))
    out = []
    while engine.has_unfinished_requests():
        out += [o for o in engine.step() if o.finished]
        seen += [(st.start, len(st.blocks)) for st in engine.speculator.proposer.states.values()]
    assert [o.token_ids for o in out] == off
    # from its first decode on
    assert seen and all(start == len(prompt) + 1 - 16 for start, _ in seen)
    # the whole prompt alone would need 23
    assert max(blocks for _, blocks in seen) <= (16 + 40 + 4) // 4
