"""The dtype names a config may give (config.py Dtype, KVCacheDtype: checked there), for the model
and for its KV cache."""

from __future__ import annotations

import torch


def resolve_dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        if device.startswith("cuda"):
            return torch.bfloat16
        # bf16 where the CPU computes it natively (AVX-512 BF16 / AMX); fp32 elsewhere.
        return torch.bfloat16 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else torch.float32
    dtypes = {
        "float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16
    }
    return dtypes[name]


def resolve_kv_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The KV cache's own dtype; "auto": the model's (never int8: that is chosen only by name)."""
    if name == "auto":
        return model_dtype
    return {
        "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
        "int8": torch.int8
    }[name]
