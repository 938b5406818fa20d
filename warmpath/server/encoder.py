"""Prompt text to token ids off the event loop, for every protocol.

Special tokens: in a completion prompt (and suffix) they are parsed as special tokens, as
llama-server and vLLM do (the FIM markers are meant to be written that way). In chat messages they
are text: a message's content is tokenized with special-token strings split into ordinary tokens, so
`<|im_end|>` in a user message can never close its turn or open a forged system turn; only the
template itself places control tokens.
"""

from __future__ import annotations

import asyncio
import threading

from tokenizers import Tokenizer as HFTokenizer

from warmpath.api.protocol import ApiError
from warmpath.models.tokenizer import Tokenizer
from warmpath.server.chat_template import render_chat_pieces


class PromptEncoder:
    """Prompt text to token ids for the server. A length bound needing no tokenizer comes first: no
    token covers more characters than the vocabulary's longest entry, so a text longer than
    max_model_len times that can never fit and is refused at once. Tokenizing (and chat templating)
    then runs in a worker thread (the tokenizer releases the GIL), so one large prompt never stalls
    the other requests' streams."""

    def __init__(self, tokenizer: Tokenizer, max_model_len: int):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.chars_per_token = max(
            1, max(len(t) for t in tokenizer.backend.get_vocab(with_added_tokens=True)))
        self._text_backend: HFTokenizer | None = None
        self._text_backend_lock = threading.Lock()

    @property
    def text_backend(self) -> HFTokenizer:
        """A copy of the tokenizer that reads special-token strings as text (a flag on the tokenizer
        object: never toggled on the shared one, which other threads use at the same time). Made at
        the first chat request, in its worker thread: copying a 150k vocabulary takes ~0.5 s that a
        server start need not wait for."""
        with self._text_backend_lock:
            if self._text_backend is None:
                backend = HFTokenizer.from_str(self.tokenizer.backend.to_str())
                backend.encode_special_tokens = True
                self._text_backend = backend
            return self._text_backend

    def check_length(self, chars: int, param: str) -> None:
        limit = self.max_model_len * self.chars_per_token
        if chars > limit:
            raise ApiError(
                400, f"prompt of {chars} characters cannot fit the model's context of "
                f"{self.max_model_len} tokens (at most {limit} characters)", param=param,
                code="context_length_exceeded")

    async def encode(self, text: str) -> list[int]:
        """A completion prompt: special tokens parsed as special."""
        self.check_length(len(text), "prompt")
        return await asyncio.to_thread(self.tokenizer.encode, text)

    async def encode_chat(self, messages: list[dict]) -> list[int]:
        """Chat messages through the model's template; their contents' special-token strings stay
        text. ValueError when the template fails on them."""
        self.check_length(sum(len(m["content"]) for m in messages), "messages")
        return await asyncio.to_thread(self._encode_chat, messages)

    def _encode_chat(self, messages: list[dict]) -> list[int]:
        pieces = render_chat_pieces(self.tokenizer, messages)
        # with the template's own text
        self.check_length(sum(len(p) for p, _ in pieces), "messages")
        tok = self.tokenizer
        ids = [tok.bos_token_id] if tok.add_bos and tok.bos_token_id is not None else []
        for text, content in pieces:
            ids += (self.text_backend if content else tok.backend).encode(
                text, add_special_tokens=False).ids
        return ids
