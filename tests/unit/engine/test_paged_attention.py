"""Paged attention for real: block sizes, scattered blocks, mixed batches, chunks over cached
context."""

import random

import pytest
import torch

from warmpath import LLM
from warmpath.engine.runner import SeqInput

PROMPTS = [
    "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int = 0\n",
    "import os\nprint(os.getcwd())\n",
    "for i in range(10):\n    if i % 3 == 0:\n        continue\n    total += i * i  # squares\n",
]


@pytest.fixture(scope="module")
def llms(tiny_llama_dir):
    return {bs: LLM(str(tiny_llama_dir), dtype="float32", block_size=bs, num_kv_blocks=4096 // bs)
            for bs in (1, 16, 32)}


def scattered_blocks(llm: LLM, n_tokens: int, rng: random.Random) -> list[int]:
    """Blocks taken from all over the pool, in random order: logic must follow the table, not
    adjacency."""
    n = -(-n_tokens // llm.config.block_size)
    blocks = llm.engine.pool.allocate(llm.engine.pool.num_free)
    rng.shuffle(blocks)
    keep, rest = blocks[:n], blocks[n:]
    llm.engine.pool.free(rest)
    return keep


def plan(llm: LLM, ids_list: list[list[int]], rng: random.Random):
    """Each sequence is computed in stages: a first prompt chunk, a second chunk over the cached
    first one, then two single-token decode steps. Returns per-stage SeqInputs for every
    sequence."""
    stages = []
    for ids in ids_list:
        blocks = scattered_blocks(llm, len(ids), rng)
        a, b = len(ids) // 2, len(ids) - 2
        stages.append(
            [
                SeqInput(ids[:a], 0, blocks),
                SeqInput(ids[a:b], a, blocks),
                SeqInput(ids[b : b + 1], b, blocks),
                SeqInput(ids[b + 1 :], b + 1, blocks),
            ]
        )
    return stages


def run_one_at_a_time(llm, stages):
    out = {}
    for i, seq_stages in enumerate(stages):
        for j, x in enumerate(seq_stages):
            out[i, j] = llm.engine.runner.forward([x])[0]
    return out


def run_mixed(llm, stages):
    """Every step mixes sequences at different stages: one prefills while another decodes."""
    out = {}
    n = len(stages)
    for step in range(4 + n - 1):
        batch = [(i, step - i) for i in range(n) if 0 <= step - i < 4]
        logits = llm.engine.runner.forward([stages[i][j] for i, j in batch])
        for (i, j), row in zip(batch, logits, strict=True):
            out[i, j] = row
    return out


def test_same_logits_for_block_sizes_and_batching(llms):
    results = []
    for bs, llm in llms.items():
        ids_list = [llm.get_tokenizer().encode(p) for p in PROMPTS]
        assert all(len(ids) > bs or bs > 16 for ids in ids_list)
        for runner in (run_one_at_a_time, run_mixed):
            stages = plan(llm, ids_list, random.Random(bs))
            results.append(((bs, runner.__name__), runner(llm, stages)))
            for seq in stages:
                llm.engine.pool.free(seq[0].block_table)
    (_, ref), *others = results
    for name, res in others:
        for key in ref:
            torch.testing.assert_close(res[key], ref[key], atol=1e-4, rtol=1e-5,
                                       msg=f"{name} {key}")


def test_staged_equals_one_prefill(llms):
    """Logits after chunked prefill + decodes over the cache equal one plain prefill of the whole
    sequence."""
    llm = llms[16]
    ids = llm.get_tokenizer().encode(PROMPTS[0])
    stages = plan(llm, [ids], random.Random(0))
    staged = run_one_at_a_time(llm, stages)
    llm.engine.pool.free(stages[0][0].block_table)
    whole = {}
    for stage, end in enumerate((len(ids) // 2, len(ids) - 2, len(ids) - 1, len(ids))):
        blocks = llm.engine.pool.allocate(-(-end // 16))
        whole[stage] = llm.engine.runner.forward([SeqInput(ids[:end], 0, blocks)])[0]
        llm.engine.pool.free(blocks)
    for stage in range(4):
        torch.testing.assert_close(staged[0, stage], whole[stage], atol=1e-4, rtol=1e-5)


def test_runner_rejects_short_block_table(llms):
    llm = llms[16]
    with pytest.raises(ValueError, match="cannot hold"):
        llm.engine.runner.forward([SeqInput(list(range(3, 40)), 0, [0])])
