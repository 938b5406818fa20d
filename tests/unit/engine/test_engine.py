"""Engine + Scheduler + BlockPool on the tiny model: exact outputs under caching / chunking /
preemption, warm prefixes, continuous batching, no head-of-line blocking, aborts and deadlines in
every state."""

import time

import pytest
from engine_checks import FakeClock, check_pool_invariants, code_texts

from warmpath import EngineRequest, SamplingParams
from warmpath.config import EngineConfig, SchedulerConfig
from warmpath.engine.engine import Engine
from warmpath.engine.request import FinishReason, RequestStatus

GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


def make(path, clock=time.monotonic, **kw) -> Engine:
    kw = {"dtype": "float32", "num_kv_blocks": 2048, **kw}
    return Engine(EngineConfig(model=str(path), **kw), clock)


def run(engine: Engine, prompts: list[list[int]], params=GREEDY,
        check=True) -> dict[str, list[int]]:
    for i, ids in enumerate(prompts):
        engine.add_request(EngineRequest(f"r{i}", ids, params))
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.token_ids
        if check:
            check_pool_invariants(engine)
    return [done[f"r{i}"] for i in range(len(prompts))]


@pytest.fixture(scope="module")
def prompts(tiny_long_dir):
    tok = make(tiny_long_dir, num_kv_blocks=4).tokenizer
    texts = code_texts(8, 100, 1200)
    shared = code_texts(1, 900, 900, seed=1)[0]  # plus three requests sharing a long prefix
    texts += [shared + "\n# a", shared + "\ndef g(", shared]
    return [tok.encode(t) for t in texts]


def test_outputs_identical_across_cache_chunking_and_preemption(tiny_long_dir, prompts):
    unlimited = SchedulerConfig(max_num_batched_tokens=1 << 16)
    reference = run(make(tiny_long_dir, enable_prefix_caching=False, scheduler=unlimited), prompts)
    cached = make(tiny_long_dir)
    assert run(cached, prompts) == reference
    assert run(cached, prompts) == reference  # now mostly prefix hits
    assert cached.stats()["prefix_cache_hit_tokens"] > 0.9 * sum(map(len, prompts))
    assert run(make(tiny_long_dir, scheduler=SchedulerConfig(max_num_batched_tokens=32)),
               prompts) == reference
    # A pool far smaller than the batch needs: preemption must happen, outputs must not change.
    small = make(tiny_long_dir, num_kv_blocks=100,
                 scheduler=SchedulerConfig(max_num_batched_tokens=128))
    assert run(small, prompts) == reference
    assert small.stats()["num_preemptions"] > 0


def test_warm_prefix_computes_only_the_new_tokens(tiny_long_dir, prompts):
    engine = make(tiny_long_dir)
    base = prompts[0][:300] if len(prompts[0]) >= 300 else (prompts[0] * 3)[:300]
    run(engine, [base], SamplingParams(max_tokens=1, temperature=0))
    before = engine.stats()["num_computed_tokens"]
    engine.add_request(
        EngineRequest("warm", base + list(range(40, 60)),
                      SamplingParams(max_tokens=1, temperature=0)))
    out = [o for o in engine.step() if o.request_id == "warm"][0]
    # every full block of the first prompt (18 x 16)
    assert out.finished and out.num_cached_tokens == 288
    assert engine.stats()["num_computed_tokens"] - before == 320 - 288


def test_new_request_joins_at_the_next_step(tiny_long_dir, prompts):
    engine = make(tiny_long_dir)
    long = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)
    for i in range(3):
        engine.add_request(EngineRequest(f"d{i}", prompts[i][:40], long))
    engine.step()
    engine.step()
    engine.add_request(EngineRequest("late", prompts[3][:30], long))
    outs = {o.request_id: o for o in engine.step()}
    assert set(outs) == {"d0", "d1", "d2", "late"}
    assert all(len(o.new_token_ids) == 1 for o in outs.values())


def test_long_prefill_never_stalls_decodes(tiny_long_dir, prompts):
    engine = make(tiny_long_dir, scheduler=SchedulerConfig(max_num_batched_tokens=256))
    long = SamplingParams(max_tokens=100, temperature=0, ignore_eos=True)
    for i in range(8):
        engine.add_request(EngineRequest(f"d{i}", prompts[i][:50], long))
    for _ in range(3):
        engine.step()
    big = (prompts[8] * 6)[:4000]
    engine.add_request(EngineRequest("big", big, SamplingParams(max_tokens=1, temperature=0)))
    steps = 0
    while "big" in engine.requests:
        outs = {o.request_id: o for o in engine.step()}
        steps += 1
        assert all(len(outs[f"d{i}"].new_token_ids) == 1
                   for i in range(8)), f"a decode skipped step {steps}"
    assert steps >= 4000 // 256  # the prompt really was chunked


def test_eviction_is_least_recently_used_session(tiny_long_dir):
    engine = make(tiny_long_dir, num_kv_blocks=14, block_size=16)
    one = SamplingParams(max_tokens=1, temperature=0)
    sessions = {
        name: [base + i % 7 for i in range(64)]
        for name, base in (("A", 10), ("B", 30), ("C", 50))
    }

    def hit(name, ids):
        engine.add_request(EngineRequest(name, ids, one))
        while engine.has_unfinished_requests():
            outs = engine.step()
        check_pool_invariants(engine)
        return [o for o in outs if o.request_id == name][0].num_cached_tokens

    for name in "ABC":
        assert hit(name, sessions[name]) == 0
    assert hit("A", sessions["A"]) == 48  # A used again: now the most recent
    hit("D", [90 + i % 5 for i in range(96)])  # needs 6 blocks: forces evictions
    assert engine.stats()["num_evictions"] >= 4
    assert hit("A", sessions["A"]) == 48  # recently used: survived
    assert hit("C", sessions["C"]) == 48
    assert hit("B", sessions["B"]) == 0  # least recently used: evicted first


