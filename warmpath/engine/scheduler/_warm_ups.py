"""Warm-ups: a session's prompt left mid-way (its request late, closed by its client, or refused
unrun) computed on at the lowest priority, reported to nobody and never counted in the cache
statistics, for the session's next keystroke; they run only in a step with nothing else, a paced
chunk at most, and never preempt anyone. They are queued (SchedulerState.queue_warm_up) in
WarmUps (_warm_up_queue.py), bounded in tokens per tenant and in all.
"""

from __future__ import annotations

from warmpath.engine.request import FinishReason
from warmpath.engine.scheduler._admission import admit
from warmpath.engine.scheduler._state import SchedulerState
from warmpath.engine.scheduler._tier_reads import TierReads
from warmpath.engine.scheduler.batch import ScheduledChunk, StepBatch


def step_warm_ups(state: SchedulerState, tiers: TierReads, out: StepBatch, budget: int,
                  chunk: int | None, max_num_seqs: int) -> None:
    """Warm-ups, only in a step with nothing else and a paced chunk at most: they never lengthen
    anyone's step. The one with the fewest tokens left first: its developer is answered soonest
    (shortest remaining first)."""
    budget = 0 if out.chunks else budget if chunk is None else min(budget, chunk)
    for req in sorted((r for r in state.running if r.warmup),
                      key=lambda r: r.num_tokens - r.num_computed_tokens):
        n = min(req.num_tokens - req.num_computed_tokens, budget)
        need = state.blocks_for(req.num_computed_tokens + n) - len(req.block_ids)
        if out.preempted or n <= 0:
            break
        if need > state.pool.num_free:
            # a warm-up never preempts anyone, nor holds blocks it cannot grow
            state.finish(req, FinishReason.ABORT)
            continue
        req.block_ids += state.pool.allocate(need) if need > 0 else []
        out.chunks.append(ScheduledChunk(req, n, req.num_computed_tokens + n == req.num_tokens))
        budget -= n
    if state.warming and not out.preempted and not state.waiting and budget > 0 \
            and len(state.running) < max_num_seqs:
        warm = min(state.warming, key=lambda r: r.num_tokens)
        if not admit(state, tiers, warm, budget, out, state.warming):
            state.finish(warm, FinishReason.ABORT)  # a warm-up never waits for blocks
