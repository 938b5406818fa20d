"""A request's life in the server: built from a validated body (a Job), refused at once if it cannot start
before its deadline, run through the AsyncEngine as text deltas, and recorded in the metrics when it ends
(however it ends: finished, late, refused, or abandoned by its client)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from warmpath.api.asgi import parse_deadline, session_key
from warmpath.api.fim import FimTemplate
from warmpath.api.protocol import ApiError, SamplingFields
from warmpath.api.responses import new_id, usage
from warmpath.engine.async_engine import AsyncEngine
from warmpath.engine.detokenizer import IncrementalDetokenizer
from warmpath.engine.engine import Engine
from warmpath.engine.metrics import Metrics
from warmpath.engine.request import FinishReason, PromptTooLongError, RequestOutput, SamplingParams, TokenLogprob
from warmpath.server.limits import Chain

_FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length", FinishReason.DEADLINE: "deadline",
           FinishReason.ERROR: "error", FinishReason.ABORT: "abort"}


@dataclass
class Job:
    """One HTTP request on its way through the engine."""

    request_id: str
    kind: str  # "completion" | "chat"
    prompt_ids: list[int]
    params: SamplingParams
    stop: list[str]
    session_id: str | None
    received: float  # time.monotonic() at receipt
    deadline: float | None
    cache_salt: str | None = None
    cutter: Chain | None = None  # where the answer ends: the completion scope, llama.cpp's n_indent
    fim_mode: str | None = None
    text: str = ""
    num_generated: int = 0
    num_cached: int = 0
    num_tier: int | None = None  # of num_cached, read back from the KV tier (None: the server has no tier)
    finish_reason: str | None = None
    recorded: bool = False  # in the metrics already (record() runs once per job)
    first_token: float | None = None
    echo: str = ""  # the prompt's text, put before the answer's (completions' `echo`)
    logprobs: list[tuple[int, TokenLogprob]] = field(default_factory=list)  # with params.logprobs: per token
    logprobs_taken: int = 0
    text_offset: int = 0  # characters of the answer the logprobs taken so far cover
    logprob_chars: int = 0  # characters of the answer's text the tokens taken so far spell
    cut: bool = False  # a stop string or the cutter ended the text: tokens after the cut are not reported
    # Editor protocols (server/editors.py): llama.cpp's limits and the warm-up.
    prompt_deadline: float | None = None  # no first token by then: silence (t_max_prompt_ms)
    predict_s: float | None = None  # this long after the first token, end at the first newline (t_max_predict_ms)
    warmup: bool = False  # only fill the prefix cache: the one token generated is not reported
    newline: bool = False  # a newline has been generated (before any cutter held it back)
    truncated: bool = False  # repository context or prefix was left out to fit the context

    def usage(self) -> dict:
        return usage(len(self.prompt_ids), self.num_generated, self.num_cached, self.num_tier)

    def take_logprobs(self, num_chars: Callable[[int], int]) -> list[tuple[int, TokenLogprob]]:
        """The logprobs of tokens not yet reported whose text has been shown (for the next chunk): a token whose
        text is held back (it may begin a stop string) waits, and one that starts after a stop string's cut is
        never reported. A finished answer that was not cut reports every token. num_chars: a token's characters."""
        everything = self.finish_reason is not None and not self.cut
        new = []
        while self.logprobs_taken < len(self.logprobs) and (everything or self.logprob_chars < len(self.text)):
            entry = self.logprobs[self.logprobs_taken]
            new.append(entry)
            self.logprobs_taken += 1
            self.logprob_chars += num_chars(entry[0])
        return new


