"""How many threads a step uses, measured as the engine runs: each step class (decode-only by rows, or with a
prompt chunk by tokens) keeps a running time per token for each candidate thread count, uses the fastest, and
now and then tries the others. On an idle 2-core machine every thread wins; when another process takes a core,
a step spread over both waits at each of its parallel regions for the thread that lost its core, and one thread
wins (benchmarks/competing_load.py). Only for steps whose numbers do not depend on the thread count (the native
kernel's: each output and each attention span is computed by one thread, merged in a fixed order)."""

from __future__ import annotations

from dataclasses import dataclass, field

EXPLORE_EVERY = 64  # steps of a class between two tries of another thread count (doubled after each try that
MAX_EXPLORE_EVERY = 4096  # lost, up to this: under contention a try of every core can cost a second) ...
EXPLORE_STEPS = 2  # ... for this many steps (the first after a change of count is not counted: see below)
MIN_SAMPLES = 3  # measured steps of each count before the faster is chosen
DECODE_BUCKETS = (1, 4, 16)  # decode-only steps of <= 1, <= 4, <= 16, more rows
TOKEN_BUCKETS = (64, 256)  # steps with a prompt chunk: <= 64, <= 256, more tokens


def step_class(decode_only: bool, rows: int) -> str:
    buckets = DECODE_BUCKETS if decode_only else TOKEN_BUCKETS
    i = next((i for i, b in enumerate(buckets) if rows <= b), len(buckets))
    return f"{'decode' if decode_only else 'chunk'}-{i}"


@dataclass
class ThreadTuner:
    """The first step after the thread count changed is not recorded (the runner says so): waking or resizing
    OpenMP's pool is paid there, and would make a count look slower than it is."""

    counts: tuple[int, ...]  # candidate thread counts, the preferred (all cores) first
    seconds: dict[tuple[str, int], float] = field(default_factory=dict)  # running seconds per token
    samples: dict[tuple[str, int], int] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)  # since the last try of another count
    every: dict[str, int] = field(default_factory=dict)  # the class's steps between tries now
    best: dict[str, int] = field(default_factory=dict)

    def choose(self, cls: str) -> int:
        for c in self.counts:  # each count measured a few times first, one after the other
            if self.samples.get((cls, c), 0) < MIN_SAMPLES:
                return c
        best = min(self.counts, key=lambda c: self.seconds[(cls, c)])
        every = self.every.get(cls, EXPLORE_EVERY)
        if self.best.get(cls, best) != best:
            every = EXPLORE_EVERY  # the choice moved: look again soon
        n = self.steps.get(cls, 0) + 1
        if n > every:  # a try of another count is over and lost: wait longer before the next
            n, every = 0, min(2 * every, MAX_EXPLORE_EVERY)
        self.steps[cls], self.every[cls], self.best[cls] = n, every, best
        if n > every - EXPLORE_STEPS:  # try another count: the machine's load changes
            others = [c for c in self.counts if c != best]
            return others[0]
        return best

    def record(self, cls: str, threads: int, seconds_per_token: float) -> None:
        key = (cls, threads)
        old = self.seconds.get(key)
        # a faster step is believed at once (a try of another count has one or two steps to show it, and a
        # faster time is no accident); a slower one moves the mean a little (one slow step may be)
        self.seconds[key] = seconds_per_token if old is None else min(seconds_per_token,
                                                                      0.7 * old + 0.3 * seconds_per_token)
        self.samples[key] = self.samples.get(key, 0) + 1
