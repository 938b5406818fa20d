"""Reading a prefix back from the KV tier instead of computing it, where that is cheaper (a fast
accelerator may compute faster than its disk reads): while others are quick, as many blocks a step
as a paced step's time allows."""

from __future__ import annotations

from dataclasses import dataclass

from warmpath.engine.kv_tier import KVTier, held_in_a_row
from warmpath.engine.request import Request
from warmpath.engine.scheduler._state import SchedulerState
from warmpath.engine.step_cost import StepCost


@dataclass
class TierReads:
    tier: KVTier | None
    cost: StepCost
    step_target_ms: float
    _left: int = 0  # blocks this step may still read back
    _pays: bool = True  # whether reading beats computing on this machine

    def begin_step(self, quick: bool, free_blocks: int, block_size: int) -> None:
        per_block = None if self.tier is None else self.tier.seconds_per_block
        per_token = self.cost.per_token
        self._pays = per_block is None or per_token is None or per_block < block_size * per_token
        self._left = free_blocks if not (quick and per_block) else max(
            1, int(self.step_target_ms / 1000 / per_block))

    @property
    def left(self) -> int:
        return self._left

    def chain(self, hashes: list[bytes], start: int) -> int:
        """How many blocks from `start` on the tier holds in a row and is worth reading (0 where it
        does not pay)."""
        return held_in_a_row(self.tier, hashes, start) if self._pays else 0

    def read(self, req: Request, state: SchedulerState) -> bool:
        """Read the blocks after req's computed ones that the tier holds into fresh blocks, as many
        as this step allows (a block it cannot read is computed from there on); whether the tier
        holds more, to read next step."""
        bs, start = state.block_size, req.num_computed_tokens // state.block_size
        if req.num_computed_tokens % bs or len(req.block_ids) != start:
            return False
        usable = req.block_hashes[: (req.num_tokens - 1) // bs]
        chain = self.chain(usable, start)
        take = min(chain, self._left, state.pool.num_free)
        if take == 0:
            return chain > 0 and self._left == 0
        fresh, tokens = state.pool.allocate(take), req.all_token_ids
        got = self.tier.restore(
            fresh, usable[start:start + take],
            [tuple(tokens[i * bs:(i + 1) * bs]) for i in range(start, start + take)])
        state.pool.free(fresh[got:])
        req.block_ids += fresh[:got]
        req.num_computed_tokens += got * bs
        self._left -= got
        if req.restoring:
            req.num_cached_tokens += got * bs
            req.num_tier_tokens += got * bs
            state.stats.prefix_cache_tier_hit_tokens += 0 if req.warmup else got * bs
        return got == take < chain
