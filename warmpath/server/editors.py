"""The editor protocols in the server: a body in any protocol (api/infill.py, api/ollama.py, api/mistral.py,
api/tabby.py) is one Fill, made a prompt as every text prompt is (prompter.py: rendered, fitted to the context),
run as a Job like any completion, and answered in that protocol's shape: its answer, its stream, its silence past
the deadline (empty text, never an error) and its errors.

A protocol here is a module: NAME, parse(raw) -> Fill, error(status, message), answer (an Outcome in its
shape); one that streams also STREAM_MEDIA, event / end and stream_error.
"""

from __future__ import annotations

import time

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from warmpath.api.asgi import ClientGone, unless_disconnected
from warmpath.api.fill import Fill, Outcome, Rendered
from warmpath.api.protocol import ApiError
from warmpath.api.responses import SSE_HEADERS
from warmpath.engine.async_engine import EngineDeadError
from warmpath.server.frontend import Frontend
from warmpath.server.jobs import Job
from warmpath.server.prompter import Prompt


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
    async def job(self, wire, fill: Fill, request: Request, received: float) -> Job | None:
        f = self.f
        warmup = fill.max_tokens == 0
        if fill.chat and f.tokenizer.chat_template:
            turns = ([{"role": "system", "content": fill.system}] if fill.system else []) + \
                [{"role": "user", "content": fill.prefix}]
            prompt = Prompt(await f.encoder.encode_chat(turns), Rendered(fill.prefix, None), False)
        else:
            prompt = await f.prompter.fit(fill, 1 if warmup else f.prompter.reserve(fill.max_tokens))
        if not prompt.ids:
            if warmup:
                return None
            raise ApiError(400, "nothing to complete: the prompt is empty", param="prompt")
        max_tokens = 1 if warmup else f.prompter.max_tokens(fill.max_tokens, prompt)
        job = f.jobs.make(wire.NAME, fill, prompt.ids, request.headers, received, max_tokens,
                          f.tenancy(fill, request))
        f.prompter.dress(job, prompt, fill.scope, fill.n_indent, fill.min_confidence)
        job.warmup = warmup
        if fill.prompt_ms is not None and not warmup:  # a warm-up's whole point is its prompt: never cut short
            job.request.prompt_deadline = received + fill.prompt_ms / 1000
        if fill.predict_ms is not None:
            job.predict_s = fill.predict_ms / 1000
        return job

    # -- the answer ---------------------------------------------------------------------------------------------
    async def respond(self, wire, fill: Fill, job: Job, request: Request) -> Response:
        self.f.jobs.start(job)
        if fill.stream:  # the background task ends a job whose client left before the stream started
            return StreamingResponse(self._stream(wire, fill, job), media_type=wire.STREAM_MEDIA, headers=SSE_HEADERS,
                                     background=BackgroundTask(self.f.jobs.end, job))
        try:
            await unless_disconnected(request, self.f.jobs.collect(job))
        except ClientGone:
            return Response(status_code=499)
        except EngineDeadError as e:
            raise wire.error(503, str(e)) from None
        finally:
            self.f.jobs.end(job)  # also when the collecting stopped before it began
        out = job.outcome()
        if out.finish == "error":
            raise wire.error(500, "the engine could not run this request")
        return Response(wire.answer(fill, job.request_id, out, self.f.model_name), media_type="application/json")

    async def _stream(self, wire, fill: Fill, job: Job):
        model = self.f.model_name
        try:
            async for delta in self.f.jobs.run(job):
                yield wire.event(fill, job.request_id, delta, job.outcome(), model)
        except EngineDeadError as e:
            yield wire.stream_error(str(e))
            return
        out = job.outcome()
        yield wire.stream_error("the engine could not run this request") if out.finish == "error" else \
            wire.end(fill, job.request_id, out, model)
