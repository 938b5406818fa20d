"""Per-token log-probabilities in OpenAI's two shapes: the completions `logprobs` object (tokens,
token_logprobs, top_logprobs, text_offset) and chat's `logprobs.content` list (token, logprob,
bytes, top_logprobs).

A token is named by its text when its bytes are whole UTF-8, else as `bytes:\\xNN...` (OpenAI's
form); chat also gives the bytes themselves. text_offset counts characters of the answer's text
(after the echoed prompt, if any). Values are the model's own distribution (engine/sampler.py
`token_logprobs`).
"""

from __future__ import annotations

from warmpath.engine.request import TokenLogprob
from warmpath.models.tokenizer import Tokenizer

FLOOR = -9999.0  # JSON has no -inf; a probability that underflowed is reported as this


def _byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level BPE's character -> byte map (the inverse of its bytes_to_unicode)."""
    bs = list(range(ord("!"),
                    ord("~") + 1)) + list(range(ord("¡"),
                                                ord("¬") + 1)) + list(range(ord("®"),
                                                                            ord("ÿ") + 1))
    cs, n = list(bs), 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


_BYTES = _byte_decoder()


class LogprobFormatter:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._bytes: dict[int, bytes] = {}

    def token_bytes(self, token_id: int) -> bytes:
        b = self._bytes.get(token_id)
        if b is None:
            piece = self.tokenizer.id_to_token(token_id)
            if piece and all(c in _BYTES for c in piece):
                # byte-level BPE: the piece spells its bytes
                b = bytes(_BYTES[c] for c in piece)
            else:
                b = self.tokenizer.decode([token_id]).encode()
            self._bytes[token_id] = b
        return b

    def num_chars(self, token_id: int) -> int:
        """Characters the token adds to the text: every byte but UTF-8 continuations."""
        return sum(1 for x in self.token_bytes(token_id) if x & 0xC0 != 0x80)

    @staticmethod
    def name(b: bytes) -> str:
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{x:02x}" for x in b)

    def completion(self, entries: list[tuple[int, TokenLogprob]], offset: int) -> tuple[dict, int]:
        """The completions object for these tokens, their text starting at character `offset`; and
        the offset after them."""
        tokens, values, tops, offsets = [], [], [], []
        for token_id, (lp, alternatives) in entries:
            b = self.token_bytes(token_id)
            name = self.name(b)
            tokens.append(name)
            values.append(max(lp, FLOOR))
            top = {self.name(self.token_bytes(a)): max(v, FLOOR) for a, v in alternatives}
            # the sampled token is always listed (as vLLM does)
            top.setdefault(name, max(lp, FLOOR))
            tops.append(top)
            offsets.append(offset)
            offset += self.num_chars(token_id)
        return {
            "tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets
        }, offset

    def chat(self, entries: list[tuple[int, TokenLogprob]]) -> dict:
        def one(token_id: int, lp: float) -> dict:
            b = self.token_bytes(token_id)
            return {"token": self.name(b), "logprob": max(lp, FLOOR), "bytes": list(b)}

        return {"content": [{**one(t, lp), "top_logprobs": [one(a, v) for a, v in alternatives]}
                            for t, (lp, alternatives) in entries], "refusal": None}
