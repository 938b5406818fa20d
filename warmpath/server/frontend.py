"""The HTTP side of the engine, shared by every route (app.py's OpenAI routes, editors.py's editor protocols):
model names, prompts from request bodies, jobs, and answers from jobs.

A late answer is silence, never an error: past X-Deadline-Ms the request is aborted and answered 200 with
empty text and finish_reason "deadline"; one that cannot start in time is answered at once with
"overloaded". A client that goes away aborts its request (its blocks return to the pool at once).
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from warmpath.api import responses as wire
from warmpath.api.asgi import ClientGone, unless_disconnected
from warmpath.api.fill import Extra, Fill
from warmpath.api.fim import suffix_tokens
from warmpath.api.protocol import ApiError, ChatRequest, CompletionRequest, SamplingFields
from warmpath.config import ServerConfig
from warmpath.engine.async_engine import AsyncEngine, EngineDeadError
from warmpath.engine.engine import Engine
from warmpath.engine.metrics import Metrics
from warmpath.models.registry import bundled
from warmpath.server.jobs import Job, Jobs
from warmpath.server.logprobs import LogprobFormatter
from warmpath.server.prompter import Prompter
from warmpath.server.tenancy import Tenancy, tenancy


class Frontend:
    """What the routes share: the engine, its model names and prompt formats, and the jobs it runs."""

    def __init__(self, engine: Engine, config: ServerConfig):
        self.engine, self.config = engine, config
        self.tokenizer = engine.tokenizer
        kept = suffix_tokens(config.fim_suffix_tokens, engine.cost.prompt_seconds_per_token, engine.config.block_size)
        self.prompter = Prompter(self.tokenizer, engine.max_model_len, config.fim_layout, config.completion_scope, kept,
                                 config.min_confidence)
        self.fim, self.encoder = self.prompter.fim, self.prompter.encoder
        self.async_engine = AsyncEngine(engine)
        self.metrics = Metrics(lambda: self.async_engine.snapshot.stats)
        self.jobs = Jobs(engine, self.async_engine, self.metrics, self.fim)
        self.logprob_format = LogprobFormatter(self.tokenizer)
        self.model_name = config.served_model_name or engine.config.model
        model = bundled(engine.config.model)  # a bundled model is served by its Ollama `name:tag` too
        tag = model.tag if model and not config.served_model_name else ""
        self.names = [self.model_name, *([tag] if tag and tag != self.model_name else [])]  # listed, in order
        self.accepted_names = {*self.names, engine.config.model}
        self.model_card = self._model_card()

    def _model_card(self) -> dict:
        """The /v1/models entry, with what a deployer checks (warmpath's fields): the architecture, the file's quant
        mix (tensors per GGUF type) and what the native kernel reads, the FIM template and whether it takes
        repository context, the context length, and KV bytes per token in the cache's dtype."""
        cfg, native = self.engine.model_config, self.engine.runner.native
        return {"id": self.model_name, "object": "model", "created": 0, "owned_by": "warmpath",
                "max_model_len": self.engine.max_model_len, "architecture": cfg.architecture,
                "context_length": cfg.max_position_embeddings, "quantization": self.engine.tensor_types or None,
                "kernel_weights": native.weight_kinds if native else None,
                "fim_template": self.fim.name if self.fim else None,
                "repo_context": bool(self.fim and self.fim.file_sep),
                "fim_suffix_tokens": self.prompter.suffix_tokens if self.fim else None,  # None: the whole suffix
                "kv_bytes_per_token": cfg.kv_bytes_per_token(self.engine.kv_dtype_name)}

    def tenancy(self, body: SamplingFields, request: Request) -> Tenancy:
        """The request's prefix-cache salt and session, scoped by its tenant (tenancy.py)."""
        return tenancy(request.headers, body.user, body.cache_salt, self.config.cache_isolation,
                       self.config.max_session_id_chars)

    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.accepted_names:
            raise ApiError(404, f"model {name!r} does not exist; this server serves {self.model_name!r}",
                           param="model", code="model_not_found")

    # -- jobs from request bodies -----------------------------------------------------------------------------
    async def completion_job(self, body: CompletionRequest, request: Request, received: float) -> Job:
        """A text prompt goes the way every protocol's does (prompter.py); token ids are taken as they are."""
        self.check_model(body.model)
        if isinstance(body.prompt, str):
            job = await self._text_completion(body, request, received)
        elif body.suffix or body.extra:
            raise ApiError(400, "suffix and extra need a text prompt", param="suffix" if body.suffix else "extra")
        else:
            job = self.jobs.make("completion", body, list(body.prompt), request.headers, received, body.max_tokens,
                                 self.tenancy(body, request))
        if body.echo:
            job.echo = body.prompt if isinstance(body.prompt, str) else self.tokenizer.decode(job.prompt_ids)
            job.text_offset = len(job.echo)
        return job

    async def _text_completion(self, body: CompletionRequest, request: Request, received: float) -> Job:
        max_len = self.engine.max_model_len
        if body.max_tokens is not None and body.max_tokens >= max_len:  # no prompt could leave it room
            raise ApiError(400, f"max_tokens ({body.max_tokens}) leaves no room for a prompt in the model's context "
                                f"of {max_len} tokens", param="max_tokens", code="context_length_exceeded")
        extra = [Extra(e.filename, e.text) for e in body.extra or []]
        # Other files without a suffix: still a FIM prompt (the context where the family reads it), hole at the end
        suffix = body.suffix or ("" if self.fim is not None and any(e.text or e.filename for e in extra) else None)
        prompt = await self.prompter.fit(Fill(prefix=body.prompt, suffix=suffix, extra=extra),
                                         self.prompter.reserve(body.max_tokens))
        if body.temperature is None and prompt.rendered.fim_mode:  # a FIM completion: greedy unless asked
            body = body.model_copy(update={"temperature": 0.0})
        job = self.jobs.make("completion", body, prompt.ids, request.headers, received,
                             self.prompter.max_tokens(body.max_tokens, prompt), self.tenancy(body, request))
        self.prompter.dress(job, prompt, body.scope, min_confidence=body.min_confidence)
        return job

    async def chat_job(self, body: ChatRequest, request: Request, received: float) -> Job:
        self.check_model(body.model)
        try:
            prompt_ids = await self.encoder.encode_chat([{"role": m.role, "content": m.text()} for m in body.messages])
        except ApiError:
            raise
        except ValueError as e:
            raise ApiError(400, str(e), param="messages") from None
        except Exception as e:  # a template that fails on these messages is the caller's input problem
            raise ApiError(400, f"chat template failed on these messages: {e}", param="messages") from None
        return self.jobs.make("chat", body, prompt_ids, request.headers, received,
                              body.max_completion_tokens or body.max_tokens, self.tenancy(body, request))

    # -- answers ----------------------------------------------------------------------------------------------
    async def respond(self, job: Job, body: SamplingFields, request: Request):
        """The job's answer; one the engine refuses is a 400 before any answer starts, one that cannot start
        before its deadline is refused at once ("overloaded": silence)."""
        self.jobs.start(job)
        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            # The background task runs when the response is done, also when the client left before the stream
            # started (the stream's own cleanup never ran then): the job is counted as the client's abort.
            return StreamingResponse(self._sse(job, include_usage), media_type="text/event-stream",
                                     headers=wire.SSE_HEADERS, background=BackgroundTask(self.jobs.end, job))
        try:  # not streamed: watch for the client going away while we compute
            await unless_disconnected(request, self.jobs.collect(job))
        except ClientGone:
            return Response(status_code=499)
        except EngineDeadError as e:
            raise ApiError(503, str(e), "server_error", code="engine_dead") from None
        finally:
            self.jobs.end(job)  # also when the collecting stopped before it began
        return wire.answer(job.kind, job.request_id, self.model_name, job.echo + job.text, job.finish_reason,
                           job.usage(), job.fim_mode, self._logprobs(job), job.confidence)

    def _logprobs(self, job: Job) -> dict | None:
        """The logprobs of the job's tokens not yet reported, in the answer's shape; None if not asked for."""
        if not job.logprobs_asked:
            return None
        if job.kind == "chat":
            return self.logprob_format.chat(job.take_logprobs(self.logprob_format.num_chars))
        entries = job.take_logprobs(self.logprob_format.num_chars)
        view, job.text_offset = self.logprob_format.completion(entries, job.text_offset)
        return view

    def _chunk(self, job: Job, text: str, finish: str | None, first: bool = False) -> str:
        if first and not job.silent:
            text = job.echo + text
        return wire.sse(wire.chunk(job.kind, job.request_id, self.model_name, text, finish, first, job.fim_mode,
                                   None if job.silent else self._logprobs(job),
                                   job.confidence if finish is not None else None))  # on the last chunk

    async def _sse(self, job: Job, include_usage: bool):
        first = True
        try:
            async for delta in self.jobs.run(job):
                yield self._chunk(job, delta, None, first)
                first = False
        except EngineDeadError as e:
            yield wire.sse_error(str(e), "engine_dead")
            return
        yield self._chunk(job, "", job.finish_reason, first)
        if include_usage:
            yield wire.sse(wire.usage_chunk(job.kind, job.request_id, self.model_name, job.usage(), job.fim_mode))
        yield wire.SSE_DONE
