"""The native kernel on AMX tiles (Sapphire Rapids and later; skipped on CPUs without them):
int8-activation products of many rows bit for bit those of the register tiles. The bf16 attention
(int8 activations over a bf16 cache; on AMX tiles, or AVX512-BF16 dot products where a CPU has those
but no AMX, or AMX is turned off) the same for a prompt whatever its chunking, close to the fp32
attention, on the bundled model. A last token computed alone gets its chunk's logits on every CPU,
with either attention."""

import ctypes
import sys
from pathlib import Path

import pytest
import torch

from warmpath.kernels import native
from warmpath.kernels.native import NativeForward
from warmpath.models.kv_cache import allocate_kv_cache
from warmpath.models.loader import load_checkpoint
from warmpath.models.registry import resolve_model
from warmpath.workloads import stdlib_files

sys.path.insert(0, str(Path(__file__).parents[1] / "unit" / "kernels"))
from test_native_kernel import int8_activation_reference, random_blocks  # noqa: E402


@pytest.fixture
def amx():
    lib = native.load_library()
    if not lib.wp_set_amx(1):
        pytest.skip("no AMX tiles on this CPU (or the OS refuses them)")
    yield lib
    lib.wp_set_amx(1)


def product(lib, q, x: torch.Tensor, amx_on: int) -> torch.Tensor:
    packed = native.pack(q, True)
    m = native._matrix(q, packed, None, True)
    y = torch.empty(x.shape[0], q.rows)
    lib.wp_set_amx(amx_on)
    assert lib.wp_matmul(ctypes.byref(m), x.data_ptr(), x.shape[0], y.data_ptr(), 2) == 0
    return y


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
@pytest.mark.parametrize("rows,cols,d", [(104, 96, 16), (104, 96, 37), (960, 576, 100),
                                         (576, 1536, 33)])
def test_amx_products_equal_the_register_tiles(amx, fmt, rows, cols, d):
    """104 rows: an odd number of groups (a half-empty last panel); 96 columns: an odd number of
    blocks; 37, 33 and 100 rows of x: a partial tile of rows."""
    q = random_blocks(fmt, rows, cols, seed=rows + d)
    x = torch.randn(d, cols, generator=torch.Generator().manual_seed(d))
    x[1, :32] = 0.0
    on, off = product(amx, q, x, 1), product(amx, q, x, 0)
    assert torch.equal(on, off)
    torch.testing.assert_close(on.double(), int8_activation_reference(q, x), rtol=1e-5, atol=1e-4)


@pytest.fixture(scope="module")
def bundled():
    ckpt = load_checkpoint(resolve_model("smollm2"), torch.float32)
    kv = allocate_kv_cache(ckpt.config, 64, 16, torch.bfloat16, "cpu")
    kernel = NativeForward(ckpt.config, ckpt.weights, ckpt.quantized, kv, 16, activations="int8")
    exact = NativeForward(ckpt.config, ckpt.weights, ckpt.quantized,
                          allocate_kv_cache(ckpt.config, 64, 16, torch.float32, "cpu"),
                          16)  # fp32 products and cache: transformers' logits, to 1e-4
    text = "".join(p.read_text() for p in list(stdlib_files())[:3])
    return kernel, exact, ckpt.tokenizer.encode(text)[:700]


def prefill(kernel: NativeForward, ids: list[int], cuts: tuple[int, ...], attention: int):
    kernel.model.attention = attention
    kernel.kv_cache.zero_()
    start, logits = 0, None
    for n in cuts:
        logits = kernel.forward([ids[start:start + n]], [start], [list(range(44))])
        start += n
    return logits, kernel.kv_cache.clone()


@pytest.fixture(params=["AMX tiles", "AVX512-BF16"])
def bf16_attention(request):
    """Each bf16 attention this CPU has: AMX tiles where it has them, AVX512-BF16 with AMX turned
    off (or absent); "fp32" (where a test asks for it): the fp32 attention, on every CPU."""
    lib = native.load_library()
    if request.param == "fp32":
        yield 0
        return
    lib.wp_set_amx(int(request.param == "AMX tiles"))
    if native.bf16_attention() != request.param:
        lib.wp_set_amx(1)
        pytest.skip(f"no {request.param} attention on this CPU")
    yield 1  # the model's attention flag
    lib.wp_set_amx(1)


def test_bf16_chunk_attention_is_the_same_whatever_the_chunking(bf16_attention, bundled):
    """One chunk, or several over what is cached (a tile of queries then holds rows of two chunks'
    worth of positions, and cuts fall inside blocks of keys): the same K/V and logits, bit for bit;
    as close to the exact fp32 pass as the fp32 attention over the same int8 products is (bf16
    queries and weights: no worse than that)."""
    kernel, exact, ids = bundled
    assert kernel.model.attention == 1  # int8 activations over a bf16 cache
    whole, cache = prefill(kernel, ids, (700,), 1)
    for cuts in ((100, 600), (37, 300, 363), (333, 65, 302)):
        logits, kv = prefill(kernel, ids, cuts, 1)
        assert torch.equal(logits, whole) and torch.equal(kv, cache)
    fp32_attention, _ = prefill(kernel, ids, (700,), 0)
    kernel.model.attention = 1  # the module's kernel, as the next bf16 attention's run expects it
    assert not torch.equal(whole, fp32_attention)  # the bf16 path ran
    exact.kv_cache.zero_()
    ref = exact.forward([ids], [0], [list(range(44))])
    assert (whole - ref).abs().max() < 1.5 * (fp32_attention - ref).abs().max()
    # the reference's top two are 0.08 apart
    assert whole.argmax(-1).item() in ref.topk(2).indices[0].tolist()


@pytest.mark.parametrize("bf16_attention", ["fp32", "AMX tiles", "AVX512-BF16"], indirect=True)
def test_a_last_token_alone_gets_the_logits_it_gets_inside_a_chunk(bf16_attention, bundled):
    """A prompt whose cached prefix leaves one token (or whose last chunk is one token), and a
    decode row: the same logits as when that token is a chunk's last row. The fp32 attention
    (native-int8's) and each bf16 one this CPU has (native-int8-bf16attn's)."""
    attention = bf16_attention
    kernel, _, ids = bundled
    whole, cache = prefill(kernel, ids, (700,), attention)
    logits, kv = prefill(kernel, ids, (699, 1), attention)
    assert torch.equal(kv, cache)
    assert torch.equal(logits, whole)
    # then the last token as a decode row beside another sequence's chunk
    prefill(kernel, ids, (699,), attention)
    both = kernel.forward([ids[699:700], ids[:100]], [699, 0],
                          [list(range(44)), list(range(44, 51))])
    assert torch.equal(both[0], whole[0])
