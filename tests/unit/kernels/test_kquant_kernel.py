"""The kernel's products over a GGUF file's own Q4_0 / Q5_0 / Q4_K / Q5_K / Q6_K blocks
(cpu/kquants.h, int8 activations): token rows read out of the packed blocks are gguf's
dequantization bit for bit, and the products are kquants.h's integer sums, on this CPU's build, an
AVX2 build and the plain-C one."""

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from kquants import QUANTIZERS
from test_native_kernel import kernel_build, portable_home  # noqa: F401  (fixtures)

from warmpath.kernels import native
from warmpath.models import quant
from warmpath.models.ggml_blocks import decode
from warmpath.models.kernel_blocks import for_fp32_activations
from warmpath.models.quant import QuantizedMatrix, from_gguf_blocks

KINDS = [("q4_0", 96), ("q5_0", 96), ("q4_k", 512), ("q5_k", 512), ("q6_k", 512)]


def file_blocks(kind: str, rows: int, cols: int,
                seed: int = 0) -> tuple[QuantizedMatrix, torch.Tensor]:
    """A matrix quantized as llama.cpp does, and gguf's dequantization of it."""
    x = np.random.default_rng(seed).normal(size=(rows, cols)).astype(np.float32) * 0.05
    qtype = Q[kind.upper()]
    raw = QUANTIZERS[qtype.name](x)[0] if qtype.name in QUANTIZERS else gguf_quantize(x, qtype)
    raw_bytes = torch.from_numpy(np.ascontiguousarray(raw).view(np.uint8).reshape(-1).copy())
    exact = torch.from_numpy(gguf_dequantize(raw, qtype).reshape(rows, cols).astype(np.float32))
    return from_gguf_blocks(raw_bytes, kind, rows, cols), exact


def reference(q: QuantizedMatrix, x: torch.Tensor) -> torch.Tensor:
    """kquants.h's numbers in torch: x quantized per 32 columns as for Q4_1 / Q8_0, each sub-block's
    (Q6_K: 16 columns) exact integer sum of (q - offset) * xq scaled by its exact scale times dx;
    Q4_K / Q5_K's min term from the fp32 x."""
    qtype = Q[q.kind.upper()]
    sub = decode(q.data.reshape(-1, GGML_QUANT_SIZES[qtype][1]), qtype)
    per, D, nb = 16 if q.kind == "q6_k" else 32, x.shape[0], q.cols // 32
    # signed (q - offset); Q4_K / Q5_K: unsigned
    quants = sub.q.view(q.rows, q.cols // per, per).long()
    xb = x.float().view(D, nb, 32)
    amax = xb.abs().amax(-1)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    xq = torch.round(xb * inv[..., None]).long().view(D, q.cols // per, per)
    dx = (amax / 127.0).repeat_interleave(32 // per, dim=1)
    # rounded in fp32, as the kernel does
    scale = sub.scale.view(q.rows, q.cols // per)[None] * dx[:, None, :]
    y = (scale.double() * torch.einsum("rsk,dsk->drs", quants, xq).double()).sum(-1)
    if q.kind in ("q4_k", "q5_k"):
        y += xb.sum(-1).double() @ sub.offset.view(q.rows, nb).double().T
    return y


@pytest.mark.parametrize(("kind", "cols"), KINDS)
def test_token_rows_are_ggufs_dequantization(kind, cols, kernel_build):  # noqa: F811
    q, exact = file_blocks(kind, 100, cols)
    assert torch.equal(q.dequantize(), exact)
    rows = [0, 7, 8, 63, 99]
    assert torch.equal(native.matrix_rows(q, rows, True), exact[rows])


@pytest.mark.parametrize(("kind", "cols"), KINDS)
@pytest.mark.parametrize("rows_of_x", [1, 2, 3, 5, 6, 7, 16, 100])
def test_products_over_the_files_blocks_equal_their_reference(kind, cols, rows_of_x, kernel_build):  # noqa: F811
    # 100 outputs: a partial last group of 8
    q, exact = file_blocks(kind, 100, cols, seed=rows_of_x)
    x = torch.randn(rows_of_x, cols, generator=torch.Generator().manual_seed(rows_of_x))
    x[0, :32] = 0.0  # an all-zero block: scale 0
    got = native.matmul(q, x, threads=2, activations="int8").double()
    torch.testing.assert_close(got, reference(q, x), rtol=1e-5, atol=1e-5)
    # and near the exact weights' product: the activations' rounding only
    full = x.double() @ exact.double().T
    assert (got - full).abs().max() < 0.03 * full.abs().max()


def test_the_files_blocks_have_no_fp32_activation_products():
    q, _ = file_blocks("q4_k", 8, 256)
    with pytest.raises(ValueError, match="int8 activations only"):
        native.matmul(q, torch.randn(1, 256), activations="fp32")


@pytest.mark.parametrize(("kind", "cols"), KINDS)
def test_a_matrix_packed_in_chunks_of_rows_multiplies_as_packed_whole(kind, cols,
                                                                      kernel_build,  # noqa: F811
                                                                      monkeypatch):
    """Large matrices are converted and packed a run of rows at a time (QuantizedMatrix.row_chunks):
    100 rows in runs of 16 must give the products of the whole matrix converted and packed at once,
    int8 and fp32 alike."""
    q, _ = file_blocks(kind, 100, cols, seed=3)
    x = torch.randn(5, cols, generator=torch.Generator().manual_seed(5))
    whole_int8 = native.matmul(q, x, threads=2, activations="int8")
    whole_fp32 = native.matmul(for_fp32_activations(q), x, threads=2, activations="fp32")
    monkeypatch.setattr(quant, "CHUNK_VALUES", 16 * cols)
    assert len(q.row_chunks()) == 7
    assert torch.equal(native.matmul(q, x, threads=2, activations="int8"), whole_int8)
    assert torch.equal(native.matmul(for_fp32_activations(q), x, threads=2, activations="fp32"),
                       whole_fp32)
