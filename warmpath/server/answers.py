"""A job's answer in its protocol's shape: the last step of the pipeline (server/pipeline.py). One
class per family of shapes, each made per request with its Ask: OpenAI's (JSON or SSE chunks,
logprobs, echo, the usage chunk) and the editor protocols' (an api/ module: NAME, answer, event,
end, stream_error, error, STREAM_MEDIA)."""

from __future__ import annotations

from typing import Protocol

from fastapi.responses import JSONResponse, Response

from warmpath.api import responses as openai_shapes
from warmpath.api.ask import Ask, Outcome
from warmpath.api.protocol import ApiError
from warmpath.server.jobs import Job
from warmpath.server.logprobs import LogprobFormatter

ENGINE_FAILED = "the engine could not run this request"


class Answers(Protocol):
    media: str  # a stream's media type

    def whole(self, job: Job) -> Response: ...  # the answer, not streamed

    def event(self, job: Job, text: str) -> str | bytes: ...  # a piece of text, streamed

    def end(self, job: Job) -> list[str | bytes]: ...  # a stream's last events

    def broken(self, message: str) -> str | bytes: ...  # a stream's end when the engine died

    # an answer with nothing run (Ollama's load, an empty warm-up)
    def idle(self, finish: str) -> Response: ...

    def error(self, e: ApiError) -> ApiError: ...  # our error in the protocol's shape


class OpenAIAnswers:
    """OpenAI's completions and chat completions."""

    media = "text/event-stream"

    def __init__(self, ask: Ask, model: str, logprob_format: LogprobFormatter):
        self.ask, self.model, self.logprob_format = ask, model, logprob_format
        self.first = True  # the next event opens the stream: the echo, a chat stream's role

    def _logprobs(self, job: Job) -> dict | None:
        """The logprobs of the job's tokens not yet reported, in the answer's shape; None if not
        asked for."""
        if not job.logprobs_asked:
            return None
        if job.kind == "chat":
            return self.logprob_format.chat(job.take_logprobs(self.logprob_format.num_chars))
        entries = job.take_logprobs(self.logprob_format.num_chars)
        view, job.text_offset = self.logprob_format.completion(entries, job.text_offset)
        return view

    def whole(self, job: Job) -> Response:
        return JSONResponse(
            openai_shapes.answer(job.kind, job.request_id, self.model,
                                 job.echo + job.text, job.finish_reason, job.usage(), job.fim_mode,
                                 self._logprobs(job), job.confidence))

    def event(self, job: Job, text: str, finish: str | None = None) -> str:
        first, self.first = self.first, False
        if first and not job.silent:
            text = job.echo + text
        return openai_shapes.sse(
            openai_shapes.chunk(job.kind, job.request_id, self.model, text, finish, first,
                                job.fim_mode, None if job.silent else self._logprobs(job),
                                job.confidence if finish is not None else None))

    def end(self, job: Job) -> list[str]:
        last = [self.event(job, "", job.finish_reason)]  # the confidence rides on the last chunk
        if self.ask.include_usage:
            last.append(
                openai_shapes.sse(
                    openai_shapes.usage_chunk(job.kind, job.request_id, self.model, job.usage(),
                                              job.fim_mode)))
        return [*last, openai_shapes.SSE_DONE]

    def broken(self, message: str) -> str:
        return openai_shapes.sse_error(message, "engine_dead")

    def idle(self, finish: str) -> Response:
        return JSONResponse(openai_shapes.silence(self.ask.kind, self.model, finish))

    def error(self, e: ApiError) -> ApiError:
        return e  # ours is OpenAI's error object


class EditorAnswers:
    """An editor protocol's answers (`wire`: its api/ module). A job the engine failed is the
    protocol's 500."""

    def __init__(self, wire, ask: Ask, model: str):
        self.wire, self.ask, self.model = wire, ask, model
        self.media = getattr(wire, "STREAM_MEDIA", "application/json")

    def whole(self, job: Job) -> Response:
        out = job.outcome()
        if out.finish == "error":
            raise self.wire.error(500, ENGINE_FAILED)
        return Response(self.wire.answer(self.ask, job.request_id, out, self.model),
                        media_type="application/json")

    def event(self, job: Job, text: str) -> bytes:
        return self.wire.event(self.ask, job.request_id, text, job.outcome(), self.model)

    def end(self, job: Job) -> list[bytes]:
        out = job.outcome()
        return [self.wire.stream_error(ENGINE_FAILED) if out.finish == "error" else
                self.wire.end(self.ask, job.request_id, out, self.model)]

    def broken(self, message: str) -> bytes:
        return self.wire.stream_error(message)

    def idle(self, finish: str) -> Response:
        return Response(self.wire.answer(self.ask, "", Outcome(finish=finish), self.model),
                        media_type="application/json")

    def error(self, e: ApiError) -> ApiError:
        return shaped_error(self.wire, e)


def shaped_error(wire, e: ApiError) -> ApiError:
    """An error in the editor protocol's own shape (one already in it as it is)."""
    return e if getattr(e, "shaped", False) else wire.error(e.status, e.body["error"]["message"])
