"""Next-token sampling: greedy rows in one argmax, the rest with temperature / top-k / top-p and a generator."""

from __future__ import annotations

import torch

from warmpath.engine.request import SamplingParams


def make_generator(params: SamplingParams, default_seed: int, device: str = "cpu") -> torch.Generator | None:
    """A per-request generator: a seeded request samples the same tokens whatever else is in the batch."""
    if params.greedy:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(params.seed if params.seed is not None else default_seed)
    return g


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) everything outside top-k and outside the top-p nucleus of one row of scaled logits."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Keep a token while the mass before it is < top_p (so the top token is always kept).
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= top_p
        drop_sorted[0] = False  # explicitly: a top_p that underflows fp32 (5e-324) must not drop everything
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(
    logits: torch.Tensor,  # [N, vocab] fp32
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[int]:
    out = logits.argmax(dim=-1).tolist()
    for i, (p, g) in enumerate(zip(params, generators, strict=True)):
        if p.greedy:
            continue
        row = filter_logits(logits[i] / p.temperature, p.top_k, p.top_p)
        probs = row.softmax(-1)
        out[i] = int(torch.multinomial(probs, 1, generator=g).item())
    return out
