"""The thread count per step class, measured as the engine runs (engine/threads.py)."""

import torch

from warmpath import LLM, SamplingParams
from warmpath.engine.threads import EXPLORE_EVERY, MIN_SAMPLES, ThreadTuner, step_class

# Seconds per token of a 16-row decode step on this project's 2-core Zen 4 (benchmarks/competing_load.py's
# conditions): idle, 2 threads beat 1; with a busy-loop process on one core, 2 threads wait at every barrier.
IDLE = {2: 0.0024, 1: 0.0041}
BUSY = {2: 0.0105, 1: 0.0046}


def run(tuner: ThreadTuner, cls: str, times: dict[int, float], steps: int) -> list[int]:
    used = []
    for _ in range(steps):
        n = tuner.choose(cls)
        tuner.record(cls, n, times[n])
        used.append(n)
    return used


def test_every_core_on_an_idle_machine_one_thread_when_another_process_takes_a_core():
    tuner, cls = ThreadTuner((2, 1)), step_class(True, 16)
    used = run(tuner, cls, IDLE, 200)
    assert used[: 2 * MIN_SAMPLES] == [2] * MIN_SAMPLES + [1] * MIN_SAMPLES and used.count(2) > 0.9 * len(used)
    used = run(tuner, cls, BUSY, 300)  # a competing process starts: the tuner moves within a few tries
    assert used[-100:].count(1) > 0.9 * 100
    used = run(tuner, cls, IDLE, 600)  # and comes back when it stops (tries grew rarer while busy)
    assert used[-100:].count(2) > 0.9 * 100


def test_classes_are_measured_apart_and_others_are_tried_now_and_then():
    tuner = ThreadTuner((2, 1))
    decode, chunk = step_class(True, 1), step_class(False, 512)
    assert decode != chunk and step_class(True, 3) == step_class(True, 4) != step_class(True, 5)
    run(tuner, decode, BUSY, 2 * MIN_SAMPLES)
    assert tuner.choose(chunk) == 2  # nothing measured for prompts yet
    idle = ThreadTuner((2, 1))
    used = run(idle, decode, IDLE, 2 * MIN_SAMPLES + 2 * EXPLORE_EVERY)[2 * MIN_SAMPLES :]
    assert 2 <= used.count(1) <= 8  # the other count is tried again now and then ...
    used = run(idle, decode, IDLE, 40 * EXPLORE_EVERY)
    assert used.count(1) < 0.01 * len(used)  # ... and less often while it keeps losing


def test_the_native_kernel_gives_the_same_tokens_whatever_the_thread_count(tiny_llama_dir):
    """What lets the tuner change threads from step to step: the kernel's numbers do not depend on them."""
    before = torch.get_num_threads()
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    prompts = ["def add(a, b):\n", "class Point:\n    def __init__(self):\n" * 6]
    try:
        torch.set_num_threads(2)
        tuned = LLM(str(tiny_llama_dir), dtype="float32", kernel="native", kernel_activations="int8",
                    thread_tuning=True)
        assert tuned.engine.runner.tuner is not None
        got = [o.token_ids for o in tuned.generate(prompts, params)]
        for fixed in (1, 2):
            llm = LLM(str(tiny_llama_dir), dtype="float32", kernel="native", kernel_activations="int8",
                      num_threads=fixed, num_decode_threads=fixed)
            assert [o.token_ids for o in llm.generate(prompts, params)] == got
        native = tuned.engine.runner.native
        step = ([list(range(3, 40)), [7], [9]], [0, 50, 120], [[0, 1, 2], [4, 5, 6, 7], list(range(8, 16))])
        logits = []
        for n in (1, 2):  # a chunk and two decodes, bit for bit
            torch.set_num_threads(n)
            logits.append(native.forward(*step))
        assert torch.equal(logits[0], logits[1])
    finally:
        torch.set_num_threads(before)
