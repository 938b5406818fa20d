"""Block-quantized weight matrices, as the native CPU kernel reads them (warmpath/kernels/).

GGUF's own blocks, one row after another: Q4_1 (20 bytes per 32 values: fp16 d, fp16 m, 16 bytes of
nibbles; w = d * q + m), Q8_0 (34 bytes: fp16 d, 32 int8 q; w = d * q), and the file kinds the
kernel multiplies as they are (int8 activations): Q4_0, Q5_0, Q4_K, Q5_K, Q6_K. A GGUF checkpoint's
blocks of these kinds are kept byte for byte, so decoding from them reads exactly the weights the
fp32 path dequantized; its other types are converted at load (models/kernel_blocks.py: requantized
to Q8_0); a matrix without blocks is read as fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from warmpath.models.footprint import BLOCK, BLOCK_BYTES, row_bytes
from warmpath.models.ggml_blocks import decode

# The kinds the kernel reads as the GGUF file has them, beyond Q4_1 and Q8_0 (int8 activations
# only).
FILE_KINDS = {k: GGMLQuantizationType[k.upper()] for k in ("q4_0", "q5_0", "q4_k", "q5_k", "q6_k")}

CHUNK_VALUES = 1 << 20  # values per chunk of rows (row_chunks): ~4 MB as fp32

__all__ = [
    "BLOCK", "BLOCK_BYTES", "FILE_KINDS", "QuantizedMatrix", "concat_rows", "from_gguf_blocks"
]


@dataclass
class QuantizedMatrix:
    kind: str  # "q4_1" | "q8_0" | a FILE_KINDS kind | "f32"
    rows: int
    cols: int
    data: torch.Tensor  # blocks: uint8 [rows, a row's GGUF bytes]; f32: float32 [rows, cols]

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def dequantize(self) -> torch.Tensor:
        """fp32 [rows, cols], computed as the GGUF loader does (d * q + m, rounded twice)."""
        if self.kind == "f32":
            return self.data.clone()
        if self.kind in FILE_KINDS:  # gguf's own decoding (models/ggml_blocks.py)
            qtype = FILE_KINDS[self.kind]
            return decode(self.data.reshape(-1, GGML_QUANT_SIZES[qtype][1]),
                          qtype).values().reshape(self.rows, self.cols)
        blocks = self.data.view(self.rows, self.cols // BLOCK, BLOCK_BYTES[self.kind])
        d = blocks[..., 0:2].contiguous().view(torch.float16).float()  # [rows, blocks, 1]
        if self.kind == "q8_0":
            return (d * blocks[..., 2:].contiguous().view(torch.int8).float()).reshape(
                self.rows, self.cols)
        m = blocks[..., 2:4].contiguous().view(torch.float16).float()
        qs = blocks[..., 4:]
        # low nibbles are values 0..15, high 16..31
        q = torch.cat([qs & 0x0F, qs >> 4], dim=-1).float()
        return (d * q + m).reshape(self.rows, self.cols)

    def row_chunks(self, multiple: int = 8) -> list[QuantizedMatrix]:
        """The matrix as consecutive runs of rows (each a multiple of `multiple` but the last) of
        ~CHUNK_VALUES values each: converting or packing a chunk at a time keeps torch's temporaries
        in cache, where a whole matrix's (hundreds of MB) would be fresh pages the OS must fault in,
        op after op (3-4x slower)."""
        step = max(multiple, CHUNK_VALUES // self.cols // multiple * multiple)
        data = self.data.view(self.rows, -1)
        return [QuantizedMatrix(self.kind, min(step, self.rows - r), self.cols, data[r:r + step])
                for r in range(0, self.rows, step)]

    def map_rows(self, fn) -> QuantizedMatrix:
        """The same matrix with its rows rearranged by fn (whole rows of blocks move together)."""
        return QuantizedMatrix(self.kind, self.rows, self.cols, fn(self.data).contiguous())


def from_gguf_blocks(raw: torch.Tensor, kind: str, rows: int, cols: int) -> QuantizedMatrix:
    """raw: the tensor's GGUF bytes (uint8), rows x cols/32 blocks."""
    return QuantizedMatrix(kind, rows, cols, raw.reshape(rows, row_bytes(kind, cols)).contiguous())


def concat_rows(parts: list[QuantizedMatrix]) -> QuantizedMatrix | None:
    """Stack matrices of one kind and width (fused q/k/v, gate/up); None when they differ."""
    if len({(p.kind, p.cols) for p in parts}) != 1:
        return None
    first = parts[0]
    return QuantizedMatrix(first.kind, sum(p.rows for p in parts), first.cols,
                           torch.cat([p.data for p in parts]).contiguous())