class Jobs:
    """Builds, runs and records the jobs of one engine."""

    def __init__(self, engine: Engine, async_engine: AsyncEngine, metrics: Metrics, fim: FimTemplate | None):
        self.engine, self.async_engine, self.metrics, self.fim = engine, async_engine, metrics, fim
        if self.fim is not None:  # heal() needs the vocabulary's index: built beside the start, not at a keystroke
            threading.Thread(target=lambda: engine.healer, name="healer-index", daemon=True).start()

    def heal(self, job: Job) -> None:
        """A FIM prompt that ends in text (the anchored layout's lines after the middle marker, /infill's cursor line)
        gives its last token back: the completion's first tokens must spell it again (engine/healing.py), so a
        cursor inside a word is completed as the word the model would write, not after the piece it was cut into."""
        mode = (job.fim_mode or "").split(";")[0]  # "; the prompt's ... markers": another family's, rebuilt
        if self.fim is None or mode != self.fim.name or len(job.prompt_ids) < 2 or job.params.heal:
            return
        piece = self.engine.tokenizer.token_bytes[job.prompt_ids[-1]]
        try:
            text = piece.decode() if piece else ""  # no piece: a special token, the prompt ends at the marker
        except UnicodeDecodeError:  # part of a character: the prompt stays as it is
            return
        if text:
            job.prompt_ids, job.params.heal = job.prompt_ids[:-1], text
            job.logprob_chars = -len(text)  # the first token's characters include it; the answer's text does not

    def make(self, kind: str, body: SamplingFields, prompt_ids: list[int], headers, received: float,
             max_tokens: int | None, cache_salt: str | None = None) -> Job:
        """A job for this prompt, or ApiError (400) if it does not fit the model or its parameters are bad."""
        max_len = self.engine.max_model_len
        if max_tokens is None:
            max_tokens = max(1, max_len - len(prompt_ids))
        elif len(prompt_ids) + max_tokens > max_len:
            raise ApiError(400, f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds the "
                                f"model's context of {max_len} tokens", param="max_tokens",
                           code="context_length_exceeded")
        try:
            temperature = 1.0 if body.temperature is None else body.temperature  # OpenAI's default
            params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=body.top_p,
                                    top_k=body.top_k, seed=body.seed, ignore_eos=body.ignore_eos,
                                    logprobs=body.num_logprobs)
            self.engine.validate(prompt_ids, params)
        except (ValueError, PromptTooLongError) as e:
            raise ApiError(400, str(e), param="prompt") from None
        return Job(new_id(kind[:4]), kind, prompt_ids, params, body.stop or [], session_key(headers, body.user),
                   received, parse_deadline(headers, received), cache_salt,
                   num_tier=None if self.engine.tier is None else 0)

    def refuse_if_overloaded(self, job: Job) -> bool:
        """Can the job not even start before its deadline, given the work queued ahead of it? Then it is
        recorded as "overloaded" ("deadline" if it is already past) and never submitted: its answer is silence,
        and its session's prompt computes on at the lowest priority, so that session's next keystroke finds it
        cached (a refusal is a deadline miss known in advance: refused unrun, a cold file would never warm).
        Otherwise it counts as queued ahead of the next one from now on (run() submits it)."""
        now = time.monotonic()
        if job.deadline is None or now + self.async_engine.estimate_wait() <= job.deadline:
            self.async_engine.reserve(job.request_id, len(job.prompt_ids))
            return False
        self.async_engine.warm_up(job.request_id, job.prompt_ids, job.session_id, job.cache_salt)
        job.finish_reason = "deadline" if now >= job.deadline else "overloaded"
        self.metrics.aborted.labels(job.finish_reason).inc()
        self.metrics.requests.labels(job.finish_reason).inc()
        return True

    def check_alive(self) -> None:
        if not self.async_engine.alive:
            raise ApiError(503, "the engine loop is not running", "server_error", code="engine_dead")

    async def run(self, job: Job) -> AsyncIterator[str]:
        """Text deltas; sets job.finish_reason ("overloaded" and nothing: refused unrun). Enforces the deadline
        itself (the engine only sees it at step boundaries, which may be long). Closing it early aborts the
        request in the engine."""
        if self.refuse_if_overloaded(job):  # checked here, right before submitting: see reserve()
            return
        self.heal(job)
        detok = IncrementalDetokenizer(self.engine.tokenizer, stop=job.stop, heal=job.params.heal)
        gen = self.async_engine.generate(job.request_id, job.prompt_ids, job.params, job.session_id, job.deadline,
                                         job.cache_salt)
        try:
            while True:
                try:
                    out = await asyncio.wait_for(anext(gen), self._timeout(job))
                except (TimeoutError, StopAsyncIteration):
                    job.finish_reason = "deadline"
                    self.metrics.aborted.labels("deadline").inc()
                    return
                delta = self._take(job, out, detok)
                if delta:
                    job.text += delta
                    yield delta
                if detok.stopped or (job.cutter and job.cutter.cut):
                    job.finish_reason, job.cut = "stop", True
                    return
                if out.finished:
                    job.finish_reason = "stop" if detok.stopped else _FINISH[out.finish_reason]
                    if job.finish_reason == "deadline":
                        self.metrics.aborted.labels("deadline").inc()
                    return
                if job.predict_s is not None and job.newline and time.monotonic() - job.first_token > job.predict_s:
                    # llama.cpp's t_max_predict_ms: past the budget, a completion that has a newline ends here
                    rest = detok.finish()
                    rest = job.cutter.feed(rest, final=True) if job.cutter else rest
                    if rest and not job.warmup:
                        job.text += rest
                        yield rest
                    job.finish_reason = "length"
                    return
        finally:
            await gen.aclose()  # aborts the request in the engine unless it finished
            self.async_engine.unreserve(job.request_id)
            self.record(job)

    async def collect(self, job: Job) -> None:
        """Runs the job to its end; its text is in job.text."""
        async for _ in self.run(job):
            pass

    @staticmethod
    def _timeout(job: Job) -> float | None:
        """Seconds until the job's next deadline: its own, and before its first token the prompt phase's."""
        ends = [d for d in (job.deadline, job.prompt_deadline if job.first_token is None else None) if d is not None]
        return None if not ends else max(0.0, min(ends) - time.monotonic())

    @staticmethod
    def _take(job: Job, out: RequestOutput, detok: IncrementalDetokenizer) -> str:
        """One engine output into the job's counts; the new text it makes visible."""
        job.num_cached = out.num_cached_tokens
        if job.num_tier is not None:
            job.num_tier = out.num_tier_tokens
        if out.new_token_ids and job.first_token is None:
            job.first_token = time.monotonic()
        job.num_generated = len(out.token_ids)
        if out.new_logprobs:
            job.logprobs += zip(out.new_token_ids, out.new_logprobs, strict=True)
            if out.finish_reason == FinishReason.STOP:
                job.logprobs.pop()  # the stop token, which is not text
        delta = detok.add(out.new_token_ids)
        if out.finished:
            delta += detok.finish()
        if job.warmup:
            return ""
        job.newline = job.newline or "\n" in delta
        if job.cutter:
            delta = job.cutter.feed(delta, final=out.finished or detok.stopped)
        return delta

    def record(self, job: Job) -> None:
        """The job in the metrics, once, however it ended; a job with no finish reason was left by its client
        (also one whose stream never started: the server calls this again when the response is done)."""
        if job.recorded:
            return
        job.recorded = True
        m = self.metrics
        if job.finish_reason is None:  # the client went away
            m.aborted.labels("client").inc()
            job.finish_reason = "abort"
        m.requests.labels(job.finish_reason).inc()
        if job.cutter is not None and job.cutter.rule is not None:
            m.scope_cuts.labels(job.cutter.rule).inc()
        m.prompt_tokens.inc(len(job.prompt_ids))
        m.generation_tokens.inc(job.num_generated)
        if job.finish_reason in ("abort", "deadline"):
            m.wasted_tokens.inc(job.num_generated)
        now = time.monotonic()
        m.e2e.observe(now - job.received)
        if job.first_token is not None:
            m.ttft.observe(job.first_token - job.received)
            if job.num_generated > 1:
                m.tpot.observe((now - job.first_token) / (job.num_generated - 1))
