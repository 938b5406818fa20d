"""Typing through a suggestion: a session's last answer, kept so that a request which only adds
the characters the developer typed from it is answered with the rest of it, at once, without a
forward pass.

A developer who accepts a suggestion by typing it (or types the same code before the ghost text
catches up) sends, keystroke by keystroke, the previous request's text plus the first characters of
its answer. tabby-agent and llama.vim answer that themselves from the suggestion they hold; Zed,
Continue and the OpenAI-protocol plugins ask the server again. The rest of the answer is the
suggestion the developer is reading and typing; asking the model again costs a prefill and a decode
per keystroke for, greedy, nearly always the same text (the tokens at the typed boundary may
differ).

A request types through the session's last answer when it asks the same thing (the model, the
text after the cursor, the context files, every sampling and ending field: one digest) and the text
before its cursor is the last request's plus `typed`, where the answer starts with `typed` and goes
on past it. The last request's text is matched by its last TAIL_CHARS characters: editors send a
window of the file, whose top moves as lines are added. Only whole answers that ended by a stop or
the length limit are kept (a client that left before the end saw none); silence keeps the last.
Kept per session (a tenant's: server/tenancy.py), at most MAX_SESSIONS, each for TTL_S.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from warmpath.api.ask import Ask

TAIL_CHARS = 256
MAX_SESSIONS = 4096
TTL_S = 120.0


@dataclass(frozen=True)
class Suggestion:
    digest: bytes  # everything the answer depends on but the text before the cursor (same())
    before_tail: str  # the last TAIL_CHARS characters before the cursor
    text: str  # the answer as the client got it
    finish: str  # "stop" | "length"
    prompt_tokens: int  # the request's prompt, for the usage of what types through it
    confidence: float | None
    fim_mode: str | None
    at: float


def before_cursor(ask: Ask) -> str | None:
    """The text before the cursor, for a request that can type through (None: one that cannot)."""
    if (ask.fill is None or ask.chat or ask.echo or ask.max_tokens == 0 or
            ask.num_logprobs is not None or ask.options.get("load_only")):
        return None
    return ask.fill.prefix + ask.fill.middle


def same(ask: Ask) -> bytes:
    """A digest of what the answer depends on besides the text before the cursor."""
    f = ask.fill
    parts = (ask.kind, ask.model, f.suffix, f.repo, f.filename,
             tuple((e.filename, e.text) for e in f.extra), ask.system, ask.max_tokens,
             ask.temperature, ask.top_p, ask.top_k, ask.seed, tuple(ask.stop), ask.ignore_eos,
             ask.cache_salt, ask.scope, ask.n_indent, ask.min_confidence, ask.prompt_ms,
             ask.predict_ms)
    return hashlib.blake2b(repr(parts).encode("utf-8", "surrogatepass"), digest_size=16).digest()


@dataclass(frozen=True)
class TypedThrough:
    typed: str  # the answer's characters the developer typed
    rest: str  # what is left of the answer: the new answer
    last: Suggestion


class Suggestions:
    """The last answer of each session."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 max_sessions: int = MAX_SESSIONS, ttl_s: float = TTL_S):
        self.clock, self.max_sessions, self.ttl_s = clock, max_sessions, ttl_s
        self.sessions: OrderedDict[str, Suggestion] = OrderedDict()

    def remember(self, session: str | None, ask: Ask, text: str, finish: str, prompt_tokens: int,
                 confidence: float | None, fim_mode: str | None) -> None:
        """The answer a session's client was given: a whole one is the session's last, an empty one
        forgets the last. Silence, errors and requests that cannot type through (warm-ups, chat)
        leave it: the developer still sees the last suggestion."""
        before = before_cursor(ask)
        if session is None or before is None or finish not in ("stop", "length"):
            return
        if not text:
            self.sessions.pop(session, None)
            return
        self.sessions[session] = Suggestion(same(ask), before[-TAIL_CHARS:], text, finish,
                                            prompt_tokens, confidence, fim_mode, self.clock())
        self.sessions.move_to_end(session)
        while len(self.sessions) > self.max_sessions:
            self.sessions.popitem(last=False)

    def match(self, session: str | None, ask: Ask) -> TypedThrough | None:
        """The rest of the session's last answer, when this request only adds characters of it."""
        last = self.sessions.get(session) if session is not None else None
        before = before_cursor(ask)
        if last is None or before is None:
            return None
        if self.clock() - last.at > self.ttl_s:
            del self.sessions[session]
            return None
        at = before.rfind(last.before_tail)
        if at < 0 or same(ask) != last.digest:
            return None
        typed = before[at + len(last.before_tail):]
        if not typed or len(typed) >= len(last.text) or not last.text.startswith(typed):
            return None
        return TypedThrough(typed, last.text[len(typed):], last)
