"""Prompt construction: fill-in-the-middle templates by model family, chat templates, and the encoder that turns
prompts into token ids off the event loop.

Special tokens: in a /v1/completions prompt (and suffix) they are parsed as special tokens, as llama-server
and vLLM do (the FIM markers are meant to be written that way). In chat messages they are text: a message's
content is tokenized with special-token strings split into ordinary tokens, so `<|im_end|>` in a user message
can never close its turn or open a forged system turn; only the template itself places control tokens.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import threading
from dataclasses import replace

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from warmpath.api.fim import FIM_TEMPLATES, FimTemplate
from warmpath.api.protocol import ApiError
from warmpath.models.tokenizer import Tokenizer


def detect_fim(tokenizer: Tokenizer) -> FimTemplate | None:
    """The FIM template whose special tokens this tokenizer has, or None (complete from the prefix). Repo-level
    markers the vocabulary lacks (StarCoder 1 has no <file_sep>) are dropped: other files then go in as text."""
    def has(tok: str) -> bool:
        return tok in tokenizer.special_tokens or tokenizer.token_to_id(tok) is not None

    for t in FIM_TEMPLATES:
        if all(has(tok) for tok in t.tokens):
            if t.file_sep and not has(t.file_sep):
                return replace(t, file_sep=None, repo_header=None)
            if t.repo_header and not has(t.repo_header.split("{repo}")[0]):
                return replace(t, repo_header=None)
            return t
    return None


def split_literal_fim(prompt: str, tokenizer: Tokenizer) -> tuple[str, str, str] | None:
    """(prefix, suffix, family) when the prompt is exactly one family's FIM layout written out as text (Continue
    with `provider: openai` renders `<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>` itself for a model
    name it does not know) and this model does not have that family's tokens: the server then fills the hole
    its own way instead of completing the markers as text. None otherwise."""
    for t in FIM_TEMPLATES:
        if not all(tok in prompt for tok in t.tokens):
            continue
        if all(tok in tokenizer.special_tokens or tokenizer.token_to_id(tok) is not None for tok in t.tokens):
            return None  # the model's own markers: they are tokenized as its special tokens
        pattern = re.escape(t.layout.replace("{context}", "")).replace(r"\{prefix\}", "(?P<prefix>.*)")
        pattern = pattern.replace(r"\{suffix\}", "(?P<suffix>.*)")
        m = re.fullmatch(pattern, prompt, re.DOTALL)
        if m and not any(tok in m["prefix"] or tok in m["suffix"] for tok in t.tokens):
            return m["prefix"], m["suffix"], t.name
    return None


def fim_stop_ids(tokenizer: Tokenizer, template: FimTemplate) -> list[int]:
    """The ids of the family's stop tokens this vocabulary has (each a single token)."""
    ids = (tokenizer.token_to_id(t) for t in template.stops)
    return sorted({i for i in ids if i is not None})


_jinja = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)


def render_chat(tokenizer: Tokenizer, messages: list[dict]) -> str:
    """The model's own chat template (ChatML for SmolLM2), with the assistant turn opened."""
    template = tokenizer.chat_template
    if not template:
        raise ValueError("this model has no chat template; use /v1/completions")
    bos = tokenizer.id_to_token(tokenizer.bos_token_id) if tokenizer.bos_token_id is not None else ""
    eos = tokenizer.id_to_token(tokenizer.eos_token_id) if tokenizer.eos_token_id is not None else ""
    return _jinja.from_string(template).render(messages=messages, add_generation_prompt=True, bos_token=bos,
                                              eos_token=eos)


def render_chat_pieces(tokenizer: Tokenizer, messages: list[dict]) -> list[tuple[str, bool]]:
    """The rendered chat prompt as (text, is_message_content) pieces. Each content is wrapped in markers with a
    fresh random nonce before rendering, so no content can fake a marker; the template's own text lies outside
    them. A template that trims a content's ends sees the markers instead: that content keeps its whitespace."""
    nonce = secrets.token_hex(8)
    start, end = f"\ue000{nonce}\ue001", f"\ue002{nonce}\ue003"
    rendered = render_chat(tokenizer, [{**m, "content": start + m["content"] + end} for m in messages])
    pieces, rest = [], rendered
    while (i := rest.find(start)) >= 0:
        j = rest.find(end, i)
        if j < 0:
            raise ValueError("the chat template cut a message's content")
        pieces += [(rest[:i], False), (rest[i + len(start) : j], True)]
        rest = rest[j + len(end) :]
    if end in rest:
        raise ValueError("the chat template cut a message's content")
    return [p for p in [*pieces, (rest, False)] if p[0]]


class PromptEncoder:
    """Prompt text to token ids for the server. A length bound needing no tokenizer comes first: no token
    covers more characters than the vocabulary's longest entry, so a text longer than max_model_len times that
    can never fit and is refused at once. Tokenizing (and chat templating) then runs in a worker thread (the
    tokenizer releases the GIL), so one large prompt never stalls the other requests' streams."""

    def __init__(self, tokenizer: Tokenizer, max_model_len: int):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.chars_per_token = max(1, max(len(t) for t in tokenizer.backend.get_vocab(with_added_tokens=True)))
        self._text_backend: HFTokenizer | None = None
        self._text_backend_lock = threading.Lock()

    @property
    def text_backend(self) -> HFTokenizer:
        """A copy of the tokenizer that reads special-token strings as text (a flag on the tokenizer object: never
        toggled on the shared one, which other threads use at the same time). Made at the first chat request, in
        its worker thread: copying a 150k vocabulary takes ~0.5 s that a server start need not wait for."""
        with self._text_backend_lock:
            if self._text_backend is None:
                backend = HFTokenizer.from_str(self.tokenizer.backend.to_str())
                backend.encode_special_tokens = True
                self._text_backend = backend
            return self._text_backend

    def check_length(self, chars: int, param: str) -> None:
        limit = self.max_model_len * self.chars_per_token
        if chars > limit:
            raise ApiError(400, f"prompt of {chars} characters cannot fit the model's context of "
                                f"{self.max_model_len} tokens (at most {limit} characters)", param=param,
                           code="context_length_exceeded")

    async def encode(self, text: str) -> list[int]:
        """A completion prompt: special tokens parsed as special."""
        self.check_length(len(text), "prompt")
        return await asyncio.to_thread(self.tokenizer.encode, text)

    async def encode_chat(self, messages: list[dict]) -> list[int]:
        """Chat messages through the model's template; their contents' special-token strings stay text.
        ValueError when the template fails on them."""
        self.check_length(sum(len(m["content"]) for m in messages), "messages")
        return await asyncio.to_thread(self._encode_chat, messages)

    def _encode_chat(self, messages: list[dict]) -> list[int]:
        pieces = render_chat_pieces(self.tokenizer, messages)
        self.check_length(sum(len(p) for p, _ in pieces), "messages")  # with the template's own text
        tok = self.tokenizer
        ids = [tok.bos_token_id] if tok.add_bos and tok.bos_token_id is not None else []
        for text, content in pieces:
            ids += (self.text_backend if content else tok.backend).encode(text, add_special_tokens=False).ids
        return ids
