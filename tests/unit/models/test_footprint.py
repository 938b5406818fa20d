"""The one memory accounting (models/footprint.py) that the engine's budget and the simulator
share."""

import pytest

from warmpath import LLM
from warmpath.models.footprint import kv_pool_blocks, parse_bytes


@pytest.mark.parametrize("text,value", [("2GiB", 2 << 30), ("1.5 GB", 1_500_000_000),
                                        ("512MiB", 512 << 20), ("1073741824", 1 << 30),
                                        ("64k", 64_000)])
def test_sizes_parse(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "2 GiBs", "lots", "-1GB"])
def test_a_bad_size_is_refused_by_name(text):
    with pytest.raises(ValueError, match="not a size"):
        parse_bytes(text)


def test_the_kv_pool_is_what_the_budget_leaves():
    assert kv_pool_blocks(1000, 300, 100, 60) == 10
    with pytest.raises(ValueError, match="leaves no room for the KV cache"):
        kv_pool_blocks(1000, 900, 100, 60)


def test_the_engine_sizes_its_pool_from_the_budget(tiny_llama_dir):
    small = LLM(str(tiny_llama_dir), dtype="float32", kernel="torch", memory_budget="8MiB").engine
    large = LLM(str(tiny_llama_dir), dtype="float32", kernel="torch", memory_budget="16MiB").engine
    per_block = small.model_config.kv_bytes_per_token("float32") * small.config.block_size
    assert (large.pool.num_blocks - small.pool.num_blocks) * per_block == pytest.approx(
        8 << 20, abs=per_block)
    with pytest.raises(ValueError, match="leaves no room"):
        LLM(str(tiny_llama_dir), dtype="float32", kernel="torch", memory_budget="1KiB")
