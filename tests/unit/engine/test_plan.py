"""The planner with recorded timings (no measuring): the fastest eligible backend per shape class,
one deterministic backend by default, a mix only when nondeterminism is allowed, the nearest class
for a step's real shape, and plans saved and loaded as they were. Timings of three CPUs: Sapphire
Rapids (AMX), an Intel of the Emerald Rapids kind whose VM shows AVX512-BF16 but no AMX, and that
one as a CPU without a bf16 attention would time it (no such column: an AVX2-only EPYC)."""

import json
import math
from pathlib import Path

import pytest

from warmpath.engine.plan import (
    BACKENDS,
    CHUNK_SHAPES,
    DECODE_SHAPES,
    DETERMINISTIC,
    MAX_CHUNK,
    NATIVE_CONTEXT,
    BackendPlan,
    choose,
    chunk_key,
    decode_key,
    fixed,
    native_options,
    single,
)

DATA = Path(__file__).parents[2] / "data"
SPR = json.loads((DATA / "plan_timings_spr.json").read_text())["backends"]
EMR = json.loads((DATA / "plan_timings_emr.json").read_text())["backends"]  # AVX512-BF16, no AMX
# AVX512-BF16, no AMX, AMD
ZEN5 = json.loads((DATA / "plan_timings_zen5_qwen05.json").read_text())["backends"]


def fastest(timings, kind, key, among=BACKENDS):
    return min((b for b in among if key in timings.get(b, {}).get(kind, {})),
               key=lambda b: timings[b][kind][key])


def test_sapphire_rapids_timings_mix_the_kernel_for_decodes_and_short_chunks_bf16_for_long_ones():
    plan = choose(SPR, allow_nondeterministic=True)
    assert (plan.native, plan.torch) == ("native-int8", "torch-bf16") and not plan.deterministic
    for kind, choice in (("decode", plan.decode), ("chunk", plan.chunk)):
        assert set(choice) == set(SPR["native-int8"][kind])
        for key, backend in choice.items():
            # exactly where the file says it is faster
            assert backend == fastest(SPR, kind, key), (kind, key)
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
    # no native kernel on this machine: the fastest torch backend, said to be so
    plan = choose(torch_only)
    assert plan.backends == ["torch-bf16"] and not plan.deterministic
    with pytest.raises(ValueError):
        choose({})


def test_a_backend_that_is_slower_everywhere_is_left_out_of_the_mix():
    fast_torch = {b: t for b, t in SPR.items() if b in ("native-int8", "torch-fp32", "torch-bf16")}
    plan = choose(
        {
            **fast_torch, "torch-fp32": {
                k: {s: 1e6
                    for s in v}
                for k, v in SPR["torch-fp32"].items()
            }
        }, allow_nondeterministic=True)
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
    assert BackendPlan.load(tmp_path / "plans" / "p.json") == plan
    assert "torch-bf16" in plan.table() and "chunk 512 @ 6144" in plan.table()


def test_named_plans_cover_every_class():
    plan = single("native-fp32")
    assert set(plan.decode) == {decode_key(r, c) for r, c in DECODE_SHAPES}
    assert set(plan.chunk) == {chunk_key(k, c) for k, c in CHUNK_SHAPES}
    assert plan.deterministic and single("torch-bf16").deterministic is False
    with pytest.raises(ValueError, match="plan must be"):
        single("fast")
    assert all(math.isfinite(v) for t in SPR.values() for k in t.values() for v in k.values())


def geomean(timings, backend):
    times = [ms for kind in timings[backend].values() for ms in kind.values()]
    return math.exp(sum(map(math.log, times)) / len(times))


