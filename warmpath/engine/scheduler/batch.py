"""What one step computes (the scheduler's StepBatch, read by the engine, the runner and the
simulator's cost model) and the scheduler's counters."""

from __future__ import annotations

from dataclasses import dataclass, field

from warmpath.engine.request import Request


@dataclass
class ScheduledChunk:
    request: Request
    # tokens computed this step, from request.num_computed_tokens on (drafts included)
    num_tokens: int
    sample: bool  # after this chunk every token is computed: sample the next one
    # a decode with this many guessed tokens after it (request.draft_token_ids), verified
    num_drafts: int = 0

    @property
    def token_ids(self) -> list[int]:
        start = self.request.num_computed_tokens
        if self.num_drafts:
            return [
                self.request.all_token_ids[start], *self.request.draft_token_ids[:self.num_drafts]
            ]
        return self.request.all_token_ids[start : start + self.num_tokens]


@dataclass
class StepBatch:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    # finished before running (deadline, error)
    finished: list[Request] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)


@dataclass
class SchedulerStats:
    prefix_cache_queried_tokens: int = 0
    prefix_cache_hit_tokens: int = 0  # in RAM
    prefix_cache_tier_hit_tokens: int = 0  # read back from the KV tier instead of computed
    num_preemptions: int = 0
    num_aborted: int = 0
    num_deadline_expired: int = 0
    # tokens run through the model (prompt chunks, recomputes, decodes)
    num_computed_tokens: int = 0
    # warm-ups dropped for their tenant's bound (the oldest, or one over it alone)
    warm_ups_dropped_tenant: int = 0
    warm_ups_dropped_total: int = 0  # warm-ups dropped for the bound over all tenants
