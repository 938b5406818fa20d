"""Ollama's `POST /api/generate` (Continue's `provider: ollama`, the `ollama` clients) to and from
an Ask, and the model listings those clients read first (`/api/show`, `/api/tags`, `/api/version`).

The body: `model`, `prompt`, `suffix` (FIM), `system`, `raw` (no template), `stream` (default true),
`options: {num_predict, temperature, top_k, top_p, seed, stop}` (Ollama's defaults: 0.8, 40, 0.9,
unbounded); other options (num_ctx, repeat_penalty, ...) are ignored, as Ollama ignores options a
model does not use. `context` (a previous answer's tokens), `images`, `format` and a custom
`template` are refused by name unless empty. An empty prompt with no suffix only "loads" the model
(`done_reason: "load"`), as in Ollama.

The answer: `{model, created_at, response, done, done_reason, context, total_duration,
load_duration, prompt_eval_count, prompt_eval_duration, eval_count, eval_duration}` (durations in
ns); a stream is NDJSON, one object per line, the last with `done: true` and the counts. Errors:
`{"error": "..."}`.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from warmpath.api.ask import Ask, Outcome
from warmpath.api.bodies import compact, parse_json, shaped, validation_message
from warmpath.api.fim import Fill
from warmpath.api.protocol import encodable, stop_strings
from warmpath.config import CompletionScope

NAME, PATHS = "ollama", ("/api/generate",)
STREAM_MEDIA, FRAMING = "application/x-ndjson", "ndjson"
VERSION = "0.11.0"  # the Ollama API these routes follow (clients gate features on it)
REFUSED = ("context", "images", "format", "template")  # known fields this server does not implement


class Options(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    num_predict: int = Field(default=-1, ge=-2)
    temperature: float = Field(default=0.8, ge=0.0, le=2.0)
    top_k: int = Field(default=40, ge=0)
    top_p: float = Field(default=0.9, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    stop: list[str] = Field(default_factory=list)

    @field_validator("stop")
    @classmethod
    def stops(cls, v):
        return stop_strings(v)


class GenerateBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str = Field(min_length=1)
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    raw: bool = False
    stream: bool = True
    options: Options = Field(default_factory=Options)
    # warmpath's: where a fill-in-the-middle answer ends (api/scope.py)
    scope: CompletionScope | None = None
    # warmpath's: server/confidence.py
    min_confidence: float | None = Field(default=None, ge=0.0, le=1.0)

    @field_validator("prompt", "suffix", "system")
    @classmethod
    def text(cls, v):
        return encodable(v)


def error(status: int, message: str, param: str | None = None):
    return shaped(status, {"error": message[:1000]})


def parse(raw: bytes) -> Ask:
    body = parse_json(raw, error)
    for name in REFUSED:
        if body.get(name) not in (None, "", [], {}):
            raise error(400, f"{name} is not supported by this server")
    if "model" not in body:
        raise error(400, "model is required")
    try:
        b = GenerateBody.model_validate(body)
    except ValidationError as e:
        raise error(400, validation_message(e)[0]) from None
    o = b.options
    # -1 unbounded, -2 "fill the context": both up to the context here; 0 would be nothing at all
    max_tokens = None if o.num_predict < 0 else max(1, o.num_predict)
    return Ask(kind=NAME, fill=Fill(prefix=b.prompt, suffix=b.suffix), chat=not b.raw and
               b.suffix is None, system=b.system, max_tokens=max_tokens, temperature=o.temperature,
               top_k=o.top_k, top_p=o.top_p, seed=None if o.seed is None or o.seed < 0 else o.seed,
               stop=o.stop, stream=b.stream, model=served_name(b.model), scope=b.scope,
               min_confidence=b.min_confidence,
               options={"load_only": not b.prompt and b.suffix is None})


def served_name(name: str) -> str:
    """Ollama names are `name:tag`; `:latest` is what a bare name means."""
    return name.removesuffix(":latest")


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _final(out: Outcome, model: str | None, text: str) -> dict:
    ns = 1_000_000_000
    return {
        "model": model, "created_at": _now(), "response": text, "done": True,
        "done_reason": out.finish, "context": [], "total_duration": int(
            (out.prompt_s + out.predict_s) * ns), "load_duration": 0,
        "prompt_eval_count": out.prompt_tokens, "prompt_eval_duration": int(out.prompt_s * ns),
        "eval_count": out.generated_tokens, "eval_duration": int(out.predict_s * ns)
    }


def answer(ask: Ask, request_id: str, out: Outcome, model: str | None) -> bytes:
    return compact(_final(out, model, "" if out.silent else out.text))


def event(ask: Ask, request_id: str, text: str, out: Outcome, model: str | None) -> bytes:
    return compact({"model": model, "created_at": _now(), "response": text, "done": False}) + b"\n"


def end(ask: Ask, request_id: str, out: Outcome, model: str | None) -> bytes:
    return compact(_final(out, model, "")) + b"\n"


def stream_error(message: str) -> bytes:
    return compact({"error": message}) + b"\n"


# -- the model listings ----------------------------------------------------------------------------
def template(layout: str | None) -> str:
    """The Go template /api/show reports. Continue offers FIM only when it mentions `.Suffix`; a
    model without FIM tokens still takes a suffix here (prefix-only, cut where the suffix repeats),
    so it always does."""
    if layout is None:
        return ("{{ .Prompt }}{{- if .Suffix }}"
                "{{- /* prefix-only: cut where .Suffix repeats */ -}}{{- end }}")
    fim = layout.replace("{context}",
                         "").replace("{prefix}",
                                     "{{ .Prompt }}").replace("{suffix}", "{{ .Suffix }}")
    return "{{- if .Suffix }}" + fim + "{{- else }}{{ .Prompt }}{{- end }}"


def details(family: str) -> dict:
    return {"parent_model": "", "format": "warmpath", "family": family, "families": [family],
            "parameter_size": "", "quantization_level": ""}


def show(name: str, layout: str | None, family: str, context_length: int) -> dict:
    return {
        "modelfile": f"FROM {name}\n", "parameters": "", "template": template(layout),
        "details": details(family),
        "model_info": {"general.architecture": family, f"{family}.context_length": context_length},
        "capabilities": ["completion", "insert"], "modified_at": _now()
    }


def tags(names: list[str], family: str = "") -> dict:
    return {"models": [{"name": n, "model": n, "modified_at": _now(), "size": 0, "digest": "",
                        "details": details(family)} for n in names]}


def version() -> dict:
    return {"version": VERSION}
