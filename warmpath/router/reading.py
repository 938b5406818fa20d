"""What the router reads of a request before it routes it: the editor protocol it speaks, its body
when that is a JSON object, the session, the prompt's text for prefix matching, the deadline (the
node judges everything else)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from warmpath.api import infill, mistral, ollama, tabby
from warmpath.api.asgi import parse_deadline, session_key
from warmpath.api.ask import Ask
from warmpath.api.protocol import ApiError, content_text

# The editor protocols, by path: each body read as its Ask (api/ask.py), answered in its own shapes.
# Tabby's shares /v1/completions with OpenAI's: told apart by the body (editor_wire).
EDITOR_WIRES = {path: w for w in (infill, ollama, mistral) for path in w.PATHS}


@dataclass
class Routed:
    """What the router learned from a request: its body (None if not a JSON object), routing key,
    deadline."""

    path: str
    raw: bytes
    body: dict | None
    session: str | None
    prompt: str
    kind: str  # "completion" | "chat"
    stream: bool
    deadline: float | None  # monotonic
    key: str | None = None  # the response-cache key, for a deterministic request
    wire: object = None  # an editor protocol's module (EDITOR_WIRES), None for OpenAI's
    ask: Ask | None = None  # its body as an Ask, when it parsed (else the node answers the 400)
    # the client's session id was over the cap: `session` is its hash (api/asgi.py)
    session_hashed: bool = False

    @property
    def model(self):
        return (self.body or {}).get("model")


def editor_wire(path: str, body: dict | None):
    """The editor protocol a request speaks (its api/ module), None for OpenAI's."""
    if path == "/v1/completions":
        return tabby if tabby.speaks(body) else None
    return EDITOR_WIRES.get(path)


def read_request(path: str, raw: bytes, headers, max_session_id_chars: int = 128) -> Routed:
    """ApiError (400) for a bad X-Deadline-Ms, with the node's own message."""
    deadline = parse_deadline(headers, time.monotonic())
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        # not JSON, not UTF-8, nested too deep: the node answers the 400
        body = None
    if not isinstance(body, dict):
        body = None
    b = body or {}
    editor = editor_wire(path, body)
    if editor is not None:
        try:
            ask = editor.parse(raw)
        except ApiError:
            ask = None
        session = session_key(headers, ask.user if ask else None, max_session_id_chars)
        return Routed(path, raw, body, session.key, ask.routing_text() if ask else "", "fill",
                      bool(ask and ask.stream), deadline, None, editor, ask, session.hashed)
    if path.endswith("/chat/completions"):
        kind = "chat"
        prompt = "".join(f"{m.get('role')}\x1f{content_text(m.get('content'))}\x1e"
                         for m in b.get("messages") or [] if isinstance(m, dict))
    else:
        kind = "completion"
        prompt = b.get("prompt", "")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, list):
            prompt = ",".join(str(t) for t in prompt)
        prompt = prompt if isinstance(prompt, str) else ""
        # repository context goes before the prompt, sorted, as the server renders it
        extra = b.get("extra")
        if isinstance(extra, list) and prompt:
            files = sorted({
                f"{e.get('filename')}\x1f{e.get('text')}\x1e"
                for e in extra if isinstance(e, dict)
            })
            prompt = "".join(files) + prompt
    session = session_key(headers, b.get("user"), max_session_id_chars)
    return Routed(path, raw, body, session.key, prompt, kind, b.get("stream") is True, deadline,
                  session_hashed=session.hashed)
