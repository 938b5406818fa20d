"""Sampling: greedy, temperature, top-k, top-p, per-request seeds independent of the batch."""

import pytest
import torch

from warmpath import SamplingParams
from warmpath.engine.sampler import filter_logits, make_generator, sample


def logits_batch(n: int, vocab: int = 50, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def test_greedy_is_argmax():
    logits = logits_batch(4)
    params = [SamplingParams(temperature=0)] * 4
    assert sample(logits, params, [None] * 4) == logits.argmax(-1).tolist()


def test_seed_gives_same_tokens_whatever_the_batch():
    logits = logits_batch(3, scale=0.5)
    p = SamplingParams(temperature=1.0, seed=1234)
    g = make_generator(p, 0)
    seq_alone = [sample(logits[1:2], [p], [g])[0] for _ in range(20)]
    others = [SamplingParams(temperature=1.0, seed=s) for s in (1, 2)]
    gens = [make_generator(others[0], 0), make_generator(p, 0), make_generator(others[1], 0)]
    seq_batched = [sample(logits, [others[0], p, others[1]], gens)[1] for _ in range(20)]
    assert seq_alone == seq_batched
    assert len(set(seq_alone)) > 1  # it really samples


def test_top_k_and_top_p_restrict_support():
    logits = logits_batch(1)[0]
    top3 = set(torch.topk(logits, 3).indices.tolist())
    p = SamplingParams(temperature=2.0, top_k=3, seed=7)
    g = make_generator(p, 0)
    seen = {sample(logits[None], [p], [g])[0] for _ in range(200)}
    assert seen <= top3 and len(seen) == 3
    kept = torch.isfinite(filter_logits(logits, 0, 0.5))
    probs = logits.softmax(-1)
    order = probs.argsort(descending=True)
    # The nucleus is the shortest top prefix whose mass reaches top_p.
    cum = probs[order].cumsum(0)
    n = int((cum < 0.5).sum()) + 1
    assert set(order[:n].tolist()) == set(kept.nonzero().flatten().tolist())


def test_vanishing_temperature_is_greedy_not_nan():
    logits = logits_batch(3, scale=30)
    params = [SamplingParams(temperature=t, seed=1) for t in (1e-300, 1e-6, 5e-324)]
    assert sample(logits, params,
                  [make_generator(p, 0) for p in params]) == logits.argmax(-1).tolist()


def test_tiny_top_p_is_greedy():
    logits = logits_batch(5)
    params = [
        SamplingParams(temperature=1.0, top_p=p, seed=i)
        for i, p in enumerate((1e-6, 5e-324, 1e-40, 1e-9, 1e-3))
    ]
    gens = [make_generator(p, 0) for p in params]
    assert sample(logits, params, gens) == logits.argmax(-1).tolist()


@pytest.mark.parametrize(
    "kwargs", [{"max_tokens": 0}, {"temperature": -1}, {"temperature": float("nan")},
               {"temperature": float("inf")}, {"top_p": 0}, {"top_p": 1.5}, {"top_k": -2}])
def test_bad_params_are_rejected(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)
