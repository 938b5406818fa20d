"""The kernel's weight layout (cpu/matmul.h, "Packed weights"): a QuantizedMatrix's blocks
rearranged so one load gives 8 output rows' quants at once. The same values as the checkpoint's
blocks, about the same bytes (the file kinds: their bytes; Q4_K / Q5_K: 2.8% / 2.3% more, their
6-bit scales a byte each)."""

from __future__ import annotations

import torch

from warmpath.kernels.build import NativeKernelError
from warmpath.models.footprint import GROUP  # output rows per packed group: one AVX2 vector
from warmpath.models.ggml_blocks import _nibbles, _scale_min_k4
from warmpath.models.quant import BLOCK, BLOCK_BYTES, FILE_KINDS, QuantizedMatrix

# cpu/common.h WP_*
KINDS = {"f32": 0, "q4_1": 1, "q8_0": 2, "q4_k": 3, "q5_0": 4, "q6_k": 5, "q4_0": 6, "q5_k": 7}


def pack(q: QuantizedMatrix, int8_activations: bool = False) -> torch.Tensor:
    """Rows in groups of 8, zero rows padding the last; each group a run of its 32-column blocks
    (256-column super-blocks for Q4_K / Q6_K) with the group's 8 rows interleaved, so that one load
    gives 8 rows' values at one column (fp32 products) or at four (int8). int8_activations: the
    quants in the order the int8 products read them (cpu/matmul.h, "Int8 activations"); the file
    kinds have that order only."""
    if q.cols % BLOCK:
        raise NativeKernelError(
            f"the native kernel needs rows of a multiple of {BLOCK} values, got {q.cols}")
    # each group of rows is packed on its own: chunks of whole groups concatenate
    chunks = q.row_chunks(GROUP)
    if len(chunks) > 1:
        return torch.cat([_pack(c, int8_activations) for c in chunks])
    return _pack(q, int8_activations)


def _pack(q: QuantizedMatrix, int8_activations: bool) -> torch.Tensor:
    groups, nb = -(-q.rows // GROUP), q.cols // BLOCK
    pad = groups * GROUP - q.rows
    if q.kind == "f32":
        w = torch.nn.functional.pad(q.data.float(), (0, 0, 0, pad))
        return w.view(groups, GROUP, nb,
                      BLOCK).permute(0, 2, 3, 1).contiguous().view(torch.uint8).reshape(-1)
    if q.kind in FILE_KINDS:
        return _pack_file_kind(q, groups, pad)
    blocks = q.data.view(q.rows, nb, BLOCK_BYTES[q.kind])
    if pad:
        blocks = torch.nn.functional.pad(blocks, (0, 0, 0, 0, 0, pad))
    blocks = blocks.view(groups, GROUP, nb, -1).permute(0, 2, 1, 3)  # [group, block, row, bytes]
    # Each field copied once, straight into its place (no concatenation of copies).
    out = torch.empty(groups, nb, GROUP * BLOCK_BYTES[q.kind], dtype=torch.uint8)
    out[..., :2 * GROUP].view(groups, nb, GROUP, 2).copy_(blocks[..., 0:2])  # fp16 d of rows 0..7
    if q.kind == "q8_0":
        qs = out[..., 2 * GROUP:]
        if int8_activations:  # vector v: row j's columns 4v..4v+3
            qs.view(groups, nb, 8, GROUP, 4).copy_(blocks[..., 2:].reshape(groups, nb, GROUP, 8,
                                                                           4).transpose(2, 3))
        else:  # [column][row]
            qs.view(groups, nb, BLOCK, GROUP).copy_(blocks[..., 2:].transpose(-1, -2))
        return out.reshape(-1)
    out[..., 2 * GROUP:4 * GROUP].view(groups, nb, GROUP, 2).copy_(blocks[..., 2:4])  # fp16 m
    nibbles = blocks[..., 4:]  # GGUF: byte i holds column i (low) and column i + 16 (high)
    cols = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1)  # [group, block, row, column]
    qs = out[..., 4 * GROUP:]
    if int8_activations:
        qs.view(groups, nb, 4, GROUP, 4).copy_(_nibble_vectors(cols))
    else:
        qs.view(groups, nb, BLOCK // 2, GROUP).copy_(
            (cols[..., 0::2] | (cols[..., 1::2] << 4)).transpose(-1, -2))
    return out.reshape(-1)


