"""The KV cache's disk tier on the tiny model: a prefix evicted from RAM, or lost to a restart, is
read back instead of computed, and gives exactly the tokens a computed one gives; a damaged,
truncated or foreign file is recomputed, never used; one tenant's blocks never serve another; a full
disk only costs the tier."""

import contextlib
import errno
import fcntl
from pathlib import Path

import pytest
from engine_checks import check_pool_invariants, code_texts

from warmpath import EngineRequest, SamplingParams
from warmpath.config import EngineConfig, SchedulerConfig
from warmpath.engine import kv_tier
from warmpath.engine.engine import Engine
from warmpath.engine.kv_tier import DiskTier

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def make(path, tier: Path | None, **kw) -> Engine:
    kw = {
        "dtype": "float32", "num_kv_blocks": 256, "kv_offload_dir": str(tier) if tier else None,
        **kw
    }
    return Engine(EngineConfig(model=str(path), **kw))


def run(engine: Engine, ids: list[int], salt: str | None = None,
        rid: str = "r") -> tuple[list[int], int, int]:
    """(output tokens, prompt tokens not computed, of those read from the tier)"""
    engine.add_request(EngineRequest(rid, ids, GREEDY, cache_salt=salt))
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done = out
        check_pool_invariants(engine)
    return done.token_ids, done.num_cached_tokens, done.num_tier_tokens


@pytest.fixture(scope="module")
def prompt(tiny_long_dir) -> list[int]:
    return make(tiny_long_dir, None,
                num_kv_blocks=4).tokenizer.encode(code_texts(1, 700, 700, seed=3)[0])


@pytest.fixture(scope="module")
def reference(tiny_long_dir, prompt) -> list[int]:
    return run(make(tiny_long_dir, None), prompt)[0]


def first_run(model_dir, tier: Path, prompt: list[int]) -> Engine:
    """An engine that served the prompt once and shut down: its blocks are in the tier."""
    engine = make(model_dir, tier)
    run(engine, prompt)
    engine.close()
    return engine


def kept_files(tier: Path) -> list[Path]:
    return sorted(tier.glob("*/*.kv"))


def test_an_evicted_prefix_is_read_back_with_the_same_tokens(tiny_long_dir, tmp_path, prompt,
                                                             reference):
    engine = make(tiny_long_dir, tmp_path)
    assert run(engine, prompt, rid="a") == (reference, 0, 0)
    engine.tier.disk.flush()
    full = (len(prompt) - 1) // 16 * 16
    # the answer's full blocks too
    assert len(kept_files(tmp_path)) == (len(prompt) + GREEDY.max_tokens - 1) // 16
    engine.pool.reset_prefix_cache()  # gone from RAM
    computed = engine.stats()["num_computed_tokens"]
    assert run(engine, prompt, rid="b") == (reference, full, full)
    assert engine.stats()["num_computed_tokens"] - computed == len(
        prompt) - full + GREEDY.max_tokens - 1
    assert engine.stats()["prefix_cache_tier_hit_tokens"] == full
    assert run(engine, prompt, rid="c") == (reference, full, 0)  # in RAM again: a RAM hit
    engine.close()


def test_blocks_evicted_by_other_sessions_come_back_from_the_tier(tiny_long_dir, tmp_path, prompt,
                                                                  reference):
    engine = make(tiny_long_dir, tmp_path, num_kv_blocks=64)
    run(engine, prompt, rid="a")
    for i, text in enumerate(code_texts(3, 700, 700, seed=9)):
        # other files push it out of the 64 blocks
        run(engine, engine.tokenizer.encode(text), rid=f"other{i}")
    assert engine.pool.find_cached_prefix(prompt, engine.pool.hashes(prompt)) == []
    tokens, cached, from_tier = run(engine, prompt, rid="b")
    assert tokens == reference and cached == from_tier == (len(prompt) - 1) // 16 * 16
    engine.close()


def test_a_restarted_engine_finds_the_prefixes(tiny_long_dir, tmp_path, prompt, reference):
    first_run(tiny_long_dir, tmp_path, prompt)
    again = make(tiny_long_dir, tmp_path)
    full = (len(prompt) - 1) // 16 * 16
    assert run(again, prompt) == (reference, full, full)
    again.close()


