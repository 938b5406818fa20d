"""The KV tier in the simulator: which prefix blocks the disk tier holds (every block the pool
caches, least recently used first out of a byte budget, as engine/kv_tier.py keeps them) and what
reading them back costs (the disk's read rate, a profile parameter measured by `warmpath simulate
--calibrate`)."""

from __future__ import annotations

from collections import OrderedDict


class SimTier:
    """scheduler.KVTier without tensors: restoring a block costs block_bytes / read rate of the
    step's time."""

    def __init__(self, capacity_bytes: int, block_bytes: int, read_bytes_per_s: float):
        self.capacity = max(0, capacity_bytes // block_bytes)
        self.seconds_per_block = block_bytes / read_bytes_per_s
        self.blocks: OrderedDict[bytes, None] = OrderedDict()
        self.restored_blocks = 0
        self._pending_s = 0.0

    def add(self, block: int, block_hash: bytes, token_ids: tuple[int, ...]) -> None:
        """BlockPool.on_cached: the block is written to the tier."""
        self.blocks[block_hash] = None
        self.blocks.move_to_end(block_hash)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)

    def has(self, block_hash: bytes) -> bool:
        return block_hash in self.blocks

    def restore(self, blocks: list[int], hashes: list[bytes], token_ids: list[tuple[int,
                                                                                    ...]]) -> int:
        for h in hashes:
            self.blocks.move_to_end(h)
        self.restored_blocks += len(blocks)
        self._pending_s += len(blocks) * self.seconds_per_block
        return len(blocks)

    def take_seconds(self) -> float:
        """The reading this step did (added to its computed time)."""
        s, self._pending_s = self._pending_s, 0.0
        return s
