"""A request's life in the server: built from an Ask (a Job), submitted to the AsyncEngine before
any answer starts (a 400 for a request the engine can never run; one that cannot start before its
deadline ends at once, refused), run as text deltas, and recorded in the metrics when it ends
(however it ends: finished, late, refused, or abandoned by its client)."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from warmpath.api.asgi import parse_deadline
from warmpath.api.ask import SILENT, Ask, Outcome
from warmpath.api.cutters import Chain
from warmpath.api.fim import FimTemplate
from warmpath.api.protocol import ApiError
from warmpath.api.responses import new_id, usage
from warmpath.engine.async_engine import AsyncEngine, EngineDeadError, RequestStream
from warmpath.engine.engine import Engine
from warmpath.engine.request import (
    EngineRequest,
    FinishReason,
    RequestOutput,
    SamplingParams,
    TokenLogprob,
)
from warmpath.server.confidence import UNSURE, Gate
from warmpath.server.detokenizer import IncrementalDetokenizer
from warmpath.server.metrics import Metrics
from warmpath.server.tenancy import Tenancy
from warmpath.server.type_through import TypedThrough

_FINISH = {
    FinishReason.STOP: "stop", FinishReason.LENGTH: "length", FinishReason.DEADLINE: "deadline",
    FinishReason.OVERLOADED: "overloaded", FinishReason.ERROR: "error", FinishReason.ABORT: "abort"
}


@dataclass
class Job:
    """One HTTP request on its way through the engine."""

    # what the engine is asked (its prompt, parameters, session, deadlines, salt)
    request: EngineRequest
    kind: str  # Ask.kind: "completion" | "chat" | an editor protocol's NAME
    stop: list[str]
    received: float  # time.monotonic() at receipt
    cutter: Chain | None = None  # where the answer ends: the completion scope, llama.cpp's n_indent
    # a FIM answer's confidence (server/confidence.py): unsure, it is silenced
    gate: Gate | None = None
    held: str = ""  # text held back until the gate has judged the answer
    # the client asked for logprobs (the gate has them computed anyway)
    logprobs_asked: bool = False
    fim_mode: str | None = None
    text: str = ""
    num_generated: int = 0
    num_cached: int = 0
    # of num_cached, read back from the KV tier (None: the server has no tier)
    num_tier: int | None = None
    finish_reason: str | None = None
    recorded: bool = False  # in the metrics already (record() runs once per job)
    first_token: float | None = None
    echo: str = ""  # the prompt's text, put before the answer's (completions' `echo`)
    # with params.logprobs: per token
    logprobs: list[tuple[int, TokenLogprob]] = field(default_factory=list)
    logprobs_taken: int = 0
    text_offset: int = 0  # characters of the answer the logprobs taken so far cover
    logprob_chars: int = 0  # characters of the answer's text the tokens taken so far spell
    # a stop string or the cutter ended the text: tokens after the cut are not reported
    cut: bool = False
    stream: RequestStream | None = None  # once submitted (JobRunner.start)
    # Editor protocols: llama.cpp's t_max_predict_ms and the warm-up.
    # this long after the first token, end at the first newline (t_max_predict_ms)
    predict_s: float | None = None
    warmup: bool = False  # only fill the prefix cache: the one token generated is not reported
    newline: bool = False  # a newline has been generated (before any cutter held it back)
    truncated: bool = False  # repository context or prefix was left out to fit the context
    # answered from the session's last answer (type_through.py): its prompt's tokens, none computed
    typed_prompt_tokens: int | None = None
    # answered from its short context (request.short), the whole prompt left warming
    short_context: bool = False

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_ids(self) -> list[int]:
        return self.request.prompt_token_ids

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def silent(self) -> bool:
        return self.finish_reason in SILENT

    @property
    def num_prompt_tokens(self) -> int:
        """The tokens of the prompt the answer was computed from."""
        if self.typed_prompt_tokens is not None:
            return self.typed_prompt_tokens
        short = self.request.short
        return len(short.token_ids if self.short_context and short else self.prompt_ids)

    def usage(self) -> dict:
        return usage(self.num_prompt_tokens, self.num_generated, self.num_cached, self.num_tier)

    def outcome(self) -> Outcome:
        """The job's answer as every protocol reports it (each protocol's answer is silence when it
        is late or refused: Outcome.silent)."""
        now, first = time.monotonic(), self.first_token
        return Outcome(text=self.echo + self.text, finish=self.finish_reason or "abort",
                       prompt_tokens=self.num_prompt_tokens, cached_tokens=self.num_cached,
                       generated_tokens=0 if self.warmup else self.num_generated,
                       prompt_s=(first or now) - self.received,
                       predict_s=now - first if first else 0.0, truncated=self.truncated,
                       confidence=self.confidence)

    @property
    def confidence(self) -> float | None:
        """The answer's confidence, once the gate has judged it (None: not a FIM answer, or not
        judged)."""
        return None if self.gate is None else self.gate.value

    def take_logprobs(self, num_chars: Callable[[int], int]) -> list[tuple[int, TokenLogprob]]:
        """The logprobs of tokens not yet reported whose text has been shown (for the next chunk): a
        token whose text is held back (it may begin a stop string) waits, and one that starts after
        a stop string's cut is never reported. A finished answer that was not cut reports every
        token. num_chars: a token's characters."""
        everything = self.finish_reason is not None and not self.cut
        new = []
        while self.logprobs_taken < len(self.logprobs) and (everything or
                                                            self.logprob_chars < len(self.text)):
            entry = self.logprobs[self.logprobs_taken]
            new.append(entry)
            self.logprobs_taken += 1
            self.logprob_chars += num_chars(entry[0])
        return new


