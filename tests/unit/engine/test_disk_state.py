"""What warmpath keeps on disk cannot lie, leak or stop a start (store.py, identity.py): a model
file changed in its middle bytes finds none of the old model's K/V; everything under $WARMPATH_HOME
and the KV tier is private to its user; a directory others could write is refused; a planted link is
never written through; a power cut that empties every file (plan, packed weights, kernel, model
hash, tier blocks) costs a rebuild, never a start, and the answers stay the same."""

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch
from engine_checks import code_texts
from safetensors.torch import load_file, save_file
from tiny_model import write_tiny_gguf, write_tiny_hf

from warmpath import LLM, EngineRequest, SamplingParams, identity
from warmpath.config import EngineConfig, ModelConfig
from warmpath.engine.engine import Engine
from warmpath.engine.kv_offload import tier_key
from warmpath.engine.plan import single
from warmpath.kernels import build, native
from warmpath.store import UnsafeDirectory

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
MIB = 1 << 20


def run(engine: Engine, ids: list[int]) -> tuple[list[int], int]:
    """(output tokens, prompt tokens read from the KV tier)"""
    engine.add_request(EngineRequest("r", ids, GREEDY))
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done = out
    return done.token_ids, done.num_tier_tokens


def all_paths(*roots: Path) -> list[Path]:
    return [p for root in roots for p in [root, *root.rglob("*")]]


def test_a_model_changed_in_its_middle_restores_nothing_of_the_old_models_kv(tmp_path):
    """A merge of new q weights into one layer: same name, size, first and last MiB, even the same
    modification time. The tier's key names the whole content, so nothing of the old model's K/V is
    read back."""
    model = write_tiny_hf(tmp_path / "model", "llama", hidden_size=256, num_attention_heads=4,
                          head_dim=64, intermediate_size=768, num_hidden_layers=4,
                          max_position_embeddings=8192)
    weights_file = model / "model.safetensors"
    before = weights_file.read_bytes()
    assert len(before) > 4 * MIB  # a model whose middle is more than its ends
    tier = tmp_path / "tier"
    config = {"dtype": "float32", "num_kv_blocks": 128, "kv_offload_dir": str(tier)}
    first = Engine(EngineConfig(model=str(model), **config))
    prompt = first.tokenizer.encode(code_texts(1, 400, 400, seed=5)[0])
    run(first, prompt)
    first.close()

    header = json.loads(before[8:8 + int.from_bytes(before[:8], "little")])
    start = 8 + int.from_bytes(before[:8], "little")
    middle = next(n for n, t in header.items() if n != "__metadata__" and start +
                  t["data_offsets"][0] > MIB and start + t["data_offsets"][1] < len(before) - MIB)
    weights = load_file(str(weights_file))
    noise = torch.randn(weights[middle].shape, generator=torch.Generator().manual_seed(1))
    weights[middle] = weights[middle] + 0.05 * noise
    st = weights_file.stat()
    save_file(weights, str(weights_file))
    os.utime(weights_file, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = weights_file.read_bytes()
    assert len(after) == len(
        before) and after[:MIB] == before[:MIB] and after[-MIB:] == before[-MIB:]
    assert after != before and weights_file.stat().st_mtime_ns == st.st_mtime_ns

    fresh = Engine(EngineConfig(model=str(model), dtype="float32", num_kv_blocks=128))
    want = run(fresh, prompt)[0]
    again = Engine(EngineConfig(model=str(model), **config))
    assert run(again, prompt) == (want, 0)
    again.close()


@pytest.fixture(scope="module")
def good_kernel() -> Path:
    """The native kernel as the real compiler builds it here (under the session's home, built
    once)."""
    return build.build_library()


@pytest.fixture
def compiler(tmp_path, good_kernel, monkeypatch) -> Path:
    """$CC: writes the library the real compiler built (a test compiles once), and counts its
    calls."""
    calls = tmp_path / "cc-calls"
    cc = tmp_path / "cc"
    cc.write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\nwhile [ $# -gt 1 ]; do [ "$1" = -o ] && out="$2"; '
        'shift; done\n'
        f'cp {good_kernel} "$out"\nchmod 755 "$out"\n')
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    native._load_library.cache_clear()
    yield calls
    native._load_library.cache_clear()


def test_everything_kept_is_private_and_a_power_cut_stops_no_start(tmp_path, monkeypatch, compiler):
    home, tier = tmp_path / "home", tmp_path / "tier"
    monkeypatch.setenv("WARMPATH_HOME", str(home))
    model = write_tiny_gguf(tmp_path / "m.gguf", max_position_embeddings=8192)[0]
    before = os.umask(0o022)  # the usual umask: what warmpath writes must not depend on it
    try:
        # the plan measured here, the kernel built, packed
        first = LLM(str(model), kv_offload_dir=str(tier))
        assert first.engine.runner.native is not None
        prompt = code_texts(1, 300, 300, seed=2)[0]
        want = first.generate(prompt, GREEDY)[0].token_ids
        first.engine.close()
    finally:
        os.umask(before)
    kept = all_paths(home, tier)
    kinds = {p.parent.name for p in kept if p.is_file()}
    assert {"plans", "packed", "kernels", "identity"} <= kinds and any(p.suffix == ".kv"
                                                                       for p in kept)
    for p in kept:
        mode = stat.S_IMODE(p.lstat().st_mode)
        assert mode & 0o077 == 0, f"{p} is {mode:o}: readable by others"
    assert len(compiler.read_text().splitlines()) == 1

    for p in kept:  # a power cut: every file there empty
        if p.is_file():
            if p.suffix == ".so":
                # a new empty file, not the one this process has mapped (truncating that kills it)
                p.unlink()
            p.write_bytes(b"")
    # measures its plan again: it may choose another backend
    again = LLM(str(model), kv_offload_dir=str(tier))
    (backend,) = again.engine.plan.backends
    if backend != first.engine.plan.backends[0]:
        want = LLM(str(model), plan=backend).generate(prompt, GREEDY)[0].token_ids
    assert again.engine.runner.native is not None and again.generate(prompt,
                                                                     GREEDY)[0].token_ids == want
    # the emptied blocks were computed again
    assert again.engine.stats()["prefix_cache_tier_hit_tokens"] == 0
    again.engine.close()
    # the emptied kernel was built again, never loaded
    assert len(compiler.read_text().splitlines()) == 2


def test_a_directory_others_can_write_or_another_user_owns_is_refused(tmp_path, tiny_llama_dir):
    tier = tmp_path / "tier"
    tier.mkdir()
    tier.chmod(0o777)
    with pytest.raises(UnsafeDirectory, match="writable by group or others.*chmod 700"):
        Engine(EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_offload_dir=str(tier)))
    tier.chmod(0o755)  # ours, readable by others (an older warmpath's): made private
    Engine(EngineConfig(model=str(tiny_llama_dir), dtype="float32",
                        kv_offload_dir=str(tier))).close()
    assert stat.S_IMODE(tier.stat().st_mode) == 0o700
    if os.geteuid() != 0:
        return  # only root can give a directory away
    os.chown(tier, 65534, 65534)
    with pytest.raises(UnsafeDirectory, match="belongs to user id 65534"):
        Engine(EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_offload_dir=str(tier)))


