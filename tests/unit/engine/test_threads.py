"""The thread count per step class, measured as the engine runs (engine/threads.py)."""

import torch

from warmpath import LLM, SamplingParams
from warmpath.engine.threads import WINDOW_S, Sample, ThreadChoice

# What the OS counts per second of native steps on this project's 2-core Zen 4
# (benchmarks/competing_load.py's conditions): process CPU seconds, and machine idle core-seconds.
# Idle machine, 2 threads: both run all the time (OpenMP's threads spin between regions); a
# busy-loop process on one core: our two threads share what is left with it; one thread: one core is
# ours whatever the other does, the other is idle unless someone holds it.
TWO_IDLE, TWO_BUSY = (1.95, 0.02), (1.30, 0.0)
ONE_IDLE, ONE_BUSY = (1.0, 0.97), (1.0, 0.01)
# One decode row at a time on an idle machine: Python's serial stretches between the kernel's calls
# leave a core idle (our CPU time per thread well below 1, as under contention), but nobody else
# takes it.
TWO_SERIAL = (1.2, 0.75)


def feed(choice: ThreadChoice, per_second: tuple[float, float], seconds: float) -> list[int]:
    """Steps of 10 ms as the machine does them; the thread count used for each."""
    used, t = [], Sample(0.0, 0.0, 0.0)
    for _ in range(int(seconds / 0.01)):
        n = choice.threads
        cpu, idle = per_second
        end = Sample(t.wall + 0.01, t.cpu + cpu * 0.01, t.idle + idle * 0.01)
        choice.record(t, end, n)
        used.append(n)
        t = end
    return used


def test_every_core_on_an_idle_machine_one_thread_while_another_process_holds_a_core():
    choice = ThreadChoice(2)
    assert set(feed(choice, TWO_IDLE, 5)) == {2}  # idle: stays on every core
    used = feed(choice, TWO_BUSY, 1.5)  # another process starts: one thread within two windows
    assert used[0] == 2 and used[-1] == 1 and used.index(1) <= 2 * int(WINDOW_S / 0.01)
    # no trial of every core while the core stays taken
    assert set(feed(choice, ONE_BUSY, 5)) == {1}
    used = feed(choice, ONE_IDLE, 1)  # the other process ends: a core is free again
    assert used[-1] == 2 and choice.switches == 2


def test_this_processs_own_serial_stretches_are_not_another_process():
    """What kept thread tuning off by default: one decode row's serial stretches read as contention
    when the rule was this process's CPU time per thread. What others took is what counts."""
    choice = ThreadChoice(2)
    assert set(feed(choice, TWO_SERIAL, 5)) == {2} and choice.switches == 0
    assert feed(choice, TWO_BUSY, 1.5)[-1] == 1


def test_steps_run_with_another_count_do_not_count():
    choice = ThreadChoice(2)
    feed(ThreadChoice(2), TWO_BUSY, 1)
    for i in range(100):
        # not the choice
        choice.record(Sample(i * 0.01, 0.0, 0.0), Sample(i * 0.01 + 0.01, 0.0, 0.0), 1)
    assert choice.threads == 2 and choice.wall == 0.0


def test_the_native_kernel_gives_the_same_tokens_whatever_the_thread_count(tiny_llama_dir):
    """What lets the tuner change threads from step to step: the kernel's numbers do not depend on
    them."""
    before = torch.get_num_threads()
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    prompts = ["def add(a, b):\n", "class Point:\n    def __init__(self):\n" * 6]
    try:
        torch.set_num_threads(2)
        tuned = LLM(str(tiny_llama_dir), dtype="float32", kernel="native",
                    kernel_activations="int8", thread_tuning=True)
        assert tuned.engine.runner.tuner is not None
        got = [o.token_ids for o in tuned.generate(prompts, params)]
        for fixed in (1, 2):
            llm = LLM(str(tiny_llama_dir), dtype="float32", kernel="native",
                      kernel_activations="int8", num_threads=fixed, num_decode_threads=fixed)
            assert [o.token_ids for o in llm.generate(prompts, params)] == got
        native = tuned.engine.runner.native
        step = ([list(range(3, 40)), [7], [9]], [0, 50, 120], [[0, 1, 2], [4, 5, 6, 7],
                                                               list(range(8, 16))])
        logits = []
        for n in (1, 2):  # a chunk and two decodes, bit for bit
            torch.set_num_threads(n)
            logits.append(native.forward(*step))
        assert torch.equal(logits[0], logits[1])
    finally:
        torch.set_num_threads(before)
