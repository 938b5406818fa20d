"""Shared checks for engine tests: block accounting invariants, real-code prompts, a fake clock."""

from __future__ import annotations

import sysconfig
from collections import Counter
from pathlib import Path

from warmpath.engine.engine import Engine
from warmpath.engine.proposers import StepTimes


def check_pool_invariants(engine: Engine) -> None:
    """Reference counts equal holders; no block is both free and held; cache map consistent; idle ->
    all free."""
    pool, sched = engine.pool, engine.scheduler
    holders = Counter(b for r in sched.running_requests() for b in r.block_ids)
    for r in sched.waiting_requests():
        assert r.block_ids == [], f"waiting request {r.request_id} holds blocks"
    free = set(pool.free_queue)
    assert len(free) == len(pool.free_queue)
    for b in range(pool.num_blocks):
        assert pool.ref_counts[b] == holders[b], (
            f"block {b}: ref {pool.ref_counts[b]} != holders {holders[b]}"
        )
        assert (b in free) == (holders[b] == 0), f"block {b} free={b in free} held by {holders[b]}"
    for h, b in pool.cached.items():
        assert pool.block_meta[b] is not None and pool.block_meta[b].block_hash == h
    assert sum(m is not None for m in pool.block_meta) == len(pool.cached)
    if not engine.has_unfinished_requests():
        assert pool.num_free == pool.num_blocks


def code_texts(n: int, min_chars: int = 200, max_chars: int = 1500, seed: int = 0) -> list[str]:
    """n windows of real standard-library source, of mixed lengths."""
    import random

    rng = random.Random(seed)
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    out = []
    while len(out) < n:
        text = rng.choice(files).read_text(encoding="utf-8")
        size = rng.randint(min_chars, max_chars)
        if len(text) > size:
            start = rng.randrange(len(text) - size)
            out.append(text[start : start + size])
    return out


class FakeClock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class FlatStepTimes(StepTimes):
    """Every decode step costs the same whatever its rows: verifying guesses always pays (the
    decision is tested apart; exactness where this is used)."""

    def record(self, rows: int, seconds: float) -> None:
        pass

    def at(self, rows: int) -> float | None:
        return 0.01
