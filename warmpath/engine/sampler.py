"""Next-token sampling: greedy rows in one argmax, the rest with temperature / top-k / top-p and a
generator."""

from __future__ import annotations

import torch

from warmpath.engine.request import SamplingParams, TokenLogprob


def make_generator(params: SamplingParams, default_seed: int,
                   device: str = "cpu") -> torch.Generator | None:
    """A per-request generator: a seeded request samples the same tokens whatever else is in the
    batch."""
    if params.greedy:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(params.seed if params.seed is not None else default_seed)
    return g


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) everything outside top-k and outside the top-p nucleus of one row of scaled
    logits."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Keep a token while the mass before it is < top_p (so the top token is always kept).
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= top_p
        # explicitly: a top_p that underflows fp32 (5e-324) must not drop everything
        drop_sorted[0] = False
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


def token_logprobs(logits: torch.Tensor, params: list[SamplingParams],
                   tokens: list[int]) -> list[TokenLogprob | None]:
    """Per row: None unless its params ask for logprobs; else the sampled token's log-probability
    and the top `params.logprobs` alternatives. Of the model's own distribution (log-softmax of the
    raw logits, before temperature, top-k and top-p), as vLLM reports them by default: comparable
    across sampling settings."""
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    out: list[TokenLogprob | None] = [None] * len(params)
    if not rows:
        return out
    lp = torch.log_softmax(logits[rows].float(), dim=-1)
    chosen = lp.gather(1,
                       torch.tensor([tokens[i] for i in rows],
                                    device=lp.device)[:, None])[:, 0].tolist()
    k = max(params[i].logprobs for i in rows)
    top = torch.topk(lp, k, dim=-1) if k else None
    ids, values = (top.indices.tolist(), top.values.tolist()) if top is not None else ([], [])
    for j, i in enumerate(rows):
        n = params[i].logprobs
        out[i] = (chosen[j], list(zip(ids[j][:n], values[j][:n], strict=True)) if n else [])
    return out
