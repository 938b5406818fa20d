"""Measuring the plan on a machine that is not quiet: every shape is tried on every backend in turn,
a round apart, so a burst of another process's load shorter than a round changes no time kept and no
choice; a machine busy throughout is told apart from a quiet one. A one-backend plan times only the
cheap classes and drops the trailing candidates, and on each recorded CPU still picks what timing
every class would."""

import json
from pathlib import Path

import pytest

from warmpath.config import ModelConfig
from warmpath.engine import plan_timing
from warmpath.engine.plan import (
    CHUNK_SHAPES,
    DECODE_SHAPES,
    DETERMINISTIC,
    choose,
    plan_steps,
    step_gflop,
)
from warmpath.engine.threads import others_share

STEPS = [("decode", "1x512", 1, 1, 512), ("decode", "16x512", 16, 1, 512),
         ("chunk", "8@0", 1, 8, 0), ("chunk", "512@2048", 1, 512, 2048)]
COST_MS = {"native-int8": {"1x512": 4, "16x512": 30, "8@0": 9, "512@2048": 300},
           "native-fp32": {"1x512": 6, "16x512": 45, "8@0": 18, "512@2048": 900}}


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeRunner:
    """A backend whose steps take COST_MS, ten times that while another process bursts (between
    burst[0] and burst[1] seconds of the clock)."""

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
    runners = {
        b: FakeRunner(b, clock, (burst_start_s, burst_start_s + 0.6 * one_round_s))
        for b in COST_MS
    }
    got = plan_timing.time_steps(runners, STEPS, progress=None, clock=clock, cpu_clock=lambda: 0.0)
    for backend, costs in COST_MS.items():
        kept = {**got[backend]["decode"], **got[backend]["chunk"]}
        assert kept == pytest.approx(costs)
    assert choose(got).native == "native-int8"


def test_without_rounds_a_burst_would_have_flipped_the_choice(monkeypatch):
    """The same burst over one backend's column alone (the order before rounds) makes the slower
    backend look faster: what the rounds are for."""
    monkeypatch.setattr(plan_timing, "ROUNDS", 1)
    monkeypatch.setattr(plan_timing, "machine_idle_s", lambda: None)
    clock = Clock()
    burst = (0.0, 100.0)  # over everything this single round times first: native-int8's column
    runners = {"native-int8": FakeRunner("native-int8", clock, burst)}
    got = plan_timing.time_steps(runners, STEPS, progress=None, clock=clock, cpu_clock=lambda: 0.0)
    got.update(
        plan_timing.time_steps({"native-fp32": FakeRunner("native-fp32", clock, (0, 0))}, STEPS,
                               progress=None, clock=clock, cpu_clock=lambda: 0.0))
    assert choose(got).native == "native-fp32"


def test_a_busy_machine_is_told_from_a_quiet_one():
    # 10 s on 2 cores: this process used 19 CPU seconds and the machine idled 0.5 s: quiet
    assert others_share(10, 19, 100.0, 100.5, cores=2) == pytest.approx(0.025)
    # another process took one core: this process used 10 s, nothing idled
    assert others_share(10, 10, 100.0, 100.0, cores=2) == pytest.approx(0.5)


DATA = Path(__file__).parents[2] / "data"
RECORDED = {name: json.loads((DATA / f"plan_timings_{name}.json").read_text())["backends"]
            for name in ("spr", "emr", "epyc_qwen05", "zen5_qwen05")}
SMOLLM2 = ModelConfig("llama", 49152, 576, 1536, 30, 9, 3, 64, max_position_embeddings=8192,
                      tie_word_embeddings=True)
QWEN_05 = ModelConfig("qwen2", 151936, 896, 4864, 24, 14, 2, 64, max_position_embeddings=32768,
                      tie_word_embeddings=True, attention_bias=True)
QWEN_15 = ModelConfig("qwen2", 151936, 1536, 8960, 28, 12, 2, 128, max_position_embeddings=32768,
                      tie_word_embeddings=True, attention_bias=True)