def _nibble_vectors(q: torch.Tensor) -> torch.Tensor:
    """uint8 [group, block, row, 32 columns] (low 4 bits) -> [group, block, v, row, i]: vector v's
    byte 4j + i = q[j][8v + i] | q[j][8v + 4 + i] << 4 (the int8 products' nibble order)."""
    g, nb = q.shape[:2]
    # Four columns move together: as one int32 word, the copies below move 4-byte elements, not
    # bytes (~5x faster).
    # [group, block, row, v, half]: columns 8v + 4 half + i
    w = q.view(torch.int32).view(g, nb, GROUP, 4, 2)
    # nibbles stay within their bytes
    v = (w[..., 0] & 0x0F0F0F0F) | ((w[..., 1] & 0x0F0F0F0F) << 4)
    return v.transpose(2, 3).contiguous().view(torch.uint8).view(g, nb, 4, GROUP, 4)


def _unpacked_vectors(q: torch.Tensor) -> torch.Tensor:
    """uint8 [group, block, row, 32] -> [group, block, e, row, i]: unpacked vector e's byte 4j + i =
    q[j][4e + i]."""
    g, nb = q.shape[:2]
    return q.view(g, nb, GROUP, 8, 4).permute(0, 1, 3, 2, 4)


def _grouped(raw: torch.Tensor, groups: int, pad: int) -> torch.Tensor:
    """[rows, n, bytes] -> [group, n, row, bytes], zero rows padding the last group."""
    if pad:
        raw = torch.nn.functional.pad(raw, (0, 0, 0, 0, 0, pad))
    return raw.view(groups, GROUP, *raw.shape[1:]).transpose(1, 2)


def _fifth_bits(quants: torch.Tensor) -> torch.Tensor:
    """uint8 [group, block, row, 32] (5-bit) -> [group, block, 32]: byte 4j + i, bit e = bit 4 of
    q[j][4e + i]."""
    g, nb = quants.shape[:2]
    fifth = (_unpacked_vectors(quants) >> 4).reshape(g, nb, 8, 32)  # [group, block, e, 4j + i]
    return (fifth << torch.arange(8, dtype=torch.uint8).view(8, 1)).sum(-2, dtype=torch.uint8)


def _q5_0_fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """Q5_0's qh, uint8 [rows, blocks, 4] (a little-endian uint32, bit k: value k's fifth bit) ->
    [rows, blocks, 4]: byte i, bit e = bit 4e + i, which is _fifth_bits' byte 4j + i for row j,
    straight from the file's bits."""
    x = qh.contiguous().view(torch.int32).squeeze(-1)
    m = torch.stack([(x >> i) & 0x11111111 for i in range(4)], dim=-1)  # bits 4e + i, at 4e
    m = (m | (m >> 3)) & 0x03030303  # bits e = 2a, 2a + 1 at 8a, 8a + 1
    m = (m | (m >> 6)) & 0x000F000F  # bits e = 4c .. 4c + 3 at 16c ..
    return ((m | (m >> 12)) & 0xFF).to(torch.uint8)