def test_an_int8_cache_restarts_from_its_tier_and_no_other_dtype_reads_it(
        tiny_long_dir, tmp_path, prompt):
    """int8 blocks (values and their scales) come back byte for byte: the tokens an int8 cache
    computes; a 16-bit engine on the same directory finds nothing (the key names the KV dtype)."""
    alone = run(make(tiny_long_dir, None, kv_cache_dtype="int8"), prompt)[0]
    first = make(tiny_long_dir, tmp_path, kv_cache_dtype="int8")
    run(first, prompt)
    first.close()
    again = make(tiny_long_dir, tmp_path, kv_cache_dtype="int8")
    full = (len(prompt) - 1) // 16 * 16
    assert run(again, prompt) == (alone, full, full)
    again.close()
    other = make(tiny_long_dir, tmp_path, kv_cache_dtype="bfloat16")
    assert run(other, prompt)[1:] == (0, 0)
    other.close()


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "foreign"])
def test_a_damaged_file_is_recomputed_never_used(tiny_long_dir, tmp_path, prompt, reference,
                                                 damage):
    first = first_run(tiny_long_dir, tmp_path, prompt)
    fourth = first.pool.hashes(prompt)[3].hex()
    # the fourth block of the prefix
    victim = next(p for p in kept_files(tmp_path) if p.stem == fourth)
    data = bytearray(victim.read_bytes())
    if damage == "flip":
        data[-100] ^= 0xFF  # in the payload: only the checksum sees it
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "empty":
        data = bytearray()
    else:  # another model's (another key's) block under this hash
        data[5:37] = bytes(32)
    victim.write_bytes(bytes(data))
    again = make(tiny_long_dir, tmp_path)
    tokens, cached, from_tier = run(again, prompt)
    assert tokens == reference
    # the three good blocks before it; computed from the damaged one on
    assert cached == from_tier == 3 * 16
    assert again.stats()["kv_tier_rejected"] == 1
    again.close()
    assert victim.read_bytes() != bytes(data)  # the recomputed block, written again
    third = make(tiny_long_dir, tmp_path)
    assert run(third, prompt)[1:] == ((len(prompt) - 1) // 16 * 16,) * 2
    third.close()


def test_a_tenants_blocks_never_serve_another(tiny_long_dir, tmp_path, prompt, reference):
    engine = make(tiny_long_dir, tmp_path)
    run(engine, prompt, salt="team-a", rid="a")
    engine.tier.disk.flush()
    engine.pool.reset_prefix_cache()
    assert run(engine, prompt, salt="team-b", rid="b") == (reference, 0, 0)
    assert run(engine, prompt, rid="c") == (reference, 0, 0)  # no salt: nobody's either
    full = (len(prompt) - 1) // 16 * 16
    engine.pool.reset_prefix_cache()
    assert run(engine, prompt, salt="team-a", rid="d") == (reference, full, full)
    engine.close()


def test_a_full_disk_leaves_blocks_in_ram_and_says_so(tiny_long_dir, tmp_path, prompt, reference,
                                                      monkeypatch, caplog):
    def no_space(path, data, durable=True):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(kv_tier, "write_atomic", no_space)
    engine = make(tiny_long_dir, tmp_path)
    assert run(engine, prompt, rid="a") == (reference, 0, 0)
    engine.tier.disk.flush()
    assert engine.stats()["kv_tier_write_errors"] > 0 and kept_files(tmp_path) == []
    assert "cannot write" in caplog.text
    full = (len(prompt) - 1) // 16 * 16
    assert run(engine, prompt, rid="b") == (reference, full, 0)  # still warm in RAM
    engine.pool.reset_prefix_cache()
    # then recomputed: nothing lost, nothing wrong
    assert run(engine, prompt, rid="c") == (reference, 0, 0)
    engine.close()


def test_the_tier_keeps_its_bound_least_recently_used_first(tmp_path):
    tier = DiskTier(tmp_path, "k", max_bytes=5 * 1200)
    for i in range(8):
        tier.put(bytes([i]) * 32, (i,) * 16, bytes(1000))
        tier.flush()
    assert tier.num_bytes <= 5 * 1200 and tier.stats.blocks_evicted == 4
    assert not tier.has(bytes([0]) * 32) and tier.has(bytes([7]) * 32)
    assert tier.read(bytes([5]) * 32, (5,) * 16, 1000) == bytes(1000)
    tier.put(bytes([8]) * 32, (8,) * 16, bytes(1000))
    tier.flush()
    # read: used, so 4 went first
    assert tier.has(bytes([5]) * 32) and not tier.has(bytes([4]) * 32)
    tier.close()


def test_another_model_on_the_same_tier_finds_nothing_of_the_first(tiny_long_dir, tiny_llama_dir,
                                                                   tmp_path, prompt):
    first_run(tiny_long_dir, tmp_path, prompt)
    other = make(tiny_llama_dir, tmp_path)
    # its own key: the first model's blocks are not its K/V
    assert run(other, prompt[:200])[1:] == (0, 0)
    other.close()
    assert len({p.parent for p in kept_files(tmp_path)}) == 2


def test_while_others_decode_a_prefix_is_read_back_a_paced_share_per_step(
        tiny_long_dir, tmp_path, prompt, reference, monkeypatch):
    """Reading a long prefix back never stalls another developer's stream: while someone decodes,
    each step reads what a paced step's time allows (step_target_ms over the measured cost of a
    block), and the others get their token in every one of those steps; the restored request's
    answer is the same."""
    engine = first_run(tiny_long_dir, tmp_path, prompt)
    engine = make(tiny_long_dir, tmp_path, scheduler=SchedulerConfig(step_target_ms=100.0))
    other = engine.tokenizer.encode(code_texts(1, 300, 300, seed=5)[0])
    engine.add_request(
        EngineRequest("other", other, SamplingParams(max_tokens=200, temperature=0,
                                                     ignore_eos=True)))
    while not engine.requests["other"].output_token_ids:
        engine.step()
    engine.add_request(EngineRequest("back", prompt, GREEDY))
    steps, other_tokens, per_step = 0, [], []
    # As if a block took 30 ms to read (3 blocks a 100 ms step), and computing its 16 tokens 160 ms:
    # reading pays.
    monkeypatch.setattr(type(engine.tier), "seconds_per_block", property(lambda tier: 0.03))
    monkeypatch.setattr(type(engine.cost), "per_token", property(lambda cost: 0.01))
    while not engine.requests["back"].output_token_ids:
        before = (engine.requests["back"].num_computed_tokens,
                  len(engine.requests["other"].output_token_ids))
        engine.step()
        steps += 1
        per_step.append(engine.requests["back"].num_computed_tokens - before[0])
        other_tokens.append(len(engine.requests["other"].output_token_ids) - before[1])
    full = (len(prompt) - 1) // 16 * 16
    # paced: 3 blocks a step, then the rest computed
    assert steps >= full // 16 // 3 and max(per_step[:-1]) <= 3 * 16
    assert all(n >= 1 for n in other_tokens)  # the other stream got a token in every step
    while engine.has_unfinished_requests():
        engine.step()
    back = engine.requests.get("back")
    assert back is None or back.finished
    engine.close()
    again = make(tiny_long_dir, tmp_path)
    assert run(again, prompt, rid="again") == (reference, full, full)
    again.close()


@pytest.fixture(scope="module")
def block_bytes(tiny_long_dir) -> int:
    """A KV block's payload in the tier for the tiny model (fp32)."""
    e = make(tiny_long_dir, None, num_kv_blocks=4)
    return e.model_config.kv_bytes_per_token(e.kv_dtype_name) * e.config.block_size


@contextlib.contextmanager
def root_held(root: Path):
    """The tier root's lock, held as another server's writer holds it (while it writes or makes
    room)."""
    with open(root / ".lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def test_a_disk_that_cannot_keep_up_drops_blocks_never_the_step(tiny_long_dir, tmp_path, prompt,
                                                                reference, block_bytes):
    """The tier's writer stalled (on the root's lock, held here as another server would): the engine
    serves on, blocks wait up to kv_offload_queue_bytes, the rest are not kept (counted), and RAM
    never holds more; once the writer can write, what waited is on disk."""
    engine = make(tiny_long_dir, tmp_path, kv_offload_queue_bytes=str(3 * block_bytes))
    with root_held(tmp_path):
        assert run(engine, prompt) == (reference, 0, 0)  # the step never waited for the disk
        cached = (len(prompt) + GREEDY.max_tokens - 1) // 16
        stats = engine.stats()
        assert stats["kv_tier_queued_bytes"] == 3 * block_bytes
        assert stats["kv_tier_dropped"] == cached - 3 and kept_files(tmp_path) == []
    engine.tier.disk.flush()
    assert len(kept_files(tmp_path)) == 3 and engine.stats()["kv_tier_queued_bytes"] == 0
    engine.close()


def root_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.glob("*/*.kv"))


