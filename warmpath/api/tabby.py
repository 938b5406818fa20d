"""Tabby's server API (its IDE extensions, through `tabby-agent`) to and from an Ask, and the small
routes the agent reads first (`GET /v1/health`, `GET /v1beta/server_setting`, `POST /v1/events`).

Tabby's completion is `POST /v1/completions`, OpenAI's path: `speaks` is the one rule, in the server
and the router alike, that tells the two apart by the body's shape: an object with `segments` and no
`prompt` is Tabby's.

The body: `language`, `segments: {prefix, suffix, filepath, git_url, declarations: [{filepath,
body}], relevant_snippets_from_changed_files / relevant_snippets_from_recently_opened_files:
[{filepath, body, score}], clipboard}`, `user` (a session key when no X-Session-Id is sent),
`temperature`, `seed`, `mode`, `debug_options`. Declarations and snippets are repository context
(rendered by api/fim.py repo_context before the prefix, sorted: the same set gives the same bytes
keystroke to keystroke); when it does not all fit, the recently opened files' snippets go first,
then the changed files', then declarations (Tabby's priority, reversed). `git_url` names the
repository and `filepath` the file in that context's header (where the model's family has repo-level
markers). The clipboard is not prompted (as in Tabby). A prefix or suffix with CRLF line ends is
prompted with LF and answered with CRLF, as Tabby does. Without `temperature` the completion is
greedy (Tabby samples at 0.1 by default: nearly greedy; greedy is repeatable, and the router caches
it); up to 64 tokens (Tabby's max_decoding_tokens). `debug_options.raw_prompt` is completed as it
is; `mode: "next_edit_suggestion"` and `debug_options.return_prompt / return_snippets` are refused
by name. Not streamed: Tabby's completions API answers whole.

The answer: `{id, choices: [{index, text, finish_reason}], mode}` (finish_reason is warmpath's own:
"deadline" / "overloaded" say why an answer is empty). Silence past X-Deadline-Ms is an empty
`text`. Errors are Tabby's (axum's): plain text, 422 for a body of the wrong shape, 400 for a
request Tabby refuses (a body that is not JSON at all is no protocol's in particular: OpenAI's 400
answers it).
"""

from __future__ import annotations

import os
import platform
import re
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from warmpath.api.ask import Ask, Outcome
from warmpath.api.bodies import compact, parse_json, shaped, validation_message
from warmpath.api.fim import ContextFile, Fill
from warmpath.api.protocol import encodable
from warmpath.cpu import cpu_name

# PATHS: none of its own; /v1/completions is shared with OpenAI (see speaks)
NAME, PATHS = "tabby", ()
# the Tabby server API these routes follow (tabby-agent gates /v1beta/server_setting on it)
API_VERSION = "0.32.0"
MAX_TOKENS = 64  # Tabby's default max_decoding_tokens
EVENT_TYPES = ("view", "select", "dismiss")


def speaks(body) -> bool:
    """Is this /v1/completions body Tabby's (a JSON object with `segments` and no `prompt`) rather
    than OpenAI's?"""
    return isinstance(body, dict) and "segments" in body and "prompt" not in body


