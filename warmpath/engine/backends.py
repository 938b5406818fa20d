"""Which backends a configuration gets: a plan (named, from a file, or measured on this machine at the first start of
a model) when the config leaves the choice to it, else the named dtype with the native kernel where it applies.
runner.route() then sends each step's sequences to them."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from warmpath.config import EngineConfig
from warmpath.engine.plan import Plan, choose, single
from warmpath.engine.plan_timing import load_or_measure
from warmpath.kernels.native import ACTIVATIONS, KV_TYPES, NativeForward, NativeKernelError, available

log = logging.getLogger(__name__)


def wants_plan(config: EngineConfig) -> bool:
    """A plan chooses the backends unless the config names them (a dtype, a kernel or its activations)."""
    if config.plan != "auto":
        return True
    named = (config.dtype, config.kernel, config.kernel_activations) != ("auto", "auto", "auto")
    return not named and config.device == "cpu"


def make_plan(config: EngineConfig, ckpt, threads: int) -> Plan:
    """The named plan, the plan file, or (auto) the plan measured on this machine for this model."""
    if config.plan != "auto":
        path = Path(config.plan).expanduser()
        plan = Plan.load(path) if path.is_file() else single(config.plan)
        how = f"from {path}" if path.is_file() else "named"
        if path.is_file() and plan.timings:
            plan = choose(plan.timings, config.allow_nondeterministic, plan.key)
    else:
        plan, how = load_or_measure(ckpt, threads, available(), config.allow_nondeterministic)
    if not plan.deterministic and not config.allow_nondeterministic and config.plan == "auto":
        log.warning("no deterministic backend here (no native kernel): greedy outputs may depend on batching")
    log.info("plan: %s (%s), %s", " + ".join(plan.backends),
             "deterministic" if plan.deterministic else "nondeterministic", how)
    return plan


def native_forward(config: EngineConfig, ckpt, dtype: torch.dtype, kv_dtype: torch.dtype) -> NativeForward | None:
    """The native kernel when the config and the model allow it (runner.route() sends it its sequences)."""
    if config.kernel not in ("auto", "native", "torch"):
        raise ValueError(f"kernel must be auto, native or torch; got {config.kernel!r}")
    if config.kernel_activations not in ("auto", *ACTIVATIONS):
        raise ValueError(f"kernel_activations must be auto, fp32 or int8; got {config.kernel_activations!r}")
    if config.kernel == "torch":
        return None
    # auto: the kernel beside a float32 model only (the kernel itself runs beside any model dtype)
    if config.kernel == "auto" and not (config.device == "cpu" and dtype == torch.float32):
        return None
    if config.device != "cpu" or kv_dtype not in KV_TYPES:
        raise ValueError(f"kernel=native needs the CPU and a float32, bfloat16, float16 or int8 KV cache; got "
                         f"{kv_dtype} on {config.device}")
    activations = config.kernel_activations
    if activations == "auto":
        activations = "int8" if config.dtype == "auto" else "fp32"
    try:
        native = NativeForward(ckpt.config, ckpt.weights, ckpt.quantized, None, config.block_size,
                               activations=activations, source=ckpt.source)
    except NativeKernelError as e:
        if config.kernel == "native":
            raise
        log.warning("native kernel unavailable, computing with torch: %s", e)
        return None
    log.info("native kernel over %.0f MB of weights, %s activations", native.weight_bytes / 1e6,
             activations)
    return native

