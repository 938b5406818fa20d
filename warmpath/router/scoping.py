"""The completion scope for engines that have none (vLLM, SGLang, llama.cpp): the router ends their
fill-in-the-middle answers where `warmpath serve` ends its own (api/scope.py, with /infill's
n_indent), and closes the node's stream at the cut, so the node stops decoding; mid-line, on an
engine that can be told how its answer begins, the prompt leaves the line's last word out for the
answer to write again (healing.py). Such answers are always streamed from the node; a client that
asked for one whole answer gets it made here.

Which requests: a completion with a `suffix` (the router renders its FIM prompt for the node), one
whose prompt is written in the node's family's FIM layout (Zed's), and an editor protocol's fill
(translate.py). The scope is the request's (`scope`, which the node never sees), else the router's
--completion-scope."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from warmpath.api import responses as shapes
from warmpath.api.ask import Ask
from warmpath.api.cutters import Chain, IndentCutter
from warmpath.api.fim import Fill, detect_fim, render
from warmpath.api.scope import SCOPES, ScopeCutter
from warmpath.router.healing import CLIENT_CONSTRAINTS, Respell, given_back
from warmpath.router.translate import openai_chunks


def fill_cutter(ask: Ask, model: str, default: str, heal: bool) -> Chain | None:
    """The cutter of an editor protocol's ask sent to a node of `model` (None: nothing to cut);
    `heal`: the node's engine can be told how its answer begins (healing.py)."""
    cursor = render(ask.fill, detect_fim(model=model)).cursor
    return _chain(cursor, ask.scope or default, ask.n_indent,
                  heal=heal and ask.fill.suffix is not None and not ask.chat)


def body_cutter(body: dict, model: str, default: str, heal: bool) -> Chain | None:
    """The cutter of an OpenAI completion body (its `prompt` and `suffix`, or a prompt in the FIM
    layout of `model`'s family) sent to a node of `model`; `heal` as for fill_cutter (not where the
    client constrains the answer itself)."""
    prompt, suffix = body.get("prompt"), body.get("suffix")
    if not isinstance(prompt, str) or (suffix is not None and not isinstance(suffix, str)):
        return None
    cursor = render(Fill(prefix=prompt, suffix=suffix), detect_fim(model=model)).cursor
    scope = body.get("scope") if body.get("scope") in SCOPES else default
    heal = heal and suffix is not None and not any(k in body for k in CLIENT_CONSTRAINTS)
    return _chain(cursor, scope, heal=heal)


def _chain(cursor: tuple[str, str] | None, scope: str, n_indent: int = 0,
           heal: bool = False) -> Chain | None:
    """`heal`: the router renders the prompt (a FIM request, not one written in the family's
    layout), so it can leave the cursor line's last word out for the engine to write again
    (healing.py)."""
    if cursor is None:
        return None
    text = given_back(cursor[0]) if heal else ""
    if scope == "none" and not n_indent and not text:
        return None
    return Chain(Respell(text) if text else None, IndentCutter(n_indent) if n_indent else None,
                 ScopeCutter(*cursor, scope) if scope != "none" else None)


def without_scope(body: dict) -> dict:
    """The body as the node gets it: `scope` is the router's to apply."""
    return {k: v for k, v in body.items() if k != "scope"}


@dataclass
class Scoped:
    """An OpenAI completion from the node's stream, cut by the scope: relayed as a stream, or made
    whole here (`collect`). The upstream stream ends at the cut (the caller closes it)."""

    cutter: Chain
    collect: bool
    media: str = "text/event-stream"
    finish: str | None = None
    usage: dict | None = None
    head: dict = field(default_factory=dict)

    async def _texts(self, events: AsyncIterator[bytes]) -> AsyncIterator[str]:
        """The answer's text, cut; finish and usage as the node said (finish "stop" at a cut)."""
        async for chunk in openai_chunks(events):
            self.head = self.head or chunk
            self.usage = chunk.get("usage") or self.usage
            for choice in chunk.get("choices") or []:
                done = choice.get("finish_reason")
                text = self.cutter.feed(choice.get("text") or "", final=bool(done))
                self.finish = done or self.finish
                if text:
                    yield text
            if self.cutter.cut:
                self.finish = "stop"
                return
        if not self.cutter.cut:
            rest = self.cutter.feed("", final=True)
            if rest:
                yield rest

    def _chunk(self, text: str, finish: str | None) -> dict:
        h = self.head
        return {"id": h.get("id") or shapes.new_id("route"), "object": "text_completion",
                "created": h.get("created") or int(time.time()), "model": h.get("model"),
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}

    async def events(self, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for text in self._texts(events):
            yield shapes.sse(self._chunk(text, None)).encode()
        last = self._chunk("", self.finish or "stop")
        if self.usage:
            last["usage"] = self.usage
        yield shapes.sse(last).encode() + shapes.SSE_DONE.encode()

    def answer(self, body: bytes) -> bytes:
        """A whole answer the node gave although a stream was asked for: cut all at once."""
        data = json.loads(body)
        choice = (data.get("choices") or [{}])[0]
        text = self.cutter.feed(choice.get("text") or "", final=True)
        return json.dumps({**data, "choices": [{**choice, "text": text,
                                                 "finish_reason": "stop" if self.cutter.cut else
                                                 choice.get("finish_reason")}]}).encode()

    async def gather(self, events: AsyncIterator[bytes]) -> bytes:
        text = "".join([t async for t in self._texts(events)])
        whole = self._chunk(text, self.finish or "stop")
        whole["usage"] = self.usage
        return json.dumps(whole).encode()
