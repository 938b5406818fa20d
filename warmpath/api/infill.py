"""llama.cpp's `POST /infill` (llama.vim, llama.vscode) to and from an Ask.

The body: `input_prefix`, `input_suffix`, `input_extra: [{text, filename, time}]`, `prompt` (the
cursor's line so far: rendered after the FIM middle marker), `n_predict` (-1: up to the context; 0:
only fill the cache, the warm-up), `t_max_prompt_ms`, `t_max_predict_ms`, `n_indent`, `stop`,
`top_k`, `top_p`, `temperature`, `seed`, `samplers`, `stream`, `response_fields`, `id_slot`,
`cache_prompt`, `n_cmpl`. Sampling follows llama.cpp's chain: with `samplers` given, a sampler not
listed is off (llama.vim lists top_k and top_p only, so temperature is 1); listed samplers this
server lacks (infill, min_p, typ_p, ...) have no effect. `cache_prompt` is always on and `id_slot`
has no meaning here (the prefix cache is shared, not per slot); `n_cmpl` above 1 still gets one
completion (a single object, which llama.vscode reads like a list of one).

The answer is compact JSON (llama.vim drops a reply unless it matches `"content":"` with no space),
with llama.cpp's fields; `response_fields` keeps only the paths asked for, each under its own flat
key (`"timings/prompt_n"`). A stream is `data: {...}` events, the last with `stop: true` and the
counts; no [DONE]. Errors: `{"error": {"code", "message", "type"}}`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from warmpath.api.ask import Ask, Outcome
from warmpath.api.bodies import compact, parse_json, shaped, validation_message
from warmpath.api.fim import ContextFile, Fill
from warmpath.api.protocol import encodable, stop_strings
from warmpath.config import CompletionScope

NAME, PATHS = "infill", ("/infill",)
# FRAMING: how the router splits a stream into whole events
STREAM_MEDIA, FRAMING = "text/event-stream", "sse"
SAMPLERS = {
    "penalties", "dry", "top_n_sigma", "top_k", "typ_p", "typical_p", "top_p", "min_p", "xtc",
    "temperature", "infill"
}
_STOP_TYPE = {
    "stop": "eos", "length": "limit", "deadline": "limit", "overloaded": "limit", "error": "limit"
}


class ExtraChunk(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    text: str = ""
    filename: str = "tmp"
    # llama.vim sends reltime() (a list), llama.vscode Date.now(): only the order counts here
    time: Any = None


class InfillBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[ExtraChunk] = Field(default_factory=list, max_length=256)
    prompt: str = ""
    n_predict: int = Field(default=-1, ge=-1)
    t_max_prompt_ms: float = -1
    t_max_predict_ms: float = -1
    n_indent: int = Field(default=0, ge=0)
    stop: list[str] = Field(default_factory=list)
    top_k: int = Field(default=40, ge=0)
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    temperature: float = Field(default=0.8, ge=0.0, le=2.0)
    seed: int = Field(default=-1, ge=-1, lt=2**63)
    samplers: list[str] | None = None
    stream: bool = False
    response_fields: list[str] | None = None
    id_slot: int = -1
    cache_prompt: bool = True
    n_cmpl: int = Field(default=1, ge=1, le=16)
    model: str | None = None
    scope: CompletionScope | None = None  # warmpath's: where the answer ends (api/scope.py)
    # warmpath's: server/confidence.py
    min_confidence: float | None = Field(default=None, ge=0.0, le=1.0)

    @field_validator("input_prefix", "input_suffix", "prompt", "stop")
    @classmethod
    def text(cls, v):
        return stop_strings(v) if isinstance(v, list) else encodable(v)

    @field_validator("samplers")
    @classmethod
    def known_samplers(cls, v):
        unknown = [s for s in v or [] if s not in SAMPLERS]
        if unknown:
            raise ValueError(f"unknown sampler {unknown[0]!r}")
        return v


def error(status: int, message: str, param: str | None = None):
    """llama.cpp's error object, raised as an ApiError."""
    kind = {401: "authentication_error", 404: "not_found_error", 501: "not_supported_error"}.get(
        status, "invalid_request_error" if status < 500 else "server_error")
    return shaped(status, {"error": {"code": status, "message": message[:1000], "type": kind}})