@pytest.mark.parametrize("state", ["waiting", "prefilling", "decoding", "preempted"])
def test_abort_in_any_state_returns_blocks_at_once(tiny_long_dir, prompts, state):
    engine = make(tiny_long_dir, num_kv_blocks=40 if state == "preempted" else 512,
                  scheduler=SchedulerConfig(max_num_batched_tokens=64))
    long = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
    engine.add_request(EngineRequest("x", prompts[1][:300], long))
    if state == "preempted":
        engine.add_request(EngineRequest("y", prompts[2][:300], long))
    target = "y" if state == "preempted" else "x"
    for _ in range(200):
        req = engine.requests[target]
        if (state == "waiting"
                or (state == "prefilling" and 0 < req.num_computed_tokens < req.num_tokens - 1)
                or (state == "decoding" and req.output_token_ids)
                or (state == "preempted" and req.status == RequestStatus.PREEMPTED)):
            break
        engine.step()
    else:
        pytest.fail(f"never reached state {state}")
    assert engine.abort(target)
    check_pool_invariants(engine)
    assert not engine.abort(target)  # once only
    outs = [o for o in engine.step() if o.request_id == target]
    assert outs[0].finished and outs[0].finish_reason == FinishReason.ABORT
    engine.abort("x")
    engine.step()
    check_pool_invariants(engine)
    assert engine.pool.num_free == engine.pool.num_blocks and engine.stats()["num_aborted"] >= 1


def test_deadline_finishes_at_the_next_step_and_computes_nothing_more(tiny_long_dir, prompts):
    clock = FakeClock()
    engine = make(tiny_long_dir, clock)
    long = SamplingParams(max_tokens=100, temperature=0, ignore_eos=True)
    # already past
    engine.add_request(EngineRequest("late", prompts[0][:50], long, deadline=clock.t - 0.001))
    engine.add_request(EngineRequest("soon", prompts[1][:50], long, deadline=clock.t + 5))
    outs = {o.request_id: o for o in engine.step()}
    assert outs["late"].finish_reason == FinishReason.DEADLINE and outs["late"].token_ids == []
    assert len(outs["soon"].token_ids) == 1
    engine.step()
    clock.t += 10
    computed = engine.stats()["num_computed_tokens"]
    outs = {o.request_id: o for o in engine.step()}
    assert outs["soon"].finish_reason == FinishReason.DEADLINE and len(outs["soon"].token_ids) == 2
    assert engine.stats()["num_computed_tokens"] == computed  # not computed further
    assert engine.stats()["num_deadline_expired"] == 2
    check_pool_invariants(engine)
    assert not engine.has_unfinished_requests()


def test_a_prompt_deadline_ends_a_request_with_no_token_yet_and_only_such_a_request(
        tiny_long_dir, prompts):
    """llama.cpp's t_max_prompt_ms: no first token by then is late; a request past its first token
    runs on."""
    clock = FakeClock()
    engine = make(tiny_long_dir, clock, scheduler=SchedulerConfig(max_num_batched_tokens=64))
    long = SamplingParams(max_tokens=100, temperature=0, ignore_eos=True)
    engine.add_request(EngineRequest("started", prompts[0][:20], long, prompt_deadline=clock.t + 1))
    engine.step()  # its prompt fits one step: it has a token
    engine.add_request(EngineRequest("slow", prompts[1][:600], long, prompt_deadline=clock.t + 1))
    engine.step()
    clock.t += 2
    outs = {o.request_id: o for o in engine.step()}
    assert outs["slow"].finish_reason == FinishReason.DEADLINE and outs["slow"].token_ids == []
    assert not outs["started"].finished
    assert engine.abort("started")
    engine.step()
    check_pool_invariants(engine)


def test_bad_requests_are_refused(tiny_long_dir):
    engine = make(tiny_long_dir, num_kv_blocks=16)
    engine.add_request(EngineRequest("a", [5, 6, 7], GREEDY))
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request(EngineRequest("a", [5, 6, 7], GREEDY))
    with pytest.raises(ValueError, match="empty"):
        engine.add_request(EngineRequest("b", [], GREEDY))


def test_a_failing_step_fails_its_requests_not_the_engine(tiny_long_dir, prompts):
    engine = make(tiny_long_dir)
    real_forward = engine.runner.forward
    calls = {"n": 0}

    def flaky(seqs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("simulated kernel failure")
        return real_forward(seqs)

    engine.runner.forward = flaky
    long = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    engine.add_request(EngineRequest("a", prompts[0][:40], long))
    engine.add_request(EngineRequest("b", prompts[1][:40], long))
    engine.step()
    outs = {o.request_id: o for o in engine.step()}
    assert {o.finish_reason for o in outs.values()} == {FinishReason.ERROR}
    assert "simulated kernel failure" in outs["a"].error
    check_pool_invariants(engine)
    assert engine.pool.num_used == 0 and not engine.has_unfinished_requests()
    # still serving
    assert run(engine, [prompts[2][:40]]) == run(make(tiny_long_dir), [prompts[2][:40]])
