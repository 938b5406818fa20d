"""Requests, sampling parameters, outputs and finish reasons."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from warmpath.engine.proposers import Speculation


class PromptTooLongError(ValueError):
    """The prompt does not fit the model's context (or the KV pool)."""


class FinishReason(enum.StrEnum):
    STOP = "stop"  # a stop token
    LENGTH = "length"  # max_tokens or the context limit
    ABORT = "abort"
    DEADLINE = "deadline"
    # refused unrun: it could not start before its deadline (AsyncEngine.submit)
    OVERLOADED = "overloaded"
    # can never run (e.g. needs more KV blocks than the pool has); see Request.error
    ERROR = "error"


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    # blocks freed (still cached); waits at the queue's front to be recomputed
    PREEMPTED = "preempted"
    FINISHED = "finished"


MIN_TEMPERATURE = 1e-5
MAX_LOGPROBS = 20  # alternatives per token (OpenAI's chat limit, vLLM's default)

# A sampled token's log-probability and its top alternatives: (logprob, [(token_id, logprob), ...]).
TokenLogprob = tuple[float, list[tuple[int, float]]]


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None  # per-request generator: same seed, same tokens, whatever the batch
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    # Report each sampled token's log-probability and this many top alternatives (0: its own only);
    # None: off.
    logprobs: int | None = None
    # Token healing (engine/healing.py): text the output's first tokens must spell, the prompt's
    # last token taken back by the caller; the output's text begins with it.
    heal: str = ""

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not self.temperature >= 0 or self.temperature == float("inf"):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        # Below this, logits / temperature overflows fp32; the limit of sampling there is greedy
        # anyway.
        return self.temperature < MIN_TEMPERATURE


@dataclass(frozen=True)
class ShortContext:
    """A FIM prompt's short form (the lines nearest the cursor, a short suffix): what a request is
    answered from when its whole prompt cannot give a first token `by` then (a cold file;
    engine/scheduler/_short_context.py)."""

    token_ids: list[int]
    by: float  # time.monotonic()


@dataclass
class EngineRequest:
    """What a caller asks of the engine: the one value from the server's job to the scheduler's
    Request. Deadlines are time.monotonic() values (the scheduler's clock), applied as
    engine/deadline.py says."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    session_id: str | None = None
    deadline: float | None = None
    # shares prefix-cache blocks only with requests of the same salt (None included)
    cache_salt: str | None = None
    prompt_deadline: float | None = None
    # whose it is (server/tenancy.py), for the warm-ups' bounds (engine/scheduler)
    tenant: str | None = None
    short: ShortContext | None = None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    num_output_tokens: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first."""
        if self.finish_time is None or self.first_token_time is None or self.num_output_tokens < 2:
            return None
        return (self.finish_time - self.first_token_time) / (self.num_output_tokens - 1)


@dataclass
class Request:
    """One request's whole state in the engine. Tokens are prompt + outputs; K/V exists for the
    first num_computed_tokens of them, in block_ids."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    stop_token_ids: frozenset[int]
    max_tokens: int  # params.max_tokens clipped to the context
    generator: torch.Generator | None
    metrics: RequestMetrics
    session_id: str | None = None
    deadline: float | None = None  # EngineRequest.deadline (engine/deadline.py)
    # mixed into its first block's hash: shares cached blocks only within a salt
    cache_salt: str | None = None
    # no output by then: finished with DEADLINE (EngineRequest)
    prompt_deadline: float | None = None
    # EngineRequest.tenant: its warm-up counts against this tenant's bound
    tenant: str | None = None
    short: ShortContext | None = None  # until its first admission (EngineRequest.short)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    # one per output, when params.logprobs is set
    output_logprobs: list[TokenLogprob] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    # chained hashes of its full blocks so far
    block_hashes: list[bytes] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_registered_blocks: int = 0  # leading blocks already entered in the prefix cache
    num_cached_tokens: int = -1  # prefix-cache hit at first admission; -1 until admitted
    num_tier_tokens: int = 0  # of those, read back from the KV tier
    # in its first admission, nothing computed yet: blocks read from the KV tier count as hits
    restoring: bool = False
    num_preemptions: int = 0
    num_sent_tokens: int = 0  # outputs already reported by Engine.step()
    finish_reason: FinishReason | None = None
    error: str | None = None
    heal_left: bytes = b""  # of params.heal, the bytes its next tokens must still spell
    # the scheduler's own: a late request's prompt computed on for its session (nobody waits)
    warmup: bool = False
    # guessed next tokens, verified at its next step
    draft_token_ids: list[int] = field(default_factory=list)
    speculation: Speculation | None = None  # its proposer state (EngineConfig.speculative_method)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def decoding(self) -> bool:
        """Its next row is its last output token's (a decode), not a prompt token's: a prompt's last
        token computed alone, after a cache hit or a chunk that left one, is still the prompt's time
        to first token."""
        return bool(self.output_token_ids) and self.num_computed_tokens + 1 == self.num_tokens

    @property
    def finished(self) -> bool:
        return self.status == RequestStatus.FINISHED


@dataclass
class RequestOutput:
    """What Engine.step() reports for a request: new_token_ids is the delta since the last report;
    token_ids all outputs so far. text is filled when the request finishes."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprob] | None  # one per new token, when params.logprobs is set
    text: str
    finished: bool
    finish_reason: FinishReason | None
    num_cached_tokens: int
    metrics: RequestMetrics
    error: str | None = None
    num_tier_tokens: int = 0  # of num_cached_tokens, read back from the KV tier
