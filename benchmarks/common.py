"""Shared by the benchmark scripts: real-code prompt windows, the machine's description, table printing."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import torch


def code_windows(tokenizer, n_tokens: int, count: int, extra: int = 0) -> list[list[int]]:
    """`count` distinct windows of n_tokens (+ extra) ids from real standard-library sources."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "".join(p.read_text(encoding="utf-8") for p in sorted(stdlib.glob("[a-m]*.py")))
    ids = tokenizer.encode(text)
    size = n_tokens + extra
    step = max(size, (len(ids) - size) // max(count, 1))
    return [ids[i * step : i * step + size] for i in range(count)]


def machine() -> str:
    cpu = Path("/proc/cpuinfo").read_text().split("model name")[1].split("\n")[0].strip(": \t")
    return f"{cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def baseline_dtype() -> str:
    """What a baseline computes in at its best on this CPU: bf16 where it has bf16 hardware (AMX or AVX512-BF16:
    vLLM-CPU's documented default there, and transformers' fast path), fp32 elsewhere (without it oneDNN falls
    back to slow bf16 emulation: a 512-token vLLM prefill took 6.4-9.3 s vs 1.1 s in fp32 on an AVX2 machine)."""
    flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0].split()
    return "bfloat16" if {"avx512_bf16", "amx_bf16"} & set(flags) else "float32"


def write_json(path: str, payload: dict) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2))
    print(f"\nwrote {out}")
