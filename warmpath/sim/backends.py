"""The engine backends a simulation steps: the engine's own Scheduler and BlockPool with a cost
model (SimBackend, virtual time), or the real Engine with the model (RealBackend, wall time) for
validation. Both take requests, abort them and step, and say what each step did (StepResult)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from warmpath.config import SchedulerConfig
from warmpath.engine.block_pool import BlockPool
from warmpath.engine.request import EngineRequest, Request, RequestMetrics, SamplingParams
from warmpath.engine.scheduler import Scheduler, StepBatch
from warmpath.engine.step_cost import StepCost
from warmpath.sim.cost import CostModel, StepShape, step_shape
from warmpath.sim.tier import SimTier

if TYPE_CHECKING:
    from warmpath.engine.engine import Engine

# What the simulated model "samples": never a stop token (requests run to max_tokens).
SIM_TOKEN = 1


@dataclass
class StepResult:
    seconds: float
    tokens: list[tuple[str, int]]  # (request id, new tokens) at the end of the step
    finished: list[tuple[str, str]]  # (request id, finish reason)
    cached: dict[str, int]  # request id -> prefix-cache hit at first admission


class SimBackend:
    """The engine's Scheduler and BlockPool, no model: a step costs what the cost model says."""

    def __init__(self, cost: CostModel, num_blocks: int, block_size: int = 16,
                 max_num_batched_tokens: int = 512, max_num_seqs: int = 64,
                 enable_prefix_caching: bool = True, tier: SimTier | None = None):
        self.cost = cost
        self.pool = BlockPool(num_blocks, block_size, enable_prefix_caching, b"sim")
        self.tier = tier
        if tier is not None:
            # the engine's disk tier: every cached block kept, read back instead of computed
            self.pool.on_cached = tier.add
        # learned from the cost model's steps, as the engine learns from its own
        self.step_cost = StepCost()
        self.scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens, max_num_seqs), self.pool,
                                   self.step_cost, tier, lambda: self.now)
        self.requests: dict[str, Request] = {}
        self.now = 0.0

    def add(self, rid: str, ids: list[int], max_tokens: int, session: str, deadline: float | None,
            now: float):
        req = Request(rid, ids, SamplingParams(max_tokens=max_tokens, temperature=0.0), frozenset(),
                      max_tokens, None, RequestMetrics(arrival_time=now), session, deadline)
        self.requests[rid] = req
        self.scheduler.add(req)

    def abort(self, rid: str, now: float) -> None:
        self.now = max(self.now, now)  # the scheduler tells late from stale by this clock
        req = self.requests.pop(rid, None)
        if req is not None:
            self.scheduler.abort(req)

    def busy(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self, now: float) -> StepResult:
        self.now = now
        batch = self.scheduler.schedule()
        sampling = [c.request for c in batch.chunks if c.sample]
        seconds = self.cost.step_seconds(step_shape(batch)) if batch.chunks else 0.0
        seconds += self.tier.take_seconds() if self.tier is not None else 0.0
        # paces prompt chunks as the engine's own steps do
        self.step_cost.record(batch.num_tokens, seconds)
        done = batch.finished + (self.scheduler.update(batch, [[SIM_TOKEN]] *
                                                       len(sampling)) if batch.chunks else [])
        cached = {c.request.request_id: c.request.num_cached_tokens for c in batch.chunks}
        for r in done:
            self.requests.pop(r.request_id, None)
        return StepResult(seconds, [(r.request_id, 1) for r in sampling],
                          [(r.request_id, r.finish_reason.value) for r in done], cached)

    @property
    def stats(self) -> dict:
        s = self.scheduler.stats
        return {"queried": s.prefix_cache_queried_tokens, "hit": s.prefix_cache_hit_tokens,
                "tier_hit": s.prefix_cache_tier_hit_tokens, "preemptions": s.num_preemptions,
                "evictions": self.pool.num_evictions}


class RealBackend:
    """The real Engine with the model; time is the wall clock (for validating the simulator)."""

    def __init__(self, engine: Engine, origin: float):
        self.engine, self.origin = engine, origin
        self.pool, self.scheduler = engine.pool, engine.scheduler
        # every step's plan shape and duration (calibration)
        self.steps: list[tuple[StepShape, float]] = []
        self._shape: StepShape | None = None
        self.scheduler.add_listener(self._note_shape)

    def _note_shape(self, batch: StepBatch) -> None:
        """The engine's batch, before the model runs (its requests' computed tokens are still the
        step's start)."""
        self._shape = step_shape(batch)

    def add(self, rid: str, ids: list[int], max_tokens: int, session: str, deadline: float | None,
            now: float):
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        at = None if deadline is None else self.origin + deadline
        self.engine.add_request(EngineRequest(rid, ids, params, session, at))

    def abort(self, rid: str, now: float) -> None:  # the engine's own clock says when
        if rid in self.engine.requests:
            self.engine.abort(rid)

    def busy(self) -> bool:
        return self.engine.scheduler.has_unfinished()

    def step(self, now: float) -> StepResult:
        t = time.monotonic()
        outs = self.engine.step()
        if self._shape is not None and self._shape.seqs:
            self.steps.append((self._shape, time.monotonic() - t))
        tokens = [(o.request_id, len(o.new_token_ids)) for o in outs if o.new_token_ids]
        finished = [(o.request_id, o.finish_reason.value) for o in outs if o.finished]
        cached = {o.request_id: o.num_cached_tokens for o in outs}
        return StepResult(time.monotonic() - t, tokens, finished, cached)

    @property
    def stats(self) -> dict:
        s = self.engine.scheduler.stats
        return {"queried": s.prefix_cache_queried_tokens, "hit": s.prefix_cache_hit_tokens,
                "tier_hit": s.prefix_cache_tier_hit_tokens, "preemptions": s.num_preemptions,
                "evictions": self.engine.pool.num_evictions}
