"""BlockPool: chained hashes, verified hits, reference counts, LRU free queue."""

import pytest

from warmpath.engine.block_pool import BlockPool, NoFreeBlocksError, block_hashes


def fill(pool: BlockPool, tokens: list[int]) -> list[int]:
    """Allocate blocks for tokens as a request would, and register its full blocks."""
    n = -(-len(tokens) // pool.block_size)
    blocks = pool.allocate(n)
    pool.cache_blocks(blocks, tokens, pool.hashes(tokens), 0)
    return blocks


def test_chained_hash_depends_on_everything_before():
    a = block_hashes(list(range(12)), 4, b"m")
    b = block_hashes([99] + list(range(1, 12)), 4, b"m")
    # a change in block 0 moves them all
    assert len(a) == 3 and all(x != y for x, y in zip(a, b, strict=True))
    assert block_hashes(list(range(12)), 4, b"other") != a  # the extra key separates models / salts
    assert block_hashes(list(range(13)), 4, b"m") == a  # only full blocks are hashed
    assert block_hashes(list(range(12)), 4, b"m", start=a[:1]) == a  # extending known hashes


def test_prefix_hit_verified_and_held():
    pool = BlockPool(8, 4)
    tokens = list(range(10))
    blocks = fill(pool, tokens)
    pool.free(blocks)
    assert pool.num_free == 8 and len(pool.cached) == 2
    hit = pool.find_cached_prefix(tokens + [5, 5], pool.hashes(tokens + [5, 5]))
    assert hit == blocks[:2]
    pool.touch(hit)
    assert pool.num_free == 6 and [pool.ref_counts[b] for b in hit] == [1, 1]
    pool.touch(hit)  # a second request sharing the prefix
    assert [pool.ref_counts[b] for b in hit] == [2, 2]
    pool.free(hit)
    pool.free(hit)
    assert pool.num_free == 8
    # A forged cache entry (same hash, other tokens) is never handed out.
    pool.block_meta[blocks[0]].token_ids = (7, 7, 7, 7)
    assert pool.find_cached_prefix(tokens, pool.hashes(tokens)) == []


def test_lru_eviction_order_and_tail_first():
    pool = BlockPool(6, 2)
    a = fill(pool, [1, 1, 2, 2])
    b = fill(pool, [3, 3, 4, 4])
    c = fill(pool, [5, 5, 6, 6])
    pool.free(a)
    pool.free(b)
    pool.free(c)
    # a's tail block is first in line, then a's head, then b ...
    assert list(pool.free_queue) == [a[1], a[0], b[1], b[0], c[1], c[0]]
    hit = pool.find_cached_prefix([1, 1, 2, 2], pool.hashes([1, 1, 2, 2]))
    pool.touch(hit)  # a is used again: it leaves the queue and comes back at the end
    pool.free(hit)
    new = pool.allocate(2)
    assert new == [b[1], b[0]]  # b is now least recently used: evicted first
    assert pool.num_evictions == 2
    assert pool.find_cached_prefix([3, 3, 4, 4], pool.hashes([3, 3, 4, 4])) == []
    assert pool.find_cached_prefix([1, 1, 2, 2], pool.hashes([1, 1, 2, 2])) == a
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(5)
    with pytest.raises(RuntimeError, match="not held"):
        pool.free([a[0]])


def test_disabled_prefix_caching_never_hits():
    pool = BlockPool(4, 2, enable_prefix_caching=False)
    blocks = fill(pool, [1, 2, 3, 4])
    pool.free(blocks)
    assert pool.find_cached_prefix([1, 2, 3, 4, 5], pool.hashes([1, 2, 3, 4, 5])) == []