def test_the_bf16_attention_is_chosen_where_it_measured_faster_and_not_where_it_is_missing():
    """On the AVX512-BF16 machine the bf16 attention was faster for long chunks, level for decodes:
    the plan takes it, by the geometric mean over every shape, and allowed to mix it takes nothing
    more (it is the fastest on every shape there). Without that column (an AVX2 CPU has no such
    candidate) the plan is native-int8."""
    plan = choose(EMR)
    assert plan.backends == ["native-int8-bf16attn"] and plan.deterministic
    assert min(DETERMINISTIC, key=lambda b: geomean(EMR, b)) == "native-int8-bf16attn"
    for key in ("128@2048", "512@2048", "512@6144"):
        assert EMR["native-int8-bf16attn"]["chunk"][key] < 0.8 * EMR["native-int8"]["chunk"][key]
    mixed = choose(EMR, allow_nondeterministic=True)
    for kind, choice in (("decode", mixed.decode), ("chunk", mixed.chunk)):
        for key, backend in choice.items():
            assert backend == fastest(EMR, kind, key,
                                      [b for b in BACKENDS if b in mixed.backends]), (kind, key)
    without = {b: t for b, t in EMR.items() if b != "native-int8-bf16attn"}
    assert choose(without).backends == ["native-int8"]
    slower = {**EMR, "native-int8-bf16attn": {k: {s: 1.5 * ms for s, ms in v.items()}
                                             for k, v in EMR["native-int8"].items()}}
    assert choose(slower).backends == ["native-int8"]  # where it measures slower it is not taken


def test_on_the_zen5_the_bf16_attention_and_mixed_torch_bf16_only_for_long_fresh_chunks():
    """The Zen 5 (AVX512-BF16, no AMX), Qwen2.5-Coder-0.5B: deterministic, the bf16 attention kernel
    (fastest on every decode and on chunks over a cached context); allowed to mix, torch's bf16
    takes exactly the long chunks with nothing cached, where it measured faster, and nothing
    else."""
    plan = choose(ZEN5)
    assert plan.backends == ["native-int8-bf16attn"] and plan.deterministic
    mixed = choose(ZEN5, allow_nondeterministic=True)
    assert set(mixed.backends) == {"native-int8-bf16attn", "torch-bf16"} and not mixed.deterministic
    for kind, choice in (("decode", mixed.decode), ("chunk", mixed.chunk)):
        for key, backend in choice.items():
            assert backend == fastest(ZEN5, kind, key,
                                      [b for b in BACKENDS if b in mixed.backends]), (kind, key)
    assert {k for k, b in mixed.chunk.items() if b == "torch-bf16"} == {"128@0", "512@0"}


def test_native_backend_names_say_the_kernels_options():
    assert native_options("native-int8") == {"activations": "int8", "attention": "fp32"}
    assert native_options("native-int8-bf16attn") == {"activations": "int8", "attention": "bf16"}
    assert native_options("native-fp32") == {"activations": "fp32", "attention": "fp32"}
    assert (single("native-int8-bf16attn").deterministic
            and single("native-int8-bf16attn").native == "native-int8-bf16attn")


def test_a_configuration_named_by_dtype_is_a_plan_with_the_fixed_rule_at_its_exact_thresholds(
        tmp_path):
    """fp32 activations: decodes and chunks of at most MAX_CHUNK new tokens, or whose whole context
    is at most NATIVE_CONTEXT, natively; torch the rest. int8 activations: every shape natively, no
    torch backend. The cache is the named dtype's. The rule survives a save and a load."""
    plan = fixed("native-fp32", "torch-fp32")
    assert plan.backends == ["native-fp32", "torch-fp32"
                             ] and plan.cache == "float32" and not plan.deterministic
    assert plan.for_decode(64, 8000) == "native-fp32"
    assert plan.for_chunk(MAX_CHUNK, 6000) == "native-fp32" and plan.for_chunk(MAX_CHUNK + 1,
                                                                               6000) == "torch-fp32"
    assert plan.for_chunk(48, NATIVE_CONTEXT - 48) == "native-fp32"
    assert plan.for_chunk(48, NATIVE_CONTEXT - 47) == "torch-fp32"
    assert plan.chunk[chunk_key(512, 0)] == "native-fp32" and plan.chunk[chunk_key(
        128, 2048)] == "torch-fp32"
    plan.save(tmp_path / "p.json")
    again = BackendPlan.load(tmp_path / "p.json")
    assert again == plan and again.for_chunk(48, NATIVE_CONTEXT - 47) == "torch-fp32"
    int8 = fixed("native-int8", "torch-bf16")
    assert int8.backends == ["native-int8"] and int8.cache == "bfloat16" and int8.deterministic
    assert int8.for_chunk(512, 6000) == "native-int8"
    bf16 = fixed(None, "torch-bf16")
    assert bf16.backends == ["torch-bf16"
                             ] and bf16.for_decode(1, 10) == bf16.for_chunk(512, 0) == "torch-bf16"
