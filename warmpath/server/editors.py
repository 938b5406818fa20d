"""The editor protocols in the server: a body in any protocol (api/infill.py, api/ollama.py, api/mistral.py) is
one Fill, rendered (repository context, then FIM or prefix-only, then the cursor's line), fitted to the
context, run as a Job like any completion, and answered in that protocol's shape: its answer, its stream, its
silence past the deadline (empty text, never an error) and its errors.

A protocol here is a module: NAME, parse(raw) -> Fill, error(status, message), answer (an Outcome in its
shape); one that streams also STREAM_MEDIA, event / end and stream_error.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from warmpath.api.asgi import ClientGone, unless_disconnected
from warmpath.api.fill import Fill, Outcome
from warmpath.api.fim import ContextFile, repo_context
from warmpath.api.protocol import ApiError
from warmpath.api.responses import SSE_HEADERS
from warmpath.engine.async_engine import EngineDeadError
from warmpath.server.frontend import Frontend
from warmpath.server.jobs import Job
from warmpath.server.limits import Chain, IndentCutter


class Editors:
    def __init__(self, frontend: Frontend):
        self.f = frontend

    async def handle(self, wire, request: Request, check_model: bool = True) -> Response:
        """The whole request: every error (ours or the engine's) in the protocol's own shape."""
        received = time.monotonic()
        try:
            fill = wire.parse(await request.body())
            if check_model:
                self.f.check_model(fill.model)
            if fill.options.get("load_only"):  # Ollama: an empty prompt only loads the model
                return Response(wire.answer(fill, "", Outcome(finish="load"), self.f.model_name),
                                media_type="application/json")
            job = await self.job(wire, fill, request, received)
            if job is None:  # a warm-up with nothing to compute
                return Response(wire.answer(fill, "", Outcome(finish="length"), self.f.model_name),
                                media_type="application/json")
            return await self.respond(wire, fill, job, request)
        except ApiError as e:
            if getattr(e, "shaped", False):
                raise
            raise wire.error(e.status, e.body["error"]["message"]) from None

    # -- the prompt ---------------------------------------------------------------------------------------------
    def render(self, fill: Fill) -> tuple[str, str | None]:
        """(prompt text, fim_mode): repository context, then the FIM layout or the prefix, then the cursor's line
        (last, so what comes before it stays cached while the developer types along the line)."""
        context = repo_context([ContextFile(e.filename, e.text) for e in fill.extra], self.f.fim, fill.repo,
                               fill.filename)
        if fill.suffix is None:
            return context + fill.prefix + fill.middle, None
        if self.f.fim is not None:
            return (self.f.fim.build(fill.prefix, fill.suffix, context, self.f.config.fim_layout) + fill.middle,
                    self.f.fim.name)
        return context + fill.prefix + fill.middle, "prefix-only"  # the scope cuts where the suffix begins

    async def fit(self, fill: Fill, reserve: int) -> tuple[list[int], str | None, bool]:
        """The rendered prompt's ids, leaving `reserve` tokens of the context for the answer; what does not fit is
        left out, as llama.cpp does: the oldest repository context first, then the prefix's first lines, then
        the suffix's last lines. (ids, fim_mode, truncated)."""
        max_len, truncated = self.f.engine.max_model_len, False
        for _ in range(64):
            text, mode = self.render(fill)
            try:
                ids = await self.f.encoder.encode(text)
                excess = len(ids) + reserve - max_len
                share = excess / max(1, len(ids))
            except ApiError:  # longer than any tokenization could fit: drop half
                excess, share = 1, 0.5
            if excess <= 0:
                return ids, mode, truncated
            truncated = True
            prefix, suffix = fill.prefix.split("\n"), (fill.suffix or "").split("\n")
            if fill.extra:
                fill = replace(fill, extra=fill.extra[max(1, math.ceil(len(fill.extra) * share)):] if share < 1 else [])
            elif len(prefix) > 1:
                fill = replace(fill, prefix="\n".join(prefix[max(1, math.ceil(len(prefix) * share)):]))
            elif len(suffix) > 1:
                fill = replace(fill, suffix="\n".join(suffix[: -max(1, math.ceil(len(suffix) * share))]))
            else:
                break
        raise ApiError(400, f"the prompt does not fit the model's context of {max_len} tokens", param="prompt",
                       code="context_length_exceeded")

    async def job(self, wire, fill: Fill, request: Request, received: float) -> Job | None:
        f, max_len = self.f, self.f.engine.max_model_len
        warmup = fill.max_tokens == 0
        mode, truncated = None, False
        if fill.chat and f.tokenizer.chat_template:
            turns = ([{"role": "system", "content": fill.system}] if fill.system else []) + \
                [{"role": "user", "content": fill.prefix}]
            ids = await f.encoder.encode_chat(turns)
        else:
            reserve = 1 if warmup else min(fill.max_tokens or max_len // 4, max_len // 2)
            ids, mode, truncated = await self.fit(fill, reserve)
        if not ids:
            if warmup:
                return None
            raise ApiError(400, "nothing to complete: the prompt is empty", param="prompt")
        max_tokens = 1 if warmup else min(fill.max_tokens or max_len, max_len - len(ids))
        job = f.jobs.make(wire.NAME, fill, ids, request.headers, received, max_tokens, f.cache_salt(fill, request))
        job.fim_mode, job.warmup, job.truncated = mode, warmup, truncated
        scope = f.scope(fill.prefix + fill.middle, fill.suffix, fill.scope) if mode else None
        if scope is not None or fill.n_indent:
            job.cutter = Chain(IndentCutter(fill.n_indent) if fill.n_indent else None, scope)
        if fill.prompt_ms is not None and not warmup:  # a warm-up's whole point is its prompt: never cut short
            job.prompt_deadline = received + fill.prompt_ms / 1000
        if fill.predict_ms is not None:
            job.predict_s = fill.predict_ms / 1000
        return job

    # -- the answer ---------------------------------------------------------------------------------------------
    @staticmethod
    def outcome(job: Job) -> Outcome:
        now = time.monotonic()
        first = job.first_token
        return Outcome(text=job.text, finish=job.finish_reason or "abort", prompt_tokens=len(job.prompt_ids),
                       cached_tokens=job.num_cached, generated_tokens=0 if job.warmup else job.num_generated,
                       prompt_s=(first or now) - job.received, predict_s=now - first if first else 0.0,
                       truncated=job.truncated)

    async def respond(self, wire, fill: Fill, job: Job, request: Request) -> Response:
        self.f.jobs.check_alive()
        if fill.stream:  # the background task records a job whose client left before the stream started
            return StreamingResponse(self._stream(wire, fill, job), media_type=wire.STREAM_MEDIA, headers=SSE_HEADERS,
                                     background=BackgroundTask(self.f.jobs.record, job))
        try:
            await unless_disconnected(request, self.f.jobs.collect(job))
        except ClientGone:
            return Response(status_code=499)
        except EngineDeadError as e:
            raise wire.error(503, str(e)) from None
        out = self.outcome(job)
        if out.finish == "error":
            raise wire.error(500, "the engine could not run this request")
        return Response(wire.answer(fill, job.request_id, out, self.f.model_name), media_type="application/json")

    async def _stream(self, wire, fill: Fill, job: Job):
        model = self.f.model_name
        try:
            async for delta in self.f.jobs.run(job):
                yield wire.event(fill, job.request_id, delta, self.outcome(job), model)
        except EngineDeadError as e:
            yield wire.stream_error(str(e))
            return
        out = self.outcome(job)
        yield wire.stream_error("the engine could not run this request") if out.finish == "error" else \
            wire.end(fill, job.request_id, out, model)