def block(i: int) -> tuple[bytes, tuple[int, ...], bytes]:
    return bytes([i]) * 32, (i,) * 16, bytes(1000)


SIZE = 1241  # one such block's file: header, 16 token ids, payload


def test_servers_on_one_root_keep_it_within_the_bound_and_a_stale_key_goes_first(tmp_path):
    """Two servers with different keys (another model, plan or code version) on one tier directory,
    beside the directory of a key nobody serves any more: the whole root stays within the bound, the
    stale directory is emptied first and removed, then the least recently used blocks go whoever
    wrote them; a block another server deleted is recomputed, never taken for a damaged one."""
    old = DiskTier(tmp_path, "old", max_bytes=6 * SIZE)
    for i in range(100, 103):
        old.put(*block(i))
    old.close()  # its server is gone: the key is stale
    a, b = DiskTier(tmp_path, "a", max_bytes=6 * SIZE), DiskTier(tmp_path, "b", max_bytes=6 * SIZE)
    for i in range(8):
        for tier, j in ((a, i), (b, 50 + i)):
            tier.put(*block(j))
            tier.flush()
            assert root_bytes(tmp_path) <= 6 * SIZE
    assert not (tmp_path /
                "old").exists() and a.root.stale_keys_pruned + b.root.stale_keys_pruned == 1
    # the newest
    assert sorted(p.stem[:2] for p in kept_files(tmp_path)) == ["05", "06", "07", "37", "38", "39"]
    for i in range(8, 11):  # a alone writes on: the oldest blocks go, b's among them
        a.put(*block(i))
        a.flush()
    assert root_bytes(tmp_path) <= 6 * SIZE
    assert sorted(p.stem[:2] for p in kept_files(tmp_path)) == ["07", "08", "09", "0a", "38", "39"]
    assert b.has(block(55)[0])  # b kept it; a deleted it
    for tier, gone in ((a, range(0, 7)), (b, range(50, 56))):  # a miss, never a damaged file
        assert all(tier.read(*block(i)[:2], 1000) is None
                   for i in gone) and tier.stats.blocks_rejected == 0
    assert not b.has(block(55)[0])
    a.close()
    b.close()


