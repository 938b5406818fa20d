"""No leaks, ever: random add / abort / step / deadline sequences keep the block accounting
exact."""

import pytest
from engine_checks import FakeClock, FlatStepTimes, check_pool_invariants
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from warmpath import EngineRequest, SamplingParams
from warmpath.config import EngineConfig, SchedulerConfig
from warmpath.engine.engine import Engine

SEED = 0  # hypothesis' seed: the sequences below
BASE = [list(range(10, 40)), list(range(10, 30)) + [7] * 12, [3, 4, 5] * 9, list(range(60, 61))]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0,
                                              len(BASE) - 1), st.integers(0, 12),
                  st.integers(1, 20), st.sampled_from([None, -1.0, 0.5, 3.0]), st.booleans()),
        st.tuples(st.just("abort"), st.integers(0, 30)),
        st.tuples(st.just("step"), st.integers(1, 6)),
        st.tuples(st.just("step"), st.integers(1, 6)),
        st.tuples(st.just("step"), st.integers(1, 6)),
        st.tuples(st.just("tick"), st.sampled_from([0.2, 1.0, 5.0])),
    ),
    min_size=10,
    max_size=60,
)


@pytest.fixture(scope="module", params=["none", "ngram"])
def engine(tiny_llama_dir, request):
    # A small pool, small blocks and a small budget: preemption, chunking and eviction all happen;
    # with speculation, guesses are verified (and rejected) beside all that, and aborts and
    # deadlines hit them.
    config = EngineConfig(model=str(tiny_llama_dir), dtype="float32", num_kv_blocks=16,
                          block_size=4, scheduler=SchedulerConfig(max_num_batched_tokens=16,
                                                                  max_num_seqs=4),
                          speculative_method=request.param)
    engine = Engine(config, FakeClock())
    if engine.speculator is not None:  # verifying always pays here
        engine.speculator.decode_times = FlatStepTimes()
    return engine


# The same sequences every run and wherever the file lives (derandomize's seed hashes the test's
# path): CI stays stable, and test_fuzzing_reached_the_hard_states below checks these sequences do
# reach the hard states.
@settings(max_examples=120, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@seed(SEED)
@given(ops)
def test_random_sequences_never_leak(engine, sequence):
    clock = engine.scheduler.clock
    clock.t = 1000.0
    ids: list[str] = []
    for op in sequence:
        if op[0] == "add":
            _, base, extra, max_tokens, deadline, seeded = op
            rid = f"q{len(ids)}-{id(sequence)}"
            params = SamplingParams(max_tokens=max_tokens, temperature=0.7 if seeded else 0, seed=1,
                                    ignore_eos=True)
            engine.add_request(EngineRequest(rid, BASE[base] + [50 + extra] * extra, params,
                               deadline=None if deadline is None else clock.t + deadline))
            ids.append(rid)
        elif op[0] == "abort" and ids:
            engine.abort(ids[op[1] % len(ids)])
        elif op[0] == "step":
            for _ in range(op[1]):
                for out in engine.step():
                    assert out.finished or len(
                        out.new_token_ids) == 1 or engine.speculator is not None
                check_pool_invariants(engine)
        elif op[0] == "tick":
            clock.t += op[1]
        check_pool_invariants(engine)
    for rid in ids:
        engine.abort(rid)
    while engine.has_unfinished_requests():
        engine.step()
    check_pool_invariants(engine)
    assert engine.pool.num_free == engine.pool.num_blocks and not engine.requests


def test_fuzzing_reached_the_hard_states(engine):
    """The random sequences above did preempt, abort, expire deadlines and evict (or they proved
    little)."""
    s = engine.stats()
    assert s["num_preemptions"] > 0 and s["num_aborted"] > 0 and s["num_deadline_expired"] > 0
    assert s["prefix_cache_hit_tokens"] > 0 and s["num_evictions"] > 0
    if engine.speculator is not None:
        assert 0 < s["spec_accepted_tokens"] < s["spec_draft_tokens"]
