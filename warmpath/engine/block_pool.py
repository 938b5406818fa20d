"""The BlockPool: fixed KV blocks with reference counts and automatic prefix caching. Pure Python
(the simulator runs it too); the tensors the blocks index live in models/kv_cache.py.

Every full block of a sequence gets a chained hash: sha256(parent hash, extra key, the block's token
ids); the first block's parent is the request's cache salt (empty without one), so requests of
different salts (tenants) never share a block, nor learn from a hit what another tenant's prompt
was. A new request reuses the longest chain of cached blocks of its tokens (each hit verified token
by token, so a collision can never hand out wrong K/V). Blocks nobody holds stay cached and sit in
an LRU free queue: freed blocks join its back (a request's last block first), allocation takes from
its front (evicting the cached content), a cache hit pulls the block out of the queue wherever it
is.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)


class NoFreeBlocksError(RuntimeError):
    """The pool cannot hand out the blocks asked for."""


def hash_block(parent: bytes, token_ids: list[int] | tuple[int, ...], extra_key: bytes) -> bytes:
    h = hashlib.sha256(parent)
    h.update(extra_key)
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return h.digest()


def salt_root(cache_salt: str | None) -> bytes:
    """The parent of a sequence's first block: empty without a salt (the hashes of unsalted
    requests)."""
    if cache_salt is None:
        return b""
    return hashlib.sha256(b"cache_salt\0" + cache_salt.encode("utf-8", "surrogatepass")).digest()


def block_hashes(token_ids: list[int], block_size: int, extra_key: bytes,
                 start: list[bytes] | None = None, cache_salt: str | None = None) -> list[bytes]:
    """Chained hashes of every full block of token_ids, extending the already-known `start`
    hashes."""
    hashes = list(start or [])
    for i in range(len(hashes), len(token_ids) // block_size):
        parent = hashes[-1] if hashes else salt_root(cache_salt)
        hashes.append(hash_block(parent, token_ids[i * block_size:(i + 1) * block_size], extra_key))
    return hashes


@dataclass
class CachedBlock:
    block_hash: bytes
    token_ids: tuple[int, ...]  # kept to verify a hit


class BlockPool:
    """A fixed set of KV blocks: reference counts, prefix cache, LRU free queue."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 extra_key: bytes = b""):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # model / adapter / cache_salt: different keys never share blocks
        self.extra_key = extra_key
        self.ref_counts = [0] * num_blocks
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.cached: dict[bytes, int] = {}  # block hash -> block id
        self.block_meta: list[CachedBlock | None] = [None] * num_blocks
        self.num_evictions = 0
        # Called with (block, hash, token ids) as a block enters the prefix cache: the engine keeps
        # it in its KV tier
        self.on_cached: Callable[[int, bytes, tuple[int, ...]], None] | None = None

    @property
    def num_free(self) -> int:
        """Blocks that can be allocated now (free, whether or not they still hold cached
        content)."""
        return len(self.free_queue)

    @property
    def num_cached_free(self) -> int:
        return sum(1 for b in self.free_queue if self.block_meta[b] is not None)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_queue)

    def hashes(self, token_ids: list[int], start: list[bytes] | None = None,
               cache_salt: str | None = None) -> list[bytes]:
        return block_hashes(token_ids, self.block_size, self.extra_key, start, cache_salt)

    def find_cached_prefix(self, token_ids: list[int], hashes: list[bytes]) -> list[int]:
        """Block ids of the longest cached chain covering token_ids' leading full blocks (not yet
        held)."""
        if not self.enable_prefix_caching:
            return []
        found = []
        for i, h in enumerate(hashes):
            b = self.cached.get(h)
            if b is None:
                break
            tokens = tuple(token_ids[i * self.block_size : (i + 1) * self.block_size])
            meta = self.block_meta[b]
            if meta is None or meta.token_ids != tokens:
                # a hash collision: treat as a miss, loudly
                log.error("prefix cache: hash collision on block %d; not reusing it", b)
                break
            found.append(b)
        return found

    def num_evictable_among(self, blocks: list[int]) -> int:
        """How many of these blocks sit in the free queue (touching them takes them out of it)."""
        return sum(1 for b in blocks if self.ref_counts[b] == 0)

    def touch(self, blocks: list[int]) -> None:
        """Take a reference on cached blocks (a prefix hit): out of the free queue if nobody held
        them."""
        for b in blocks:
            if self.ref_counts[b] == 0:
                del self.free_queue[b]
            self.ref_counts[b] += 1

    def allocate(self, n: int) -> list[int]:
        """n fresh blocks from the front of the LRU queue, evicting whatever they cached."""
        if n > len(self.free_queue):
            raise NoFreeBlocksError(f"asked for {n} blocks, {len(self.free_queue)} free")
        blocks = []
        for _ in range(n):
            b, _ = self.free_queue.popitem(last=False)
            meta = self.block_meta[b]
            if meta is not None:
                del self.cached[meta.block_hash]
                self.block_meta[b] = None
                self.num_evictions += 1
            self.ref_counts[b] = 1
            blocks.append(b)
        return blocks

    def free(self, blocks: list[int]) -> None:
        """Drop one reference on each; unheld blocks join the back of the queue, last block first,
        so a request's tail is evicted before its (more shareable) head."""
        for b in reversed(blocks):
            if self.ref_counts[b] <= 0:
                raise RuntimeError(f"block {b} freed while not held")
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_queue[b] = None

    def cache_blocks(self, blocks: list[int], token_ids: list[int], hashes: list[bytes],
                     start: int) -> None:
        """Register blocks[start:len(hashes)] (now full of computed tokens) under their hashes."""
        if not self.enable_prefix_caching:
            return
        for i in range(start, len(hashes)):
            b, h = blocks[i], hashes[i]
            if self.block_meta[b] is not None or h in self.cached:
                # already cached, or the same content lives in another block: keep that one
                continue
            self.cached[h] = b
            self.block_meta[b] = CachedBlock(
                h, tuple(token_ids[i * self.block_size:(i + 1) * self.block_size]))
            if self.on_cached is not None:
                self.on_cached(b, h, self.block_meta[b].token_ids)

    def reset_prefix_cache(self) -> None:
        for b, meta in enumerate(self.block_meta):
            if meta is not None and self.ref_counts[b] == 0:
                del self.cached[meta.block_hash]
                self.block_meta[b] = None