def parse(raw: bytes) -> Ask:
    body = parse_json(raw, error)
    try:
        b = InfillBody.model_validate(body)
        for e in b.input_extra:
            encodable(e.text), encodable(e.filename)
    except (ValidationError, ValueError) as e:
        message = validation_message(e)[0] if isinstance(e, ValidationError) else str(e)
        raise error(400, message) from None
    on = (lambda name: True) if b.samplers is None else (lambda name: name in b.samplers)  # noqa: E731
    return Ask(
        kind=NAME,
        fill=Fill(prefix=b.input_prefix, suffix=b.input_suffix, middle=b.prompt,
                  extra=[ContextFile(e.filename, e.text) for e in b.input_extra
                         if e.text]), max_tokens=None if b.n_predict < 0 else b.n_predict,
        temperature=b.temperature if on("temperature") else 1.0,
        top_k=b.top_k if on("top_k") else 0, top_p=b.top_p if on("top_p") else 1.0,
        seed=None if b.seed < 0 else b.seed, stop=b.stop, stream=b.stream, model=b.model,
        prompt_ms=b.t_max_prompt_ms if b.t_max_prompt_ms > 0 else None,
        predict_ms=b.t_max_predict_ms if b.t_max_predict_ms > 0 else None, n_indent=b.n_indent,
        scope=b.scope, min_confidence=b.min_confidence,
        options={"response_fields": b.response_fields or [], "id_slot": b.id_slot})


def _result(ask: Ask, out: Outcome, model: str | None, content: str) -> dict:
    prompt_n = max(0, out.prompt_tokens - out.cached_tokens)
    prompt_ms, predicted_ms = out.prompt_s * 1000, out.predict_s * 1000
    return {
        "index": 0,
        "content": content,
        "tokens": [],
        "id_slot": ask.options.get("id_slot", -1),
        "stop": True,
        "model": model,
        "tokens_predicted": out.generated_tokens,
        "tokens_evaluated": out.prompt_tokens,
        "generation_settings": {
            "n_predict": -1 if ask.max_tokens is None else ask.max_tokens,
            "temperature": ask.temperature, "top_k": ask.top_k, "top_p": ask.top_p,
            "seed": -1 if ask.seed is None else ask.seed, "n_indent": ask.n_indent,
            "t_max_prompt_ms": ask.prompt_ms or -1, "t_max_predict_ms": ask.predict_ms or -1
        },
        "has_new_line": "\n" in out.text,
        "truncated": out.truncated,
        "stop_type": _STOP_TYPE.get(out.finish, "limit"),
        "stopping_word": "",
        "tokens_cached": out.cached_tokens,
        # warmpath's own: "deadline" / "overloaded" / "low_confidence" for a silent answer, and the
        # confidence
        "finish_reason": out.finish,
        "confidence": out.confidence,
        "timings": {
            "cache_n": out.cached_tokens,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": prompt_n / out.prompt_s if out.prompt_s > 0 else 0.0,
            "predicted_n": out.generated_tokens,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms /
            out.generated_tokens if out.generated_tokens else 0.0,
            "predicted_per_second": out.generated_tokens /
            out.predict_s if out.predict_s > 0 else 0.0,
        },
    }


def _fields(result: dict, paths: list[str]) -> dict:
    """llama.cpp's response_fields: each path found ("a/b" walks into objects) under its own flat
    key."""
    if not paths:
        return result
    picked = {}
    for path in paths:
        node, found = result, True
        for part in path.split("/"):
            if isinstance(node, dict) and part in node:
                node = node[part]
            else:
                found = False
                break
        if found:
            picked[path] = node
    return picked


def answer(ask: Ask, request_id: str, out: Outcome, model: str | None) -> bytes:
    return compact(_fields(_result(ask, out, model, "" if out.silent else out.text),
                           ask.options.get("response_fields", [])))


def event(ask: Ask, request_id: str, text: str, out: Outcome, model: str | None) -> bytes:
    """One streamed piece of text."""
    payload = {
        "index": 0, "content": text, "tokens": [], "stop": False,
        "id_slot": ask.options.get("id_slot", -1), "tokens_predicted": out.generated_tokens,
        "tokens_evaluated": out.prompt_tokens
    }
    return b"data: " + compact(payload) + b"\n\n"


def end(ask: Ask, request_id: str, out: Outcome, model: str | None) -> bytes:
    """The stream's last event: the whole result with empty content (the text went before) and stop:
    true."""
    return b"data: " + compact(_fields(_result(ask, out, model, ""),
                                       ask.options.get("response_fields", []))) + b"\n\n"


def stream_error(message: str) -> bytes:
    return b"data: " + compact(error(500, message).body) + b"\n\n"
