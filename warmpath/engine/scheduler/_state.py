"""The scheduler's state: its queues, the block pool and the counters. Owned by Scheduler; its
managers (the other private modules of this package) change it, nothing outside the package does."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from warmpath.engine.block_pool import BlockPool
from warmpath.engine.request import FinishReason, Request, RequestStatus
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
