"""The one request shape every editor protocol translates to, and what running it gives back.

A protocol (llama.cpp `/infill`, Ollama, Mistral FIM, Tabby: one small file each in api/) turns its body into a
`Fill` (prefix, suffix, repository context, limits, session hints) and an `Outcome` back into its own answer,
stream event or "nothing" (silence past the deadline is an Outcome with empty text). The server runs a Fill;
the router reads one to route the request and answers a protocol's silence itself. `render` is the one way a Fill
becomes prompt text, in the server and in the router (for an engine that rejects `suffix`). So every protocol gets
the same behaviour: FIM or prefix-only, the prefix cache, deadlines, cancellation, sessions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pydantic import ValidationError

from warmpath.api.fim import ContextFile, FimTemplate, repo_context
from warmpath.api.protocol import ApiError


@dataclass(frozen=True)
class Extra:
    """A piece of repository context (another file, a yanked chunk), placed before the prefix."""

    filename: str
    text: str


@dataclass
class Fill:
    """Fill in the middle: the model writes what goes between `prefix + middle` and `suffix`.

    `middle` is the cursor's line so far (llama.cpp's `prompt`): rendered last, after the FIM middle marker, so
    everything before it stays in the prefix cache while the developer types along one line.
    """

    prefix: str
    suffix: str | None = None  # None: a plain completion of the prefix
    middle: str = ""
    extra: list[Extra] = field(default_factory=list)  # in the client's order (stable keystroke to keystroke)
    repo: str = ""  # the repository's name (Tabby's git_url): the context's repo header, where the family has one
    filename: str = ""  # the file being edited (Tabby's filepath): the context's last file separator names it
    chat: bool = False  # the prefix is a user turn for the model's chat template (Ollama's generate, not raw)
    system: str | None = None  # that turn's system message
    max_tokens: int | None = None  # None: up to the context; 0: only fill the cache (the warm-up)
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    model: str | None = None
    user: str | None = None  # the protocol's user field: a session key when no X-Session-Id is sent
    prompt_ms: float | None = None  # no first token within this: silence (llama.cpp's t_max_prompt_ms)
    predict_ms: float | None = None  # past this since the first token, end at a newline (t_max_predict_ms)
    n_indent: int = 0  # end before a new line indented less than this (llama.cpp's n_indent)
    scope: str | None = None  # where the answer ends (api/scope.py SCOPES); None: the server's default
    min_confidence: float | None = None  # an answer less sure than this is silence; None: the server's default
    options: dict = field(default_factory=dict)  # the protocol's own answer options (llama.cpp's response_fields)
    # What Jobs.make reads from an OpenAI body too.
    cache_salt: str | None = None
    ignore_eos: bool = False
    num_logprobs: int | None = None

    def routing_text(self) -> str:
        """What the router's prefix policy hashes: the parts in the order the server renders them (context,
        sorted as repo_context sorts it, then prefix, line), so requests that share a rendered prefix share a
        routing prefix."""
        context = "".join(sorted({f"{e.filename}\x1f{e.text}\x1e" for e in self.extra}))
        where = f"{self.repo}\x1f{self.filename}\x1d" if self.extra and (self.repo or self.filename) else ""
        return where + context + self.prefix + self.middle


@dataclass(frozen=True)
class Rendered:
    """A Fill as prompt text, and what the answer's end depends on."""

    text: str
    fim_mode: str | None  # the family's name; "prefix-only" (no FIM tokens); None: a plain completion
    stops: tuple[str, ...] = ()  # the family's markers: the answer ends at one
    cursor: tuple[str, str] | None = None  # the text before and after the cursor: the completion scope's


def render(fill: Fill, template: FimTemplate | None, layout: str = "anchored") -> Rendered:
    """The prompt: repository context, then the family's FIM layout (or the prefix alone for a model without FIM
    tokens: the scope cuts where the suffix begins), then the cursor's line (last, so what comes before it stays
    cached while the developer types along the line). A prompt with no suffix that is written in the family's own
    layout (Zed writes it itself) is sent as it is, and answered as a FIM prompt."""
    context = repo_context([ContextFile(e.filename, e.text) for e in fill.extra], template, fill.repo, fill.filename)
    if fill.suffix is None:
        text = context + fill.prefix + fill.middle
        own = template.split(text) if template is not None else None
        return Rendered(text, None) if own is None else Rendered(text, template.name, template.stops, own)
    cursor = (fill.prefix + fill.middle, fill.suffix)
    if template is None:
        return Rendered(context + fill.prefix + fill.middle, "prefix-only", (), cursor)
    return Rendered(template.build(fill.prefix, fill.suffix, context, layout) + fill.middle, template.name,
                    template.stops, cursor)


# Finishes answered with empty text: late, refused unrun, or too unsure to show (server/confidence.py).
SILENT = ("deadline", "overloaded", "low_confidence")


@dataclass
class Outcome:
    """A run's result as every protocol reports it. `finish`: stop | length | deadline | overloaded | error."""

    text: str = ""
    finish: str = "deadline"
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    prompt_s: float = 0.0  # receipt to first token (or to the end, with none)
    predict_s: float = 0.0  # first token to the end
    truncated: bool = False  # the context did not fit: some repository context or prefix was left out
    confidence: float | None = None  # a FIM answer's first line, as the confidence gate judged it (0..1)

    @property
    def silent(self) -> bool:
        return self.finish in SILENT


def compact(payload) -> bytes:
    """JSON with no spaces: llama.vim takes a reply only if it matches `"content":"` (no space after the colon)."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def validation_message(e: ValidationError) -> tuple[str, str | None]:
    """The first error of a body's validation as (message, field)."""
    first = e.errors()[0] if e.errors() else {}
    loc = ".".join(str(x) for x in first.get("loc", ()) if not str(x).startswith(("function-", "list[", "dict[")))
    return (f"{loc}: " if loc else "") + first.get("msg", "invalid request"), loc or None


def parse_json(raw: bytes, error) -> dict:
    """The body as a JSON object, or `error(400, message)` (the protocol's own shape) raised."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise error(400, "request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise error(400, "request body must be a JSON object")
    return body


def shaped(status: int, body: dict | str) -> ApiError:
    """An ApiError answered with `body` as it is: a protocol's own error shape, JSON or (a str) plain text (see
    asgi.install_error_handlers)."""
    e = ApiError(status, "")
    e.body, e.shaped = body, True  # shaped: already the protocol's (server/editors.py converts the others)
    return e
