"""One step's plan under a token budget: deadlines, running requests first, then FCFS admission with
chunked prefill, and preemption by recompute when blocks run out.

The scheduler knows requests, tokens and blocks; it never touches tensors, so the simulator can drive it
with a cost model instead of a model.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from warmpath.config import SchedulerConfig
from warmpath.engine.block_pool import BlockPool
from warmpath.engine.kv_tier import KVTier, held_in_a_row
from warmpath.engine.request import FinishReason, Request, RequestMetrics, RequestStatus, SamplingParams
from warmpath.engine.step_plan import ScheduledChunk, SchedulerOutput, SchedulerStats
from warmpath.engine.warmups import WarmUps

log = logging.getLogger(__name__)
ACTIVE_S = 5.0  # a session that sent a request this recently is still typing (bursts: a request every ~1-2 s)
QUICK_CHUNKS = 4  # a request needing more paced chunks than this misses an editor's deadline anyway: not "quick"


class Scheduler:
    def __init__(self, config: SchedulerConfig, pool: BlockPool):
        self.config = config
        self.pool = pool
        self.block_size = pool.block_size
        self.waiting: deque[Request] = deque()
        self.warming = WarmUps(config.warm_up_tokens_per_tenant, config.warm_up_tokens)  # not admitted yet, bounded
        self.running: list[Request] = []  # in admission order: the last one is preempted first
        self.stats = SchedulerStats()
        self.clock = time.monotonic
        self.seconds_per_token: float | None = None  # of prompt-heavy steps, measured (observe)
        self.latency_chunk: int | None = None  # a prompt chunk's most tokens while others are in (None: budget)
        self.quick_seen: dict[str | None, float] = {}  # session -> when a quick request of it came
        self.tier: KVTier | None = None  # blocks evicted from the pool, or from before a restart
        self._restore_left, self._tier_pays = 0, True  # blocks this step may still read back; whether reading pays

    def observe(self, num_tokens: int, seconds: float) -> None:
        """A step's measured time. From steps of 32+ tokens: what a token costs on this machine and model, and so
        latency_chunk, the chunk a step of about config.step_target_ms holds (a block at least)."""
        if num_tokens < 32 or not self.config.step_target_ms:
            return
        per = seconds / num_tokens
        self.seconds_per_token = per if self.seconds_per_token is None else 0.8 * self.seconds_per_token + 0.2 * per
        chunk = int(self.config.step_target_ms / 1000 / self.seconds_per_token) // self.block_size * self.block_size
        self.latency_chunk = max(self.block_size, chunk)

    # -- requests in and out -------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        self.waiting.append(req)
        self._end_warm_up(req.session_id)  # what it computed stays cached for this one
        req.block_hashes = self.note_arrival(req.session_id, req.prompt_token_ids, req.cache_salt)

    def note_arrival(self, session_id: str | None, token_ids: list[int], cache_salt: str | None) -> list[bytes]:
        """A request of session came (admitted later, or refused unrun by the server): the session is quick if the
        prefix cache leaves it a few chunks to compute at most, and from this step on the others' prompt chunks
        are kept short for it. Returns the prompt's block hashes (the admission reuses them)."""
        hashes = self.pool.hashes(token_ids, None, cache_salt)
        chunk, now = self.latency_chunk, self.clock()
        cached = len(self.pool.find_cached_prefix(token_ids, hashes)) * self.block_size
        self.quick_seen = {s: t for s, t in self.quick_seen.items() if now - t < ACTIVE_S and s != session_id}
        if chunk is not None and len(token_ids) - cached <= QUICK_CHUNKS * chunk:
            self.quick_seen[session_id] = now
        return hashes

    def quick_sessions(self) -> set[str | None]:
        """The sessions a long prompt chunk would hold up: those decoding now, and those whose last request (in the
        last ACTIVE_S) came needing a few chunks at most beyond the prefix cache (note_arrival()): still typing,
        each keystroke answered in a short step if it does not wait behind a long one. Chunks are kept short only
        for their sake: cold sessions alone gain nothing from it (every step costs its fixed part too)."""
        now = self.clock()
        return {s for s, t in self.quick_seen.items() if now - t < ACTIVE_S} | \
            {r.session_id for r in self.running if r.output_token_ids and not r.warmup}

    def quick_until(self) -> float:
        """Until when (on self.clock) quick_sessions() stays non-empty if nothing else happens: for a reader that
        holds a snapshot of this moment (AsyncEngine.estimate_wait)."""
        if any(r.output_token_ids and not r.warmup for r in self.running):
            return float("inf")
        return max((t + ACTIVE_S for t in self.quick_seen.values()), default=float("-inf"))

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.warming)

    def expire(self, req: Request, reason: FinishReason = FinishReason.DEADLINE) -> None:
        """Finish a request past its deadline (or one its client left: abort()). A session's request still in its
        prompt leaves a warm-up behind (warm_up()) until the session's next request comes."""
        full = len(req.prompt_token_ids) // self.block_size * self.block_size
        if not req.warmup and not req.output_token_ids and req.num_computed_tokens < full - 1:
            self.warm_up(req.request_id, req.prompt_token_ids, req.session_id, req.cache_salt, req.tenant)
        self.finish(req, reason)

    def warm_up(self, request_id: str, prompt_token_ids: list[int], session_id: str | None,
                cache_salt: str | None = None, tenant: str | None = None) -> None:
        """Compute a session's prompt's full blocks at the lowest priority, reported to nobody and never counted in
        the cache statistics, for its next keystroke: a request left mid-prompt (expire()) or refused unrun (the
        server). The session's next request (or warm-up) ends it; one already in computes it itself."""
        full = len(prompt_token_ids) // self.block_size * self.block_size
        newer = any(r.session_id == session_id and not r.warmup and r.request_id != request_id
                    for r in (*self.waiting, *self.running))
        if not self.config.warm_late_prompts or session_id is None or full == 0 or newer:
            return
        self._end_warm_up(session_id)
        for dropped in self.warming.add(Request(f"{request_id}/warm", list(prompt_token_ids[:full]),
                                                SamplingParams(max_tokens=1, temperature=0), frozenset(), 1, None,
                                                RequestMetrics(arrival_time=time.perf_counter()), session_id,
                                                cache_salt=cache_salt, tenant=tenant, warmup=True)):
            self.finish(dropped, FinishReason.ABORT)  # over a bound (WarmUps): it never computes

    def _end_warm_up(self, session_id: str | None) -> None:
        queued = self.warming.of_session(session_id)
        for w in [r for r in self.running if r.warmup and r.session_id == session_id] + ([queued] if queued else []):
            self.finish(w, FinishReason.ABORT)

    def abort(self, req: Request) -> None:
        """The client gave up on req: late (past its deadline), or stale (its developer typed again, or the editor's
        own first-token deadline passed). Either way its prompt computes on (expire()): the session's next keystroke
        shares all of it but its end, so that is the work it needs first, done before it comes, in nobody's way."""
        late = req.expires_at is not None and self.clock() >= req.expires_at
        self.expire(req, FinishReason.DEADLINE if late else FinishReason.ABORT)

    def finish(self, req: Request, reason: FinishReason, error: str | None = None) -> None:
        """Finish a request in any state; its blocks go back to the pool at once (full ones stay cached)."""
        if req.finished:
            return
        for queue in (self.running, self.waiting, self.warming):
            if req in queue:
                queue.remove(req)
                break
        self._release(req)
        req.status, req.finish_reason, req.error = RequestStatus.FINISHED, reason, error
        req.metrics.finish_time = time.perf_counter()
        if reason == FinishReason.ABORT:
            self.stats.num_aborted += 1
        elif reason == FinishReason.DEADLINE:
            self.stats.num_deadline_expired += 1

    def _release(self, req: Request) -> None:
        self.pool.free(req.block_ids)
        req.block_ids, req.num_computed_tokens, req.num_registered_blocks = [], 0, 0

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- the plan ------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        now = self.clock()
        for req in [r for r in (*self.running, *self.waiting) if r.expires_at is not None and now >= r.expires_at]:
            self.expire(req)
            out.finished.append(req)
        budget = self.config.max_num_batched_tokens
        # Others in the engine: prompt chunks kept to a short step, so whoever arrives next waits little.
        quick = self.quick_sessions()
        chunk = self.latency_chunk

        def cap(req: Request) -> int:  # another quick session may send a keystroke mid-step: keep it short
            return chunk if chunk is not None and quick - {req.session_id} else budget
        # A long prompt running leaves a chunk of the budget (half at most) to a request waiting that could be
        # admitted, so a keystroke is not starved behind it.
        admissible = len(self.running) < self.config.max_num_seqs and any(not r.warmup for r in self.waiting)
        reserve = min(chunk, budget // 2) if chunk is not None and admissible else 0
        # Reading a prefix back from the KV tier, where that is cheaper than computing it (a fast accelerator may
        # compute faster than its disk reads): while others are quick, as much as a paced step's time allows.
        per_block = getattr(self.tier, "seconds_per_block", None)
        self._tier_pays = per_block is None or self.seconds_per_token is None or \
            per_block < self.block_size * self.seconds_per_token
        self._restore_left = len(self.pool.free_queue) if not (quick and per_block) else \
            max(1, int(self.config.step_target_ms / 1000 / per_block))

        # 1. Running requests: one decode token each, or the next chunk of an unfinished prefill.
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if req.restoring and not req.warmup and self._from_tier(req):  # the tier holds more: read next step
                i += 1
                continue
            left = req.num_tokens - req.num_computed_tokens
            if req.warmup or (left > 1 and budget <= reserve):  # warm-ups after everyone else (3.)
                i += 1
                continue
            n = min(left, budget if left == 1 else budget - reserve, cap(req))
            drafts = self._drafts(req, n, budget)
            if not self._grow(req, n + drafts, out):
                break  # req itself was preempted (it was the newest): nothing after it runs either
            req.restoring = False
            out.chunks.append(ScheduledChunk(req, n + drafts, req.num_computed_tokens + n == req.num_tokens, drafts))
            budget -= n + drafts
            i += 1

        # 2. Waiting requests, FCFS (preempted ones are at the front), chunked to what is left of the budget.
        # Not in a step that had to preempt: blocks are short, admitting would only thrash.
        while not out.preempted and self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            if self._blocks_for(req.num_tokens + 1) > self.pool.num_blocks:
                self.finish(req, FinishReason.ERROR,
                            f"request needs {self._blocks_for(req.num_tokens + 1)} KV blocks; the pool has "
                            f"{self.pool.num_blocks} in all")
                out.finished.append(req)
                continue
            if not self._admit(req, min(budget, cap(req)), out):
                warm = next((r for r in reversed(self.running) if r.warmup), None)
                if warm is None:
                    break  # head of line does not fit yet: keep FCFS order, wait for blocks
                self.finish(warm, FinishReason.ABORT)  # a warm-up's blocks go back before anyone waits for them
                continue
            budget -= out.chunks[-1].num_tokens if out.chunks and out.chunks[-1].request is req else 0

        # 3. Warm-ups, only in a step with nothing else and a paced chunk at most: they never lengthen anyone's step.
        # The one with the fewest tokens left first: its developer is answered soonest (shortest remaining first).
        budget = 0 if out.chunks else budget if chunk is None else min(budget, chunk)
        for req in sorted((r for r in self.running if r.warmup), key=lambda r: r.num_tokens - r.num_computed_tokens):
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            need = self._blocks_for(req.num_computed_tokens + n) - len(req.block_ids)
            if out.preempted or n <= 0:
                break
            if need > self.pool.num_free:  # a warm-up never preempts anyone, nor holds blocks it cannot grow
                self.finish(req, FinishReason.ABORT)
                continue
            req.block_ids += self.pool.allocate(need) if need > 0 else []
            out.chunks.append(ScheduledChunk(req, n, req.num_computed_tokens + n == req.num_tokens))
            budget -= n
        if self.warming and not out.preempted and not self.waiting and budget > 0 \
                and len(self.running) < self.config.max_num_seqs:
            warm = min(self.warming, key=lambda r: r.num_tokens)
            if not self._admit(warm, budget, out, self.warming):
                self.finish(warm, FinishReason.ABORT)  # a warm-up never waits for blocks
        return out

    def _drafts(self, req: Request, n: int, budget: int) -> int:
        """How many of a decode's guessed tokens to verify this step: what the budget and the free blocks allow
        (guesses never preempt anyone)."""
        if not req.draft_token_ids or n != 1 or not req.decoding:
            return 0
        k = min(len(req.draft_token_ids), budget - 1)
        have = len(req.block_ids) + self.pool.num_free
        while k and self._blocks_for(req.num_computed_tokens + 1 + k) > have:
            k -= 1
        return k

    def _grow(self, req: Request, n: int, out: SchedulerOutput) -> bool:
        """Make req's blocks cover n more tokens, preempting the newest running requests if needed.
        False when req itself had to be preempted."""
        need = self._blocks_for(req.num_computed_tokens + n) - len(req.block_ids)
        while need > self.pool.num_free:
            victim = next((r for r in reversed(self.running) if r.warmup), self.running[-1])  # warm-ups go first
            if victim is req and len(self.running) == 1:
                # Alone and still no room: it can never finish in this pool.
                self.finish(req, FinishReason.ERROR, f"request grew to {req.num_tokens} tokens; the KV pool "
                            f"holds {self.pool.num_blocks * self.block_size}")
                out.finished.append(req)
                return False
            self._preempt(victim, out)
            if victim is req:
                return False
        if need > 0:
            req.block_ids += self.pool.allocate(need)
        return True

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        if req.warmup:  # nobody waits for it: dropped, not queued again (its full blocks stay cached)
            out.chunks = [c for c in out.chunks if c.request is not req]
            self.finish(req, FinishReason.ABORT)
            return
        self.running.remove(req)
        out.chunks = [c for c in out.chunks if c.request is not req]
        self._release(req)
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.waiting.appendleft(req)
        out.preempted.append(req)
        self.stats.num_preemptions += 1
        log.warning("preempted request %s (%d tokens, recompute from the prefix cache); %d preemptions so far, "
                    "%d running, %d waiting, %d/%d blocks free", req.request_id, req.num_tokens,
                    self.stats.num_preemptions, len(self.running), len(self.waiting), self.pool.num_free,
                    self.pool.num_blocks)

    def _admit(self, req: Request, budget: int, out: SchedulerOutput, queue: WarmUps | None = None) -> bool:
        tokens = req.all_token_ids
        req.block_hashes = self.pool.hashes(tokens, req.block_hashes, req.cache_salt)
        # At least the last token is always computed: its logits give the next token.
        usable = req.block_hashes[: (req.num_tokens - 1) // self.block_size]
        hit = self.pool.find_cached_prefix(tokens, usable)
        chain = held_in_a_row(self.tier, usable, len(hit)) if self._tier_pays else 0
        kept = min(chain, self._restore_left)  # read back now; the rest of the chain in the next steps
        num_cached = (len(hit) + kept) * self.block_size
        n = 0 if kept < chain else min(req.num_tokens - num_cached, budget)
        need = self._blocks_for(num_cached + n) - len(hit)
        if need > self.pool.num_free - self.pool.num_evictable_among(hit):
            return False
        self.pool.touch(hit)
        req.block_ids, req.num_registered_blocks = hit, len(hit)
        req.num_computed_tokens = len(hit) * self.block_size
        if req.num_cached_tokens < 0:  # first admission: what the prefix cache saved this prompt
            req.num_cached_tokens, req.restoring = req.num_computed_tokens, True
            if not req.warmup:
                self.stats.prefix_cache_queried_tokens += req.num_tokens
                self.stats.prefix_cache_hit_tokens += req.num_computed_tokens
        more = self._from_tier(req) if kept else False
        (self.waiting if queue is None else queue).remove(req)
        self.running.append(req)
        req.status = RequestStatus.RUNNING
        n = min(req.num_tokens - req.num_computed_tokens, budget)
        need = self._blocks_for(req.num_computed_tokens + n) - len(req.block_ids)
        if not more and need <= self.pool.num_free:  # (restored blocks enter the pool's cache after the step)
            req.block_ids += self.pool.allocate(need)
            req.restoring = False
            out.chunks.append(ScheduledChunk(req, n, req.num_computed_tokens + n == req.num_tokens))
        return True  # else it reads on, or computes from a bad block on, in the next step's running requests

    def _from_tier(self, req: Request) -> bool:
        """Read the blocks after req's computed ones that the KV tier holds into fresh blocks, as many as this step
        allows (a block it cannot read is computed from there on); whether the tier holds more, to read next step."""
        bs, start = self.block_size, req.num_computed_tokens // self.block_size
        if req.num_computed_tokens % bs or len(req.block_ids) != start:
            return False
        usable = req.block_hashes[: (req.num_tokens - 1) // bs]
        chain = held_in_a_row(self.tier, usable, start) if self._tier_pays else 0
        take = min(chain, self._restore_left, self.pool.num_free)
        if take == 0:
            return chain > 0 and self._restore_left == 0
        fresh, tokens = self.pool.allocate(take), req.all_token_ids
        got = self.tier.restore(fresh, usable[start:start + take],
                                [tuple(tokens[i * bs:(i + 1) * bs]) for i in range(start, start + take)])
        self.pool.free(fresh[got:])
        req.block_ids += fresh[:got]
        req.num_computed_tokens += got * bs
        self._restore_left -= got
        if req.restoring:
            req.num_cached_tokens += got * bs
            req.num_tier_tokens += got * bs
            self.stats.prefix_cache_tier_hit_tokens += 0 if req.warmup else got * bs
        return got == take < chain

    # -- after the model ran ---------------------------------------------------------------------------
    def update(self, out: SchedulerOutput, sampled: list[list[int]]) -> list[Request]:
        """Advance the scheduled requests by what was computed and sampled (per sampling chunk, in order: one
        token, or for a verified decode the tokens kept, the model's own after the last accepted guess); returns
        those that finished. A verified decode keeps K/V only for its accepted tokens: num_computed_tokens ends
        there, blocks beyond what the next token needs go back, and no block holding a rejected guess's K/V is
        entered in the prefix cache (only blocks full of computed tokens are)."""
        finished = []
        taken = iter(sampled)
        now = time.perf_counter()
        for c in out.chunks:
            req = c.request
            self.stats.num_computed_tokens += c.num_tokens
            reason = None
            if c.sample:
                kept, reason = self._append(req, next(taken), now)
                # a verified decode computed its last token and the guesses it kept: all but the newest output
                req.num_computed_tokens += kept if c.num_drafts else c.num_tokens
            else:
                req.num_computed_tokens += c.num_tokens
            if c.num_drafts:
                self._trim_blocks(req)
            # Blocks now full of computed tokens become reusable prefix.
            full = req.num_computed_tokens // self.block_size
            if full > req.num_registered_blocks:
                if len(req.block_hashes) < full:
                    req.block_hashes = self.pool.hashes(req.all_token_ids[: full * self.block_size], req.block_hashes,
                                                        req.cache_salt)
                self.pool.cache_blocks(req.block_ids, req.all_token_ids, req.block_hashes[:full],
                                       req.num_registered_blocks)
                req.num_registered_blocks = full
            if reason is not None:
                self.finish(req, reason)
                finished.append(req)
        return finished

    @staticmethod
    def _append(req: Request, tokens: list[int], now: float) -> tuple[int, FinishReason | None]:
        """Append sampled tokens up to a stop token or max_tokens; how many were kept, and why to finish."""
        kept = 0
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
        else:
            reason = None
        req.metrics.num_output_tokens = len(req.output_token_ids)
        req.metrics.first_token_time = req.metrics.first_token_time or now
        return kept, reason

    def _trim_blocks(self, req: Request) -> None:
        """Blocks allocated for rejected guesses only go back to the pool."""
        keep = self._blocks_for(req.num_computed_tokens + 1)
        if len(req.block_ids) > keep:
            self.pool.free(req.block_ids[keep:])
            req.block_ids = req.block_ids[:keep]
