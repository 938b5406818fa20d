"""Answers made by the router from a node's OpenAI answer:

- Translation: an editor protocol's request for a node whose engine does not speak it (vLLM, SGLang:
  no /infill, no Ollama or Tabby API) goes as an OpenAI completion (a chat completion for Ollama's
  templated generate); the node's answer, whole or streamed, comes back in the protocol's own answer
  and events. upstream.py then renders the FIM prompt for the engine as for any OpenAI client.
- Collected: a whole (non-streamed) OpenAI answer asked of an engine that aborts only streams when
  the client goes away (llama-server): streamed from the node, the whole answer made here, so a
  deadline or a client that leaves still stops the node.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from warmpath.api import responses as wire_shapes
from warmpath.api.ask import Ask, Outcome


def openai_request(ask: Ask, model: str | None) -> tuple[str, dict]:
    """(path, body) of the OpenAI request that runs an editor protocol's `ask` (the way back of
    protocol.py's CompletionRequest.ask and ChatRequest.ask)."""
    fill = ask.fill
    if ask.chat:
        messages = [{"role": "system", "content": ask.system}] if ask.system else []
        path, body = "/v1/chat/completions", {
            "messages": [*messages, {"role": "user", "content": fill.prefix}]
        }
    else:
        path, body = "/v1/completions", {"prompt": fill.prefix + fill.middle}
        if fill.suffix is not None:
            body["suffix"] = fill.suffix
        if fill.extra:
            body["extra"] = [{"filename": e.filename, "text": e.text} for e in fill.extra]
    body.update(model=model or ask.model, temperature=ask.temperature, top_p=ask.top_p,
                stream=ask.stream)
    if ask.max_tokens is not None:  # 0 (a warm-up: only fill the cache) runs one token, never shown
        body["max_tokens"] = max(1, ask.max_tokens)
    if ask.stop:
        body["stop"] = ask.stop
    if ask.seed is not None:
        body["seed"] = ask.seed
    if ask.stream:
        body["stream_options"] = {"include_usage": True}
    return path, body


@dataclass
class Translation:
    """One attempt's conversion back: the protocol (an api/ module), its Ask, and what the node
    reported."""

    wire: object
    ask: Ask
    model: str | None
    collect: bool = False  # the node streams what the client wants whole (Collected's reason)
    cutter: object = None  # the completion scope (router/scoping.py) for a node that applies none
    out: Outcome = field(default_factory=lambda: Outcome(finish="stop"))
    started: float = field(default_factory=time.monotonic)
    first: float | None = None

    @property
    def media(self) -> str:
        return getattr(self.wire, "STREAM_MEDIA",
                       "application/json") if self.ask.stream else "application/json"

    def _read(self, choice: dict, usage: dict | None) -> str:
        text = choice.get("text")
        if text is None:
            text = (choice.get("delta") or choice.get("message") or {}).get("content") or ""
        if choice.get("finish_reason"):
            self.out.finish = choice["finish_reason"]
        if usage:
            self.out.prompt_tokens = usage.get("prompt_tokens") or 0
            self.out.generated_tokens = usage.get("completion_tokens") or 0
            self.out.cached_tokens = (usage.get("prompt_tokens_details") or
                                      {}).get("cached_tokens") or 0
        if self.cutter is not None:
            text = self.cutter.feed(text, final=bool(choice.get("finish_reason")))
            if self.cutter.cut:
                self.out.finish = "stop"
        if text and self.first is None:
            self.first = time.monotonic()
        return "" if self.ask.max_tokens == 0 else text

    def _timed(self) -> Outcome:
        now = time.monotonic()
        self.out.prompt_s = (self.first or now) - self.started
        self.out.predict_s = now - self.first if self.first else 0.0
        return self.out

    def answer(self, body: bytes) -> bytes:
        """The node's whole OpenAI answer as the protocol's."""
        data = json.loads(body)
        choice = (data.get("choices") or [{}])[0]
        self.out.text = self._read(
            {**choice, "finish_reason": choice.get("finish_reason") or "stop"}, data.get("usage"))
        return self.wire.answer(self.ask,
                                data.get("id") or wire_shapes.new_id("route"), self._timed(),
                                self.model)

    async def gather(self, events: AsyncIterator[bytes]) -> bytes:
        """The protocol's whole answer from the node's stream."""
        async for chunk in openai_chunks(events):
            self.out.text += self._read((chunk.get("choices") or [{}])[0], chunk.get("usage"))
            if self.cutter is not None and self.cutter.cut:
                # the scope ended it: the node's stream is closed
                break
        return self.wire.answer(self.ask, wire_shapes.new_id("route"), self._timed(), self.model)

    async def events(self, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """The node's SSE events as the protocol's stream: one event per piece of text, its own last
        event."""
        request_id = wire_shapes.new_id("route")
        async for chunk in openai_chunks(events):
            text = self._read((chunk.get("choices") or [{}])[0], chunk.get("usage"))
            self.out.text += text
            if text:
                yield self.wire.event(self.ask, request_id, text, self.out, self.model)
            if self.cutter is not None and self.cutter.cut:
                # the scope ended it: the node's stream is closed
                break
        yield self.wire.end(self.ask, request_id, self._timed(), self.model)


async def openai_chunks(events: AsyncIterator[bytes]) -> AsyncIterator[dict]:
    """The JSON objects of an OpenAI SSE stream, up to [DONE]."""
    async for event in events:
        data = event.strip().removeprefix(b"data:").strip()
        if data == b"[DONE]":
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            continue
        if isinstance(chunk, dict):
            if "error" in chunk:
                raise ValueError(f"the node's stream ended in an error: {chunk['error']}")
            yield chunk


# Body fields whose answer a collected stream cannot rebuild: such requests go to the node as they
# came.
UNCOLLECTABLE = ("n", "best_of", "logprobs", "top_logprobs", "echo", "tools", "response_format")


@dataclass
class Collected:
    """A whole OpenAI completion or chat completion, made from the node's stream of it."""

    chat: bool
    collect: bool = True

    @staticmethod
    def streamed(body: dict) -> dict | None:
        """The body asking for the same answer as a stream (with usage), or None if it cannot be
        collected."""
        if body.get("stream") or any(body.get(f) not in (None, False, 1) for f in UNCOLLECTABLE):
            return None
        return {**body, "stream": True, "stream_options": {"include_usage": True}}

    async def gather(self, events: AsyncIterator[bytes]) -> bytes:
        text, finish, usage, head = [], None, None, {}
        async for chunk in openai_chunks(events):
            head = head or chunk
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or
                         {}).get("content") if self.chat else choice.get("text")
                text.append(piece or "")
                finish = choice.get("finish_reason") or finish
        whole = "".join(text)
        choice = {"index": 0, "finish_reason": finish, "logprobs": None}
        choice.update(
            {"message": {"role": "assistant", "content": whole}} if self.chat else {"text": whole})
        return json.dumps({
            "id": head.get("id") or wire_shapes.new_id("route"),
            "object": "chat.completion" if self.chat else "text_completion",
            "created": head.get("created") or int(time.time()), "model": head.get("model"),
            "choices": [choice], "usage": usage
        }).encode()


def upstream_message(body: bytes) -> str:
    """A node's error message, from the OpenAI error object it answered with (else its text)."""
    try:
        error = json.loads(body).get("error")
        return str(error.get("message") if isinstance(error, dict) else error)
    except (ValueError, AttributeError):
        return body.decode("utf-8", "replace")[:500]
