"""Fit a CostModel to the real engine: time the model runner on step shapes that span what the
scheduler plans (prefill chunks over cached context, decode batches over long contexts, mixed
steps), then least squares with non-negative coefficients. `warmpath simulate --calibrate` runs it
and saves the result."""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
import time

import numpy as np

from warmpath.config import EngineConfig
from warmpath.engine.engine import Engine
from warmpath.engine.runner import SeqInput
from warmpath.sim.cost import FEATURES, CostModel, StepShape
from warmpath.store import home_dir

log = logging.getLogger(__name__)

# (chunk tokens, cached context) · (decode sequences, their context) · (chunk, context, decodes,
# their context)
PREFILL = [(n, c) for c in (0, 1024, 2048) for n in (8, 32, 128, 512)]
DECODE = [(b, ctx) for ctx in (256, 2048) for b in (1, 4, 16)]
MIXED = [(256, 1024, 4, 1024), (64, 0, 8, 2000)]


def _blocks(n_tokens: int, block_size: int, start: int) -> list[int]:
    return list(range(start, start + -(-n_tokens // block_size)))


def _time(engine: Engine, seqs: list[SeqInput], repeats: int) -> float:
    engine.runner.forward(seqs)  # warm-up (allocator, kernels for this shape)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        engine.runner.forward(seqs)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(engine: Engine, repeats: int = 2) -> list[tuple[StepShape, float]]:
    """(shape, seconds) for every calibration step; the K/V contents are irrelevant to the time."""
    bs = engine.config.block_size
    vocab = engine.model_config.vocab_size
    rng = np.random.default_rng(0)

    def ids(n: int) -> list[int]:
        return rng.integers(100, vocab - 1, n).tolist()

    samples: list[tuple[StepShape, float]] = []

    def prefill_seq(n: int, ctx: int, start: int) -> tuple[SeqInput, int]:
        blocks = _blocks(ctx + n, bs, start)
        return SeqInput(ids(n), ctx, blocks, True), start + len(blocks)

    def decode_seqs(b: int, ctx: int, start: int) -> tuple[list[SeqInput], int]:
        seqs = []
        for _ in range(b):
            blocks = _blocks(ctx + 1, bs, start)
            seqs.append(SeqInput(ids(1), ctx, blocks, True))
            start += len(blocks)
        return seqs, start

    for n, ctx in PREFILL:
        # Real prefill chunks rarely repeat a shape (every warm request brings its own few new
        # tokens), and a new shape costs more than a warmed one: each call here gets its own length,
        # no warm-up.
        for r in range(repeats + 1):
            m = n + int(rng.integers(0, max(2, n // 4)))
            seq, _ = prefill_seq(m, ctx + r, 0)
            t = time.perf_counter()
            engine.runner.forward([seq])
            samples.append((StepShape(tokens=m, prefill_attention=m * (ctx + r + m / 2), seqs=1,
                                      kv_read=ctx + r + m, chunks=1), time.perf_counter() - t))
    for b, ctx in DECODE:
        seqs, _ = decode_seqs(b, ctx, 0)
        samples.append((StepShape(tokens=b, seqs=b,
                                  kv_read=b * (ctx + 1)), _time(engine, seqs, repeats)))
    for n, ctx, b, dctx in MIXED:
        for _ in range(repeats):
            m = n + int(rng.integers(0, max(2, n // 4)))
            seq, nxt = prefill_seq(m, ctx, 0)
            seqs, _ = decode_seqs(b, dctx, nxt)
            shape = StepShape(tokens=m + b, prefill_attention=m * (ctx + m / 2), seqs=1 + b,
                              kv_read=ctx + m + b * (dctx + 1), chunks=1)
            t = time.perf_counter()
            engine.runner.forward([seq, *seqs])
            samples.append((shape, time.perf_counter() - t))
    return samples


def fit(samples: list[tuple[StepShape, float]]) -> CostModel:
    """Least squares on relative error (short decode steps matter as much as long prefills),
    coefficients kept >= 0 by dropping any that come out negative and refitting."""
    x = np.array([s.features() for s, _ in samples])
    y = np.array([t for _, t in samples])
    w = 1.0 / y
    active = list(range(len(FEATURES)))
    while True:
        coef, *_ = np.linalg.lstsq(x[:, active] * w[:, None], y * w, rcond=None)
        if (coef >= 0).all():
            break
        active = [a for a, c in zip(active, coef, strict=True) if c >= 0]
    full = [0.0] * len(FEATURES)
    for a, c in zip(active, coef, strict=True):
        full[a] = float(c)
    return CostModel(*full)


def traffic_steps(engine: Engine, seconds: float = 90.0) -> list[tuple[StepShape, float]]:
    """Every step of real editor traffic through the real engine (wall clock): the shapes that
    matter most (a few new tokens over a long cached prefix, small decode batches), in the
    proportions they occur."""
    from dataclasses import replace

    from warmpath.config import ClientConfig
    from warmpath.sim.backends import RealBackend
    from warmpath.sim.driver import Driver
    from warmpath.workloads import make_trace

    trace = make_trace("editor", 4, seconds, seed=101, rate=20)  # not a seed the validation uses
    backend = RealBackend(engine, 0.0)
    driver = Driver(trace, [backend], engine.tokenizer.encode,
                    replace(ClientConfig(), deadline_ms=3000, max_time_ms=3000), realtime=True,
                    drain_s=10)
    backend.origin = driver.origin
    driver.run()
    engine.pool.reset_prefix_cache()
    return backend.steps


def disk_read_rate(size: int = 256 << 20) -> float:
    """Bytes per second this machine reads back a file it wrote under $WARMPATH_HOME (where the KV
    tier lives), with the file's pages dropped from the page cache first: what a tier read costs
    after a long idle gap."""
    root = home_dir("sim")
    with tempfile.NamedTemporaryFile(dir=root) as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        t = time.perf_counter()
        with open(f.name, "rb", buffering=0) as g:
            while g.read(4 << 20):
                pass
        return size / (time.perf_counter() - t)


def calibrate(model: str = "smollm2", dtype: str = "auto", repeats: int = 2,
              traffic_s: float = 90.0) -> tuple[CostModel, dict]:
    """Synthetic shapes (coverage: long prefills, big decode batches) plus the steps of a short real
    editor trace (the common case, as it really runs)."""
    blocks_needed = 4096  # covers the largest calibration step (16 x 2,049 tokens)
    engine = Engine(EngineConfig(model=model, dtype=dtype, num_kv_blocks=blocks_needed))
    synthetic = measure(engine, repeats)
    traffic = traffic_steps(engine, traffic_s) if traffic_s > 0 else []
    samples = synthetic + traffic
    cost = fit(samples)
    errors = [abs(cost.step_seconds(s) - t) / t for s, t in samples]
    traffic_errors = [(cost.step_seconds(s) - t) / t for s, t in traffic]
    meta = {
        "model": model, "dtype": str(engine.dtype).removeprefix("torch."),
        "threads": engine.config.num_threads, "weight_bytes": engine.weight_bytes,
        "kv_dtype": engine.kv_dtype_name,
        "samples": [[s.tokens, s.prefill_attention, s.seqs, s.kv_read, s.chunks, t]
                    for s, t in samples
                    ], "synthetic_samples": len(synthetic), "traffic_samples": len(traffic),
        "median_relative_error": statistics.median(errors), "max_relative_error": max(errors),
        "traffic_median_signed_error": statistics.median(traffic_errors)
        if traffic_errors else None, "disk_read_bytes_per_s": disk_read_rate()
    }
    log.info("calibrated %s: %s (median error %.1f%%, max %.1f%%)", model, cost,
             100 * meta["median_relative_error"], 100 * meta["max_relative_error"])
    return cost, meta
