"""OpenAI-compatible request bodies (pydantic), the one chat-content rule, and the error object."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


def encodable(v):
    """Text the tokenizer can take: every string (also in lists and content parts) encodes as UTF-8. JSON can
    carry lone UTF-16 surrogates (`"\\ud800"`), which no tokenizer can encode."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("text must be valid Unicode (no lone surrogates)") from None
    elif isinstance(v, list):
        for x in v:
            encodable(x.get("text") if isinstance(x, dict) else x)
    return v


class SamplingFields(BaseModel):
    # Unknown fields are ignored, as OpenAI clients send many we have no use for.
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    stop: str | list[str] | None = None
    stream: bool = False
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    user: str | None = Field(default=None, max_length=256)
    # vLLM's field: requests share prefix-cache blocks (and their timing) only with requests of the same salt.
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)
    n: int = Field(default=1, ge=1, le=1)  # one choice per request: an editor wants one suggestion
    stream_options: dict | None = None

    @field_validator("temperature", "top_p")
    @classmethod
    def finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @field_validator("cache_salt")
    @classmethod
    def salt_encodable(cls, v):
        return encodable(v)

    @field_validator("stop")
    @classmethod
    def stop_list(cls, v):
        encodable(v if isinstance(v, list) else [v])
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 8 or any(not s or len(s) > 256 for s in stops):
            raise ValueError("stop: at most 8 non-empty strings of at most 256 characters")
        return stops


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    suffix: str | None = None
    max_tokens: int | None = Field(default=16, ge=1)

    @field_validator("prompt", "suffix")
    @classmethod
    def one_prompt(cls, v, info):
        encodable(v)
        if info.field_name == "suffix":
            return v
        if isinstance(v, list) and v and isinstance(v[0], (str, list)):
            if len(v) != 1:
                raise ValueError("one prompt per request")
            v = v[0]
        if isinstance(v, list) and any(t < 0 for t in v):
            raise ValueError("token ids must be non-negative")
        if not v:
            raise ValueError("prompt must not be empty")
        return v


def content_text(content) -> str:
    """A chat message's text: a string as it is; of a list of content parts, the `type == "text"` parts' text.
    Takes raw JSON too (the router builds its routing key from unvalidated bodies): anything else is ""."""
    if isinstance(content, list):
        return "".join(p["text"] for p in content
                       if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict] | None = None

    @field_validator("content")
    @classmethod
    def content_encodable(cls, v):
        return encodable(v)

    def text(self) -> str:
        return content_text(self.content)


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message[:1000], "type": type_, "param": param, "code": code}}


class ApiError(Exception):
    """Answered as the OpenAI error object with this status (see asgi.install_error_handlers)."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.body = status, error_body(message, type_, param, code)
