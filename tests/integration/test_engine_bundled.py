"""The engine on the bundled model (fp32): exact outputs whatever the caching, chunking or
preemption, and a warm 2,000-token prefix computed only for its new tokens."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from warmpath import LLM, SamplingParams
from warmpath.config import SchedulerConfig

DATA = Path(__file__).parents[1] / "data"
CASES = json.loads((DATA / "greedy_reference.json").read_text())["cases"]
GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    """Six real-code prompts of 256-512 tokens, plus three sharing a 700-token prefix with different
    tails."""
    short = [c["prompt_ids"] for c in CASES if len(c["prompt_ids"]) <= 512]
    long = next(c["prompt_ids"] for c in CASES if len(c["prompt_ids"]) == 2048)
    shared = [long[:700] + long[900 + 40 * i : 960 + 40 * i] for i in range(3)]
    return short + shared


def set_budget(engine, tokens: int) -> None:
    """The token budget per step of a running engine: a new (frozen) SchedulerConfig, which its
    scheduler reads."""
    engine.config.scheduler = engine.scheduler.config = replace(engine.config.scheduler,
                                                                max_num_batched_tokens=tokens)


def outputs(llm: LLM, prompts) -> list[list[int]]:
    return [o.token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY)]


@pytest.mark.slow
def test_identical_outputs_cache_chunking_preemption(smollm2_fp32, prompts):
    assert len(prompts) >= 8
    engine = smollm2_fp32.engine
    budget = engine.config.scheduler.max_num_batched_tokens
    engine.pool.reset_prefix_cache()
    engine.pool.enable_prefix_caching = False
    set_budget(engine, 1 << 16)
    try:
        # no cache, unlimited budget: every prompt in one step
        reference = outputs(smollm2_fp32, prompts)
    finally:
        engine.pool.enable_prefix_caching = True
        set_budget(engine, budget)
    assert outputs(smollm2_fp32, prompts) == reference  # cache on, cold
    before = smollm2_fp32.stats()
    # cache on, warm: nearly every prompt token is a hit
    assert outputs(smollm2_fp32, prompts) == reference
    hits = smollm2_fp32.stats()["prefix_cache_hit_tokens"] - before["prefix_cache_hit_tokens"]
    assert hits >= sum((len(p) - 1) // 16 * 16 for p in prompts)

    set_budget(engine, 32)
    engine.pool.reset_prefix_cache()
    try:
        assert outputs(smollm2_fp32, prompts) == reference  # heavy chunking
    finally:
        set_budget(engine, budget)

    small = LLM("smollm2", dtype="float32", num_kv_blocks=80,
                scheduler=SchedulerConfig(max_num_batched_tokens=256))
    assert outputs(small, prompts) == reference  # a pool too small for the batch
    assert small.stats()["num_preemptions"] > 0
    assert small.stats()["free_blocks"] == 80


def test_warm_prefix_2000_tokens(smollm2_fp32):
    ids = next(c["prompt_ids"] for c in CASES if c["name"] == "_markupbase.py")[:2000]
    one = SamplingParams(max_tokens=1, temperature=0)
    cold = smollm2_fp32.generate({"prompt_token_ids": ids}, one)[0]
    before = smollm2_fp32.stats()["num_computed_tokens"]
    warm = smollm2_fp32.generate(
        {"prompt_token_ids": ids + cold.token_ids + list(range(1000, 1019))}, one)[0]
    assert warm.num_cached_tokens >= 1984
    assert smollm2_fp32.stats()["num_computed_tokens"] - before == 2020 - warm.num_cached_tokens
    # behaviour, not a threshold: far less work was done
    assert warm.metrics.ttft < cold.metrics.ttft
