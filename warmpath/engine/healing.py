"""Token healing. A prompt that ends inside a word ends on a token the model rarely saw there: the
anchored FIM layout (api/fim.py) puts the cursor's line after the middle marker, so "return fi" ends
on "fi", and the model goes on as if "fi" were the whole name. The server takes the prompt's last
token back (SamplingParams.heal holds its text) and the completion's first tokens must spell those
bytes again: the model chooses the tokenization ("fib")."""

from __future__ import annotations

import bisect

import torch


class Healer:
    """Which tokens may come next while `heal` (bytes still to spell) is not spelled: those that
    begin with all of it, and those that are a part of its start. Built once per tokenizer from each
    token's bytes."""

    def __init__(self, pieces: list[bytes | None]):
        self.pieces = pieces
        order = sorted((p, i) for i, p in enumerate(pieces) if p)
        self._keys, self._ids = [p for p, _ in order], [i for _, i in order]
        self._cache: dict[bytes, torch.Tensor] = {}

    def allowed(self, heal: bytes) -> torch.Tensor:
        """The token ids that keep the completion on `heal` (never empty for a piece of the
        vocabulary)."""
        if heal not in self._cache:
            ids = []
            for k in range(1, len(heal)):  # the pieces that spell a part of its start
                j = bisect.bisect_left(self._keys, heal[:k])
                while j < len(self._keys) and self._keys[j] == heal[:k]:
                    ids.append(self._ids[j])
                    j += 1
            # the pieces that begin with all of it: one sorted run
            j = bisect.bisect_left(self._keys, heal)
            while j < len(self._keys) and self._keys[j].startswith(heal):
                ids.append(self._ids[j])
                j += 1
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[heal] = torch.tensor(sorted(ids), dtype=torch.long)
        return self._cache[heal]

    def constrain(self, row: torch.Tensor, heal: bytes) -> None:
        """Mask (in place, to -inf) every token of one row of logits that leaves `heal`."""
        allowed = self.allowed(heal)
        keep = row[allowed]
        row.fill_(float("-inf"))
        row[allowed] = keep

    def mask(self, logits: torch.Tensor, requests: list) -> None:
        """Constrain the rows (one per request, in place) of the requests still healing."""
        for row, req in zip(logits, requests, strict=True):
            if req.heal_left:
                self.constrain(row, req.heal_left)

    def spelled(self, requests: list, tokens: list[int]) -> None:
        """After sampling: what each healing request has still to spell."""
        for req, tok in zip(requests, tokens, strict=True):
            if req.heal_left:
                req.heal_left = self.advance(req.heal_left, tok)

    def advance(self, heal: bytes, token_id: int) -> bytes:
        """What is left of `heal` to spell after `token_id` (b"" once spelled)."""
        piece = self.pieces[token_id] or b""
        return heal[len(piece):] if heal.startswith(piece) and len(piece) < len(heal) else b""
