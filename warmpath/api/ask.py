"""The one request value every protocol parses into, and the one result every protocol answers from.

A protocol (OpenAI's completions and chat in protocol.py; llama.cpp `/infill`, Ollama, Mistral FIM,
Tabby: one small file each in api/) turns its body into an `Ask` and an `Outcome` back into its own
answer, stream event or "nothing" (silence past the deadline is an Outcome with empty text). The
server runs an Ask (server/pipeline.py); the router reads one to route the request, translates it
for an engine that lacks the protocol, and answers a protocol's silence itself. So every protocol
gets the same behaviour: FIM or prefix-only, the prefix cache, deadlines, cancellation, sessions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from warmpath.api.fim import Fill


@dataclass
class Ask:
    """What a client asks, in any protocol. The prompt is one of: `token_ids` (OpenAI's, taken as
    they are), `messages` (OpenAI's chat, through the model's template), or `fill` (text around a
    hole, or a plain prefix)."""

    # "completion" | "chat" (OpenAI) or an editor protocol's NAME: the answer's shape
    kind: str = "completion"
    fill: Fill | None = None
    token_ids: list[int] | None = None
    messages: list[dict] | None = None
    # the fill's prefix is a user turn for the model's chat template, if it has one (Ollama)
    chat: bool = False
    system: str | None = None  # that turn's system message
    max_tokens: int | None = None  # None: up to the context; 0: only fill the cache (the warm-up)
    # OpenAI's rule (True): a prompt taken as it is must leave room for max_tokens (else 400), and
    # one the server fits must not ask for the whole context. False (editors): at most what the
    # context leaves.
    exact_max_tokens: bool = False
    temperature: float | None = None  # None: greedy for a FIM prompt, else 1.0 (OpenAI's default)
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    # a stream's usage in a last chunk of its own (OpenAI's stream_options)
    include_usage: bool = False
    echo: bool = False  # the prompt's text before the answer's (OpenAI completions)
    num_logprobs: int | None = None  # top alternatives per token reported; None: no logprobs
    ignore_eos: bool = False
    model: str | None = None
    user: str | None = None  # the protocol's user field: a session key when no X-Session-Id is sent
    cache_salt: str | None = None
    # no first token within this: silence (llama.cpp's t_max_prompt_ms)
    prompt_ms: float | None = None
    # past this since the first token, end at a newline (t_max_predict_ms)
    predict_ms: float | None = None
    n_indent: int = 0  # end before a new line indented less than this (llama.cpp's n_indent)
    # where the answer ends (api/scope.py SCOPES); None: the server's default
    scope: str | None = None
    # an answer less sure than this is silence; None: the server's default
    min_confidence: float | None = None
    # the protocol's own answer options (llama.cpp's response_fields)
    options: dict = field(default_factory=dict)

    def routing_text(self) -> str:
        """What the router's prefix policy hashes (Fill.routing_text)."""
        return self.fill.routing_text() if self.fill is not None else ""


# Finishes answered with empty text: late, refused unrun, or too unsure to show
# (server/confidence.py).
SILENT = ("deadline", "overloaded", "low_confidence")


@dataclass
class Outcome:
    """A run's result as every protocol reports it. `finish`: stop | length | deadline | overloaded
    | error."""

    text: str = ""
    finish: str = "deadline"
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    prompt_s: float = 0.0  # receipt to first token (or to the end, with none)
    predict_s: float = 0.0  # first token to the end
    # the context did not fit: some repository context or prefix was left out
    truncated: bool = False
    # a FIM answer's first line, as the confidence gate judged it (0..1)
    confidence: float | None = None

    @property
    def silent(self) -> bool:
        return self.finish in SILENT
