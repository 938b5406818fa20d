"""OpenAI-compatible request bodies (pydantic) and each as an Ask (api/ask.py), the one chat-content
rule, and the error object.

Types are strict (`"stream": "yes"` or a token id `"7"` is a 400, not coerced). Unknown fields are
ignored, as OpenAI clients send many we have no use for; but a known parameter we do not implement
is refused by name unless it has its neutral value (UNSUPPORTED), never silently ignored.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from warmpath.api.ask import Ask
from warmpath.api.fim import ContextFile, Fill
from warmpath.config import CompletionScope

MAX_LOGPROBS = 20  # the engine's bound (engine/request.py), which this layer does not import

# Parameter -> its neutral values: what clients send when they do not mean to use it.
UNSUPPORTED = {
    "best_of": (None, 1),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "repetition_penalty": (None, 1),
    "min_p": (None, 0),
    "min_tokens": (None, 0),
    "use_beam_search": (None, False),
    "response_format": (None, {"type": "text"}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "prediction": (None, ),
    "audio": (None, ),
    "modalities": (None, ["text"]),
    "prompt_logprobs": (None, ),
    "guided_json": (None, ),
    "guided_regex": (None, ),
    "guided_choice": (None, ),
    "guided_grammar": (None, ),
    "structured_outputs": (None, ),
}


# One bound on stop strings for every protocol: Zed's edit prediction sends 14 (its FIM markers of
# every family).
MAX_STOPS, MAX_STOP_CHARS = 32, 256


def stop_strings(v) -> list[str]:
    """A request's stop strings (one string, a list, or none), checked the same way for every
    protocol."""
    stops = [v] if isinstance(v, str) else (v or [])
    encodable(stops)
    if len(stops) > MAX_STOPS or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise ValueError(
            f"stop: at most {MAX_STOPS} non-empty strings of at most {MAX_STOP_CHARS} characters")
    return stops


def encodable(v):
    """Text the tokenizer can take: every string (also in lists and content parts) encodes as UTF-8.
    JSON can carry lone UTF-16 surrogates (`"\\ud800"`), which no tokenizer can encode."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("text must be valid Unicode (no lone surrogates)") from None
    elif isinstance(v, list):
        for x in v:
            encodable(x.get("text") if isinstance(x, dict) else x)
    return v


def _neutral(value, neutral: tuple) -> bool:
    return value is None or any(value == v and isinstance(value, bool) == isinstance(v, bool)
                                for v in neutral)


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    # Absent: OpenAI's 1.0, but greedy (0) for a fill-in-the-middle completion (a `suffix`, or a
    # prompt in the model's FIM layout): the answer an editor inserts as it is (Zed sends none)
    # should be the model's best.
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    stop: str | list[str] | None = None
    stream: bool = False
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    user: str | None = Field(default=None, max_length=256)
    # vLLM's field: requests share prefix-cache blocks (and their timing) only with requests of the
    # same salt.
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)
    n: int = Field(default=1, ge=1, le=1)  # one choice per request: an editor wants one suggestion
    stream_options: dict | None = None
    # vLLM's: generate max_tokens whatever the model's stop tokens (benchmarks use it)
    ignore_eos: bool = False

    @model_validator(mode="before")
    @classmethod
    def refuse_unsupported(cls, body):
        if isinstance(body, dict):
            for name, neutral in UNSUPPORTED.items():
                if not _neutral(body.get(name), neutral):
                    raise ApiError(400, f"{name} is not supported by this server", param=name,
                                   code="unsupported_parameter")
        return body

    @property
    def num_logprobs(self) -> int | None:
        """Top alternatives per sampled token the answer reports; None: no logprobs."""
        return None

    def _asked(self) -> dict:
        """The Ask's fields every OpenAI body has."""
        return {
            "model": self.model, "temperature": self.temperature, "top_p": self.top_p,
            "top_k": self.top_k, "seed": self.seed, "stop": self.stop or [], "stream": self.stream,
            "user": self.user, "include_usage": bool(
                (self.stream_options or {}).get("include_usage")), "cache_salt": self.cache_salt,
            "ignore_eos": self.ignore_eos, "num_logprobs": self.num_logprobs,
            "exact_max_tokens": True
        }

    @field_validator("stream_options")
    @classmethod
    def include_usage_bool(cls, v):
        if v is not None and not isinstance(v.get("include_usage", False), bool):
            raise ValueError("include_usage must be a boolean")
        return v

    @field_validator("temperature", "top_p")
    @classmethod
    def finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @field_validator("cache_salt")
    @classmethod
    def salt_encodable(cls, v):
        return encodable(v)

    @field_validator("stop")
    @classmethod
    def stop_list(cls, v):
        return stop_strings(v)


class ExtraFile(BaseModel):
    """Repository context for a completion: another file (or a chunk of one) by its path
    (llama.vim's input_extra chunk); the server puts it before the prefix in the model family's
    repo-level form (api/fim.py)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    filename: str = Field(default="", max_length=4096)
    text: str = ""

    @field_validator("filename", "text")
    @classmethod
    def text_encodable(cls, v):
        return encodable(v)


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    suffix: str | None = None
    # warmpath's: repository-level context
    extra: list[ExtraFile] | None = Field(default=None, max_length=256)
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool = False  # the prompt's text before the completion's
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)  # top alternatives per token
    # warmpath's: where a FIM answer ends; None: the server's default
    scope: CompletionScope | None = None
    # warmpath's: a fill-in-the-middle answer less sure than this is silence (server/confidence.py)
    min_confidence: float | None = Field(default=None, ge=0.0, le=1.0)

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs

    @model_validator(mode="after")
    def echo_without_logprobs(self):
        if self.echo and self.logprobs is not None:
            raise ApiError(
                400, "echo with logprobs needs the prompt's logprobs, which are not supported",
                param="echo", code="unsupported_parameter")
        return self

    @model_validator(mode="after")
    def token_ids_without_suffix(self):
        if not isinstance(self.prompt, str) and (self.suffix or self.extra):
            raise ApiError(400, "suffix and extra need a text prompt",
                           param="suffix" if self.suffix else "extra")
        return self

    def ask(self) -> Ask:
        """A text prompt as a Fill (`suffix: ""` is no suffix; `extra` alone still makes a FIM
        prompt: FimFormat hole_at_end); token ids as they are."""
        fill = None
        if isinstance(self.prompt, str):
            fill = Fill(prefix=self.prompt, suffix=self.suffix or None,
                        extra=[ContextFile(e.filename, e.text) for e in self.extra or []])
        return Ask(kind="completion", fill=fill, token_ids=None if fill else list(self.prompt),
                   max_tokens=self.max_tokens, echo=self.echo, scope=self.scope,
                   min_confidence=self.min_confidence, **self._asked())

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
    """A chat message's text: a string as it is; of a list of content parts, the `type == "text"`
    parts' text. Takes raw JSON too (the router builds its routing key from unvalidated bodies):
    anything else is ""."""
    if isinstance(content, list):
        return "".join(
            p["text"] for p in content
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
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
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    @field_validator("top_logprobs")
    @classmethod
    def needs_logprobs(cls, v, info):
        if v is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return v

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def ask(self) -> Ask:
        return Ask(kind="chat",
                   messages=[{"role": m.role, "content": m.text()} for m in self.messages],
                   max_tokens=self.max_completion_tokens or self.max_tokens, **self._asked())


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message[:1000], "type": type_, "param": param, "code": code}}


class ApiError(Exception):
    """Answered as the OpenAI error object with this status (see asgi.install_error_handlers)."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.body = status, error_body(message, type_, param, code)
