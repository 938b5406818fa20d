"""KV cache memory: how many blocks fit, the cache tensor, and the BlockPool that hands blocks out.

This is the pool's first form (allocate / free with reference counts). Automatic prefix caching with chained
block hashes and the LRU free queue build on it in the engine-core issue.
"""

from __future__ import annotations

import logging
from collections import deque

import torch

from warmpath.config import EngineConfig, ModelConfig

log = logging.getLogger(__name__)


class NoFreeBlocksError(RuntimeError):
    """The pool cannot hand out the blocks asked for."""


def num_kv_blocks(engine: EngineConfig, model: ModelConfig, dtype: torch.dtype) -> int:
    """Blocks from num_kv_blocks, else from the kv_cache_memory byte budget. Logs what it chose."""
    per_token = model.kv_bytes_per_token(torch.finfo(dtype).bits // 8)
    per_block = per_token * engine.block_size
    blocks = engine.num_kv_blocks or max(1, engine.kv_cache_memory // per_block)
    tokens = blocks * engine.block_size
    log.info(
        "KV cache: %d blocks x %d tokens = %d tokens (%.1f MiB, %d bytes/token); fits %.1f 4k-token sessions",
        blocks,
        engine.block_size,
        tokens,
        blocks * per_block / 2**20,
        per_token,
        tokens / 4096,
    )
    return blocks


def allocate_kv_cache(model: ModelConfig, num_blocks: int, block_size: int, dtype, device) -> torch.Tensor:
    """[num_layers, 2 (K, V), num_blocks, block_size, num_kv_heads, head_dim]."""
    shape = (model.num_layers, 2, num_blocks, block_size, model.num_kv_heads, model.head_dim)
    return torch.zeros(shape, dtype=dtype, device=device)


class BlockPool:
    """A fixed set of block ids with reference counts."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self.free_queue: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    def allocate(self, n: int) -> list[int]:
        if n > len(self.free_queue):
            raise NoFreeBlocksError(f"asked for {n} blocks, {len(self.free_queue)} free")
        blocks = [self.free_queue.popleft() for _ in range(n)]
        for b in blocks:
            self.ref_counts[b] = 1
        return blocks

    def free(self, blocks: list[int]) -> None:
        # Reverse order: a request's last block goes back first (it is the least likely to be shared).
        for b in reversed(blocks):
            if self.ref_counts[b] <= 0:
                raise RuntimeError(f"block {b} freed twice")
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_queue.append(b)
