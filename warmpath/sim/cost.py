"""How long one engine step takes, from the step's batch alone, and how many KV blocks a memory
budget buys.

Step time = base + per_token * T + prefill_attention * A + per_seq * S + kv_read * C + per_chunk *
P, where
  T = tokens computed in the step (prefill chunks and decodes): matmul work, linear in tokens A =
  sum over prefill chunks of n * (context before the chunk + n / 2): attention of new tokens over
  the cache S = sequences in the step (sampling, per-sequence bookkeeping) C = sum over all
  sequences of the K/V they attend over (cached context + new tokens): gathering and reading
      it, paid even by a 5-token chunk over a 2,000-token context
  P = prefill chunks in the step (the prefill attention path has its own fixed cost per span)
and base is the fixed cost of a step (one pass over the weights, launch overhead). The coefficients
of a hardware profile are either fitted to the real engine (`warmpath simulate --calibrate`) or
derived from a datasheet (each says where its numbers come from).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from warmpath.api.fim import FimTemplate, detect_fim, suffix_tokens
from warmpath.config import ModelConfig, ServerConfig
from warmpath.engine.scheduler import StepBatch
from warmpath.models.footprint import kv_pool_blocks
from warmpath.store import home_dir, write_atomic

FEATURES = ("base", "per_token", "prefill_attention", "per_seq", "kv_read", "per_chunk")


@dataclass
class StepShape:
    tokens: int = 0
    prefill_attention: float = 0.0
    seqs: int = 0
    kv_read: int = 0
    chunks: int = 0  # prefill chunks among the seqs

    def features(self) -> list[float]:
        return [
            1.0,
            float(self.tokens), self.prefill_attention,
            float(self.seqs),
            float(self.kv_read),
            float(self.chunks)
        ]


def step_shape(batch: StepBatch) -> StepShape:
    s = StepShape()
    for c in batch.chunks:
        ctx = c.request.num_computed_tokens
        s.tokens += c.num_tokens
        s.seqs += 1
        s.kv_read += ctx + c.num_tokens
        if not (c.num_tokens == 1 and ctx >= len(c.request.prompt_token_ids)):
            # a prefill chunk, not a decode
            s.prefill_attention += c.num_tokens * (ctx + c.num_tokens / 2)
            s.chunks += 1
    return s


@dataclass
class CostModel:
    base: float  # seconds per step
    per_token: float
    prefill_attention: float
    per_seq: float
    kv_read: float
    per_chunk: float = 0.0

    def step_seconds(self, shape: StepShape) -> float:
        return sum(c * f for c, f in zip(self.coefficients(), shape.features(), strict=True))

    def coefficients(self) -> list[float]:
        return [getattr(self, f) for f in FEATURES]


@dataclass
class Profile:
    """A deployment: the model's shape and weights, the hardware's memory, and the step-time
    model."""

    name: str
    model: ModelConfig
    # resident weights by weights dtype (models/footprint.py for the CPU engine)
    weight_bytes: dict[str, int]
    kv_dtype: str  # config.KV_ELEMENT_BYTES' names
    # the memory budget: weights + working buffers + KV (the engine's memory_budget)
    memory_bytes: int
    cost: dict[str, CostModel]  # by weights dtype: fewer bytes per weight shorten the weight pass
    default_dtype: str
    block_size: int = 16
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    # activations of the largest step (models/footprint.working_bytes for the CPU engine)
    working_bytes: int = 0
    # The KV tier's disk: bytes per second read back from files not in the page cache (`--calibrate`
    # measures it here; the default is what a cloud VM's SSD volume gave)
    disk_read_bytes_per_s: float = 200e6
    # the model `--calibrate` fits the cost to (None: a paper profile)
    model_spec: str | None = None
    calibrate_dtype: str = "auto"  # the engine's dtype while it does
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def fim(self) -> FimTemplate | None:
        """The FIM family of the profile's model (None: a paper profile, or a model without one:
        prefix-only)."""
        return detect_fim(model=self.model_spec or "")

    @property
    def fim_suffix_tokens(self) -> int | None:
        """The FIM suffix the server keeps on this profile's machine by default
        (`--fim-suffix-tokens`: None, the whole suffix; "auto", api/fim.suffix_budget of a token's
        cost)."""
        return suffix_tokens(ServerConfig.fim_suffix_tokens,
                             self.cost[self.default_dtype].per_token, self.block_size)

    @property
    def kv_block_bytes(self) -> int:
        return self.model.kv_bytes_per_token(self.kv_dtype) * self.block_size

    def num_kv_blocks(self, dtype: str | None = None, memory_bytes: int | None = None) -> int:
        """The block pool that fits beside the weights in the memory budget, counted as the engine
        counts."""
        per_block = self.model.kv_bytes_per_token(self.kv_dtype) * self.block_size
        return kv_pool_blocks(memory_bytes or self.memory_bytes,
                              self.weight_bytes[dtype or
                                                self.default_dtype], self.working_bytes, per_block)


def calibration_path(name: str) -> Path:
    return home_dir("sim") / f"{name}.json"


def save_calibration(name: str, cost: CostModel, meta: dict) -> Path:
    path = calibration_path(name)
    write_atomic(path, json.dumps({"cost": asdict(cost), **meta}, indent=1))
    return path


def calibration_meta(name: str) -> dict | None:
    """What `--calibrate` saved for this profile on this machine (the fit, and what it measured
    beside it)."""
    path = calibration_path(name)
    return json.loads(path.read_text()) if path.exists() else None


def load_calibration(name: str) -> CostModel | None:
    meta = calibration_meta(name)
    return None if meta is None else CostModel(**meta["cost"])
