"""Measuring the plan on a machine that is not quiet: every shape is tried on every backend in turn, a round apart,
so a burst of another process's load shorter than a round changes no time kept and no choice; a machine busy
throughout is told apart from a quiet one."""

import pytest

from warmpath.engine import plan_timing
from warmpath.engine.plan import choose
from warmpath.engine.threads import others_share

STEPS = [("decode", "1x512", 1, 1, 512), ("decode", "16x512", 16, 1, 512), ("chunk", "8@0", 1, 8, 0),
         ("chunk", "512@2048", 1, 512, 2048)]
COST_MS = {"native-int8": {"1x512": 4, "16x512": 30, "8@0": 9, "512@2048": 300},
           "native-fp32": {"1x512": 6, "16x512": 45, "8@0": 18, "512@2048": 900}}


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeRunner:
    """A backend whose steps take COST_MS, ten times that while another process bursts (between burst[0] and
    burst[1] seconds of the clock)."""

    def __init__(self, backend: str, clock: Clock, burst: tuple[float, float]):
        self.backend, self.clock, self.burst = backend, clock, burst

    def forward(self, seqs) -> None:
        rows, new, cached = len(seqs), len(seqs[0].token_ids), seqs[0].num_computed
        key = f"{rows}x{cached}" if new == 1 else f"{new}@{cached}"
        ms = COST_MS[self.backend].get(key, 1)
        if self.burst[0] <= self.clock.now < self.burst[1]:
            ms *= 10
        self.clock.now += ms / 1000


@pytest.mark.parametrize("burst_start_s", [0.0, 0.3, 0.9, 1.3])
def test_a_burst_shorter_than_a_round_changes_no_time_kept(burst_start_s, monkeypatch):
    monkeypatch.setattr(plan_timing, "machine_idle_s", lambda: None)
    one_round_s = sum(sum(c.values()) for c in COST_MS.values()) / 1000  # 1.312 s of steps a round
    clock = Clock()
    runners = {b: FakeRunner(b, clock, (burst_start_s, burst_start_s + 0.6 * one_round_s)) for b in COST_MS}
    got = plan_timing.time_steps(runners, STEPS, progress=None, clock=clock, cpu_clock=lambda: 0.0)
    for backend, costs in COST_MS.items():
        kept = {**got[backend]["decode"], **got[backend]["chunk"]}
        assert kept == pytest.approx(costs)
    assert choose(got).native == "native-int8"


def test_without_rounds_a_burst_would_have_flipped_the_choice(monkeypatch):
    """The same burst over one backend's column alone (the order before rounds) makes the slower backend look
    faster: what the rounds are for."""
    monkeypatch.setattr(plan_timing, "ROUNDS", 1)
    monkeypatch.setattr(plan_timing, "machine_idle_s", lambda: None)
    clock = Clock()
    burst = (0.0, 100.0)  # over everything this single round times first: native-int8's column
    runners = {"native-int8": FakeRunner("native-int8", clock, burst)}
    got = plan_timing.time_steps(runners, STEPS, progress=None, clock=clock, cpu_clock=lambda: 0.0)
    got.update(plan_timing.time_steps({"native-fp32": FakeRunner("native-fp32", clock, (0, 0))}, STEPS,
                                      progress=None, clock=clock, cpu_clock=lambda: 0.0))
    assert choose(got).native == "native-fp32"


def test_a_busy_machine_is_told_from_a_quiet_one():
    # 10 s on 2 cores: this process used 19 CPU seconds and the machine idled 0.5 s: quiet
    assert others_share(10, 19, 100.0, 100.5, cores=2) == pytest.approx(0.025)
    # another process took one core: this process used 10 s, nothing idled
    assert others_share(10, 10, 100.0, 100.0, cores=2) == pytest.approx(0.5)
