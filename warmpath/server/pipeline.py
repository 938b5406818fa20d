"""Every request's way through `warmpath serve`, whatever its protocol: an Ask (api/ask.py) → its
prompt (token ids as sent, chat turns through the template, or a Fill fitted to the context:
prompt_fitter.py) → a Job (jobs.py) with where its answer ends → the answer in the protocol's shape
(answers.py), streamed or whole.

A late answer is silence, never an error: past X-Deadline-Ms the request is aborted and answered 200
with empty text and finish "deadline"; one that cannot start in time is answered at once with
"overloaded". A client that goes away aborts its request (its blocks return to the pool at once):
499 when the answer was not streamed.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from warmpath.api.asgi import ClientGone, unless_disconnected
from warmpath.api.ask import Ask
from warmpath.api.cutters import Chain, IndentCutter
from warmpath.api.fim import Fill, Rendered
from warmpath.api.protocol import ApiError
from warmpath.api.responses import SSE_HEADERS
from warmpath.api.scope import ScopeCutter
from warmpath.engine.async_engine import EngineDeadError
from warmpath.engine.request import ShortContext
from warmpath.server.answers import Answers
from warmpath.server.confidence import Gate
from warmpath.server.jobs import Job, warming_session
from warmpath.server.prompt_fitter import Prompt
from warmpath.server.served_model import ServedModel

AS_SENT = Rendered("", None)  # token ids or chat turns: no FIM family, no scope, no gate


class Pipeline:
    def __init__(self, served: ServedModel):
        self.served = served

    async def run(self, ask: Ask, answers: Answers, request: Request, received: float,
                  check_model: bool = True) -> Response:
        """The whole request; every error (ours or the engine's) in the protocol's own shape.
        `check_model`: False for protocols whose clients name no model or any (llama.cpp's /infill,
        Tabby)."""
        try:
            if check_model:
                self.served.check_model(ask.model)
            if ask.options.get("load_only"):  # Ollama: an empty prompt only loads the model
                return answers.idle("load")
            typed = self.typed_through(ask, request, received)
            if typed is not None:
                return self.answer(typed, ask, answers)
            job = await self.job(ask, request, received)
            if job is None:  # a warm-up with nothing to compute
                return answers.idle("length")
            if job.warmup and not (ask.echo or job.logprobs_asked):  # else it is scoring a prompt
                self.served.runner.warm(job)
                return answers.idle("length")
            return await self.respond(job, ask, answers, request)
        except ApiError as e:
            raise answers.error(e) from None

    # -- request → prompt → job --------------------------------------------------------------------
    async def job(self, ask: Ask, request: Request, received: float) -> Job | None:
        s, warmup = self.served, ask.max_tokens == 0
        prompt, fitted = await self.prompt(ask, warmup)
        if not prompt.ids:
            if warmup:
                return None
            raise ApiError(400, "nothing to complete: the prompt is empty", param="prompt")
        if warmup:
            max_tokens = 1
        elif ask.exact_max_tokens and not fitted:
            # OpenAI: the prompt as sent must leave room for it (make())
            max_tokens = ask.max_tokens
        else:
            max_tokens = s.fitter.max_tokens(ask.max_tokens, prompt)
        # No temperature asked: greedy for a FIM prompt (the answer an editor inserts as it is),
        # else OpenAI's 1.0
        temperature = (ask.temperature if ask.temperature is not None else
                       0.0 if prompt.rendered.fim_mode else 1.0)
        job = s.runner.make(ask, prompt.ids, request.headers, received, max_tokens, temperature,
                            s.tenancy(ask, request))
        self.bound(job, prompt, ask)
        job.warmup = warmup
        if ask.prompt_ms is not None and not warmup:
            # a warm-up's whole point is its prompt: never cut short
            job.request.prompt_deadline = received + ask.prompt_ms / 1000
        if ask.predict_ms is not None:
            job.predict_s = ask.predict_ms / 1000
        if not warmup and not ask.echo and ask.fill is not None:
            await self.shorten(job, ask.fill, prompt)
        if ask.echo:
            job.echo = ask.fill.prefix if ask.fill is not None else s.tokenizer.decode(
                job.prompt_ids)
            job.text_offset = len(job.echo)
        return job

    async def prompt(self, ask: Ask, warmup: bool) -> tuple[Prompt, bool]:
        """(the prompt, whether it was fitted to the context)."""
        s = self.served
        if ask.token_ids is not None:
            return Prompt(ask.token_ids, AS_SENT, False), False
        if ask.messages is not None or (ask.chat and s.tokenizer.chat_template):
            turns = ask.messages if ask.messages is not None else \
                [*([{"role": "system", "content": ask.system}] if ask.system else []),
                 {"role": "user", "content": ask.fill.prefix}]
            return Prompt(await self._encode_chat(turns), AS_SENT, False), False
        max_len = s.engine.max_model_len
        if ask.exact_max_tokens and ask.max_tokens is not None and ask.max_tokens >= max_len:
            raise ApiError(
                400,
                f"max_tokens ({ask.max_tokens}) leaves no room for a prompt in the model's context "
                f"of {max_len} tokens", param="max_tokens", code="context_length_exceeded")
        return await s.fitter.fit(ask.fill, 1 if warmup else s.fitter.reserve(ask.max_tokens)), True

    async def shorten(self, job: Job, fill: Fill, prompt: Prompt) -> None:
        """Give a FIM job its short context (--short-context): "auto", to a job with a deadline, for
        the scheduler to answer from when the whole prompt cannot answer within --first-token-ms
        (engine/scheduler/_short_context.py); "always", as its prompt."""
        s, r = self.served, job.request
        mode = s.config.short_context
        if mode == "off" or mode == "auto" and r.deadline is None and r.prompt_deadline is None:
            return
        ids = await s.fitter.short(fill, s.short_context_tokens, prompt)
        if ids is None:
            return
        if mode == "always":
            r.prompt_token_ids, job.truncated = ids, True
            job.short_context = True
        else:  # its whole prompt may be left warming
            r.short = ShortContext(ids, job.received + s.config.first_token_ms / 1000)
            warming_session(r)

    async def _encode_chat(self, turns: list[dict]) -> list[int]:
        try:
            return await self.served.encoder.encode_chat(turns)
        except ApiError:
            raise
        except ValueError as e:
            raise ApiError(400, str(e), param="messages") from None
        except Exception as e:
            # a template that fails on these messages is the caller's input problem
            raise ApiError(400, f"chat template failed on these messages: {e}",
                           param="messages") from None

    def bound(self, job: Job, prompt: Prompt, ask: Ask) -> None:
        """Where the job's answer ends: at the family's markers (as special tokens: stop ids, never
        shown; spelled out in text: stop strings), where the completion scope (the ask's, else the
        server's) or llama.cpp's n_indent cut; a FIM answer is judged by the confidence gate (the
        ask's threshold, else the server's)."""
        s, r = self.served, prompt.rendered
        job.fim_mode, job.truncated = r.fim_mode, prompt.truncated
        if r.stops:
            job.params.stop_token_ids = sorted({*job.params.stop_token_ids, *s.fim_stop_ids})
            job.stop = [*job.stop, *(t for t in r.stops if t not in job.stop)]
        scope = ask.scope or s.config.completion_scope
        cut = ScopeCutter(*r.cursor, scope) if r.cursor is not None and scope != "none" else None
        if cut is not None or ask.n_indent:
            job.cutter = Chain(IndentCutter(ask.n_indent) if ask.n_indent else None, cut)
        if r.cursor is not None:  # its tokens' log-probabilities are computed for the gate
            job.gate = Gate(s.config.min_confidence if ask.min_confidence is
                            None else ask.min_confidence)
            if job.params.logprobs is None:
                job.params.logprobs = 0

    def typed_through(self, ask: Ask, request: Request, received: float) -> Job | None:
        """A finished job when the request only types into the session's last answer
        (type_through.py), else None."""
        s = self.served
        session = self.suggestion_key(ask, request)
        hit = s.suggestions.match(session, ask)
        if hit is None:
            return None
        job = s.runner.typed_through(ask, hit, received)
        self.remember(job, ask, request)  # typing on goes on through what is left
        return job

    def suggestion_key(self, ask: Ask, request: Request) -> str:
        """Whose last answer: the session's, else the tenant's (editors that send no session id:
        a developer's own key, or a local server's one user)."""
        t = self.served.tenancy(ask, request)
        return t.session or f"tenant {t.tenant}"

    def remember(self, job: Job, ask: Ask, request: Request) -> None:
        self.served.suggestions.remember(self.suggestion_key(ask, request), ask, job.text,
                                         job.finish_reason or "abort", job.num_prompt_tokens,
                                         job.confidence, job.fim_mode)

    def answer(self, job: Job, ask: Ask, answers: Answers) -> Response:
        """A finished job's answer, whole or as a stream of one piece."""
        if not ask.stream:
            return answers.whole(job)

        async def events():
            yield answers.event(job, job.text)
            for event in answers.end(job):
                yield event

        return StreamingResponse(events(), media_type=answers.media, headers=SSE_HEADERS)

    # -- job → answer ------------------------------------------------------------------------------
    async def respond(self, job: Job, ask: Ask, answers: Answers, request: Request) -> Response:
        """The job's answer; one the engine refuses is a 400 before any answer starts, one that
        cannot start before its deadline is refused at once ("overloaded": silence)."""
        runner = self.served.runner
        runner.start(job)
        if ask.stream:
            # The background task runs when the response is done, also when the client left before
            # the stream started (the stream's own cleanup never ran then): the job is counted as
            # the client's abort.
            return StreamingResponse(self._stream(job, ask, answers, request),
                                     media_type=answers.media, headers=SSE_HEADERS,
                                     background=BackgroundTask(runner.end, job))
        try:  # not streamed: watch for the client going away while we compute
            await unless_disconnected(request, runner.collect(job))
        except ClientGone:
            return Response(status_code=499)
        except EngineDeadError as e:
            raise ApiError(503, str(e), "server_error", code="engine_dead") from None
        finally:
            runner.end(job)  # also when the collecting stopped before it began
        self.remember(job, ask, request)
        return answers.whole(job)

    async def _stream(self, job: Job, ask: Ask, answers: Answers, request: Request):
        try:
            async for delta in self.served.runner.run(job):
                yield answers.event(job, delta)
        except EngineDeadError as e:
            yield answers.broken(str(e))
            return
        self.remember(job, ask, request)  # streamed to its end
        for event in answers.end(job):
            yield event