def test_a_link_planted_at_a_temporary_name_is_never_written_through(tmp_path):
    plans = tmp_path / "plans"
    plans.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    for name in ("p.tmp", "p.json.tmp", ".p.json.tmp"):  # the names a predictable writer would use
        (plans / name).symlink_to(victim)
    plan = single("torch-fp32")
    plan.save(plans / "p.json")
    assert victim.read_text() == "untouched" and json.loads(
        (plans / "p.json").read_text())["torch"] == "torch-fp32"
    assert stat.S_IMODE((plans / "p.json").stat().st_mode) == 0o600


def test_every_module_that_changes_numbers_is_in_the_tiers_key(tmp_path, monkeypatch):
    """The KV quantization, the KV cache, the GGUF dequantization and the packing change a block's
    numbers without touching the runner: a change to any of them is a new tier key, so no block
    computed by the old code is read."""
    copy = tmp_path / "warmpath"
    for d in identity.NUMERICS:
        shutil.copytree(identity.PACKAGE / d, copy / d,
                        ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(identity, "PACKAGE", copy)
    model = ModelConfig("llama", vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1,
                        num_heads=1, num_kv_heads=1, head_dim=8)
    weights = write_tiny_gguf(tmp_path / "m.gguf")[0]

    def key() -> str:
        identity.numerics_identity.cache_clear()
        return tier_key(str(weights), ["native-int8"], torch.int8, 16, model)

    before = key()
    assert key() == before
    for changed in ("models/kv_quant.py", "models/kv_cache.py", "models/ggml_blocks.py",
                    "kernels/packing.py"):
        path = copy / changed
        path.write_text(path.read_text() + "\n# changed\n")
        assert key() != before, changed
        before = key()
    identity.numerics_identity.cache_clear()
