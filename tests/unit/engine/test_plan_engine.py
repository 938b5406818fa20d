"""The plan in the engine: a saved plan is reused and measured again when the machine, the model or
the code changes; a forced mixed plan (the Sapphire Rapids choice: the native kernel for decodes and
short chunks, bf16 torch for long chunks) runs both backends over one 16-bit KV cache; a native-only
plan holds no torch model."""

import json
from pathlib import Path

import pytest
import torch
from tiny_model import write_tiny_gguf

from warmpath import LLM, SamplingParams
from warmpath.config import SchedulerConfig
from warmpath.engine import plan_timing
from warmpath.engine.plan import choose
from warmpath.engine.runner import SeqInput
from warmpath.models.loader import load_checkpoint

SPR = json.loads(
    (Path(__file__).parents[2] / "data" / "plan_timings_spr.json").read_text())["backends"]
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def long_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(
        tmp_path_factory.mktemp("plan") / "long.gguf", max_position_embeddings=8192)[0]


@pytest.mark.slow
def test_a_saved_plan_is_reused_and_remeasured_when_the_cpu_model_or_code_changes(
        long_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("WARMPATH_HOME", str(tmp_path))
    calls = []

    def measure(ckpt, backends, steps, eliminate=False, progress=None):
        # Sapphire Rapids' times stand in
        # (its file has no bf16 attention column: here twice native-int8's times)
        calls.append(list(backends))
        slower = {k: {s: 2 * ms for s, ms in v.items()} for k, v in SPR["native-int8"].items()}
        return {b: SPR[b] if b in SPR else slower for b in backends}

    monkeypatch.setattr(plan_timing, "measure", measure)
    ckpt = load_checkpoint(str(long_gguf), torch.float32)
    plan, how = plan_timing.load_or_measure(ckpt, 2, True, False)
    natives = [b for b in plan_timing.candidates(True) if b.startswith("native")]
    # deterministic plans time what they may use
    assert calls == [natives] and "native-int8-bf16attn" not in SPR
    assert how.startswith("measured") and plan.backends == ["native-int8"]
    assert plan_timing.load_or_measure(ckpt, 2, True,
                                       False)[1].startswith("loaded") and len(calls) == 1
    # mixing allowed: torch timed once, then kept
    mixed, how = plan_timing.load_or_measure(ckpt, 2, True, True)
    torches = [b for b in plan_timing.candidates(True) if b.startswith("torch")]
    assert calls[1:] == [torches] and mixed.torch == min(
        torches, key=lambda b: sum(SPR[b]["chunk"].values()))
    assert plan_timing.load_or_measure(ckpt, 2, True,
                                       True)[1].startswith("loaded") and len(calls) == 2
    key = plan_timing.machine_key(ckpt, 2)
    assert plan_timing.machine_key(ckpt, 1) != key  # threads
    monkeypatch.setattr(plan_timing, "_cpu_identity",
                        lambda: "model name: another CPU\nflags: avx2")
    assert plan_timing.machine_key(ckpt, 2) != key  # CPU
    other = load_checkpoint(str(write_tiny_gguf(tmp_path / "other.gguf", seed=1)[0]), torch.float32)
    monkeypatch.undo()
    monkeypatch.setenv("WARMPATH_HOME", str(tmp_path))
    assert plan_timing.machine_key(other, 2) != key  # model file
    code = tmp_path / "runner_copy.py"
    code.write_text("changed")
    monkeypatch.setattr(plan_timing, "CODE", [*plan_timing.CODE, code])
    assert plan_timing.machine_key(ckpt, 2) != key  # code


def test_a_forced_mixed_plan_runs_both_backends_over_one_16_bit_cache(long_gguf, tmp_path):
    plan = choose(SPR, allow_nondeterministic=True)
    path = tmp_path / "spr_plan.json"
    plan.save(path)
    llm = LLM(str(long_gguf), plan=str(path), allow_nondeterministic=True,
              scheduler=SchedulerConfig(max_num_batched_tokens=160), num_kv_blocks=600)
    engine = llm.engine
    assert engine.plan.backends == ["native-int8", "torch-bf16"]
    assert engine.runner.native is not None and engine.runner.model is not None
    assert engine.dtype == torch.bfloat16 and engine.kv_dtype == torch.bfloat16
    # One step: decodes (native) beside a long chunk over 2k cached tokens (bf16 torch).
    route = engine.runner.route(
        [SeqInput([1], 600, []),
         SeqInput([2], 900, []),
         SeqInput([5] * 128, 2048, [])])
    assert (route.native, route.torch) == ([0, 1], [2])
    tok = llm.get_tokenizer()
    prompts = [{"prompt_token_ids": tok.encode(f"def f(x):\n    return x * {i}\n" * (1 + 40 * i))}
               for i in range(4)]
    together = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    alone = [llm.generate(p, GREEDY)[0].token_ids for p in prompts]
    assert together == alone and all(len(t) == GREEDY.max_tokens for t in together)
    assert engine.pool.num_free == engine.pool.num_blocks


def test_a_native_only_plan_keeps_no_torch_model(long_gguf):
    llm = LLM(str(long_gguf), plan="native-int8", num_kv_blocks=64)
    assert llm.engine.runner.model is None and llm.engine.runner.native.activations == "int8"
    assert llm.engine.kv_dtype == torch.bfloat16
    out = llm.generate("def f(x):", GREEDY)[0]
    assert len(out.token_ids) == GREEDY.max_tokens
    assert llm.generate("def f(x):", GREEDY)[0].token_ids == out.token_ids  # warm: the same tokens


@pytest.mark.parametrize(("config", "backends", "cache"), [
    ({"dtype": "float32"}, ["native-fp32", "torch-fp32"], torch.float32),
    ({"dtype": "float32", "kernel_activations": "int8"}, ["native-int8"], torch.float32),
    ({"dtype": "float32", "kernel": "torch"}, ["torch-fp32"], torch.float32),
    ({"dtype": "bfloat16"}, ["torch-bf16"], torch.bfloat16),
    ({"dtype": "bfloat16", "kernel": "native"}, ["native-fp32", "torch-bf16"], torch.bfloat16),
    ({"plan": "native-int8"}, ["native-int8"], torch.bfloat16),
])
def test_every_configuration_is_a_plan_and_the_step_goes_where_the_plan_says(
        long_gguf, config, backends, cache):
    """A named dtype, kernel or activations is a plan too (plan.fixed): the engine holds the plan's
    backends and nothing else, its KV cache is the plan's, and route() sends every shape where the
    plan names."""
    engine = LLM(str(long_gguf), num_kv_blocks=64, **config).engine
    plan, runner = engine.plan, engine.runner
    assert plan.backends == backends and engine.kv_dtype == cache
    assert (runner.native is not None) == (plan.native is not None)
    assert (runner.model is not None) == (plan.torch is not None)
    for new, cached in [(1, 100), (1, 4000), (32, 4000), (33, 4000), (48, 464), (48, 465), (512, 0),
                        (512, 2048)]:
        chosen = plan.for_decode(1, cached + 1) if new == 1 else plan.for_chunk(new, cached)
        route = runner.route([SeqInput([0] * new, cached, [])])
        assert (route.native == [0]) == chosen.startswith("native"), (new, cached, chosen)


@pytest.mark.slow
def test_plan_roofline_times_a_prompt_and_states_its_share_of_the_int8_peak(
        long_gguf, tmp_path, monkeypatch, capsys):
    """`warmpath plan --roofline 256`: the plan, then a 256-token prompt's prefill on the engine and
    its share of the peak the CPU's flags give (at the clock asked for)."""
    from warmpath.cli import main
    from warmpath.kernels.roofline import int8_peak

    monkeypatch.setenv("WARMPATH_HOME", str(tmp_path))
    monkeypatch.setattr(plan_timing, "measure",
                        lambda ckpt, backends, steps, eliminate=False, progress=None: {
                            b: SPR.get(b, SPR["native-int8"]) for b in backends})
    assert main(["plan", "--model", str(long_gguf), "--num-threads", "2", "--roofline", "256",
                 "--ghz", "2.0"]) == 0
    out = capsys.readouterr().out
    peak = int8_peak(cores=2, ghz=2.0)
    assert "prefill of 256 tokens:" in out and "of the int8 peak" in out
    assert f"{peak.unit}: {peak.macs_per_cycle:,} int8 multiply-adds a cycle x 2 cores x 2.00 GHz" \
        in out
