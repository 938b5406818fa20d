"""The KV cache tensors: how many blocks fit the configured memory, and the cache tensor itself."""

from __future__ import annotations

import logging

import numpy as np
import torch

from warmpath.config import EngineConfig, ModelConfig
from warmpath.models.footprint import kv_pool_blocks, parse_bytes, working_bytes
from warmpath.models.kv_quant import row_width

log = logging.getLogger(__name__)


def num_kv_blocks(engine: EngineConfig, model: ModelConfig, dtype: torch.dtype,
                  weight_bytes: int = 0) -> int:
    """Blocks from num_kv_blocks; else what memory_budget leaves beside the resident weights and the
    largest step's working buffers (models/footprint.py, the simulator's accounting too); else from
    the kv_cache_memory byte budget. Logs what it chose."""
    per_token = model.kv_bytes_per_token(str(dtype).removeprefix("torch."))
    per_block = per_token * engine.block_size
    if engine.num_kv_blocks or not engine.memory_budget:
        blocks = engine.num_kv_blocks or max(1, engine.kv_cache_memory // per_block)
    else:
        working = working_bytes(model, engine.scheduler.max_num_batched_tokens,
                                engine.scheduler.max_num_seqs)
        blocks = kv_pool_blocks(parse_bytes(engine.memory_budget), weight_bytes, working, per_block)
    tokens = blocks * engine.block_size
    log.info(
        "KV cache: %d blocks x %d tokens = %d tokens (%.1f MiB, %d bytes/token); fits %.1f "
        "4k-token sessions",
        blocks,
        engine.block_size,
        tokens,
        blocks * per_block / 2**20,
        per_token,
        tokens / 4096,
    )
    return blocks


def allocate_kv_cache(model: ModelConfig, num_blocks: int, block_size: int, dtype,
                      device) -> torch.Tensor:
    """[num_layers, 2 (K, V), num_blocks, block_size, num_kv_heads, head_dim (+2 for int8:
    kv_quant.py)], zeros. On the CPU from calloc's zero pages (numpy): the OS maps them as they are
    first written, so a start does not spend a second writing zeros over a pool most of which waits
    for sessions (and the resident set grows with the cache's use)."""
    shape = (model.num_layers, 2, num_blocks, block_size, model.num_kv_heads,
             row_width(model.head_dim, dtype))
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    itemsize = torch.empty((), dtype=dtype).element_size()
    same_size = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[itemsize]
    return torch.from_numpy(np.zeros(shape, dtype=same_size)).view(dtype)
