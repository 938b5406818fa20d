"""Admission: waiting requests join the running ones first come, first served (preempted ones are at
the front), each with its prefix-cache hit, the blocks the KV tier gives back, and a first chunk of
what the budget leaves; a cold FIM prompt that cannot answer in time, with its short context
(_short_context.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from warmpath.engine.request import FinishReason, Request, RequestStatus
from warmpath.engine.scheduler._short_context import choose_context
from warmpath.engine.scheduler._state import SchedulerState
from warmpath.engine.scheduler._tier_reads import TierReads
from warmpath.engine.scheduler.batch import ScheduledChunk, StepBatch

if TYPE_CHECKING:
    from warmpath.engine.scheduler._warm_up_queue import WarmUps


def admit_waiting(state: SchedulerState, tiers: TierReads, out: StepBatch, budget: int,
                  max_num_seqs: int, cap: Callable[[Request], int], now: float) -> int:
    """Admit waiting requests while the budget, the sequence limit and the blocks allow; returns the
    budget left. Not in a step that had to preempt: blocks are short, admitting would only
    thrash."""
    while not out.preempted and state.waiting and budget > 0 and len(state.running) < max_num_seqs:
        req = state.waiting[0]
        choose_context(state, tiers, req, now, cap(req))
        if state.blocks_for(req.num_tokens + 1) > state.pool.num_blocks:
            state.finish(
                req, FinishReason.ERROR,
                f"request needs {state.blocks_for(req.num_tokens + 1)} KV blocks; "
                f"the pool has {state.pool.num_blocks} in all")
            out.finished.append(req)
            continue
        if not admit(state, tiers, req, min(budget, cap(req)), out):
            warm = next((r for r in reversed(state.running) if r.warmup), None)
            if warm is None:
                break  # head of line does not fit yet: keep FCFS order, wait for blocks
            # a warm-up's blocks go back before anyone waits for them
            state.finish(warm, FinishReason.ABORT)
            continue
        budget -= out.chunks[-1].num_tokens if out.chunks and out.chunks[-1].request is req else 0
    return budget


def admit(state: SchedulerState, tiers: TierReads, req: Request, budget: int, out: StepBatch,
          queue: WarmUps | None = None) -> bool:
    """Move req from the waiting queue (or `queue`) to the running requests if its blocks fit; False
    if not."""
    bs, pool, tokens = state.block_size, state.pool, req.all_token_ids
    req.block_hashes = pool.hashes(tokens, req.block_hashes, req.cache_salt)
    # At least the last token is always computed: its logits give the next token.
    usable = req.block_hashes[: (req.num_tokens - 1) // bs]
    hit = pool.find_cached_prefix(tokens, usable)
    chain = tiers.chain(usable, len(hit))
    kept = min(chain, tiers.left)  # read back now; the rest of the chain in the next steps
    num_cached = (len(hit) + kept) * bs
    n = 0 if kept < chain else min(req.num_tokens - num_cached, budget)
    need = state.blocks_for(num_cached + n) - len(hit)
    if need > pool.num_free - pool.num_evictable_among(hit):
        return False
    pool.touch(hit)
    req.block_ids, req.num_registered_blocks = hit, len(hit)
    req.num_computed_tokens = len(hit) * bs
    if req.num_cached_tokens < 0:  # first admission: what the prefix cache saved this prompt
        req.num_cached_tokens, req.restoring = req.num_computed_tokens, True
        if not req.warmup:
            state.stats.prefix_cache_queried_tokens += req.num_tokens
            state.stats.prefix_cache_hit_tokens += req.num_computed_tokens
    more = tiers.read(req, state) if kept else False
    (state.waiting if queue is None else queue).remove(req)
    state.running.append(req)
    req.status = RequestStatus.RUNNING
    n = min(req.num_tokens - req.num_computed_tokens, budget)
    need = state.blocks_for(req.num_computed_tokens + n) - len(req.block_ids)
    if not more and need <= pool.num_free:
        # (restored blocks enter the pool's cache after the step)
        req.block_ids += pool.allocate(need)
        req.restoring = False
        out.chunks.append(ScheduledChunk(req, n, req.num_computed_tokens + n == req.num_tokens))
    # else it reads on, or computes from a bad block on, in the next step's running requests
    return True