class Declaration(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    filepath: str = Field(max_length=4096)
    body: str


class Snippet(Declaration):
    score: float = 0.0


class Segments(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    prefix: str
    suffix: str | None = None
    filepath: str | None = Field(default=None, max_length=4096)
    git_url: str | None = Field(default=None, max_length=4096)
    declarations: list[Declaration] | None = Field(default=None, max_length=256)
    relevant_snippets_from_changed_files: list[Snippet] | None = Field(default=None, max_length=256)
    relevant_snippets_from_recently_opened_files: list[Snippet] | None = Field(
        default=None, max_length=256)
    clipboard: str | None = None

    @field_validator("prefix", "suffix", "filepath", "git_url")
    @classmethod
    def text(cls, v):
        return encodable(v)


class DebugOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    raw_prompt: str | None = None
    return_snippets: bool = False
    return_prompt: bool = False
    disable_retrieval_augmented_code_completion: bool = False

    @field_validator("raw_prompt")
    @classmethod
    def text(cls, v):
        return encodable(v)


class CompletionBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    language: str | None = None
    segments: Segments | None = None
    user: str | None = Field(default=None, max_length=256)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, allow_inf_nan=False)
    seed: int | None = Field(default=None, ge=0, lt=2**64)  # Tabby's u64
    mode: str = "standard"
    debug_options: DebugOptions | None = None


def error(status: int, message: str, param: str | None = None):
    """Tabby's error: a status and a plain-text message (what axum's JSON extractor answers)."""
    return shaped(status, message[:1000])


def parse(raw: bytes) -> Ask:
    body = parse_json(raw, error)
    try:
        b = CompletionBody.model_validate(body)
        for s in _snippets(b.segments):
            encodable(s.filepath), encodable(s.body)
    except (ValidationError, ValueError) as e:
        message = validation_message(e)[0] if isinstance(e, ValidationError) else str(e)
        raise error(
            422, f"Failed to deserialize the JSON body into the target type: {message}") from None
    debug = b.debug_options or DebugOptions()
    if b.mode == "next_edit_suggestion":
        raise error(400, "mode next_edit_suggestion is not supported by this server")
    for name in ("return_prompt", "return_snippets"):
        if getattr(debug, name):
            raise error(400, f"debug_options.{name} is not supported by this server")
    temperature = 0.0 if b.temperature is None else b.temperature  # greedy unless asked
    seed = None if b.seed is None else b.seed % 2**63  # the engine's seeds are signed 64-bit
    if debug.raw_prompt is not None:  # Tabby: passed to the model as it is, segments ignored
        return Ask(kind=NAME, fill=Fill(prefix=debug.raw_prompt), max_tokens=MAX_TOKENS,
                   temperature=temperature, seed=seed, user=b.user)
    if b.segments is None:
        raise error(400, "empty prompt from completion request")
    s = b.segments
    crlf = "\r\n" in s.prefix or "\r\n" in (s.suffix or "")
    lf = (lambda t: t.replace("\r\n", "\n")) if crlf else (lambda t: t)  # noqa: E731
    snippets = [] if debug.disable_retrieval_augmented_code_completion else _snippets(s)
    fill = Fill(prefix=lf(s.prefix), suffix=lf(s.suffix or ""), repo=repo_name(s.git_url or ""),
                extra=[ContextFile(x.filepath, lf(x.body)) for x in reversed(snippets) if x.body],
                filename=s.filepath or "")
    return Ask(kind=NAME, fill=fill, max_tokens=MAX_TOKENS, temperature=temperature, seed=seed,
               user=b.user, options={"crlf": crlf})


def _snippets(s: Segments | None) -> list[Declaration]:
    """Declarations, then the changed files' snippets, then the recently opened files': Tabby's
    priority."""
    if s is None:
        return []
    return [*(s.declarations or []), *(s.relevant_snippets_from_changed_files or []),
            *(s.relevant_snippets_from_recently_opened_files or [])]


def repo_name(git_url: str) -> str:
    """`https://github.com/org/repo.git`, `git@github.com:org/repo.git` -> `repo` (the name
    Qwen2.5-Coder-style repo headers carry)."""
    tail = re.split(r"[/:]", git_url.rstrip("/"))[-1]
    return tail.removesuffix(".git")


def answer(ask: Ask, request_id: str, out: Outcome, model: str | None) -> bytes:
    text = "" if out.silent else out.text
    if ask.options.get("crlf"):
        text = re.sub(r"(?<!\r)\n", "\r\n", text)
    return compact({
        "id": request_id, "choices": [{"index": 0, "text": text, "finish_reason": out.finish}],
        "mode": "standard"
    })


# -- what tabby-agent reads besides completions ----------------------------------------------------
def health(model: str, device: str, cuda_devices: list[str]) -> dict:
    """Tabby's HealthState. tabby-agent offers completions once `model` is set, shows `device`, and
    reads `version.git_describe` as a semver (the Tabby API followed, then warmpath's own
    version)."""
    # when this code was installed
    built = datetime.fromtimestamp(Path(__file__).stat().st_mtime, UTC)
    return {
        "model": model, "device": device, "cuda_devices": cuda_devices, "models": {
            "completion": {
                "local": {"model_id": model, "device": device, "cuda_devices": cuda_devices}
            }
        }, "arch": platform.machine(), "cpu_info": cpu_name(), "cpu_count": os.cpu_count() or 1,
        "version": {
            "build_date": built.date().isoformat(), "build_timestamp": built.isoformat(),
            "git_sha": "", "git_describe": f"v{API_VERSION}-warmpath-{_version()}"
        }, "webserver": False
    }


def _version() -> str:
    try:
        return version("warmpath")
    except PackageNotFoundError:
        return "unknown"


def server_setting() -> dict:
    """A self-hosted server: the agent sends no usage telemetry to TabbyML."""
    return {"disable_client_side_telemetry": True}


def check_event(raw: bytes) -> None:
    """`POST /v1/events` is accepted and dropped (warmpath keeps no completion log); a body Tabby
    would refuse is refused the same way."""
    body = parse_json(raw, error)
    if not isinstance(body.get("type"), str) or not isinstance(body.get("completion_id"), str):
        raise error(
            422,
            "Failed to deserialize the JSON body into the target type: type and completion_id are "
            "required strings")
    if body["type"] not in EVENT_TYPES:
        raise error(400, f"unknown event type {body['type']!r}")
