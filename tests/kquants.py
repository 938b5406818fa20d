"""A small K-quant quantizer for test fixtures (the `gguf` package dequantizes Q2_K..Q6_K but cannot
quantize them). Simple, not llama.cpp's search for the best scales: min/max per sub-block, 6- or
4-bit scales rounded to the nearest. Each quantize_* returns (GGUF bytes, the values those bytes
stand for), the values computed here from the chosen integers on their own, so tests can check them
against `gguf.quants.dequantize` (an independent reader of the same bytes) and the loader against
both.
"""

from __future__ import annotations

import numpy as np

QK = 256


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def _round(x: np.ndarray) -> np.ndarray:
    return np.floor(x + 0.5)


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros(np.broadcast(a, b).shape, np.float32), where=b != 0)


def _two_bit_fields(q: np.ndarray) -> np.ndarray:
    """[n, 256] values of 2 bits -> [n, 64] bytes: value h*128 + s*32 + l in bits 2s of byte h*32 +
    l."""
    q = q.reshape(-1, 2, 4, 32).astype(np.uint8)
    return sum(q[:, :, s, :] << (2 * s) for s in range(4)).astype(np.uint8).reshape(-1, 64)


def _bitplane(bits: np.ndarray) -> np.ndarray:
    """[n, 8, 32] bits -> [n, 32] bytes: bit k of byte l is bits[k, l]."""
    return sum(bits[:, k, :].astype(np.uint8) << k for k in range(8)).astype(np.uint8)


def _asym(x: np.ndarray, sub: int, levels: int, scale_bits: int):
    """Sub-blocks of `sub` values as d * sc * q - dmin * m, q in 0..levels-1, sc and m of scale_bits
    bits."""
    n = x.shape[0]
    xs = x.reshape(n, -1, sub)
    lo = np.minimum(xs.min(axis=2), 0)
    span = (xs.max(axis=2) - lo) / (levels - 1)
    top = (1 << scale_bits) - 1
    d = _f16(span.max(axis=1, keepdims=True) / top)
    dmin = _f16((-lo).max(axis=1, keepdims=True) / top)
    df, dminf = d.astype(np.float32), dmin.astype(np.float32)
    sc = np.clip(_round(_safe_div(span, df)), 0, top)
    m = np.clip(_round(_safe_div(-lo, dminf)), 0, top)
    scale = (df * sc.astype(np.float32))[:, :, None]
    off = (dminf * m.astype(np.float32))[:, :, None]
    q = np.clip(_round(_safe_div(xs + off, scale)), 0, levels - 1)
    values = (scale * q.astype(np.float32) - off).reshape(n, QK)
    return d, dmin, sc.astype(np.uint8), m.astype(np.uint8), q.astype(np.uint8).reshape(n,
                                                                                        QK), values


def _pack_scale_min_k4(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins -> 12 bytes (Q4_K / Q5_K)."""
    out = np.zeros((sc.shape[0], 12), np.uint8)
    for j in range(4):
        out[:, j] = sc[:, j] | ((sc[:, j + 4] >> 4) << 6)
        out[:, j + 4] = m[:, j] | ((m[:, j + 4] >> 4) << 6)
        out[:, j + 8] = (sc[:, j + 4] & 0x0F) | ((m[:, j + 4] & 0x0F) << 4)
    return out


def _blocks(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    if x.size % QK:
        raise ValueError(f"K-quants need a multiple of {QK} values")
    return x.reshape(-1, QK)


def quantize_q4_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = _blocks(x)
    d, dmin, sc, m, q, values = _asym(x, 32, 16, 6)
    q = q.reshape(-1, 4, 2, 32)
    qs = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(-1, 128)
    raw = np.concatenate(
        [d.view(np.uint8), dmin.view(np.uint8),
         _pack_scale_min_k4(sc, m), qs], axis=1)
    return raw, values.reshape(-1)


def quantize_q5_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = _blocks(x)
    d, dmin, sc, m, q, values = _asym(x, 32, 32, 6)
    low = (q & 0x0F).reshape(-1, 4, 2, 32)
    qs = (low[:, :, 0, :] | (low[:, :, 1, :] << 4)).reshape(-1, 128)
    qh = _bitplane((q >> 4).reshape(-1, 8, 32))
    raw = np.concatenate(
        [d.view(np.uint8), dmin.view(np.uint8),
         _pack_scale_min_k4(sc, m), qh, qs], axis=1)
    return raw, values.reshape(-1)


def quantize_q2_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = _blocks(x)
    d, dmin, sc, m, q, values = _asym(x, 16, 4, 4)
    raw = np.concatenate(
        [sc | (m << 4), _two_bit_fields(q),
         d.view(np.uint8), dmin.view(np.uint8)], axis=1)
    return raw, values.reshape(-1)


def _sym(x: np.ndarray, sub: int, qmin: int, qmax: int, smax: int):
    """Sub-blocks of `sub` values as d * s * q, q in qmin..qmax, |s| <= smax; the largest magnitude
    -> qmin."""
    n = x.shape[0]
    xs = x.reshape(n, -1, sub)
    at = np.take_along_axis(xs, np.abs(xs).argmax(axis=2)[..., None], axis=2)[..., 0]
    scale = at / qmin  # signed: the extreme value lands on qmin, as llama.cpp's Q3_K / Q6_K do
    d = _f16(np.abs(scale).max(axis=1, keepdims=True) / smax)
    df = d.astype(np.float32)
    s = np.clip(_round(_safe_div(scale, df)), -smax, smax)
    dl = (df * s.astype(np.float32))[:, :, None]
    q = np.clip(_round(_safe_div(xs, dl)), qmin, qmax)
    values = (dl * q.astype(np.float32)).reshape(n, QK)
    return d, s.astype(np.int8), q.astype(np.int8).reshape(n, QK), values


def quantize_q6_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = _blocks(x)
    d, s, q, values = _sym(x, 16, -32, 31, 127)
    u = (q.astype(np.int16) + 32).astype(np.uint8)  # 0..63
    low = (u & 0x0F).reshape(-1, 2, 2, 64)  # value h*128 + s*64 + l
    ql = (low[:, :, 0, :] | (low[:, :, 1, :] << 4)).reshape(-1, 128)
    qh = _two_bit_fields(u >> 4)
    raw = np.concatenate([ql, qh, s.view(np.uint8), d.view(np.uint8)], axis=1)
    return raw, values.reshape(-1)


def quantize_q3_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = _blocks(x)
    d, s, q, values = _sym(x, 16, -4, 3, 31)
    u = (s.astype(np.int16) + 32).astype(np.uint8)  # 6-bit scales, stored + 32
    scales = np.zeros((x.shape[0], 12), np.uint8)
    scales[:, 0:8] = (u[:, 0:8] & 0x0F) | ((u[:, 8:16] & 0x0F) << 4)
    for j in range(4):
        scales[:, 8 + j] = sum(((u[:, s4 * 4 + j] >> 4) & 3) << (2 * s4) for s4 in range(4))
    high = (q >= 0).astype(np.uint8)  # the high bit set means no -4 offset
    low = (q.astype(np.int16) + 4 * (1 - high)).astype(np.uint8)  # 0..3
    hmask = _bitplane(high.reshape(-1, 8, 32))
    raw = np.concatenate([hmask, _two_bit_fields(low), scales, d.view(np.uint8)], axis=1)
    return raw, values.reshape(-1)


QUANTIZERS = {
    "Q2_K": quantize_q2_k, "Q3_K": quantize_q3_k, "Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k,
    "Q6_K": quantize_q6_k
}
