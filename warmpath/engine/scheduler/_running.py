"""Running requests: each gets its next decode token (with guesses to verify) or its next prompt
chunk, growing its blocks, and preempting the newest requests (warm-ups first) by recompute when
blocks run out."""

from __future__ import annotations

import logging
from collections.abc import Callable

from warmpath.engine.request import FinishReason, Request, RequestStatus
from warmpath.engine.scheduler._state import SchedulerState
from warmpath.engine.scheduler._tier_reads import TierReads
from warmpath.engine.scheduler.batch import ScheduledChunk, StepBatch

log = logging.getLogger("warmpath.engine.scheduler")


def step_running(state: SchedulerState, tiers: TierReads, out: StepBatch, budget: int, reserve: int,
                 cap: Callable[[Request], int]) -> int:
    """One decode token each, or the next chunk of an unfinished prefill (warm-ups are left to the
    warm-up step); a prompt chunk leaves `reserve` of the budget to an admissible waiting request.
    Returns the budget left."""
    i = 0
    while i < len(state.running) and budget > 0:
        req = state.running[i]
        if req.restoring and not req.warmup and tiers.read(req, state):
            # the tier holds more: read next step
            i += 1
            continue
        left = req.num_tokens - req.num_computed_tokens
        if req.warmup or (left > 1 and budget <= reserve):
            i += 1
            continue
        n = min(left, budget if left == 1 else budget - reserve, cap(req))
        drafts = _drafts(state, req, n, budget)
        if not grow(state, req, n + drafts, out):
            break  # req itself was preempted (it was the newest): nothing after it runs either
        req.restoring = False
        out.chunks.append(
            ScheduledChunk(req, n + drafts, req.num_computed_tokens + n == req.num_tokens, drafts))
        budget -= n + drafts
        i += 1
    return budget


def _drafts(state: SchedulerState, req: Request, n: int, budget: int) -> int:
    """How many of a decode's guessed tokens to verify this step: what the budget and the free
    blocks allow (guesses never preempt anyone)."""
    if not req.draft_token_ids or n != 1 or not req.decoding:
        return 0
    k = min(len(req.draft_token_ids), budget - 1)
    have = len(req.block_ids) + state.pool.num_free
    while k and state.blocks_for(req.num_computed_tokens + 1 + k) > have:
        k -= 1
    return k


def grow(state: SchedulerState, req: Request, n: int, out: StepBatch) -> bool:
    """Make req's blocks cover n more tokens, preempting the newest running requests if needed.
    False when req itself had to be preempted."""
    need = state.blocks_for(req.num_computed_tokens + n) - len(req.block_ids)
    while need > state.pool.num_free:
        # warm-ups go first
        victim = next((r for r in reversed(state.running) if r.warmup), state.running[-1])
        if victim is req and len(state.running) == 1:
            # Alone and still no room: it can never finish in this pool.
            state.finish(
                req, FinishReason.ERROR, f"request grew to {req.num_tokens} tokens; the KV pool "
                f"holds {state.pool.num_blocks * state.block_size}")
            out.finished.append(req)
            return False
        _preempt(state, victim, out)
        if victim is req:
            return False
    if need > 0:
        req.block_ids += state.pool.allocate(need)
    return True


def _preempt(state: SchedulerState, req: Request, out: StepBatch) -> None:
    out.chunks = [c for c in out.chunks if c.request is not req]
    if req.warmup:  # nobody waits for it: dropped, not queued again (its full blocks stay cached)
        state.finish(req, FinishReason.ABORT)
        return
    state.running.remove(req)
    state.release(req)
    req.status = RequestStatus.PREEMPTED
    req.num_preemptions += 1
    state.waiting.appendleft(req)
    out.preempted.append(req)
    state.stats.num_preemptions += 1
    log.warning(
        "preempted request %s (%d tokens, recompute from the prefix cache); %d preemptions so far, "
        "%d running, %d waiting, %d/%d blocks free",
        req.request_id, req.num_tokens, state.stats.num_preemptions, len(state.running),
        len(state.waiting), state.pool.num_free, state.pool.num_blocks)
