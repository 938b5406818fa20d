"""Every protocol's text prompt on its way to a Job: a Fill rendered (api/fill.render), fitted to the context by one
rule, tokenized; the job then ends where the FIM family's markers and the completion scope say. OpenAI's
completions, llama.cpp's /infill, Ollama, Mistral and Tabby all come through here, so an over-long prompt is cut the
same way whichever protocol sent it."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from warmpath.api.cutters import Chain, IndentCutter
from warmpath.api.fill import Fill, Rendered, render
from warmpath.api.fim import LAYOUTS, keep_suffix
from warmpath.api.protocol import ApiError
from warmpath.api.scope import SCOPES, Scope
from warmpath.models.tokenizer import Tokenizer
from warmpath.server.confidence import Gate
from warmpath.server.jobs import Job
from warmpath.server.prompts import PromptEncoder, detect_fim, fim_stop_ids, split_literal_fim


@dataclass
class Prompt:
    ids: list[int]
    rendered: Rendered
    truncated: bool  # repository context, the prefix's first lines or the suffix's last lines were left out


class Prompter:
    def __init__(self, tokenizer: Tokenizer, max_model_len: int, layout: str, completion_scope: str,
                 suffix_tokens: int | None = None, min_confidence: float = 0.0):
        """suffix_tokens: the most tokens of a FIM suffix the prompt keeps (api/fim.keep_suffix); None: all.
        min_confidence: the confidence gate's default threshold (server/confidence.py)."""
        if layout not in LAYOUTS:
            raise ValueError(f"--fim-layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        if completion_scope not in SCOPES:
            raise ValueError(f"--completion-scope must be one of {', '.join(SCOPES)}, got {completion_scope!r}")
        self.tokenizer, self.max_model_len = tokenizer, max_model_len
        if not 0.0 <= min_confidence <= 1.0:
            raise ValueError(f"--min-confidence must be in [0, 1], got {min_confidence}")
        self.layout, self.completion_scope, self.suffix_tokens = layout, completion_scope, suffix_tokens
        self.min_confidence = min_confidence
        self.fim = detect_fim(tokenizer)
        self.fim_stop_ids = fim_stop_ids(tokenizer, self.fim) if self.fim else []
        self.encoder = PromptEncoder(tokenizer, max_model_len)

    def render(self, fill: Fill) -> Rendered:
        """api/fill.render with this model's family; a prompt written in another family's FIM layout, which this
        model has no tokens for (Continue writes StarCoder's for a model name it does not know), is read as the
        prefix and suffix it holds and filled this model's way."""
        if fill.suffix is None and (split := split_literal_fim(fill.prefix, self.tokenizer)):
            prefix, suffix, family = split
            r = self._render(replace(fill, prefix=prefix, suffix=suffix))
            return replace(r, fim_mode=f"{r.fim_mode}; the prompt's {family} markers read as prefix and suffix")
        return self._render(fill)

    def _render(self, fill: Fill) -> Rendered:
        """The prompt with the suffix's first lines only (suffix_tokens); the answer's scope reads all of it."""
        if self.suffix_tokens is None or not fill.suffix or self.fim is None:
            return render(fill, self.fim, self.layout)
        count = lambda text: len(self.tokenizer.encode(text, add_bos=False))  # noqa: E731
        r = render(replace(fill, suffix=keep_suffix(fill.suffix, self.suffix_tokens, count)), self.fim, self.layout)
        return replace(r, cursor=(r.cursor[0], fill.suffix)) if r.cursor else r

    def reserve(self, max_tokens: int | None) -> int:
        """Tokens of the context kept for the answer when a prompt must be cut: what was asked, at most half."""
        return min(max_tokens or self.max_model_len // 4, self.max_model_len // 2)

    def max_tokens(self, asked: int | None, prompt: Prompt) -> int:
        """What the answer may take: what was asked, within what the context leaves after the prompt."""
        return min(asked or self.max_model_len, self.max_model_len - len(prompt.ids))

    async def fit(self, fill: Fill, reserve: int) -> Prompt:
        """The rendered prompt's ids, leaving `reserve` tokens of the context for the answer. What does not fit is
        left out, as llama.cpp does, in proportion to the excess: the oldest repository context first, then the
        prefix's first lines, then the suffix's last lines. 400 when even that cannot make it fit."""
        truncated = False
        for _ in range(64):
            rendered = self.render(fill)
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
                fill = replace(fill, extra=fill.extra[max(1, math.ceil(len(fill.extra) * share)):] if share < 1 else [])
            elif len(prefix) > 1:
                fill = replace(fill, prefix="\n".join(prefix[max(1, math.ceil(len(prefix) * share)):]))
            elif len(suffix) > 1:
                fill = replace(fill, suffix="\n".join(suffix[: -max(1, math.ceil(len(suffix) * share))]))
            else:
                break
        raise ApiError(400, f"the prompt does not fit the model's context of {self.max_model_len} tokens",
                       param="prompt", code="context_length_exceeded")

    def dress(self, job: Job, prompt: Prompt, scope: str | None, n_indent: int = 0,
              min_confidence: float | None = None) -> None:
        """The job ends at the family's markers (as special tokens: stop ids, never shown; spelled out in text: stop
        strings) and where the completion scope (the request's, else the server's) or llama.cpp's n_indent cut; a
        FIM answer is judged by the confidence gate (the request's threshold, else the server's)."""
        r = prompt.rendered
        job.fim_mode, job.truncated = r.fim_mode, prompt.truncated
        if r.stops:
            job.params.stop_token_ids = sorted({*job.params.stop_token_ids, *self.fim_stop_ids})
            job.stop = [*job.stop, *(t for t in r.stops if t not in job.stop)]
        scope = scope or self.completion_scope
        cut = Scope(*r.cursor, scope) if r.cursor is not None and scope != "none" else None
        if cut is not None or n_indent:
            job.cutter = Chain(IndentCutter(n_indent) if n_indent else None, cut)
        if r.cursor is not None:  # its tokens' log-probabilities are computed for the gate
            job.gate = Gate(self.min_confidence if min_confidence is None else min_confidence)
            if job.params.logprobs is None:
                job.params.logprobs = 0