def test_two_servers_on_one_key_count_each_file_once(tmp_path):
    a, b = DiskTier(tmp_path, "k", max_bytes=6 * SIZE), DiskTier(tmp_path, "k", max_bytes=6 * SIZE)
    for i in range(5):
        for tier in (a, b):  # the same blocks from both (replicas of one model), then their own
            tier.put(*block(i))
            tier.flush()
        a.put(*block(20 + i))
        b.put(*block(40 + i))
        a.flush()
        b.flush()
        assert root_bytes(tmp_path) <= 6 * SIZE
    assert len(
        kept_files(tmp_path)) == 6 and a.stats.blocks_rejected == b.stats.blocks_rejected == 0
    a.close()
    b.close()


def test_the_root_is_private_and_a_stale_keys_temp_files_go_only_once_no_write_can_be_making_them(
        tmp_path):
    """The lock and the in-use marks are 0600 in 0700 directories; a key directory no server holds
    goes with a crash's leftover temporary file (store.atomic_file's name, older than STALE_TMP_S),
    never with a fresh one (a write under way, an older warmpath's without the in-use mark)."""
    import os
    import stat
    import time

    name = ".{}.kv.x1y2z3ab.tmp".format("ab" * 32)
    for key, age in (("crashed", 2 * kv_tier.STALE_TMP_S), ("writing", 1.0)):
        (tmp_path / key).mkdir(mode=0o700)
        (tmp_path / key / ".in-use").touch()
        (tmp_path / key / name).write_bytes(b"part of a block")
        then = time.time() - age
        os.utime(tmp_path / key / name, (then, then))
    tier = DiskTier(tmp_path, "live", max_bytes=6 * SIZE)
    tier.put(*block(1))
    tier.flush()
    assert not (tmp_path / "crashed").exists() and tier.root.stale_keys_pruned == 1
    assert (tmp_path / "writing" / name).exists() and (tmp_path / "writing" / ".in-use").exists()
    for p in (tmp_path / ".lock", tmp_path / "live" / ".in-use", *kept_files(tmp_path)):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    for d in (tmp_path, tmp_path / "live"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    tier.close()
