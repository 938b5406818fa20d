"""Warm-ups: a session's prompt left mid-way (its request late, closed by its client, or refused unrun) computed
on at the lowest priority, reported to nobody and never counted in the cache statistics, for the session's next
keystroke; they run only in a step with nothing else, a paced chunk at most, and never preempt anyone. Queued
ones wait in WarmUps, bounded in tokens per tenant and in all.

Why bounded: every request refused at its deadline, late or left by its client leaves one, and a client can send any
number of them (a new session id each time), each up to a context of tokens, all held until an idle step comes.
Past a bound the oldest warm-ups go first (the tenant's own for its bound): a developer's latest file is the one
worth warming. One queued warm-up per session (the scheduler ends a session's older one). A tenant is the request's
`tenant` (its credential's, server/tenancy.py, whatever the cache isolation: a new `cache_salt` is no new tenant);
requests with none (the offline API) are one tenant.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

from warmpath.engine.request import FinishReason, Request, RequestMetrics, SamplingParams
from warmpath.engine.scheduler._admission import admit
from warmpath.engine.scheduler._state import SchedulerState
from warmpath.engine.scheduler._tier_reads import TierReads
from warmpath.engine.scheduler.batch import ScheduledChunk, SchedulerStats, StepBatch


@dataclass
class WarmUps:
    """Queued warm-ups, oldest first; `add` keeps both bounds and returns the warm-ups it dropped (the scheduler
    finishes them: none holds blocks yet)."""

    tokens_per_tenant: int
    max_tokens: int
    stats: SchedulerStats  # its warm_ups_dropped_* counters
    tokens: int = 0  # prompt tokens held, all tenants
    _queue: OrderedDict[str, Request] = field(default_factory=OrderedDict)  # by request id, oldest first
    _by_tenant: dict[str | None, OrderedDict[str, Request]] = field(default_factory=dict)
    _tenant_tokens: dict[str | None, int] = field(default_factory=dict)
    _by_session: dict[str | None, Request] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self._queue.values()))

    def __contains__(self, req: object) -> bool:
        return isinstance(req, Request) and self._queue.get(req.request_id) is req

    def of_session(self, session_id: str | None) -> Request | None:
        return self._by_session.get(session_id)

    def tenant_tokens(self, tenant: str | None) -> int:
        return self._tenant_tokens.get(tenant, 0)

    def add(self, req: Request) -> list[Request]:
        tenant, n = req.tenant, req.num_tokens
        if n > self.tokens_per_tenant or n > self.max_tokens:  # alone over a bound: never queued
            self._count(n > self.tokens_per_tenant)
            return [req]
        dropped = []
        while self.tenant_tokens(tenant) + n > self.tokens_per_tenant:
            dropped.append(self.remove(next(iter(self._by_tenant[tenant].values()))))
            self._count(True)
        while self.tokens + n > self.max_tokens:
            dropped.append(self.remove(next(iter(self._queue.values()))))
            self._count(False)
        self._queue[req.request_id] = req
        self._by_tenant.setdefault(tenant, OrderedDict())[req.request_id] = req
        self._tenant_tokens[tenant] = self.tenant_tokens(tenant) + n
        self._by_session[req.session_id] = req
        self.tokens += n
        return dropped

    def remove(self, req: Request) -> Request:
        if self._queue.pop(req.request_id, None) is not req:
            raise ValueError(f"{req.request_id} is not a queued warm-up")
        tenant = req.tenant
        mine = self._by_tenant[tenant]
        del mine[req.request_id]
        self._tenant_tokens[tenant] -= req.num_tokens
        if not mine:
            del self._by_tenant[tenant], self._tenant_tokens[tenant]
        if self._by_session.get(req.session_id) is req:
            del self._by_session[req.session_id]
        self.tokens -= req.num_tokens
        return req

    def _count(self, tenant: bool) -> None:
        if tenant:
            self.stats.warm_ups_dropped_tenant += 1
        else:
            self.stats.warm_ups_dropped_total += 1


def queue_warm_up(state: SchedulerState, request_id: str, prompt_token_ids: list[int], session_id: str | None,
                  cache_salt: str | None, tenant: str | None) -> None:
    """Queue a warm-up of the prompt's full blocks, unless a newer request of its session is in (it computes them
    itself); the session's older warm-up ends."""
    full = len(prompt_token_ids) // state.block_size * state.block_size
    newer = any(r.session_id == session_id and not r.warmup and r.request_id != request_id
                for r in (*state.waiting, *state.running))
    if session_id is None or full == 0 or newer:
        return
    end_warm_up(state, session_id)
    for dropped in state.warming.add(Request(f"{request_id}/warm", list(prompt_token_ids[:full]),
                                             SamplingParams(max_tokens=1, temperature=0), frozenset(), 1, None,
                                             RequestMetrics(arrival_time=time.perf_counter()), session_id,
                                             cache_salt=cache_salt, tenant=tenant, warmup=True)):
        state.finish(dropped, FinishReason.ABORT)  # over a bound: it never computes


def end_warm_up(state: SchedulerState, session_id: str | None) -> None:
    """The session's warm-up, queued or running, ends: its next request (or warm-up) came."""
    queued = state.warming.of_session(session_id)
    for w in [r for r in state.running if r.warmup and r.session_id == session_id] + ([queued] if queued else []):
        state.finish(w, FinishReason.ABORT)


def step_warm_ups(state: SchedulerState, tiers: TierReads, out: StepBatch, budget: int, chunk: int | None,
                  max_num_seqs: int) -> None:
    """Warm-ups, only in a step with nothing else and a paced chunk at most: they never lengthen anyone's step. The
    one with the fewest tokens left first: its developer is answered soonest (shortest remaining first)."""
    budget = 0 if out.chunks else budget if chunk is None else min(budget, chunk)
    for req in sorted((r for r in state.running if r.warmup), key=lambda r: r.num_tokens - r.num_computed_tokens):
        n = min(req.num_tokens - req.num_computed_tokens, budget)
        need = state.blocks_for(req.num_computed_tokens + n) - len(req.block_ids)
        if out.preempted or n <= 0:
            break
        if need > state.pool.num_free:  # a warm-up never preempts anyone, nor holds blocks it cannot grow
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
