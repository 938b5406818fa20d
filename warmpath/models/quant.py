"""Block-quantized weight matrices, as the native CPU decode kernel reads them (warmpath/kernels/).

Two formats, both from GGUF (blocks of 32 values along a row): Q4_1 (w = d * q + m, q in 0..15) and Q8_0
(w = d * q, q in -127..127). A GGUF checkpoint's own blocks are kept as they are, so decoding from them reads
exactly the weights the fp32 path dequantized; a matrix without them is read as fp32. Scales are stored as
fp32 (GGUF has fp16): the kernel converts nothing per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32


@dataclass
class QuantizedMatrix:
    kind: str  # "q4_1" | "q8_0" | "f32"
    rows: int
    cols: int
    qs: torch.Tensor  # q4_1: uint8 [rows, cols/2]; q8_0: int8 [rows, cols]; f32: float32 [rows, cols]
    d: torch.Tensor | None = None  # [rows, cols/32] fp32 block scales
    m: torch.Tensor | None = None  # q4_1: [rows, cols/32] fp32 block minimums

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qs, self.d, self.m) if t is not None)

    def dequantize(self) -> torch.Tensor:
        """fp32 [rows, cols], computed as the GGUF loader does (d * q + m, rounded twice)."""
        if self.kind == "f32":
            return self.qs.clone()
        d = self.d.repeat_interleave(BLOCK, dim=1)
        if self.kind == "q8_0":
            return d * self.qs.float()
        blocks = self.qs.view(self.rows, -1, BLOCK // 2)
        q = torch.cat([blocks & 0x0F, blocks >> 4], dim=2).reshape(self.rows, self.cols).float()
        return d * q + self.m.repeat_interleave(BLOCK, dim=1)

    def map_rows(self, fn) -> QuantizedMatrix:
        """The same matrix with its rows rearranged by fn (applied to every per-row tensor alike)."""
        return QuantizedMatrix(self.kind, self.rows, self.cols, fn(self.qs).contiguous(),
                               None if self.d is None else fn(self.d).contiguous(),
                               None if self.m is None else fn(self.m).contiguous())


def from_gguf_blocks(raw: torch.Tensor, kind: str, rows: int, cols: int) -> QuantizedMatrix:
    """raw: the tensor's GGUF bytes (uint8), rows x cols/32 blocks of 20 (q4_1) or 34 (q8_0) bytes."""
    size = {"q4_1": 20, "q8_0": 34}[kind]
    blocks = raw.reshape(rows, cols // BLOCK, size)
    d = blocks[..., 0:2].contiguous().view(torch.float16).float().reshape(rows, cols // BLOCK)
    if kind == "q8_0":
        return QuantizedMatrix(kind, rows, cols, blocks[..., 2:].contiguous().view(torch.int8).reshape(rows, cols), d)
    m = blocks[..., 2:4].contiguous().view(torch.float16).float().reshape(rows, cols // BLOCK)
    return QuantizedMatrix(kind, rows, cols, blocks[..., 4:].contiguous().reshape(rows, cols // 2), d, m)


def concat_rows(parts: list[QuantizedMatrix]) -> QuantizedMatrix | None:
    """Stack matrices of one kind and width (fused q/k/v, gate/up); None when they differ."""
    if len({(p.kind, p.cols) for p in parts}) != 1:
        return None

    def cat(ts):
        return None if ts[0] is None else torch.cat(ts).contiguous()

    first = parts[0]
    return QuantizedMatrix(first.kind, sum(p.rows for p in parts), first.cols, cat([p.qs for p in parts]),
                           cat([p.d for p in parts]), cat([p.m for p in parts]))
