"""Which backends an engine has, decided here alone. Every configuration is a BackendPlan
(engine/plan.py): named (`--plan native-int8`, a plan file), fixed by a dtype / kernel / activations
the config names (or by a GPU), else measured on this machine at the first start of a model. The
engine's backends are built from the plan alone, and runner.route() sends each step's sequences
where the plan says."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from warmpath.config import EngineConfig
from warmpath.engine.dtypes import resolve_dtype, resolve_kv_dtype
from warmpath.engine.plan import TORCH_DTYPES, BackendPlan, choose, fixed, native_options, single
from warmpath.engine.plan_timing import load_or_measure
from warmpath.kernels.native import NativeForward, NativeKernelError, available
from warmpath.models.llama import LlamaForCausalLM

log = logging.getLogger(__name__)

TORCH_BACKEND = {
    torch.float32: "torch-fp32", torch.bfloat16: "torch-bf16", torch.float16: "torch-fp16"
}


@dataclass
class Backends:
    plan: BackendPlan
    native: NativeForward | None
    model: LlamaForCausalLM | None
    dtype: torch.dtype  # the torch model's (float32 without one)
    kv_dtype: torch.dtype


def fixed_plan(config: EngineConfig) -> BackendPlan | None:
    """The plan of a configuration that names its dtype, kernel or activations (or runs on a GPU);
    None when a plan is named or measured."""
    named = (config.dtype, config.kernel, config.kernel_activations) != ("auto", "auto", "auto")
    if config.plan != "auto" or (not named and config.device == "cpu"):
        return None
    dtype = resolve_dtype(config.dtype, config.device)
    # auto: the kernel beside a float32 model only (the kernel itself runs beside any model dtype)
    on_cpu = config.device == "cpu"
    native = config.kernel == "native" or (config.kernel == "auto" and on_cpu and
                                           dtype == torch.float32)
    if native and not on_cpu:
        raise ValueError(f"kernel=native needs the CPU; got {config.device}")
    activations = config.kernel_activations
    if activations == "auto":
        activations = "int8" if config.dtype == "auto" else "fp32"
    return fixed(f"native-{activations}" if native else None, TORCH_BACKEND[dtype])


def load_dtype(config: EngineConfig) -> torch.dtype:
    """The dtype the checkpoint is read in: a named dtype's own; float32 where a plan is named or
    measured (each backend then takes what it needs)."""
    return resolve_dtype(config.dtype, config.device) if fixed_plan(config) else torch.float32


def plan_for(config: EngineConfig, ckpt, threads: int) -> BackendPlan:
    """The configuration's plan: fixed, named, from a plan file, or (auto) measured on this machine
    for this model."""
    plan, how = fixed_plan(config), "from the named dtype / kernel"
    if plan is None and config.plan != "auto":
        path = Path(config.plan).expanduser()
        plan = BackendPlan.load(path) if path.is_file() else single(config.plan)
        how = f"from {path}" if path.is_file() else "named"
        if path.is_file() and plan.timings:
            plan = choose(plan.timings, config.allow_nondeterministic, plan.key)
    elif plan is None:
        plan, how = load_or_measure(ckpt, threads, available(), config.allow_nondeterministic)
        if not plan.deterministic and not config.allow_nondeterministic:
            log.warning(
                "no deterministic backend here (no native kernel): greedy outputs may depend on "
                "batching"
            )
    log.info("plan: %s (%s), %s", " + ".join(plan.backends),
             "deterministic" if plan.deterministic else "nondeterministic", how)
    return plan


def build(config: EngineConfig, ckpt, threads: int) -> Backends:
    """The plan's backends over this checkpoint: the native kernel (its own copies of what it reads)
    and the torch model. A fixed plan whose kernel cannot run here computes with torch (kernel auto)
    or fails (kernel native); one whose kernel multiplies in fp32 after all (int8 asked of a
    checkpoint with no quantized blocks) takes the fp32 rule."""
    plan, named = plan_for(config, ckpt, threads), fixed_plan(config) is not None
    kv_dtype = resolve_kv_dtype(config.kv_cache_dtype, getattr(torch, plan.cache))
    torch_backend = TORCH_BACKEND[resolve_dtype(config.dtype, config.device)]
    native = None
    if plan.native is not None:
        options = native_options(plan.native)
        if named:
            # a configuration named by dtype leaves the attention to the kernel (bf16 where it pays)
            options["attention"] = "auto"
        elif (
            kv_dtype == torch.int8 and options["attention"] == "bf16" and config.plan != plan.native
        ):
            log.info(
                "int8 KV cache: the plan's native attention computes in fp32 (bf16's reads a bf16 "
                "cache)"
            )
            options["attention"] = "fp32"
        try:
            native = NativeForward(ckpt.config, ckpt.weights, ckpt.quantized, None,
                                   config.block_size, **options, source=ckpt.source)
        except NativeKernelError as e:
            if not named or config.kernel == "native":
                raise
            log.warning("native kernel unavailable, computing with torch: %s", e)
            plan = fixed(None, torch_backend)
        if native is not None:
            if native.activations != options["activations"]:
                # int8 asked of a file with no quantized blocks
                plan = fixed(f"native-{native.activations}", torch_backend)
            log.info("native kernel over %.0f MB of weights, %s activations",
                     native.weight_bytes / 1e6, native.activations)
    dtype = getattr(torch, TORCH_DTYPES[plan.torch]) if plan.torch else torch.float32
    model = None if plan.torch is None else LlamaForCausalLM.from_weights(
        ckpt.config, ckpt.weights, dtype, config.device)
    return Backends(plan, native, model, dtype, kv_dtype)
