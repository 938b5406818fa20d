"""Mistral's `POST /v1/fim/completions` (Continue's `provider: mistral`, the `mistralai` client) to
and from an Ask.

The body: `model`, `prompt` (the prefix), `suffix`, `max_tokens`, `temperature` (default 0.7,
Codestral's), `top_p`, `stop`, `random_seed`, `stream`, `prompt_cache_key` (a session key when no
X-Session-Id is sent); `min_tokens` is refused unless 0. The answer is chat-completion shaped
(`choices[0].message.content`), a stream is chat chunks (`choices[0].delta.content`) ending with
`data: [DONE]`. Validation errors are 422 `{"detail": [{loc, msg, type}]}` (what the client parses
as HTTPValidationError), others `{"object": "error", "message", "type", "param", "code"}`.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from warmpath.api.ask import Ask, Outcome
from warmpath.api.bodies import compact, parse_json, shaped, validation_message
from warmpath.api.fim import Fill
from warmpath.api.protocol import encodable, stop_strings
from warmpath.config import CompletionScope

NAME, PATHS = "mistral", ("/v1/fim/completions",)
STREAM_MEDIA, FRAMING = "text/event-stream", "sse"


class FimBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str
    prompt: str
    suffix: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    min_tokens: int | None = Field(default=None, ge=0, le=0)
    temperature: float | None = Field(default=None, ge=0.0, le=1.5)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    random_seed: int | None = Field(default=None, ge=0, lt=2**63)
    stream: bool = False
    prompt_cache_key: str | None = Field(default=None, max_length=256)
    scope: CompletionScope | None = None  # warmpath's: where the answer ends (api/scope.py)
    # warmpath's: server/confidence.py
    min_confidence: float | None = Field(default=None, ge=0.0, le=1.0)

    @field_validator("prompt", "suffix", "stop")
    @classmethod
    def text(cls, v):
        stops = [v] if isinstance(v, str) else v
        encodable(stops)
        return v


def error(status: int, message: str, param: str | None = None):
    if status == 422:
        return shaped(
            422, {
                "detail": [{
                    "loc": ["body", *(param.split(".") if param else [])], "msg": message[:1000],
                    "type": "value_error"
                }]
            })
    kind = "invalid_request_error" if status < 500 else "internal_error"
    return shaped(
        status,
        {"object": "error", "message": message[:1000], "type": kind, "param": param, "code": None})


def parse(raw: bytes) -> Ask:
    body = parse_json(raw, error)
    try:
        b = FimBody.model_validate(body)
    except ValidationError as e:
        message, field = validation_message(e)
        raise error(422, message, field) from None
    try:
        stops = stop_strings(b.stop)
    except ValueError as e:
        raise error(422, str(e), "stop") from None
    return Ask(kind=NAME, fill=Fill(prefix=b.prompt, suffix=b.suffix), max_tokens=b.max_tokens,
               temperature=0.7 if b.temperature is None else b.temperature, top_p=b.top_p,
               seed=b.random_seed, stop=stops, stream=b.stream, model=b.model,
               user=b.prompt_cache_key, scope=b.scope, min_confidence=b.min_confidence)


def _usage(out: Outcome) -> dict:
    return {"prompt_tokens": out.prompt_tokens, "completion_tokens": out.generated_tokens,
            "total_tokens": out.prompt_tokens + out.generated_tokens,
            "prompt_tokens_details": {"cached_tokens": out.cached_tokens}}


def answer(ask: Ask, request_id: str, out: Outcome, model: str | None) -> bytes:
    return compact({
        "id": request_id, "object": "chat.completion", "model": model, "created": int(time.time()),
        "usage": _usage(out), "choices": [{
            "index": 0, "message": {"role": "assistant", "content": "" if out.silent else out.text},
            "finish_reason": out.finish
        }]
    })


def _chunk(request_id: str, model: str | None, delta: dict, finish: str | None,
           usage: dict | None = None) -> bytes:
    body = {
        "id": request_id, "object": "chat.completion.chunk", "created": int(time.time()),
        "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
    }
    if usage is not None:
        body["usage"] = usage
    return b"data: " + compact(body) + b"\n\n"


def event(ask: Ask, request_id: str, text: str, out: Outcome, model: str | None) -> bytes:
    return _chunk(request_id, model, {"role": "assistant", "content": text}, None)


def end(ask: Ask, request_id: str, out: Outcome, model: str | None) -> bytes:
    return _chunk(request_id, model, {"content": ""}, out.finish, _usage(out)) + b"data: [DONE]\n\n"


def stream_error(message: str) -> bytes:
    return b"data: " + compact(error(500, message).body) + b"\n\n"
