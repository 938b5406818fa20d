"""Measuring the plan on the machine at hand: each candidate backend's step time on each shape
class, once per machine, model and code version (cached under $WARMPATH_HOME/plans/; a change of any
of them measures again).

A step is timed on a KV cache holding zeros: a step's time does not depend on the values it attends
over, so no context has to be prefilled to time a chunk over 6,144 cached tokens.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from warmpath.engine.plan import (
    BACKENDS,
    DETERMINISTIC,
    MARGIN,
    BackendPlan,
    Timings,
    choose,
    native_options,
    plan_steps,
    single,
    trailing,
)
from warmpath.engine.runner import ModelRunner, SeqInput
from warmpath.engine.threads import machine_idle_s, others_share
from warmpath.identity import model_identity
from warmpath.kernels.native import NativeForward, NativeKernelError, bf16_attention
from warmpath.models.checkpoint import Checkpoint
from warmpath.models.kv_cache import allocate_kv_cache
from warmpath.models.llama import LlamaForCausalLM
from warmpath.store import exclusive, home_dir, write_atomic

log = logging.getLogger(__name__)

BLOCK = 16
# blocks the timed sequences read (shared among them, more than the caches hold)
CONTEXT_BLOCKS = 576
TAIL_BLOCKS = 64  # a block of its own per sequence, where its new tokens are written
ROUNDS = 3  # tries of every step shape on every backend, a round apart
SLOW_MS = 1000.0  # a step slower than this is tried twice only
BUSY_SHARE = 0.25  # others' share of the CPU above which a measured plan is called into doubt
# The code whose speed a plan measures: a change to any of these files means measuring again.
CODE = [
    Path(__file__).parents[1] / p
    for p in ("engine/runner.py", "engine/plan_timing.py", "models/llama.py", "models/attention.py",
              "kernels/native.py")
]


def candidates(native_available: bool) -> list[str]:
    """What can run here: the native kernel where it builds (its bf16 attention where the CPU has
    AMX or AVX512-BF16); bf16 in torch where the CPU computes bf16."""
    out = ["native-int8", "native-fp32"] if native_available else []
    if native_available and bf16_attention():
        out.insert(1, "native-int8-bf16attn")
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        out.append("torch-bf16")
    return [*out, "torch-fp32"]


def machine_key(ckpt: Checkpoint, threads: int) -> str:
    """CPU model and flags, torch, threads, the model file, the code: what a plan's times depend
    on."""
    h = hashlib.sha256()
    h.update(_cpu_identity().encode())
    h.update(f"{torch.__version__} threads={threads} {platform.machine()}".encode())
    h.update(model_identity(Path(ckpt.source)).encode())
    h.update(code_identity().encode())
    return h.hexdigest()[:20]


def code_identity() -> str:
    """A digest of the code whose numbers a step's outputs (and its K/V) are: the runner, the model,
    the kernel."""
    h = hashlib.sha256()
    for path in sorted(CODE) + sorted(
        (Path(__file__).parents[1] / "kernels" / "cpu").glob("*.[ch]")):
        h.update(path.read_bytes())
    return h.hexdigest()[:20]


def _cpu_identity() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    keep = [ln for ln in lines if ln.startswith(("model name", "flags", "Features", "CPU part"))]
    return "\n".join(dict.fromkeys(keep))  # the first core's lines; the others repeat them


def plan_path(key: str) -> Path:
    return home_dir("plans") / f"{key}.json"


def prompt_speed_path(key: str) -> Path:
    return home_dir("plans") / f"{key}.prompt.json"


def prompt_speed(plan: BackendPlan, route: str, measure: Callable[[], float]) -> float:
    """Seconds per prompt token of `route` (the engine's backends and cache) on this machine:
    `measure()`d once and kept beside a measured plan (a fixed plan's, which has no key: measured at
    every start), so every start on the same machine, model and code reads the same figure and makes
    the same prompts (api/fim.suffix_budget)."""
    if not plan.key:
        return measure()
    path = prompt_speed_path(plan.key)
    # Engines starting together measure one after the other and all read the first one's figure;
    # one that measures another route keeps what the others saved.
    with exclusive(path.with_suffix(".lock")):
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            saved = {}
        if not isinstance(saved, dict):
            saved = {}
        if not isinstance(saved.get(route), float):
            saved[route] = measure()
            write_atomic(path, json.dumps(saved))
        return saved[route]


def load_or_measure(ckpt: Checkpoint, threads: int, native_available: bool,
                    allow_nondeterministic: bool, remeasure: bool = False, full: bool = False,
                    progress=sys.stderr) -> tuple[BackendPlan, str]:
    """The plan for this machine and model, and where it came from ("loaded PATH" / "measured, saved
    to PATH"). Only the backends the choice can use are timed: without nondeterminism allowed, the
    deterministic ones (where the kernel builds) on the cheap classes until one leads
    (plan.plan_steps, plan.trailing); with it (or `full`), every candidate on every class. Times
    already saved are kept: a plan that may mix backends later times only what it lacks."""
    key = machine_key(ckpt, threads)
    path = plan_path(key)
    full = full or allow_nondeterministic
    steps = plan_steps(ckpt.config, full)
    timings = {} if remeasure else _saved_timings(path)
    if remeasure:
        prompt_speed_path(key).unlink(missing_ok=True)
    wanted = [b for b in candidates(native_available)
              if allow_nondeterministic or b in DETERMINISTIC or not native_available]

    def measured(b: str) -> bool:  # a screened candidate was timed until it trailed or another led
        return b in timings and (not full or all(k in timings[b].get(kind, {})
                                                 for kind, k, *_ in steps))

    missing = [b for b in wanted if not measured(b)]
    if missing:
        got = measure(ckpt, missing, steps, eliminate=not full, progress=progress)
        timings = {**timings, **{b: {kind: {**timings.get(b, {}).get(kind, {}), **t.get(kind, {})}
                                     for kind in ("decode", "chunk")} for b, t in got.items()}}
        # the timings are what is kept; the choice is made at load
        choose(timings, False, key).save(path)
    how = f"measured {', '.join(missing)}, saved to {path}" if missing else f"loaded {path}"
    return choose({b: t
                   for b, t in timings.items() if b in wanted}, allow_nondeterministic, key), how


def _saved_timings(path: Path) -> Timings:
    """The timings a plan file keeps; none (measured again) where it is absent, torn or not a
    plan."""
    try:
        return BackendPlan.load(path).timings
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError) as e:
        log.warning("plan %s unreadable (%s): measuring again", path, e)
        return {}


def measure(ckpt: Checkpoint, backends: list[str], steps: list[tuple[str, str, int, int, int]],
            eliminate: bool = False, progress=sys.stderr) -> Timings:
    """ms per step for each backend on each of `steps` (plan.plan_steps)."""
    runners: dict[str, ModelRunner] = {}
    for backend in backends:
        try:
            runners[backend] = _runner(ckpt, backend)
        except NativeKernelError as e:
            log.warning("plan: %s cannot run here: %s", backend, e)
    got = time_steps(runners, steps, progress, eliminate=eliminate)
    winner = choose(got).native if any(b in DETERMINISTIC for b in got) else None
    if winner is not None:
        # the engine's kernel of the chosen backend reads it back (the others: not kept)
        runners[winner].native.keep_packing()
    return got


def time_steps(runners: dict[str, ModelRunner], steps: list[tuple[str, str, int, int, int]],
               progress=sys.stderr, clock: Callable[[], float] = time.perf_counter,
               cpu_clock: Callable[[],
                                   float] = time.process_time, eliminate: bool = False) -> Timings:
    """Each shape on every backend in turn, ROUNDS times over, the fastest try kept: another
    process's burst of load then lands on all candidates of a shape alike (not on one backend's
    whole column), and a shape's tries are a round apart, so a burst shorter than a round costs it
    one try. `eliminate` (a one-backend plan): a candidate that trails the leader (plan.trailing) is
    timed no further, and timing ends when one is left. A machine busy throughout is said in a
    warning: its plan is worth measuring again on a quiet one (`warmpath plan --remeasure`)."""
    t0, c0, idle0 = clock(), cpu_clock(), machine_idle_s()
    got: Timings = {b: {"decode": {}, "chunk": {}} for b in runners}
    for runner in runners.values():
        _once(runner, _seqs(1, 8, 0), clock)  # warm-up: first calls allocate and build
    active = list(runners)
    for round_ in range(ROUNDS):
        for kind, key, rows, new, cached in steps:
            if eliminate and len(active) < 2:
                break
            seqs = _seqs(rows, new, cached)
            for backend in active:
                best = got[backend][kind].get(key)
                if best is not None and best > SLOW_MS and round_ >= 2:
                    continue  # a slow step's third try would cost more than it tells
                ms = _once(runners[backend], seqs, clock)
                got[backend][kind][key] = ms if best is None else min(best, ms)
            if eliminate and (dropped := trailing(got, active)):
                active = [b for b in active if b not in dropped]
                if progress is not None:
                    print(
                        f"plan: {', '.join(dropped)} trailing {' and '.join(active)} by more than "
                        f"{MARGIN - 1:.0%} on the classes so far: timed no further", file=progress,
                        flush=True)
        if progress is not None:
            print(
                f"plan: round {round_ + 1} of {ROUNDS}: {', '.join(active)} timed on {len(steps)} "
                "step shapes "
                f"({clock() - t0:.0f} s so far)", file=progress, flush=True)
        if eliminate and len(active) < 2:
            break  # one candidate left: nothing to compare it with
    others = others_share(clock() - t0,
                          cpu_clock() - c0, idle0, machine_idle_s(),
                          os.cpu_count() or 1)
    if others > BUSY_SHARE:
        log.warning(
            "plan: other processes used %.0f%% of the CPU while the plan was measured, so it may "
            "be off; "
            "measure again on a quiet machine with `warmpath plan --remeasure`", 100 * others)
    return got


def _runner(ckpt: Checkpoint, backend: str) -> ModelRunner:
    cfg = ckpt.config
    blocks = CONTEXT_BLOCKS + TAIL_BLOCKS
    if backend.startswith("torch"):
        dtype = torch.bfloat16 if backend == "torch-bf16" else torch.float32
        model = LlamaForCausalLM.from_weights(cfg, ckpt.weights, dtype, "cpu")
        return ModelRunner(model, allocate_kv_cache(cfg, blocks, BLOCK, torch.bfloat16, "cpu"),
                           BLOCK, plan=single(backend))
    # the plan's one cache is 16-bit
    kv = allocate_kv_cache(cfg, blocks, BLOCK, torch.bfloat16, "cpu")
    native = NativeForward(cfg, ckpt.weights, ckpt.quantized, kv, BLOCK, **native_options(backend),
                           source=ckpt.source, keep_packing=False)
    return ModelRunner(None, kv, BLOCK, native, plan=single(backend))


def _seqs(rows: int, new: int, cached: int) -> list[SeqInput]:
    """`rows` sequences of `new` tokens over `cached` ones: context blocks spread over the shared
    ones, the new tokens' blocks each sequence's own."""
    ctx_blocks, new_blocks = -(-cached // BLOCK), -(-(cached % BLOCK + new) // BLOCK)
    seqs = []
    for i in range(rows):
        table = [(i * ctx_blocks + j) % CONTEXT_BLOCKS for j in range(cached // BLOCK)]
        table += [CONTEXT_BLOCKS + (i * new_blocks + j) % TAIL_BLOCKS for j in range(new_blocks)]
        seqs.append(SeqInput([1 + (i + j) % 100 for j in range(new)], cached, table))
    return seqs


def _once(runner: ModelRunner, seqs: list[SeqInput], clock: Callable[[], float]) -> float:
    t = clock()
    runner.forward(seqs)
    return (clock() - t) * 1000


__all__ = [
    "BACKENDS", "candidates", "load_or_measure", "machine_key", "measure", "plan_path",
    "prompt_speed", "time_steps"
]