def _pack_file_kind(q: QuantizedMatrix, groups: int, pad: int) -> torch.Tensor:
    """Q4_0, Q5_0, Q4_K, Q5_K, Q6_K in cpu/matmul.h's layouts (kquants.h multiplies them)."""
    nb, ns = q.cols // BLOCK, q.cols // 256
    if q.kind in ("q4_0", "q5_0"):
        size, qs_at = (18, 2) if q.kind == "q4_0" else (22, 6)
        raw = q.data.view(q.rows, nb, size)
        # Q5_0: its quants' low 4 bits
        low = _nibbles(raw.reshape(-1, size)[:, qs_at:]).view(q.rows, nb, 32)
        blk, low = _grouped(raw, groups, pad), _grouped(low, groups, pad)
        out = torch.empty(groups, nb, 8 * size, dtype=torch.uint8)
        out[..., :16].view(groups, nb, GROUP, 2).copy_(blk[..., 0:2])
        out[..., 16:144].view(groups, nb, 4, GROUP, 4).copy_(_nibble_vectors(low))
        if q.kind == "q5_0":
            out[..., 144:].view(groups, nb, GROUP,
                                4).copy_(_grouped(_q5_0_fifth_bits(raw[..., 2:6]), groups, pad))
        return out.reshape(-1)
    if q.kind in ("q4_k", "q5_k"):
        size, qs_at, per = (144, 16, 128) if q.kind == "q4_k" else (176, 48, 160)
        raw = q.data.view(q.rows * ns, size)
        sc, mn = _scale_min_k4(raw[:, 4:16])
        qs = raw[:, qs_at:qs_at + 128].reshape(-1, 4, 1, 32)
        quants = torch.cat([qs & 0x0F, qs >> 4], dim=2).reshape(-1, 8, 32)  # sub-block j: 32 values
        if q.kind == "q5_k":  # bit j of qh[l]: value 32 j + l's fifth bit
            quants = quants | ((
                (raw[:, 16:48].unsqueeze(1) >> torch.arange(8, dtype=torch.uint8).view(8, 1)) & 1)
                               << 4)
        fields = _grouped(raw.view(q.rows, ns, size), groups, pad)  # [group, super, row, bytes]
        quants = _grouped(quants.reshape(q.rows, ns * 8, 32), groups, pad)
        out = torch.empty(groups, ns, 32 + 128 + 8 * per, dtype=torch.uint8)
        out[..., 0:16].view(groups, ns, GROUP, 2).copy_(fields[..., 0:2])
        out[..., 16:32].view(groups, ns, GROUP, 2).copy_(fields[..., 2:4])
        for at, field in ((32, sc), (96, mn)):  # [group, super, block, row]
            out[..., at:at + 64].view(groups, ns, 8, GROUP).copy_(
                _grouped(field.view(q.rows, ns, 8), groups, pad).transpose(-1, -2))
        blocks = out[..., 160:].view(groups, ns, 8, per)
        blocks[..., :128].copy_(_nibble_vectors(quants).reshape(groups, ns, 8, 128))
        if q.kind == "q5_k":
            blocks[..., 128:].copy_(_fifth_bits(quants).view(groups, ns, 8, 32))
        return out.reshape(-1)
    # q6_k: ql 128, qh 64, scales 16 (int8), d
    raw = q.data.view(q.rows * ns, 210)
    ql, qh = raw[:, 0:128], raw[:, 128:192]
    # value h*128 + s*64 + l
    low = torch.stack([ql.view(-1, 2, 64) & 0x0F, ql.view(-1, 2, 64) >> 4], dim=2)
    # h*128 + s*32 + l
    high = torch.stack([(qh.view(-1, 2, 32) >> (2 * s)) & 3 for s in range(4)], dim=2)
    quants = (low.reshape(-1, 256) | (high.reshape(-1, 256) << 4)).view(q.rows, ns * 8, 32)  # 0..63
    fields = _grouped(raw.view(q.rows, ns, 210), groups, pad)
    quants = _grouped(quants, groups, pad)  # [group, block, row, 32]
    out = torch.empty(groups, ns, 1680, dtype=torch.uint8)
    out[..., 0:16].view(groups, ns, GROUP, 2).copy_(fields[..., 208:210])
    out[..., 16:144].view(groups, ns, 16, GROUP).copy_(fields[..., 192:208].transpose(-1, -2))
    blocks = out[..., 144:].view(groups, ns, 8, 192)
    blocks[..., :128].copy_(_nibble_vectors(quants).reshape(groups, ns, 8, 128))
    # [group, super, block, a, e', 4j + i]
    e = (_unpacked_vectors(quants) >> 4).reshape(groups, ns, 8, 2, 4, 32)
    hb = e[..., 0, :] | (e[..., 1, :] << 2) | (e[..., 2, :] << 4) | (e[..., 3, :] << 6)
    blocks[..., 128:].view(groups, ns, 8, 2, 32).copy_(hb)
    return out.reshape(-1)
