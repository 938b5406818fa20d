"""The scheduler's state: its queues, the block pool and the counters. Owned by Scheduler; its
managers (the other private modules of this package) change it, nothing outside the package does."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from warmpath.engine.block_pool import BlockPool
from warmpath.engine.request import (
    FinishReason,
    Request,
    RequestMetrics,
    RequestStatus,
    SamplingParams,
)
from warmpath.engine.scheduler.batch import SchedulerStats

if TYPE_CHECKING:
    from warmpath.engine.scheduler._warm_up_queue import WarmUps


@dataclass
class SchedulerState:
    pool: BlockPool
    warming: WarmUps  # not admitted yet, bounded
    stats: SchedulerStats
    # FCFS; preempted requests go back to the front
    waiting: deque[Request] = field(default_factory=deque)
    # in admission order: the last one is preempted first
    running: list[Request] = field(default_factory=list)

    @property
    def block_size(self) -> int:
        return self.pool.block_size

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def finish(self, req: Request, reason: FinishReason, error: str | None = None) -> None:
        """Finish a request in any state; its blocks go back to the pool at once (full ones stay
        cached)."""
        if req.finished:
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        elif req in self.warming:
            self.warming.remove(req)
        self.release(req)
        req.status, req.finish_reason, req.error = RequestStatus.FINISHED, reason, error
        req.metrics.finish_time = time.perf_counter()
        if reason == FinishReason.ABORT:
            self.stats.num_aborted += 1
        elif reason == FinishReason.DEADLINE:
            self.stats.num_deadline_expired += 1

    def release(self, req: Request) -> None:
        self.pool.free(req.block_ids)
        req.block_ids, req.num_computed_tokens, req.num_registered_blocks = [], 0, 0

    def queue_warm_up(self, request_id: str, prompt_token_ids: list[int], session_id: str | None,
                      cache_salt: str | None, tenant: str | None) -> None:
        """Queue a warm-up of the prompt's full blocks (_warm_ups.py), unless a newer request of its
        session is in (it computes them itself); the session's older warm-up ends."""
        full = len(prompt_token_ids) // self.block_size * self.block_size
        newer = any(r.session_id == session_id and not r.warmup and r.request_id != request_id
                    for r in (*self.waiting, *self.running))
        if session_id is None or full == 0 or newer:
            return
        self.end_warm_up(session_id)
        for dropped in self.warming.add(
                Request(f"{request_id}/warm", list(prompt_token_ids[:full]),
                        SamplingParams(max_tokens=1, temperature=0), frozenset(), 1, None,
                        RequestMetrics(arrival_time=time.perf_counter()), session_id,
                        cache_salt=cache_salt, tenant=tenant, warmup=True)):
            self.finish(dropped, FinishReason.ABORT)  # over a bound: it never computes

    def end_warm_up(self, session_id: str | None) -> None:
        """The session's warm-up, queued or running, ends: its next request (or warm-up) came."""
        queued = self.warming.of_session(session_id)
        for w in [r for r in self.running if r.warmup and r.session_id == session_id
                  ] + ([queued] if queued else []):
            self.finish(w, FinishReason.ABORT)
