"""Shared by the benchmark scripts: real-code prompt windows, the machine's description, table
printing."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import torch

from warmpath.cpu import cpu_label


def code_windows(tokenizer, n_tokens: int, count: int, extra: int = 0) -> list[list[int]]:
    """`count` distinct windows of n_tokens (+ extra) ids from real standard-library sources."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "".join(p.read_text(encoding="utf-8") for p in sorted(stdlib.glob("[a-m]*.py")))
    ids = tokenizer.encode(text)
    size = n_tokens + extra
    step = max(size, (len(ids) - size) // max(count, 1))
    return [ids[i * step : i * step + size] for i in range(count)]


def machine() -> str:
    return f"{cpu_label()}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def write_json(path: str, payload: dict) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2))
    print(f"\nwrote {out}")
