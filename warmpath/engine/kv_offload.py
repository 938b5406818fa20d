"""The engine's side of the KV tier: a pool block's K/V copied into the DiskTier as the block enters
the prefix cache, and read back into fresh pool blocks when the scheduler restores a prefix
(kv_tier.KVTier)."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import torch

from warmpath.config import ModelConfig
from warmpath.engine.kv_tier import DiskTier
from warmpath.identity import model_identity, numerics_identity
from warmpath.stats import MovingAverage


def tier_key(source: str, backends: list[str], kv_dtype: torch.dtype, block_size: int,
             model: ModelConfig) -> str:
    """Everything that makes a block's K/V valid (identity.py): the model file's content, the
    backends that computed it and the code, torch and CPU behind them, the KV dtype, the block size,
    the model's shape."""
    what = [model_identity(Path(source)), " + ".join(backends), numerics_identity(), str(kv_dtype),
            str(block_size), repr(model)]
    return hashlib.sha256("\n".join(what).encode()).hexdigest()[:24]


class KVOffload:
    """A DiskTier over the engine's KV cache tensor [layers, 2, blocks, block_size, kv heads, head
    dim]."""

    def __init__(self, disk: DiskTier, kv_cache: torch.Tensor):
        self.disk, self.kv = disk, kv_cache
        self.block_shape = kv_cache[:, :, 0].shape
        self.block_bytes = kv_cache[:, :, 0].numel() * kv_cache.element_size()
        # of a block, measured as blocks are read back (the scheduler paces by it)
        self._read_time = MovingAverage()

    @property
    def seconds_per_block(self) -> float | None:
        return self._read_time.value

    def save(self, block: int, block_hash: bytes, token_ids: tuple[int, ...]) -> None:
        """BlockPool.on_cached: a block just entered the prefix cache is kept in the tier too
        (written off this thread; a block the tier has already is only marked as used)."""
        if self.disk.has(block_hash):
            self.disk.touch(block_hash)
            return
        self.disk.put(block_hash, token_ids,
                      self.kv[:, :, block].contiguous().view(torch.uint8).numpy().tobytes())

    def has(self, block_hash: bytes) -> bool:
        return self.disk.has(block_hash)

    def restore(self, blocks: list[int], hashes: list[bytes], token_ids: list[tuple[int,
                                                                                    ...]]) -> int:
        t, done = time.perf_counter(), len(blocks)
        for i, (b, h, tokens) in enumerate(zip(blocks, hashes, token_ids, strict=True)):
            payload = self.disk.read(h, tokens, self.block_bytes)
            if payload is None:
                done = i
                break
            kept = torch.frombuffer(bytearray(payload),
                                    dtype=torch.uint8).view(self.kv.dtype).view(self.block_shape)
            self.kv[:, :, b].copy_(kept)
        if done:
            self._read_time.add((time.perf_counter() - t) / done)
        return done

    def close(self) -> None:
        self.disk.close()