class RecordedRunner:
    """A backend whose steps take the times a CPU recorded for it."""

    def __init__(self, times: dict, clock: Clock, log: list):
        self.times, self.clock, self.log = times, clock, log

    def forward(self, seqs) -> None:
        rows, new, cached = len(seqs), len(seqs[0].token_ids), seqs[0].num_computed
        kind, key = ("decode", f"{rows}x{cached}") if new == 1 else ("chunk", f"{new}@{cached}")
        ms = self.times[kind].get(key, 1.0)
        self.log.append(ms)
        self.clock.now += ms / 1000


def test_the_screen_times_the_cheap_classes_the_model_size_scales_and_a_full_plan_all():
    for cfg in (SMOLLM2, QWEN_05, QWEN_15):
        full, screen = plan_steps(cfg, True), plan_steps(cfg, False)
        assert len(full) == len(DECODE_SHAPES) + len(CHUNK_SHAPES)
        work = [step_gflop(cfg, k, r if k == "decode" else n, c) for k, _, r, n, c in full]
        assert work == sorted(work) and screen == full[:len(screen)]  # cheapest first
        # decode, chunk and a long context
        assert {"1x512", "8@0", "8@6144"} <= {key for _, key, *_ in screen}
        assert "512@6144" not in {key for _, key, *_ in screen}
    sizes = [len(plan_steps(cfg, False)) for cfg in (SMOLLM2, QWEN_05, QWEN_15)]
    # a larger model: fewer classes
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[2]


@pytest.mark.parametrize("cpu", sorted(RECORDED))
@pytest.mark.parametrize("cfg", [SMOLLM2, QWEN_05, QWEN_15], ids=["smollm2", "qwen05", "qwen15"])
def test_a_screened_measurement_chooses_what_timing_every_class_would_in_a_fraction_of_the_time(
        cpu, cfg, monkeypatch):
    """On each recorded CPU (Sapphire Rapids with AMX, an AVX512-BF16 Intel, the AVX2 EPYC, a Zen
    5), for each model's screen: the deterministic candidates timed on the cheap classes with the
    trailing ones dropped pick the backend that every class, every round, would."""
    monkeypatch.setattr(plan_timing, "machine_idle_s", lambda: None)
    recorded = {b: t for b, t in RECORDED[cpu].items() if b in DETERMINISTIC}
    clock, spent = Clock(), []
    runners = {b: RecordedRunner(t, clock, spent) for b, t in recorded.items()}
    got = plan_timing.time_steps(runners, plan_steps(cfg, False), progress=None, clock=clock,
                                 cpu_clock=lambda: 0.0, eliminate=True)
    assert choose(got).native == choose(recorded).native
    everything = plan_timing.ROUNDS * sum(sum(ms for kind in t.values() for ms in kind.values())
                                          for t in recorded.values())
    assert sum(spent) < 0.25 * everything  # what the three rounds of every class cost


def test_a_screened_plan_routes_every_step_to_its_one_backend(monkeypatch):
    """The screen may stop after the cheapest decode classes (the other candidate trailing): the
    plan still answers for a chunk of any size."""
    monkeypatch.setattr(plan_timing, "machine_idle_s", lambda: None)
    clock, spent = Clock(), []
    recorded = {b: RECORDED["epyc_qwen05"][b] for b in ("native-int8", "native-fp32")}
    slow = {kind: {k: 3 * ms for k, ms in t.items()} for kind, t in recorded["native-fp32"].items()}
    runners = {"native-int8": RecordedRunner(recorded["native-int8"], clock, spent),
               "native-fp32": RecordedRunner(slow, clock, spent)}
    got = plan_timing.time_steps(runners, plan_steps(QWEN_05, False), progress=None, clock=clock,
                                 cpu_clock=lambda: 0.0, eliminate=True)
    assert not got["native-int8"]["chunk"]  # stopped among the decode classes
    plan = choose(got)
    assert plan.backends == [
        "native-int8"
    ] and plan.for_chunk(500, 3000) == plan.for_decode(3, 100) == "native-int8"
    assert "| chunk 512 @ 6144 | – | – | native-int8 |" in plan.table()
