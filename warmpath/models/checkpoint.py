"""What a loader returns: the model's shape, its weights in HF naming, its tokenizer (and quantized
blocks)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from warmpath.config import ModelConfig
from warmpath.models.tokenizer import Tokenizer

if TYPE_CHECKING:
    import torch

    from warmpath.models.quant import QuantizedMatrix


@dataclass
class Checkpoint:
    config: ModelConfig
    # a dict, or a GGUF file's tensors read on access (models/gguf.py)
    weights: Mapping[str, torch.Tensor]
    tokenizer: Tokenizer
    source: str
    # Quantized blocks of 2-D weights for the native kernel, HF-named: a GGUF file's own Q4_1 / Q8_0
    # blocks, or its other types converted to them (models/kernel_blocks.py); empty for unquantized
    # checkpoints.
    # read on access for a GGUF file
    quantized: Mapping[str, QuantizedMatrix] = field(default_factory=dict)
    # a GGUF file's quant mix: tensors per type
    tensor_types: dict[str, int] = field(default_factory=dict)
