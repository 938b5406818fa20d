"""The OpenAI-compatible HTTP server over one AsyncEngine.

A late answer is silence, never an error: past X-Deadline-Ms the request is aborted and answered 200 with
empty text and finish_reason "deadline"; one that cannot start in time is answered at once with
"overloaded". A client that goes away aborts its request (its blocks return to the pool at once).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from warmpath.config import ServerConfig
from warmpath.engine.async_engine import AsyncEngine, EngineDeadError
from warmpath.engine.detokenizer import IncrementalDetokenizer
from warmpath.engine.engine import Engine
from warmpath.engine.metrics import Metrics
from warmpath.engine.request import FinishReason, PromptTooLongError, RequestOutput, SamplingParams
from warmpath.server.guard import GuardMiddleware
from warmpath.server.prompts import SuffixCutter, detect_fim, render_chat
from warmpath.server.protocol import ChatRequest, CompletionRequest, error_body

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.body = status, error_body(message, type_, param, code)


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
    cutter: SuffixCutter | None = None
    fim_mode: str | None = None
    text: str = ""
    num_generated: int = 0
    num_cached: int = 0
    finish_reason: str | None = None
    first_token: float | None = None


def _finish_reason(out: RequestOutput, detok: IncrementalDetokenizer) -> str:
    if detok.stopped:
        return "stop"
    return {FinishReason.STOP: "stop", FinishReason.LENGTH: "length", FinishReason.DEADLINE: "deadline",
            FinishReason.ERROR: "error", FinishReason.ABORT: "abort"}[out.finish_reason]


def create_app(engine: Engine, config: ServerConfig | None = None) -> FastAPI:
    config = config or ServerConfig()
    async_engine = AsyncEngine(engine)
    metrics = Metrics(engine)
    tokenizer = engine.tokenizer
    fim = detect_fim(tokenizer)
    model_name = config.served_model_name or engine.config.model
    accepted_names = {model_name, engine.config.model}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        async_engine.shutdown()

    app = FastAPI(title="warmpath", lifespan=lifespan)
    app.state.engine, app.state.async_engine, app.state.metrics = engine, async_engine, metrics

    # -- errors: always the OpenAI error object ------------------------------------------------------------
    @app.exception_handler(ApiError)
    async def api_error(_: Request, e: ApiError):
        return JSONResponse(e.body, status_code=e.status)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, e: Exception):  # a bug: logged with its traceback, answered in shape
        log.exception("unhandled error")
        return JSONResponse(error_body(f"internal error: {type(e).__name__}", "server_error"), status_code=500)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        msg = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":  # its loc is a character offset, not a field
            msg, loc = "request body is not valid JSON", []
        return JSONResponse(error_body(f"{'.'.join(loc) + ': ' if loc else ''}{msg}", param=".".join(loc) or None),
                            status_code=400)

    app.add_middleware(GuardMiddleware, config=config)

    # -- simple routes --------------------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        if not async_engine.alive:
            return JSONResponse({"status": "dead", "error": repr(async_engine.error)}, status_code=503)
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "warmpath", "max_model_len": engine.max_model_len}]}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    # -- building a job -------------------------------------------------------------------------------------
    def check_model(name: str | None) -> None:
        if name is not None and name not in accepted_names:
            raise ApiError(404, f"model {name!r} does not exist; this server serves {model_name!r}",
                           param="model", code="model_not_found")

    def deadline_from(request: Request, received: float) -> float | None:
        raw = request.headers.get("x-deadline-ms")
        if raw is None:
            return None
        try:
            ms = float(raw)
        except ValueError:
            ms = float("nan")
        if not ms > 0 or ms == float("inf"):
            raise ApiError(400, "X-Deadline-Ms must be a positive number of milliseconds", param="X-Deadline-Ms")
        return received + ms / 1000

    def make_job(kind: str, body, prompt_ids: list[int], request: Request, received: float,
                 max_tokens: int | None) -> Job:
        room = engine.max_model_len - len(prompt_ids)
        if max_tokens is None:
            max_tokens = max(1, room)
        elif len(prompt_ids) + max_tokens > engine.max_model_len:
            raise ApiError(400, f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds the "
                                f"model's context of {engine.max_model_len} tokens", param="max_tokens",
                           code="context_length_exceeded")
        try:
            params = SamplingParams(max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
                                    top_k=body.top_k, seed=body.seed)
            engine.validate(prompt_ids, params)
        except (ValueError, PromptTooLongError) as e:
            raise ApiError(400, str(e), param="prompt") from None
        session = request.headers.get("x-session-id") or body.user
        return Job(f"{kind[:4]}-{uuid.uuid4().hex}", kind, prompt_ids, params, body.stop or [], session, received,
                   deadline_from(request, received))

    def overloaded(job: Job) -> bool:
        """Can the request not even start before its deadline, given the work queued ahead of it?"""
        return job.deadline is not None and time.monotonic() + async_engine.estimate_wait() > job.deadline

    # -- running a job --------------------------------------------------------------------------------------
    async def run(job: Job) -> AsyncIterator[str]:
        """Text deltas; sets job.finish_reason. Enforces the deadline itself (the engine only sees it at step
        boundaries, which may be long)."""
        detok = IncrementalDetokenizer(tokenizer, stop=job.stop)
        gen = async_engine.generate(job.request_id, job.prompt_ids, job.params, job.session_id, job.deadline)
        try:
            while True:
                timeout = None if job.deadline is None else max(0.0, job.deadline - time.monotonic())
                try:
                    out = await asyncio.wait_for(anext(gen), timeout)
                except (TimeoutError, StopAsyncIteration):
                    job.finish_reason = "deadline"
                    metrics.aborted.labels("deadline").inc()
                    return
                job.num_cached = out.num_cached_tokens
                if out.new_token_ids and job.first_token is None:
                    job.first_token = time.monotonic()
                job.num_generated = len(out.token_ids)
                delta = detok.add(out.new_token_ids)
                if out.finished:
                    delta += detok.finish()
                if job.cutter:
                    delta = job.cutter.feed(delta, final=out.finished or detok.stopped)
                if delta:
                    job.text += delta
                    yield delta
                if detok.stopped or (job.cutter and job.cutter.cut):
                    job.finish_reason = "stop"
                    return
                if out.finished:
                    job.finish_reason = _finish_reason(out, detok)
                    if job.finish_reason == "deadline":
                        metrics.aborted.labels("deadline").inc()
                    return
        finally:
            await gen.aclose()  # aborts the request in the engine unless it finished
            record(job)

    def record(job: Job) -> None:
        if job.finish_reason is None:  # the client went away
            metrics.aborted.labels("client").inc()
            job.finish_reason = "abort"
        metrics.requests.labels(job.finish_reason).inc()
        metrics.prompt_tokens.inc(len(job.prompt_ids))
        metrics.generation_tokens.inc(job.num_generated)
        if job.finish_reason in ("abort", "deadline"):
            metrics.wasted_tokens.inc(job.num_generated)
        now = time.monotonic()
        metrics.e2e.observe(now - job.received)
        if job.first_token is not None:
            metrics.ttft.observe(job.first_token - job.received)
            if job.num_generated > 1:
                metrics.tpot.observe((now - job.first_token) / (job.num_generated - 1))

    def usage(job: Job) -> dict:
        return {"prompt_tokens": len(job.prompt_ids), "completion_tokens": job.num_generated,
                "total_tokens": len(job.prompt_ids) + job.num_generated,
                "prompt_tokens_details": {"cached_tokens": job.num_cached}}

    def envelope(job: Job, choice: dict, chunk: bool = False) -> dict:
        obj = {"completion": "text_completion", "chat": "chat.completion"}[job.kind]
        body = {"id": job.request_id, "object": obj + (".chunk" if chunk and job.kind == "chat" else ""),
                "created": int(time.time()), "model": model_name, "choices": [choice]}
        if job.fim_mode is not None:
            body["fim_mode"] = job.fim_mode
        return body

    def choice(job: Job, text: str, finish: str | None, delta: bool = False, first: bool = False) -> dict:
        if job.kind == "completion":
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        if delta:
            d = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            return {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                "finish_reason": finish}

    async def respond(job: Job, stream: bool, request: Request, include_usage: bool):
        if overloaded(job):
            metrics.aborted.labels("overloaded").inc()
            metrics.requests.labels("overloaded").inc()
            job.finish_reason = "overloaded"
            if stream:
                return StreamingResponse(sse_silence(job), media_type="text/event-stream")
            return {**envelope(job, choice(job, "", "overloaded")), "usage": usage(job)}
        if not async_engine.alive:
            raise ApiError(503, "the engine loop is not running", "server_error", code="engine_dead")
        if stream:
            return StreamingResponse(sse(job, include_usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        # Non-streaming: watch for the client going away while we compute.
        consume = asyncio.ensure_future(_collect(run(job)))
        gone = asyncio.ensure_future(_wait_disconnect(request))
        await asyncio.wait({consume, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not consume.done():
            consume.cancel()
            await asyncio.gather(consume, return_exceptions=True)
            return Response(status_code=499)
        gone.cancel()
        try:
            consume.result()
        except EngineDeadError as e:
            raise ApiError(503, str(e), "server_error", code="engine_dead") from None
        text = "" if job.finish_reason == "deadline" else job.text  # late: silence, not a fragment
        return {**envelope(job, choice(job, text, job.finish_reason)), "usage": usage(job)}

    async def sse(job: Job, include_usage: bool):
        first = True
        try:
            async for delta in run(job):
                yield _sse(envelope(job, choice(job, delta, None, delta=True, first=first), chunk=True))
                first = False
        except EngineDeadError as e:
            yield _sse(error_body(str(e), "server_error", code="engine_dead"))
            return
        yield _sse(envelope(job, choice(job, "", job.finish_reason, delta=True, first=first), chunk=True))
        if include_usage:
            yield _sse({**envelope(job, choice(job, "", None, delta=True), chunk=True), "choices": [],
                        "usage": usage(job)})
        yield "data: [DONE]\n\n"

    async def sse_silence(job: Job):
        yield _sse(envelope(job, choice(job, "", job.finish_reason, delta=True, first=True), chunk=True))
        yield "data: [DONE]\n\n"

    # -- the two generation routes ----------------------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        received = time.monotonic()
        check_model(body.model)
        cutter, fim_mode = None, None
        if isinstance(body.prompt, str):
            text = body.prompt
            if body.suffix:
                if fim is not None:
                    text, fim_mode = fim.build(body.prompt, body.suffix), fim.name
                else:  # no FIM tokens: complete from the prefix, cut where the suffix starts repeating
                    cutter, fim_mode = SuffixCutter(body.suffix), "prefix-only"
            prompt_ids = tokenizer.encode(text)
        else:
            if body.suffix:
                raise ApiError(400, "suffix needs a text prompt", param="suffix")
            prompt_ids = list(body.prompt)
        job = make_job("completion", body, prompt_ids, request, received, body.max_tokens)
        job.cutter, job.fim_mode = cutter, fim_mode
        return await respond(job, body.stream, request, _include_usage(body))

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        received = time.monotonic()
        check_model(body.model)
        try:
            text = render_chat(tokenizer, [{"role": m.role, "content": m.text()} for m in body.messages])
        except ValueError as e:
            raise ApiError(400, str(e), param="messages") from None
        except Exception as e:  # a template that fails on these messages is the caller's input problem
            raise ApiError(400, f"chat template failed on these messages: {e}", param="messages") from None
        job = make_job("chat", body, tokenizer.encode(text), request, received,
                       body.max_completion_tokens or body.max_tokens)
        return await respond(job, body.stream, request, _include_usage(body))

    return app


def _include_usage(body) -> bool:
    return bool((body.stream_options or {}).get("include_usage"))


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _collect(chunks: AsyncIterator[str]) -> None:
    async for _ in chunks:
        pass


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
