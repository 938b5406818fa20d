"""Greedy continuations of real code on the bundled model match transformers (fp32) token for token.

Where the reference's top-1/top-2 logit margin is tiny (< 0.02), another summation order may
legitimately pick the other token; comparison stops at the first such position (none of the 8
prompts diverges before).
"""

import json
from pathlib import Path

import pytest
import torch

from warmpath import SamplingParams
from warmpath.models.registry import resolve_model

DATA = Path(__file__).parents[1] / "data"
NEAR_TIE = 0.02
CASES = json.loads((DATA / "greedy_reference.json").read_text())["cases"]
GREEDY32 = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)


def comparable_prefix(case) -> int:
    return next((i for i, m in enumerate(case["top1_minus_top2_logit"]) if m < NEAR_TIE), 32)


@pytest.mark.parametrize("kernel", ["native", pytest.param("torch", marks=pytest.mark.slow)])
def test_matches_stored_transformers_reference(smollm2_fp32, kernel):
    """Both decode paths: the native kernel (the default on a CPU) over the GGUF's own blocks, and
    torch."""
    assert len(CASES) >= 8 and all(200 <= len(c["prompt_ids"]) <= 2048 for c in CASES)
    llm = smollm2_fp32
    if kernel == "torch":
        from warmpath import LLM

        llm = LLM("smollm2", dtype="float32", kernel="torch", kv_cache_memory=1 << 28)
    else:
        # every matrix read from its GGUF blocks
        assert llm.engine.runner.native.weight_kinds == ["q4_1", "q8_0"]
    outs = llm.generate([{"prompt_token_ids": c["prompt_ids"]} for c in CASES], GREEDY32)
    for case, out in zip(CASES, outs, strict=True):
        n = comparable_prefix(case)
        assert out.token_ids[:n] == case["greedy_ids"][:n], case["name"]
    # Prompts without a near tie must match all 32 tokens.
    assert sum(comparable_prefix(c) == 32 for c in CASES) >= 6


@pytest.fixture(scope="module")
def transformers_model():
    transformers = pytest.importorskip("transformers")
    path = resolve_model("smollm2")
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()


@pytest.mark.slow
def test_matches_transformers_live(smollm2_fp32, transformers_model):
    """The reference generated now, by transformers loading the same GGUF, on prompts of 3
    lengths."""
    picked = [
        c for c in CASES
        if c["name"] in ("_sitebuiltins.py", "_bootsubprocess.py", "_compat_pickle.py")
    ]
    for case in picked:
        ids = torch.tensor([case["prompt_ids"]])
        with torch.no_grad():
            ref = transformers_model.generate(ids, max_new_tokens=32,
                                              do_sample=False)[0, ids.shape[1]:].tolist()
        ours = smollm2_fp32.generate({"prompt_token_ids": case["prompt_ids"]},
                                     GREEDY32)[0].token_ids
        assert ours == ref, case["name"]


def test_fp16_gemv_decode_matches_reference():
    """gemv_dtype=float16 (half-width weights for 1-4 row steps): single-stream greedy decode still
    gives the reference's tokens up to its first near tie (measured: 7 of 8 prompts identical for
    all 32 tokens)."""
    from warmpath import LLM

    llm = LLM("smollm2", dtype="float32", gemv_dtype="float16", kernel="torch")
    picked = [
        c for c in CASES if c["name"] in ("_sitebuiltins.py", "_threading_local.py",
                                          "__future__.py", "_aix_support.py")
    ]
    assert len(picked) == 4
    for case in picked:  # one at a time: every decode step has one row, so it takes the fp16 path
        out = llm.generate({"prompt_token_ids": case["prompt_ids"]}, GREEDY32)[0].token_ids
        n = comparable_prefix(case)
        assert out[:n] == case["greedy_ids"][:n], case["name"]
