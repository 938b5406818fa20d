"""Incremental detokenization: token ids in, text deltas out, never half a UTF-8 character, stop
strings honoured across token boundaries and never leaked in part."""

from __future__ import annotations

from dataclasses import dataclass, field

from warmpath.models.tokenizer import Tokenizer

# Re-decode only this many tokens before the new ones: enough context for byte-level merges, and
# O(1) a step.
_CONTEXT_TOKENS = 6


@dataclass
class IncrementalDetokenizer:
    tokenizer: Tokenizer
    stop: list[str] = field(default_factory=list)
    skip_special_tokens: bool = True
    tokens: list[int] = field(default_factory=list)
    prefix_offset: int = 0  # tokens[prefix_offset:read_offset] were decoded to text already emitted
    read_offset: int = 0
    text: str = ""  # all text decoded so far (stop-string cut applied)
    emitted: int = 0  # characters of text already handed out
    stopped: bool = False  # a stop string matched: nothing more is emitted
    # the text's start the prompt had already (SamplingParams.heal): dropped before stop strings
    heal: str = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, new_token_ids: list[int]) -> str:
        """Feed new tokens; returns the text that is now safe to show."""
        if self.stopped:
            return ""
        self.tokens.extend(new_token_ids)
        prefix = self._decode(self.tokens[self.prefix_offset : self.read_offset])
        full = self._decode(self.tokens[self.prefix_offset :])
        if full.endswith("\ufffd"):
            # An incomplete UTF-8 sequence: wait for the tokens that complete it.
            return self._release(final=False)
        self.text += full[len(prefix) :]
        if self.heal:  # the healing tokens spell it first (the engine's constraint)
            taken = min(len(self.heal), len(self.text))
            self.heal, self.text = self.heal[taken:], self.text[taken:]
        self.read_offset = len(self.tokens)
        self.prefix_offset = max(0, self.read_offset - _CONTEXT_TOKENS)
        return self._release(final=False)

    def finish(self) -> str:
        """The request ended: release whatever was held back (no stop string can complete any
        more)."""
        if self.stopped:
            return ""
        if self.read_offset < len(self.tokens):
            # trailing bytes never completed a character: show as decoded
            self.text += self._decode(self.tokens[self.prefix_offset :])[
                len(self._decode(self.tokens[self.prefix_offset : self.read_offset])) :
            ]
            self.read_offset = len(self.tokens)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        start = max(0, self.emitted - max((len(s) for s in self.stop), default=0))
        for s in self.stop:
            i = self.text.find(s, start)
            if i >= 0:
                self.text = self.text[:i]
                self.stopped = True
        if self.stopped or final:
            end = len(self.text)
        else:
            # Hold back a tail that could still become the start of a stop string.
            end = len(self.text)
            for s in self.stop:
                for k in range(min(len(s) - 1, len(self.text)), 0, -1):
                    if self.text.endswith(s[:k]):
                        end = min(end, len(self.text) - k)
                        break
        end = max(end, self.emitted)
        delta = self.text[self.emitted : end]
        self.emitted = end
        return delta
