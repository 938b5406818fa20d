"""A text prompt fitted to the context, for every protocol: a Fill rendered in the model's FIM
format (api/fim.py), cut by one rule when it does not fit, tokenized. OpenAI's completions,
llama.cpp's /infill, Ollama, Mistral and Tabby all come through here, so an over-long prompt is cut
the same way whichever protocol sent it."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from warmpath.api.fim import Fill, FimFormat, Rendered
from warmpath.api.protocol import ApiError
from warmpath.api.short_context import short_fill
from warmpath.models.tokenizer import Tokenizer
from warmpath.server.encoder import PromptEncoder


@dataclass
class Prompt:
    ids: list[int]
    rendered: Rendered
    # repository context, the prefix's first lines or the suffix's last lines were left out
    truncated: bool


class PromptFitter:
    def __init__(self, tokenizer: Tokenizer, max_model_len: int, fim: FimFormat):
        self.max_model_len, self.fim = max_model_len, fim
        self.encoder = PromptEncoder(tokenizer, max_model_len)

    def reserve(self, max_tokens: int | None) -> int:
        """Tokens of the context kept for the answer when a prompt must be cut: what was asked, at
        most half."""
        return min(max_tokens or self.max_model_len // 4, self.max_model_len // 2)

    def max_tokens(self, asked: int | None, prompt: Prompt) -> int:
        """What the answer may take: what was asked, within what the context leaves after the
        prompt."""
        return min(asked or self.max_model_len, self.max_model_len - len(prompt.ids))

    async def fit(self, fill: Fill, reserve: int) -> Prompt:
        """The rendered prompt's ids, leaving `reserve` tokens of the context for the answer. What
        does not fit is left out, as llama.cpp does, in proportion to the excess: the oldest
        repository context first, then the prefix's first lines, then the suffix's last lines. 400
        when even that cannot make it fit."""
        truncated = False
        fill = self.fim.hole_at_end(fill)
        for _ in range(64):
            rendered = self.fim.render(fill)
            try:
                ids = await self.encoder.encode(rendered.text)
                excess = len(ids) + reserve - self.max_model_len
                share = excess / max(1, len(ids))
            except ApiError:  # longer than any tokenization could fit: drop half
                excess, share = 1, 0.5
            if excess <= 0:
                return Prompt(ids, rendered, truncated)
            truncated = True
            prefix, suffix = fill.prefix.split("\n"), (fill.suffix or "").split("\n")
            if fill.extra:
                fill = replace(
                    fill, extra=fill.extra[max(1, math.ceil(len(fill.extra) *
                                                            share)):] if share < 1 else [])
            elif len(prefix) > 1:
                fill = replace(fill,
                               prefix="\n".join(prefix[max(1, math.ceil(len(prefix) * share)):]))
            elif len(suffix) > 1:
                fill = replace(fill,
                               suffix="\n".join(suffix[:-max(1, math.ceil(len(suffix) * share))]))
            else:
                break
        raise ApiError(
            400, f"the prompt does not fit the model's context of {self.max_model_len} tokens",
            param="prompt", code="context_length_exceeded")

    async def short(self, fill: Fill, tokens: int, whole: Prompt) -> list[int] | None:
        """The ids of `fill`'s short context of about `tokens` tokens (api/short_context.py); None
        where it has none (no suffix, or a prompt written in a family's own layout) or it is not a
        quarter shorter than the `whole` prompt."""
        fill = self.fim.hole_at_end(fill)
        if fill.suffix is None or self.fim.count is None:
            return None
        ids = await self.encoder.encode(self.fim.render(short_fill(fill, tokens,
                                                                   self.fim.count)).text)
        return ids if len(ids) * 4 <= len(whole.ids) * 3 else None
