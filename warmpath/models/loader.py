"""A model spec -> its loaded checkpoint (weights in torch), by the loader of its format."""

from __future__ import annotations

import torch

from warmpath.models.checkpoint import Checkpoint
from warmpath.models.gguf import load_gguf
from warmpath.models.hf import load_hf_dir
from warmpath.models.registry import resolve_model


def load_checkpoint(spec: str, dtype: torch.dtype) -> Checkpoint:
    path = resolve_model(spec)
    if path.is_dir():
        return load_hf_dir(path, dtype)
    return load_gguf(path, dtype)
