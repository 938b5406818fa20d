"""A cold file answered at once: a request whose whole prompt cannot give a first token by its
short context's `by` (the prefix cache and the KV tier hold too little of it) is answered from that
short context instead, and its whole prompt computes on as its session's warm-up, so a later
keystroke finds it cached and is answered from the whole file. Decided once, at the request's first
admission, from what is cached then and what a step costs (StepCost)."""

from __future__ import annotations

import math

from warmpath.engine.deadline import expires_at
from warmpath.engine.request import Request
from warmpath.engine.scheduler._state import SchedulerState
from warmpath.engine.scheduler._tier_reads import TierReads


def choose_context(state: SchedulerState, tiers: TierReads, req: Request, now: float,
                   chunk: int) -> bool:
    """At req's first admission: swap its prompt for its short context (req.short) when the whole
    prompt's uncached tokens, chunks of at most `chunk` beside the prompts running, would give the
    first token after `by` (or the request's own deadline) and the short one computes a block
    less at least; the whole prompt is queued as the session's warm-up. Whether it swapped."""
    short, req.short = req.short, None
    if short is None or req.num_cached_tokens >= 0 or req.output_token_ids:
        return False
    by = min(short.by, expires_at(req, False) or math.inf)
    left = _uncached(state, tiers, req.prompt_token_ids, req.block_hashes, req.cache_salt)
    ahead = sum(r.num_tokens - r.num_computed_tokens - 1 for r in state.running
                if not r.warmup and not r.output_token_ids)
    first_token = now + tiers.cost.seconds(left + ahead, max(1, math.ceil(left / max(1, chunk))))
    saved = left - _uncached(state, tiers, short.token_ids, [], req.cache_salt)
    if first_token <= by or saved < state.block_size:  # a block or less: no time to speak of
        return False
    state.queue_warm_up(req.request_id, req.prompt_token_ids, req.session_id, req.cache_salt,
                        req.tenant)
    req.prompt_token_ids, req.block_hashes = list(short.token_ids), []
    return True


def _uncached(state: SchedulerState, tiers: TierReads, tokens: list[int], hashes: list[bytes],
              salt: str | None) -> int:
    """The prompt tokens neither the prefix cache nor the KV tier holds."""
    pool, bs = state.pool, state.block_size
    usable = pool.hashes(tokens, hashes, salt)[: (len(tokens) - 1) // bs]
    hit = len(pool.find_cached_prefix(tokens, usable))
    return len(tokens) - (hit + tiers.chain(usable, hit)) * bs
