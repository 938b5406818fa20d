"""The Scheduler: one step's batch under a token budget, and the only owner of the requests' queues.
Each step: late requests finish (engine/deadline.py); running requests get a decode token or their
next prompt chunk (_running.py: grow, preempt); waiting ones are admitted first come, first served
(_admission.py), reading cached prefixes back from the KV tier where that pays (_tier_reads.py); an
idle step computes warm-ups (_warm_ups.py). Prompt chunks are kept short while another session is
quick (_pacing.py), at the cost StepCost measures.

It knows requests, tokens and blocks; it never touches tensors, so the simulator drives it with a
cost model instead of a model, through the same methods and hooks as the engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from warmpath.config import SchedulerConfig
from warmpath.engine.block_pool import BlockPool
from warmpath.engine.deadline import is_late
from warmpath.engine.kv_tier import KVTier
from warmpath.engine.request import FinishReason, Request
from warmpath.engine.scheduler._admission import admit_waiting
from warmpath.engine.scheduler._pacing import Pacing
from warmpath.engine.scheduler._running import step_running
from warmpath.engine.scheduler._state import SchedulerState
from warmpath.engine.scheduler._tier_reads import TierReads
from warmpath.engine.scheduler._warm_up_queue import WarmUps
from warmpath.engine.scheduler._warm_ups import step_warm_ups
from warmpath.engine.scheduler.batch import SchedulerStats, StepBatch
from warmpath.engine.step_cost import StepCost


class Scheduler:
    def __init__(self, config: SchedulerConfig, pool: BlockPool, cost: StepCost | None = None,
                 tier: KVTier | None = None, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self._clock = clock  # the deadlines' and the pacing's time (the simulator's is virtual)
        self.stats = SchedulerStats()
        warming = WarmUps(config.warm_up_tokens_per_tenant, config.warm_up_tokens, self.stats)
        self._state = SchedulerState(pool, warming, self.stats)
        cost = cost or StepCost()
        self._pacing = Pacing(config.step_target_ms, pool.block_size, cost)
        self._tiers = TierReads(tier, cost, config.step_target_ms)
        self._listeners: list[Callable[[StepBatch], None]] = []

    # -- what others may read ----------------------------------------------------------------------
    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    @property
    def latency_chunk(self) -> int | None:
        """A prompt chunk's most tokens while another session is quick (None: chunks fill the
        budget)."""
        return self._pacing.latency_chunk

    def running_requests(self) -> tuple[Request, ...]:
        return tuple(self._state.running)

    def waiting_requests(self) -> tuple[Request, ...]:
        return tuple(self._state.waiting)

    def queued_warm_ups(self) -> tuple[Request, ...]:
        return tuple(self._state.warming)

    @property
    def num_running(self) -> int:
        return len(self._state.running)

    @property
    def num_waiting(self) -> int:
        return len(self._state.waiting)

    @property
    def warm_up_tokens(self) -> int:
        return self._state.warming.tokens

    def prompt_left(self) -> tuple[int, ...]:
        """Prompt tokens still to compute, per waiting or running request (warm-ups yield to
        everyone: not counted)."""
        return tuple(r.num_tokens - r.num_computed_tokens - 1
                     for r in (*self._state.waiting, *self._state.running) if not r.warmup)

    def quick_until(self) -> float:
        """Until when (on self.clock) prompt chunks stay paced if nothing else happens
        (AsyncEngine.estimate_wait)."""
        return self._pacing.quick_until(self._state.running)

    def has_unfinished(self) -> bool:
        s = self._state
        return bool(s.waiting or s.running or s.warming)

    def only_warm_ups(self) -> bool:
        """Nothing but warm-ups to compute: no request waits or runs for a client."""
        s = self._state
        return not s.waiting and all(r.warmup for r in s.running)

    def add_listener(self, listener: Callable[[StepBatch], None]) -> None:
        """Called with each step's batch as it is planned, before the model runs (the simulator's
        calibration)."""
        self._listeners.append(listener)

    # -- requests in and out -----------------------------------------------------------------------
    def add(self, req: Request) -> None:
        self._state.waiting.append(req)
        self._state.end_warm_up(req.session_id)  # what it computed stays cached for this one
        req.block_hashes = self.note_arrival(req.session_id, req.prompt_token_ids, req.cache_salt)

    def note_arrival(self, session_id: str | None, token_ids: list[int],
                     cache_salt: str | None) -> list[bytes]:
        """A request of session came (admitted later, or refused unrun by the server): pacing learns
        whether it is quick. Returns the prompt's block hashes (the admission reuses them)."""
        pool = self._state.pool
        hashes = pool.hashes(token_ids, None, cache_salt)
        cached = len(pool.find_cached_prefix(token_ids, hashes)) * pool.block_size
        self._pacing.note(session_id, len(token_ids) - cached, self._clock())
        return hashes

    def warm_up(self, request_id: str, prompt_token_ids: list[int], session_id: str | None,
                cache_salt: str | None = None, tenant: str | None = None) -> None:
        """Compute a session's prompt's full blocks at the lowest priority for its next keystroke
        (_warm_ups.py): a request left mid-prompt or refused unrun (the server). The session's next
        request (or warm-up) ends it."""
        if self.config.warm_late_prompts:
            self._state.queue_warm_up(request_id, prompt_token_ids, session_id, cache_salt, tenant)

    def abort(self, req: Request) -> None:
        """The client gave up on req: late (past its deadline), or stale (its developer typed again,
        or the editor's own first-token deadline passed). Either way its prompt computes on: the
        session's next keystroke shares all of it but its end, so that is the work it needs first,
        done before it comes, in nobody's way."""
        late = is_late(req, self._clock(), bool(req.output_token_ids))
        self._expire(req, FinishReason.DEADLINE if late else FinishReason.ABORT)

    def finish(self, req: Request, reason: FinishReason, error: str | None = None) -> None:
        """Finish a request in any state; its blocks go back to the pool at once (full ones stay
        cached)."""
        self._state.finish(req, reason, error)

    def _expire(self, req: Request, reason: FinishReason = FinishReason.DEADLINE) -> None:
        """Finish a request; one still in its prompt leaves a warm-up behind until its session's
        next request."""
        full = len(req.prompt_token_ids) // self._state.block_size * self._state.block_size
        if not req.warmup and not req.output_token_ids and req.num_computed_tokens < full - 1:
            self.warm_up(req.request_id, req.prompt_token_ids, req.session_id, req.cache_salt,
                         req.tenant)
        self.finish(req, reason)

    # -- the batch ---------------------------------------------------------------------------------
    def schedule(self) -> StepBatch:
        state, out, now = self._state, StepBatch(), self._clock()
        for req in [
                r for r in (*state.running, *state.waiting)
                if is_late(r, now, bool(r.output_token_ids))
        ]:
            self._expire(req)
            out.finished.append(req)
        budget, max_seqs = self.config.max_num_batched_tokens, self.config.max_num_seqs
        # Others in the engine: prompt chunks kept to a short step, so whoever arrives next waits
        # little.
        quick = self._pacing.quick_sessions(now, state.running)
        chunk = self._pacing.latency_chunk

        def cap(req: Request) -> int:
            # another quick session may send a keystroke mid-step: keep it short
            return chunk if chunk is not None and quick - {req.session_id} else budget
        # A long prompt running leaves a chunk of the budget (half at most) to a request waiting
        # that could be admitted, so a keystroke is not starved behind it.
        admissible = len(state.running) < max_seqs and any(not r.warmup for r in state.waiting)
        reserve = min(chunk, budget // 2) if chunk is not None and admissible else 0
        self._tiers.begin_step(bool(quick), len(state.pool.free_queue), state.block_size)

        budget = step_running(state, self._tiers, out, budget, reserve, cap)
        budget = admit_waiting(state, self._tiers, out, budget, max_seqs, cap, now)
        step_warm_ups(state, self._tiers, out, budget, chunk, max_seqs)
        for listener in self._listeners:
            listener(out)
        return out

    # -- after the model ran -----------------------------------------------------------------------
    def update(self, out: StepBatch, sampled: list[list[int]]) -> list[Request]:
        """Advance the scheduled requests by what was computed and sampled (per sampling chunk, in
        order: one token, or for a verified decode the tokens kept, the model's own after the last
        accepted guess); returns those that finished. A verified decode keeps K/V only for its
        accepted tokens: num_computed_tokens ends there, blocks beyond what the next token needs go
        back, and no block holding a rejected guess's K/V is entered in the prefix cache (only
        blocks full of computed tokens are)."""
        finished, taken, now = [], iter(sampled), time.perf_counter()
        pool, bs = self._state.pool, self._state.block_size
        for c in out.chunks:
            req = c.request
            self.stats.num_computed_tokens += c.num_tokens
            reason = None
            if c.sample:
                kept, reason = _append(req, next(taken), now)
                # a verified decode computed its last token and the guesses it kept: all but the
                # newest output
                req.num_computed_tokens += kept if c.num_drafts else c.num_tokens
            else:
                req.num_computed_tokens += c.num_tokens
            if c.num_drafts:
                self._trim_blocks(req)
            # Blocks now full of computed tokens become reusable prefix.
            full = req.num_computed_tokens // bs
            if full > req.num_registered_blocks:
                if len(req.block_hashes) < full:
                    req.block_hashes = pool.hashes(req.all_token_ids[:full * bs], req.block_hashes,
                                                   req.cache_salt)
                pool.cache_blocks(req.block_ids, req.all_token_ids, req.block_hashes[:full],
                                  req.num_registered_blocks)
                req.num_registered_blocks = full
            if reason is not None:
                self.finish(req, reason)
                finished.append(req)
        return finished

    def _trim_blocks(self, req: Request) -> None:
        """Blocks allocated for rejected guesses only go back to the pool."""
        keep = self._state.blocks_for(req.num_computed_tokens + 1)
        if len(req.block_ids) > keep:
            self._state.pool.free(req.block_ids[keep:])
            req.block_ids = req.block_ids[:keep]


def _append(req: Request, tokens: list[int], now: float) -> tuple[int, FinishReason | None]:
    """Append sampled tokens up to a stop token or max_tokens; how many were kept, and why to
    finish."""
    kept, reason = 0, None
    for tok in tokens:
        req.output_token_ids.append(tok)
        kept += 1
        if tok in req.stop_token_ids:
            reason = FinishReason.STOP
        elif len(req.output_token_ids) >= req.max_tokens:
            reason = FinishReason.LENGTH
        else:
            continue
        break
    req.metrics.num_output_tokens = len(req.output_token_ids)
    req.metrics.first_token_time = req.metrics.first_token_time or now
    return kept, reason