def warming_session(r: EngineRequest) -> None:
    """A request that names no session warms as its tenant's session of warm-ups (the scheduler
    keeps one per session; the tenant's next one ends it)."""
    if r.session_id is None:
        r.session_id = "warm-up " + hashlib.sha256(str(r.tenant).encode()).hexdigest()[:16]


@contextmanager
def _engine_errors() -> Iterator[None]:
    """The engine's refusals as the API's: 503 with the engine loop dead, 400 for a request it can
    never run."""
    try:
        yield
    except EngineDeadError as e:
        raise ApiError(503, str(e), "server_error", code="engine_dead") from None
    except ValueError as e:  # PromptTooLongError too
        raise ApiError(400, str(e), param="prompt") from None


class JobRunner:
    """Builds, runs and records the jobs of one engine."""

    def __init__(self, engine: Engine, async_engine: AsyncEngine, metrics: Metrics,
                 fim: FimTemplate | None):
        self.engine, self.async_engine, self.metrics, self.fim = engine, async_engine, metrics, fim
        if self.fim is not None:
            # heal() needs the vocabulary's index: built beside the start, not at a keystroke
            threading.Thread(target=lambda: engine.healer, name="healer-index", daemon=True).start()

    def heal(self, job: Job) -> None:
        """A FIM prompt that ends in text (the anchored layout's lines after the middle marker,
        /infill's cursor line) gives its last token back: the completion's first tokens must spell
        it again (engine/healing.py), so a cursor inside a word is completed as the word the model
        would write, not after the piece it was cut into."""
        # "; the prompt's ... markers": another family's, rebuilt
        mode = (job.fim_mode or "").split(";")[0]
        if self.fim is None or mode != self.fim.name or len(job.prompt_ids) < 2 or job.params.heal:
            return
        piece = self.engine.tokenizer.token_bytes[job.prompt_ids[-1]]
        try:
            # no piece: a special token, the prompt ends at the marker
            text = piece.decode() if piece else ""
        except UnicodeDecodeError:  # part of a character: the prompt stays as it is
            return
        if text:
            r, last = job.request, job.prompt_ids[-1]
            r.prompt_token_ids, job.params.heal = job.prompt_ids[:-1], text
            if r.short is not None:  # it ends at the same cursor: the same token, else not used
                r.short = replace(r.short, token_ids=r.short.token_ids[:-1]) \
                    if r.short.token_ids[-1:] == [last] else None
            # the first token's characters include it; the answer's text does not
            job.logprob_chars = -len(text)

    def make(self, ask: Ask, prompt_ids: list[int], headers, received: float,
             max_tokens: int | None, temperature: float, tenancy: Tenancy) -> Job:
        """A job for this prompt, or ApiError (400) if its parameters are bad or it does not fit the
        model with the max_tokens asked for (the engine checks the rest at start())."""
        max_len = self.engine.max_model_len
        if max_tokens is None:
            max_tokens = max(1, max_len - len(prompt_ids))
        elif len(prompt_ids) + max_tokens > max_len:
            raise ApiError(
                400, f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds the "
                f"model's context of {max_len} tokens", param="max_tokens",
                code="context_length_exceeded")
        try:
            params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=ask.top_p,
                                    top_k=ask.top_k, seed=ask.seed, ignore_eos=ask.ignore_eos,
                                    logprobs=ask.num_logprobs)
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        if tenancy.session_hashed:
            self.metrics.session_ids_hashed.inc()
        request = EngineRequest(new_id(ask.kind[:4]), prompt_ids, params, tenancy.session,
                                parse_deadline(headers, received), tenancy.salt,
                                tenant=tenancy.tenant)
        return Job(request, ask.kind, list(ask.stop), received,
                   num_tier=None if self.engine.tier is None else 0, logprobs_asked=ask.num_logprobs
                   is not None)

    def typed_through(self, ask: Ask, hit: TypedThrough, received: float) -> Job:
        """A finished job whose answer is the rest of the session's last one: no engine request."""
        count = self.engine.tokenizer.encode
        prompt = hit.last.prompt_tokens + len(count(hit.typed, add_bos=False))
        job = Job(EngineRequest(new_id(ask.kind[:4]), [], SamplingParams()), ask.kind, [],
                  received, fim_mode=hit.last.fim_mode, text=hit.rest,
                  num_generated=len(count(hit.rest, add_bos=False)), num_cached=prompt,
                  num_tier=None if self.engine.tier is None else 0,
                  finish_reason=hit.last.finish, first_token=time.monotonic(),
                  typed_prompt_tokens=prompt)
        if hit.last.confidence is not None:
            job.gate = Gate(0.0, value=hit.last.confidence, passed=True)
        job.recorded = True  # counted here, not as a generation
        self.metrics.requests.labels(job.finish_reason).inc()
        self.metrics.typed_through.inc()
        return job

    def start(self, job: Job) -> None:
        """Submit the job, before its answer starts: ApiError 400 if the engine can never run it,
        503 if the engine loop is dead. A job that cannot start before its deadline is refused unrun
        (AsyncEngine.submit): its run ends at once, "overloaded" ("deadline" if already past), its
        answer silence."""
        self.heal(job)
        with _engine_errors():
            job.stream = self.async_engine.submit(job.request)

    def warm(self, job: Job) -> None:
        """A client's own warm-up (`n_predict: 0`), queued for the engine's idle steps and answered
        at once (AsyncEngine.warm_up): it never delays a keystroke. A client that names no session
        warms as its tenant's session of warm-ups (its newest warm-up ends the one before)."""
        r = job.request
        warming_session(r)
        with _engine_errors():
            self.async_engine.warm_up(r)
        job.finish_reason = "length"
        self.metrics.warm_ups_asked.inc()

    async def run(self, job: Job) -> AsyncIterator[str]:
        """The text deltas of a started job; sets job.finish_reason. The deadlines are the stream's
        (it ends at them, also between steps). Closing this early aborts the request in the
        engine."""
        detok = IncrementalDetokenizer(self.engine.tokenizer, stop=job.stop, heal=job.params.heal)
        try:
            async for out in job.stream:
                delta = self._take(job, out, detok)
                ends = out.finished or detok.stopped or bool(job.cutter and job.cutter.cut)
                if ends and job.gate is not None:
                    job.gate.finish()
                if job.gate is not None and job.gate.threshold > 0 and not job.gate.passed:
                    if not job.gate.judged:  # held back until the gate has judged the first line
                        job.held += delta
                        continue
                    if job.gate.unsure:
                        # silence; closing the stream (end()) stops the decode at once
                        job.finish_reason = UNSURE
                        return
                    job.gate.passed = True
                    delta, job.held = job.held + delta, ""
                if delta:
                    job.text += delta
                    yield delta
                if detok.stopped or (job.cutter and job.cutter.cut):
                    job.finish_reason, job.cut = "stop", True
                    return
                if out.finished:
                    job.finish_reason = "stop" if detok.stopped else _FINISH[out.finish_reason]
                    return
                if job.predict_s is not None and job.newline and time.monotonic(
                ) - job.first_token > job.predict_s:
                    # llama.cpp's t_max_predict_ms: past the budget, a completion that has a newline
                    # ends here
                    rest = detok.finish()
                    rest = job.cutter.feed(rest, final=True) if job.cutter else rest
                    if rest and not job.warmup:
                        job.text += rest
                        yield rest
                    job.finish_reason = "length"
                    return
        finally:
            self.end(job)

    def end(self, job: Job) -> None:
        """The job's end, however it came (also a response whose stream never started): the request
        is aborted in the engine unless it finished, and the job recorded. Safe to call again."""
        if job.stream is not None:
            job.stream.close()
        self.record(job)

    async def collect(self, job: Job) -> None:
        """Runs the job to its end; its text is in job.text."""
        async for _ in self.run(job):
            pass

    def _take(self, job: Job, out: RequestOutput, detok: IncrementalDetokenizer) -> str:
        """One engine output into the job's counts; the new text it makes visible."""
        job.num_cached = out.num_cached_tokens
        if job.num_tier is not None:
            job.num_tier = out.num_tier_tokens
        if out.new_token_ids and job.first_token is None:
            job.first_token = time.monotonic()
        job.num_generated = len(out.token_ids)
        if job.request.short is not None and out.prompt_token_ids is not None and \
                len(out.prompt_token_ids) != len(job.prompt_ids):  # the scheduler took the short
            job.short_context = job.truncated = True
        if out.new_logprobs:
            if job.gate is not None:
                # the model's vocabulary may be padded past it
                pieces = self.engine.tokenizer.token_bytes
                job.gate.observe([(pieces[t] if t < len(pieces) else None) or b""
                                  for t in out.new_token_ids], [lp[0] for lp in out.new_logprobs])
            if job.logprobs_asked:
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
        """The job in the metrics, once, however it ended; a job with no finish reason was left by
        its client (also one whose stream never started: the server calls this again when the
        response is done)."""
        if job.recorded:
            return
        job.recorded = True
        m = self.metrics
        if job.finish_reason is None:  # the client went away
            m.aborted.labels("client").inc()
            job.finish_reason = "abort"
        elif job.finish_reason in SILENT:
            m.aborted.labels(job.finish_reason).inc()
        m.requests.labels(job.finish_reason).inc()
        if job.cutter is not None and job.cutter.rule is not None:
            m.scope_cuts.labels(job.cutter.rule).inc()
        m.prompt_tokens.inc(job.num_prompt_tokens)
        if job.short_context:
            m.short_context.inc()
        m.generation_tokens.inc(job.num_generated)
        if job.finish_reason in ("abort", "deadline"):
            m.wasted_tokens.inc(job.num_generated)
        now = time.monotonic()
        m.e2e.observe(now - job.received)
        if job.first_token is not None:
            m.ttft.observe(job.first_token - job.received)
            if job.num_generated > 1:
                m.tpot.observe((now - job.first_token) / (job.num_generated - 1))
