"""The planner with recorded timings (no measuring): the fastest eligible backend per shape class, one
deterministic backend by default, a mix only when nondeterminism is allowed, the nearest class for a step's
real shape, and plans saved and loaded as they were."""

import json
import math
from pathlib import Path

import pytest

from warmpath.engine.plan import BACKENDS, CHUNK_SHAPES, DECODE_SHAPES, Plan, choose, chunk_key, decode_key, single

SPR = json.loads((Path(__file__).parents[1] / "data" / "plan_timings_spr.json").read_text())["backends"]


def fastest(timings, kind, key, among=BACKENDS):
    return min((b for b in among if key in timings.get(b, {}).get(kind, {})), key=lambda b: timings[b][kind][key])


def test_sapphire_rapids_timings_mix_the_kernel_for_decodes_and_short_chunks_with_bf16_for_long_chunks():
    plan = choose(SPR, allow_nondeterministic=True)
    assert (plan.native, plan.torch) == ("native-int8", "torch-bf16") and not plan.deterministic
    for kind, choice in (("decode", plan.decode), ("chunk", plan.chunk)):
        assert set(choice) == set(SPR["native-int8"][kind])
        for key, backend in choice.items():
            assert backend == fastest(SPR, kind, key), (kind, key)  # exactly where the file says it is faster
    assert set(plan.decode.values()) == {"native-int8"}
    assert plan.chunk["8@6144"] == plan.chunk["32@0"] == "native-int8"
    assert plan.chunk["32@2048"] == plan.chunk["128@0"] == plan.chunk["512@6144"] == "torch-bf16"


def test_by_default_one_deterministic_backend_computes_every_shape():
    plan = choose(SPR)
    assert plan.deterministic and plan.backends == ["native-int8"]
    assert set(plan.decode.values()) | set(plan.chunk.values()) == {"native-int8"}


def test_the_fastest_candidate_wins_whichever_it_is():
    flipped = {b: {k: {s: (1.0 if b == "native-fp32" else 5.0) for s in v} for k, v in t.items()}
               for b, t in SPR.items()}
    assert choose(flipped).backends == ["native-fp32"]
    torch_only = {b: t for b, t in SPR.items() if b.startswith("torch")}
    plan = choose(torch_only)  # no native kernel on this machine: the fastest torch backend, said to be so
    assert plan.backends == ["torch-bf16"] and not plan.deterministic
    with pytest.raises(ValueError):
        choose({})


def test_a_backend_that_is_slower_everywhere_is_left_out_of_the_mix():
    fast_torch = {b: t for b, t in SPR.items() if b in ("native-int8", "torch-fp32", "torch-bf16")}
    plan = choose({**fast_torch, "torch-fp32": {k: {s: 1e6 for s in v} for k, v in SPR["torch-fp32"].items()}},
                  allow_nondeterministic=True)
    assert plan.torch == "torch-bf16"


def test_a_step_is_routed_by_its_nearest_class():
    plan = choose(SPR, allow_nondeterministic=True)
    assert plan.for_chunk(30, 1900) == plan.chunk["32@2048"] == "torch-bf16"
    assert plan.for_chunk(40, 100) == plan.chunk["32@0"] == "native-int8"
    assert plan.for_chunk(2000, 0) == plan.chunk["512@0"]
    assert plan.for_chunk(8, 9000) == plan.chunk["8@6144"]
    assert plan.for_decode(3, 300) == plan.decode["4x512"]
    assert plan.for_decode(200, 4000) == plan.decode["16x2048"]


def test_plans_are_saved_and_loaded_as_they_were(tmp_path):
    plan = choose(SPR, allow_nondeterministic=True, key="cpu+model+code")
    plan.save(tmp_path / "plans" / "p.json")
    assert Plan.load(tmp_path / "plans" / "p.json") == plan
    assert "torch-bf16" in plan.table() and "chunk 512 @ 6144" in plan.table()


def test_named_plans_cover_every_class():
    plan = single("native-fp32")
    assert set(plan.decode) == {decode_key(r, c) for r, c in DECODE_SHAPES}
    assert set(plan.chunk) == {chunk_key(k, c) for k, c in CHUNK_SHAPES}
    assert plan.deterministic and single("torch-bf16").deterministic is False
    with pytest.raises(ValueError, match="plan must be"):
        single("fast")
    assert all(math.isfinite(v) for t in SPR.values() for k in t.values() for v in k.values())
