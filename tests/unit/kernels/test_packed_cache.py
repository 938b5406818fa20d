"""The packed weights kept for the next start: the second kernel of a model file reads the first
one's packing (converting no GGUF block) and computes the same numbers; a damaged cache file is
packed again; a rewritten model file or other options never read another's packing; a model file
keeps one packing per option set."""

import logging
import os
from collections.abc import Mapping

import pytest
import torch
from tiny_gguf import QWEN_VOCAB, q4_k_m, write_gguf

from warmpath.kernels.native import NativeForward
from warmpath.kernels.packed_cache import cache_path
from warmpath.models.kv_cache import allocate_kv_cache
from warmpath.models.loader import load_checkpoint

pytestmark = pytest.mark.slow


class Untouchable(Mapping):
    """Blocks that must not be read: the packing comes from the cache."""

    def __init__(self, names):
        self.names = set(names)

    def __getitem__(self, name):
        raise AssertionError(f"converted {name} although its packing was kept")

    def __contains__(self, name):
        return name in self.names

    def __iter__(self):
        return iter(self.names)

    def __len__(self):
        return len(self.names)


def logits(kernel: NativeForward, kv: torch.Tensor) -> torch.Tensor:
    kv.zero_()
    return kernel.forward([[1, 5, 9, 14, 3, 7]], [0], [[0]])


@pytest.mark.parametrize("activations", ["int8", "fp32"])
def test_the_next_kernel_reads_the_kept_packing_and_computes_the_same(tmp_path, monkeypatch, caplog,
                                                                      activations):
    monkeypatch.setenv("WARMPATH_HOME", str(tmp_path / "home"))
    path, _, _ = write_gguf(tmp_path / "m.gguf", "qwen2", q4_k_m(2), QWEN_VOCAB, num_layers=2)
    ckpt = load_checkpoint(str(path), torch.float32)
    kv = allocate_kv_cache(ckpt.config, 4, 16, torch.bfloat16, "cpu")
    first = NativeForward(ckpt.config, ckpt.weights, ckpt.quantized, kv, 16,
                          activations=activations, source=str(path))
    kept = cache_path(str(path), f"checkpoint {activations}")
    assert kept.exists() and kept.with_suffix(".json").exists()
    second = NativeForward(ckpt.config, ckpt.weights, Untouchable(ckpt.quantized), kv, 16,
                           activations=activations, source=str(path))
    assert second.weight_kinds == first.weight_kinds and second.activations == first.activations
    assert second.weight_bytes == first.weight_bytes
    assert torch.equal(logits(first, kv), logits(second, kv))

    with open(kept, "r+b") as f:
        # a cut-off file (a full disk, a crash): packed again, with a warning
        f.truncate(kept.stat().st_size // 2)
    caplog.set_level(logging.WARNING)
    third = NativeForward(ckpt.config, ckpt.weights, ckpt.quantized, kv, 16,
                          activations=activations, source=str(path))
    assert "packing again" in caplog.text and torch.equal(logits(first, kv), logits(third, kv))
    assert NativeForward(
        ckpt.config, ckpt.weights, Untouchable(ckpt.quantized), kv, 16, activations=activations,
        source=str(path)).weight_bytes == first.weight_bytes  # the repacked file is whole


def test_another_file_or_option_set_has_another_packing_and_older_ones_go(tmp_path, monkeypatch):
    monkeypatch.setenv("WARMPATH_HOME", str(tmp_path / "home"))
    path, _, _ = write_gguf(tmp_path / "m.gguf", "qwen2", q4_k_m(2), QWEN_VOCAB, num_layers=2)
    before = cache_path(str(path), "checkpoint int8")
    assert cache_path(str(path), "checkpoint fp32") != before
    st = path.stat()
    # touched, the same bytes: the same packing
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert cache_path(str(path), "checkpoint int8") == before
    size = path.stat().st_size
    # rewritten: same name and size
    write_gguf(path, "qwen2", q4_k_m(2), QWEN_VOCAB, num_layers=2, seed=1)
    assert path.stat().st_size == size and cache_path(str(path), "checkpoint int8") != before
    assert cache_path(str(tmp_path), "checkpoint int8") is None  # a directory: nothing kept

    ckpt = load_checkpoint(str(path), torch.float32)
    for activations in ("int8", "fp32"):
        NativeForward(ckpt.config, ckpt.weights, ckpt.quantized, None, 16, activations=activations,
                      source=str(path))
    write_gguf(path, "qwen2", q4_k_m(2), QWEN_VOCAB, num_layers=2, seed=2)
    ckpt = load_checkpoint(str(path), torch.float32)
    NativeForward(ckpt.config, ckpt.weights, ckpt.quantized, None, 16, activations="int8",
                  source=str(path))
    kept = sorted(p.name for p in (tmp_path / "home" / "packed").iterdir())
    # per option set: the latest pair
    assert len(kept) == 4 and sum("int8" in k for k in kept) == 2, kept
    assert cache_path(str(path), "checkpoint int8").name in kept


def test_a_plan_candidate_keeps_its_packing_only_when_asked(tmp_path, monkeypatch):
    """The plan packs every candidate but keeps only the winner's (the engine's kernel reads it
    back)."""
    monkeypatch.setenv("WARMPATH_HOME", str(tmp_path / "home"))
    path, _, _ = write_gguf(tmp_path / "m.gguf", "qwen2", q4_k_m(2), QWEN_VOCAB, num_layers=2)
    ckpt = load_checkpoint(str(path), torch.float32)
    candidate = NativeForward(ckpt.config, ckpt.weights, ckpt.quantized, None, 16,
                              activations="int8", source=str(path), keep_packing=False)
    kept = cache_path(str(path), "checkpoint int8")
    assert not kept.exists()
    candidate.keep_packing()
    assert kept.exists()
    again = NativeForward(ckpt.config, ckpt.weights, Untouchable(ckpt.quantized), None, 16,
                          activations="int8", source=str(path), keep_packing=False)
    again.keep_packing()  # read back, nothing to write
    assert again.weight_bytes == candidate.weight_bytes and kept.exists()
