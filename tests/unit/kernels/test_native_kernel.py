"""The native CPU kernel (warmpath/kernels/): its matrix products read the quantized blocks as the
fp32 weights' exact values, a decode step equals the torch model's up to summation order, a
sequence's result does not depend on what it is batched with, and the engine mixes it with torch
prefill correctly."""

import ctypes
import dataclasses
import logging
import os
import platform
import subprocess
import sys

import pytest
import torch
from tiny_model import write_tiny_gguf, write_tiny_hf

from warmpath import LLM, SamplingParams
from warmpath.config import SchedulerConfig
from warmpath.cpu import cpu_flags
from warmpath.engine.plan import NATIVE_CONTEXT
from warmpath.engine.runner import ModelRunner, SeqInput
from warmpath.kernels import build, native
from warmpath.kernels.native import NativeForward, NativeKernelError, matmul
from warmpath.models import kv_quant
from warmpath.models.kv_cache import allocate_kv_cache
from warmpath.models.llama import LlamaForCausalLM
from warmpath.models.loader import load_checkpoint
from warmpath.models.quant import QuantizedMatrix, from_gguf_blocks

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def random_blocks(kind: str, rows: int, cols: int, seed: int = 0) -> QuantizedMatrix:
    """GGUF blocks with random quants and sane fp16 scales (random bytes would include inf/nan)."""
    g = torch.Generator().manual_seed(seed)
    n = rows * cols // 32
    blocks = torch.randint(0, 256, (n, {"q4_1": 20, "q8_0": 34}[kind]), dtype=torch.uint8,
                           generator=g)
    blocks[:, 0:2] = (torch.rand(n, generator=g) * 0.02).half().view(torch.uint8).view(-1, 2)
    if kind == "q4_1":
        blocks[:, 2:4] = (-torch.rand(n, generator=g) * 0.1).half().view(torch.uint8).view(-1, 2)
    return from_gguf_blocks(blocks.reshape(-1), kind, rows, cols)


@pytest.fixture(scope="module")
def portable_home(tmp_path_factory):
    return tmp_path_factory.mktemp("portable-kernel")  # built once for the module


@pytest.fixture(params=["native", "avx2", "portable"])
def kernel_build(request, portable_home, monkeypatch):
    """The kernel as built for this CPU, for an AVX2 CPU without AVX-512 (-march=haswell: 16 vector
    registers), and its plain-C fallback (-march=x86-64: no AVX2), which CPUs without AVX2 (and
    other architectures) get."""
    if request.param != "native":
        if platform.machine() != "x86_64":
            pytest.skip("the other variants are forced with x86-64 flags")
        march = "-march=haswell" if request.param == "avx2" else "-march=x86-64"
        monkeypatch.setattr(build, "CFLAGS",
                            [f if f != "-march=native" else march for f in build.CFLAGS])
        monkeypatch.setenv("WARMPATH_HOME", str(portable_home / request.param))
    native._load_library.cache_clear()
    yield request.param
    native._load_library.cache_clear()


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0", "f32"])
@pytest.mark.parametrize("rows_of_x", [1, 3, 4, 5, 16])
def test_matrix_product_equals_the_dequantized_weights_product(fmt, rows_of_x, kernel_build):
    torch.manual_seed(0)
    w = torch.randn(100, 96)  # 100 rows: not a multiple of the 4-row tiles
    q = QuantizedMatrix("f32", 100, 96, w) if fmt == "f32" else random_blocks(fmt, 100, 96)
    x = torch.randn(rows_of_x, 96)
    ref = x.double() @ q.dequantize().double().T
    torch.testing.assert_close(matmul(q, x, threads=2).double(), ref, rtol=1e-5, atol=1e-4)


def int8_activation_reference(q: QuantizedMatrix, x: torch.Tensor) -> torch.Tensor:
    """cpu/matmul.h's "Int8 activations" in torch: x quantized per block of 32 (dx = max|x| / 127,
    round half to even), exact integer block sums against the quants, each scaled by d * dx; Q4_1's
    min term from the fp32 x."""
    D, nb = x.shape[0], q.cols // 32
    blocks = q.data.view(q.rows, nb, {"q4_1": 20, "q8_0": 34}[q.kind])
    d = blocks[..., 0:2].contiguous().view(torch.float16).float().squeeze(-1)  # [rows, blocks]
    if q.kind == "q4_1":
        # [rows, blocks, 32]
        quants = torch.cat([blocks[..., 4:] & 0x0F, blocks[..., 4:] >> 4], dim=-1).long()
    else:
        quants = blocks[..., 2:].contiguous().view(torch.int8).long()
    xb = x.float().view(D, nb, 32)
    amax = xb.abs().amax(-1)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    xq = torch.round(xb * inv[..., None]).long()  # [D, blocks, 32]
    sums = torch.einsum("rbk,dbk->drb", quants, xq).double()  # exact integers
    # [D, rows, blocks]: d * dx, rounded in fp32
    scale = (d[None] * (amax / 127.0)[:, None, :]).double()
    y = (scale * sums).sum(-1)
    if q.kind == "q4_1":
        m = blocks[..., 2:4].contiguous().view(torch.float16).float().squeeze(-1)
        y += xb.sum(-1).double() @ m.double().T
    return y


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
@pytest.mark.parametrize("rows_of_x", [1, 2, 3, 5, 6, 7, 16, 100])
def test_int8_activation_product_equals_its_reference(fmt, rows_of_x, kernel_build):
    torch.manual_seed(0)
    q = random_blocks(fmt, 100, 96)
    x = torch.randn(rows_of_x, 96)
    x[0, :32] = 0.0  # an all-zero block: scale 0, no division by zero
    got = matmul(q, x, threads=2, activations="int8").double()
    torch.testing.assert_close(got, int8_activation_reference(q, x), rtol=1e-5, atol=1e-4)
    # and close to the fp32 product: the activations' rounding is the only difference
    exact = x.double() @ q.dequantize().double().T
    assert (got - exact).abs().max() < 0.02 * exact.abs().max()


def test_512_bit_int8_tiles_give_the_256_bit_tiles_numbers(monkeypatch):
    """Where the CPU has AVX512-VNNI, int8 products run two groups of outputs per 512-bit register:
    bit for bit the 256-bit tiles' outputs (a build with them off), for every row count of a step
    (tiles of 1-6 rows; 13 groups of outputs: an odd last one; 100 outputs: a partial group)."""
    if not {"avx512_vnni", "avx512bw"} <= set(cpu_flags().split()):
        pytest.skip("no AVX512-VNNI on this CPU: the 256-bit tiles run everywhere")
    builds = []
    for extra in ([], ["-DWP_NO_I8_ZMM"]):
        with monkeypatch.context() as m:
            m.setattr(build, "CFLAGS", [*build.CFLAGS, *extra])
            native._load_library.cache_clear()
            builds.append(native.load_library())
    native._load_library.cache_clear()
    for fmt, outputs in (("q4_1", 104), ("q8_0", 104), ("q4_1", 100), ("q8_0", 100)):
        q = random_blocks(fmt, outputs, 96, seed=7)
        packed = native.pack(q, True)
        mat = native._matrix(q, packed, None, True)
        for rows in (1, 2, 3, 4, 5, 6, 7, 13, 100):
            x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows))
            ys = [torch.empty(rows, outputs) for _ in builds]
            for lib, y in zip(builds, ys, strict=True):
                assert lib.wp_matmul(ctypes.byref(mat), x.data_ptr(), rows, y.data_ptr(), 2) == 0
            assert torch.equal(ys[0], ys[1]), (fmt, rows)
        torch.testing.assert_close(ys[0].double(), int8_activation_reference(q, x), rtol=1e-5,
                                   atol=1e-4)


def test_gguf_blocks_are_kept_and_decode_to_the_loaded_weights(tmp_path):
    path, _ = write_tiny_gguf(tmp_path / "tiny.gguf")
    ckpt = load_checkpoint(str(path), torch.float32)
    kinds = {name: q.kind for name, q in ckpt.quantized.items()}
    assert (
        kinds["model.embed_tokens.weight"] == "q8_0"
        and kinds["model.layers.0.mlp.gate_proj.weight"] == "q4_1"
    )
    # as the file has it (models/kernel_blocks.py)
    assert kinds["model.layers.0.mlp.down_proj.weight"] == "q4_0"
    for name, q in ckpt.quantized.items():
        assert torch.equal(q.dequantize(), ckpt.weights[name]), name


def step_inputs(n_ctx: int, first_block: int) -> tuple[list[int], list[int]]:
    torch.manual_seed(n_ctx)
    return torch.randint(3, 200,
                         (n_ctx, )).tolist(), list(range(first_block,
                                                         first_block + n_ctx // 16 + 1))


@pytest.mark.parametrize("model_dir", ["tiny_llama_dir", "tiny_qwen2_dir"])
def test_a_step_equals_the_torch_models(model_dir, request, kernel_build):
    """fp32 weights in the kernel: the same logits as the torch model (to summation order) and the
    same K/V written into the cache, for sequences of different lengths in one step (Qwen2: with
    q/k/v biases)."""
    ckpt = load_checkpoint(str(request.getfixturevalue(model_dir)), torch.float32)
    cfg = ckpt.config
    model = LlamaForCausalLM.from_weights(cfg, ckpt.weights, torch.float32, "cpu")
    kv = allocate_kv_cache(cfg, 64, 16, torch.float32, "cpu")
    runner = ModelRunner(model, kv, 16)
    kernel = NativeForward(cfg, ckpt.weights, {}, kv, 16, weights_mode="f32")
    seqs = []
    # Decodes and short chunks (causal within the chunk): not block-aligned, some over more than one
    # 128-token attention span, one chunk crossing a span boundary, one with nothing cached.
    for n_ctx, first, new in ((5, 0, 1), (37, 4, 1), (130, 10, 1), (124, 20, 9), (0, 30, 20),
                              (300, 40, 3)):
        prompt, table = step_inputs(n_ctx + new, first)
        if n_ctx:
            runner.forward([SeqInput(prompt[:n_ctx], 0, table)])
        seqs.append(SeqInput(prompt[n_ctx:], n_ctx, table))
    before = kv.clone()
    ref = runner.forward(seqs)
    kv_ref, kv[:] = kv.clone(), before
    out = kernel.forward([s.token_ids for s in seqs], [s.num_computed for s in seqs],
                         [s.block_table for s in seqs])
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(kv, kv_ref, rtol=1e-5, atol=1e-5)
    assert out.argmax(-1).tolist() == ref.argmax(-1).tolist()


@pytest.mark.parametrize("activations", ["fp32", "int8"])
def test_a_sequence_gets_the_same_logits_whatever_it_is_batched_with(tmp_path, activations):
    """Bit for bit, over the GGUF's Q4_0, Q4_1 and Q8_0 blocks: up to 7 rows of a step run in
    register tiles, 8 or more through converted panels (fp32) or 6-row int8 tiles, a prompt chunk
    beside decodes too."""
    path, _ = write_tiny_gguf(tmp_path / "tiny.gguf")
    ckpt = load_checkpoint(str(path), torch.float32)
    cfg = ckpt.config
    model = LlamaForCausalLM.from_weights(cfg, ckpt.weights, torch.float32, "cpu")
    kv = allocate_kv_cache(cfg, 160, 16, torch.float32, "cpu")
    runner = ModelRunner(model, kv, 16)
    kernel = NativeForward(cfg, ckpt.weights, ckpt.quantized, kv, 16, activations=activations)
    # int8 reads the file's Q4_0 as it is; fp32 activations convert it to Q4_1 (exactly)
    int8_kinds = ["f32", "q4_0", "q4_1", "q8_0"]
    assert kernel.weight_kinds == (int8_kinds if activations == "int8" else ["f32", "q4_1", "q8_0"])
    seqs = []
    for i, n_ctx in enumerate((40, 3, 150, 17, 64, 90, 8, 33)):
        prompt, table = step_inputs(n_ctx, 16 * i)
        runner.forward([SeqInput(prompt, 0, table)])
        seqs.append(([prompt[-1]], n_ctx, table))
    before = kv.clone()

    def decode(batch):
        kv[:] = before
        return kernel.forward(*map(list, zip(*batch, strict=True)))

    prompt, table = step_inputs(30, 16 * 9)
    chunk = (prompt, 0, table)  # a 30-token prompt beside the 8 decodes: 38 rows
    alone = decode(seqs[:1])[0]
    for batch in (seqs[:3], seqs[:4], seqs[:5], seqs[:7], seqs, [*seqs, chunk]):
        assert torch.equal(decode(batch)[0], alone)
    if activations == "int8":  # near the fp32 kernel's: only the activations' rounding differs
        exact = NativeForward(cfg, ckpt.weights, ckpt.quantized, kv, 16)
        kv[:] = before
        ref = exact.forward(*map(list, zip(*seqs[:1], strict=True)))[0]
        assert not torch.equal(alone, ref) and (alone - ref).abs().max() < 0.05 * ref.abs().max()


@pytest.mark.parametrize(("activations", "kv_dtype"), [("fp32", "float32"), ("int8", "float32"),
                                                       ("fp32", "bfloat16"), ("fp32", "int8")])
def test_engine_mixes_native_decode_with_torch_prefill(tiny_long_dir, tmp_path, activations,
                                                       kv_dtype):
    """Prompts admitted while others decode: steps carry prompt chunks over long contexts (torch
    with fp32 activations, the kernel with int8: a GGUF with Q4_1 / Q8_0 blocks) beside short
    prompts' chunks and decodes (native), over one cache (bf16: both paths write it rounded). Every
    request gets the tokens it gets alone, and the pool is whole afterwards."""
    model = tiny_long_dir if activations == "fp32" else write_tiny_gguf(
        tmp_path / "long.gguf", max_position_embeddings=8192)[0]
    llm = LLM(str(model), dtype="float32", kernel="native",
              scheduler=SchedulerConfig(max_num_batched_tokens=48), num_kv_blocks=400,
              kernel_activations=activations, kv_cache_dtype=kv_dtype)
    assert llm.engine.runner.native.kv_cache.dtype == getattr(torch, kv_dtype)
    kernel = llm.engine.runner.native
    assert kernel.activations == activations
    assert runs_natively(llm, 48, NATIVE_CONTEXT) == (activations == "int8")
    tok = llm.get_tokenizer()
    prompts = [{"prompt_token_ids": tok.encode(f"def f(x):\n    return x * {i}\n" * (1 + 12 * i))}
               for i in range(6)]
    lengths = [len(p["prompt_token_ids"]) for p in prompts]
    assert min(lengths) < 48 and max(lengths) > NATIVE_CONTEXT + 48  # both paths, chunks of 48
    together = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    alone = [llm.generate(p, GREEDY)[0].token_ids for p in prompts]
    assert together == alone
    assert llm.engine.pool.num_free == llm.engine.pool.num_blocks


def runs_natively(llm: LLM, num_new: int, num_computed: int) -> bool:
    return llm.engine.runner.route([SeqInput([0] * num_new, num_computed, [])]).native == [0]


def test_kernel_settings(tiny_llama_dir):
    # auto: native on fp32 CPU
    assert LLM(str(tiny_llama_dir), dtype="float32").engine.runner.native is not None
    # auto: torch otherwise
    assert LLM(str(tiny_llama_dir), dtype="bfloat16").engine.runner.native is None
    assert LLM(str(tiny_llama_dir), dtype="float32", kernel="torch").engine.runner.native is None
    with pytest.raises(ValueError, match="kernel must be"):
        LLM(str(tiny_llama_dir), dtype="float32", kernel="fast")
    # on request: its own weights
    beside_bf16 = LLM(str(tiny_llama_dir), dtype="bfloat16", kernel="native")
    assert (beside_bf16.engine.runner.native is not None
            and beside_bf16.engine.kv_dtype == torch.bfloat16)
    assert len(beside_bf16.generate("def f", GREEDY)[0].token_ids) == 12


def test_the_bf16_attention_is_refused_where_it_cannot_run(tmp_path):
    """A named plan asking for the bf16 attention gets a clear error, not the fp32 one in silence:
    without int8 activations, with a head dim it has no kernel for (the tiny model's 16), or on a
    CPU without AMX / AVX512-BF16."""
    path, _ = write_tiny_gguf(tmp_path / "tiny.gguf")
    ckpt = load_checkpoint(str(path), torch.float32)
    kv = allocate_kv_cache(ckpt.config, 16, 16, torch.bfloat16, "cpu")
    with pytest.raises(ValueError, match="attention must be"):
        NativeForward(ckpt.config, ckpt.weights, ckpt.quantized, kv, 16, activations="int8",
                      attention="fast")
    for activations in ("fp32", "int8"):
        with pytest.raises(NativeKernelError, match="bf16 attention needs"):
            NativeForward(ckpt.config, ckpt.weights, ckpt.quantized, kv, 16,
                          activations=activations, attention="bf16")
    auto = NativeForward(ckpt.config, ckpt.weights, ckpt.quantized, kv, 16, activations="int8")
    # head dim 16: the fp32 spans, and the startup line says so
    assert auto.attention_kind == "fp32"
    with pytest.raises(NativeKernelError, match="plan must be|bf16 attention needs"):
        LLM(str(path), plan="native-int8-bf16attn", num_kv_blocks=16)


def test_kernel_activations_settings(tiny_llama_dir, tmp_path):
    """fp32 activations when float32 is asked for (exact); int8 on request, for a checkpoint with
    quantized blocks; one without (an fp32 HF directory) has nothing to multiply in int8 and keeps
    fp32 (long chunks in torch). With every setting auto the measured plan chooses."""
    gguf_path, _ = write_tiny_gguf(tmp_path / "tiny.gguf")
    assert LLM(str(gguf_path), dtype="float32").engine.runner.native.activations == "fp32"
    llm = LLM(str(gguf_path), dtype="float32", kernel_activations="int8")
    assert llm.engine.runner.native.activations == "int8"
    assert len(llm.generate("def f", GREEDY)[0].token_ids) == 12
    fp32_weights = LLM(str(tiny_llama_dir), dtype="float32", kernel_activations="int8")
    assert fp32_weights.engine.runner.native.activations == "fp32"
    assert not runs_natively(fp32_weights, 48, NATIVE_CONTEXT)
    # all auto: the plan measured here picks one deterministic backend
    auto = LLM(str(gguf_path)).engine
    assert auto.plan is not None and auto.plan.deterministic and auto.runner.native is not None
    for kernel in ("native", "torch"):  # a bad value is an error even where the kernel is not used
        with pytest.raises(ValueError, match="kernel_activations"):
            LLM(str(tiny_llama_dir), dtype="float32", kernel=kernel, kernel_activations="int4")


def test_without_a_compiler_auto_falls_back_to_torch_and_native_says_why(
        tiny_llama_dir, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("WARMPATH_HOME", str(tmp_path))  # no kernel built here yet
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    native._load_library.cache_clear()
    try:
        with caplog.at_level(logging.WARNING):
            llm = LLM(str(tiny_llama_dir), dtype="float32")
        assert llm.engine.runner.native is None and "native kernel unavailable" in caplog.text
        assert len(llm.generate("def f", GREEDY)[0].token_ids) == 12
        with pytest.raises(NativeKernelError, match="no C compiler"):
            LLM(str(tiny_llama_dir), dtype="float32", kernel="native")
    finally:
        native._load_library.cache_clear()


@pytest.mark.parametrize("kernel", ["native", "torch"])
def test_decode_steps_thread_count(tiny_llama_dir, kernel):
    """Decode-only steps keep every thread by default (README, "Server vs engine": faster on 2
    cores, kernel and torch path alike), num_decode_threads sets them, and a step with a prompt
    chunk gets every thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for configured, expected in ((None, 2), (1, 1)):
            llm = LLM(str(tiny_llama_dir), dtype="float32", kernel=kernel,
                      num_decode_threads=configured)
            runner = llm.engine.runner
            decodes = [SeqInput([5], 10, [0]), SeqInput([7], 3, [1])]
            # measured ones (native, none configured): all first
            assert runner.route(decodes).threads == expected
            assert runner.route([*decodes, SeqInput([1, 2, 3], 0, [2])]).threads == 2
            out = llm.generate("def add(a, b):\n", GREEDY)[0]
            assert len(out.token_ids) == GREEDY.max_tokens
            if runner.tuner is None:
                assert torch.get_num_threads() == expected
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_serving_releases_the_loading_threads_openmp_pool(tiny_llama_dir):
    """libgomp stops spinning at barriers once its pools hold more threads than cores (a 16-row
    decode step then took 1.7x as long), so the thread that loaded the model gives its pool back
    when the AsyncEngine starts: its worker thread ends. In a fresh process, whose thread count is
    its own."""
    script = f"""
import os, torch
from warmpath import LLM
from warmpath.engine.async_engine import AsyncEngine
torch.set_num_threads(2)
threads = lambda: len(os.listdir("/proc/self/task"))
llm = LLM({str(tiny_llama_dir)!r}, dtype="float32")
x = torch.randn(256, 256)
(x @ x).sum()  # the loading thread has a pool of 2 (one worker thread)
loaded = threads()
engine = AsyncEngine(llm.engine)  # + the step thread, - the worker
started = threads()
engine.shutdown()
print(loaded, started)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, check=True)
    loaded, started = map(int, out.stdout.split())
    assert started == loaded  # one step thread in, one OpenMP worker out


# -- 16-bit KV cache, weights of the kernel's own --------------------------------------------------

KV16 = [torch.bfloat16, torch.float16]


def rounding_cases(dtype: torch.dtype) -> torch.Tensor:
    """fp32 values over every rounding case of dtype: random bit patterns, exact ties (round half to
    even), fp16 subnormals and their ties, overflow, infinities, signed zeros."""
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**31), 2**31, (200_000, ), generator=g,
                         dtype=torch.int64).to(torch.int32)
    if dtype == torch.bfloat16:
        ties = (bits & ~0xFFFF) | 0x8000
    else:  # exponents of fp16's range, the low 13 bits exactly half an fp16 ulp
        exponent = torch.randint(100, 145, bits.shape, generator=g, dtype=torch.int32) << 23
        ties = (bits & (0x807FE000 - 2**32)) | exponent | 0x1000
    odd = torch.arange(1, 4096, 2, dtype=torch.float32)
    special = torch.tensor(
        [0.0, -0.0,
         float("inf"), -float("inf"), 65504.0, 65519.0, 65520.0, 3.4e38, 1e-45])
    x = torch.cat([
        bits.view(torch.float32),
        ties.view(torch.float32), odd * 2.0**-25, odd * 2.0**-24, -odd * 2.0**-25, special,
        -special,
        torch.randn(10_000, generator=g)
    ])
    return x[~x.isnan()]


@pytest.mark.parametrize("dtype", KV16)
def test_kv_rounding_equals_torchs(dtype, kernel_build):
    x = rounding_cases(dtype)
    assert torch.equal(native.store_kv(x, dtype).view(torch.int16), x.to(dtype).view(torch.int16))
    assert native.store_kv(torch.tensor([float("nan")]), dtype).isnan().all()


def tiny_gguf_kernels(tmp_path, *kv_dtypes, activations="fp32", blocks=160):
    path, _ = write_tiny_gguf(tmp_path / "tiny.gguf")
    ckpt = load_checkpoint(str(path), torch.float32)
    caches = [allocate_kv_cache(ckpt.config, blocks, 16, d, "cpu") for d in kv_dtypes]
    return ckpt, [
        NativeForward(ckpt.config, ckpt.weights, ckpt.quantized, kv, 16, activations=activations)
        for kv in caches
    ]


def three_steps(kernel: NativeForward) -> list[torch.Tensor]:
    """Prompts as chunks (one over a span boundary), then their decodes, then a chunk over a cached
    context beside decodes; the cache starts empty. The logits of every step."""
    kernel.kv_cache.zero_()
    seqs = [step_inputs(n, 16 * i) for i, n in enumerate((40, 3, 150, 17))]
    out = [kernel.forward([p[:-1] for p, _ in seqs], [0] * 4, [t for _, t in seqs])]
    out.append(
        kernel.forward([p[-1:] for p, _ in seqs], [len(p) - 1 for p, _ in seqs],
                       [t for _, t in seqs]))
    more, table = step_inputs(60, 16 * 4)
    kernel.forward([more[:40]], [0], [table])
    out.append(
        kernel.forward([more[40:], *([p[-1]] for p, _ in seqs[:3])],
                       [40, *(len(p) for p, _ in seqs[:3])], [table, *(t for _, t in seqs[:3])]))
    return out


def test_int8_kv_rows_are_the_torch_paths_bytes(kernel_build):
    """An int8 row as models/kv_quant.py writes it (the torch path's): the fp16 scale's rounding,
    values exactly half a step apart (round half to even), all-zero rows, rows whose largest value
    sets the scale."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000, 64, generator=g) * torch.rand(3000, 1, generator=g) * 50
    x[0], x[1] = 0.0, 1e-9
    # ties at a scale of exactly 0.25
    x[2:100] = (torch.randint(-126, 126, (98, 64), generator=g) + 0.5) * 0.25
    x[2:100, 0] = 31.75
    got = native.store_kv(x, torch.int8)
    assert got.shape == (3000, 66) and torch.equal(got, kv_quant.quantize(x))
    assert (got[2:100, 1:64].abs() % 2 == 0).all()  # every tie went to the even value
    assert (kv_quant.dequantize(got) - x).abs().max() <= x.abs().amax() / 127 * 0.51


@pytest.mark.parametrize("dtype", [*KV16, torch.int8])
def test_a_16_or_8_bit_kv_cache(tmp_path, dtype, kernel_build):
    """K/V written rounded as torch rounds them, int8 quantized as the torch path quantizes them
    (layer 0's: the same fp32 values in both runs; later layers see a rounded context), logits close
    to the fp32 cache's, and a sequence's logits whatever it is batched with."""
    ckpt, (k32, k16) = tiny_gguf_kernels(tmp_path, torch.float32, dtype)
    ref, got = three_steps(k32), three_steps(k16)
    assert k16.kv_cache.dtype == dtype and k16.kv_cache[0].abs().sum() > 0
    if dtype == torch.int8:
        assert torch.equal(k16.kv_cache[0], kv_quant.quantize(k32.kv_cache[0]))
        assert not torch.equal(kv_quant.dequantize(k16.kv_cache), k32.kv_cache)
    else:
        assert torch.equal(k16.kv_cache[0].view(torch.int16),
                           k32.kv_cache[0].to(dtype).view(torch.int16))
        assert not torch.equal(k16.kv_cache.float(), k32.kv_cache)
    # int8 rows: 1/254 of a row's largest value; bf16: 2^-9 of each
    bound = 0.04 if dtype == torch.int8 else 0.02
    for a, b in zip(got, ref, strict=True):
        assert (a - b).abs().max() < bound * b.abs().max()
        assert a.argmax(-1).tolist() == b.argmax(-1).tolist()
    before = k16.kv_cache.clone()
    decodes = [([p[-1]], len(p) - 1, t)
               for p, t in (step_inputs(n, 16 * i) for i, n in enumerate((40, 3, 150, 17)))]
    chunk = (step_inputs(30, 16 * 5)[0], 0, step_inputs(30, 16 * 5)[1])

    def step(batch):
        k16.kv_cache[:] = before
        return k16.forward(*map(list, zip(*batch, strict=True)))

    alone = step(decodes[:1])[0]
    for batch in (decodes[:2], decodes, [*decodes, chunk]):
        assert torch.equal(step(batch)[0], alone)


def weights_of(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """HF-named views of a torch model's own tensors: what the kernel read before it kept weights of
    its own."""
    cfg = model.cfg
    sizes = [
        cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim
    ]
    w = {"model.embed_tokens.weight": model.embed, "model.norm.weight": model.norm}
    if model.lm_head is not None:
        w["lm_head.weight"] = model.lm_head
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"], w[p + "post_attention_layernorm.weight"] = (
            layer.input_norm, layer.post_attention_norm)
        for x, t in zip("qkv", layer.qkv_weight.split(sizes), strict=True):
            w[p + f"self_attn.{x}_proj.weight"] = t
        if layer.qkv_bias is not None:
            for x, t in zip("qkv", layer.qkv_bias.split(sizes), strict=True):
                w[p + f"self_attn.{x}_proj.bias"] = t
        w[p + "self_attn.o_proj.weight"] = layer.o_weight
        w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"] = layer.gate_up_weight.chunk(2)
        w[p + "mlp.down_proj.weight"] = layer.down_weight
    return w


@pytest.mark.parametrize("source", ["tiny.gguf", "tiny_qwen2_dir"])
def test_checkpoint_weights_beside_a_bf16_model_equal_the_fp32_models(source, tmp_path, request):
    """The kernel built from the checkpoint's weights, beside a bf16 torch model (the checkpoint
    then dropped), gives the logits, bit for bit, of the kernel built from an fp32 torch model's own
    tensors (the old path)."""
    path = write_tiny_gguf(
        tmp_path / source)[0] if source.endswith(".gguf") else request.getfixturevalue(source)
    ckpt = load_checkpoint(str(path), torch.float32)
    cfg, quantized = ckpt.config, ckpt.quantized
    fp32_model = LlamaForCausalLM.from_weights(cfg, ckpt.weights, torch.float32, "cpu")
    old = NativeForward(cfg, weights_of(fp32_model), quantized,
                        allocate_kv_cache(cfg, 160, 16, torch.float32, "cpu"), 16)
    del fp32_model
    bf16_model = LlamaForCausalLM.from_weights(cfg, ckpt.weights, torch.bfloat16, "cpu")
    new = NativeForward(cfg, ckpt.weights, quantized,
                        allocate_kv_cache(cfg, 160, 16, torch.float32, "cpu"), 16)
    del ckpt, quantized
    # its own norms, biases and RoPE table besides the matrices
    assert new.weight_bytes >= old.weight_bytes
    for a, b in zip(three_steps(new), three_steps(old), strict=True):
        assert torch.equal(a, b)
    assert bf16_model.embed.dtype == torch.bfloat16


def test_kernel_and_bf16_torch_model_share_a_bf16_kv_cache(tmp_path):
    """A bf16 torch prefill and a native decode over the same blocks (and the other way round):
    close to the torch model decoding its own prefill."""
    path, _ = write_tiny_gguf(tmp_path / "tiny.gguf")
    ckpt = load_checkpoint(str(path), torch.float32)
    kv = allocate_kv_cache(ckpt.config, 64, 16, torch.bfloat16, "cpu")
    runner = ModelRunner(
        LlamaForCausalLM.from_weights(ckpt.config, ckpt.weights, torch.bfloat16, "cpu"), kv, 16)
    kernel = NativeForward(ckpt.config, ckpt.weights, ckpt.quantized, kv, 16)
    prompts = [step_inputs(n, 16 * i) for i, n in enumerate((40, 90))]

    def prefill_then_decode(first, then):
        kv.zero_()
        first([p[:-1] for p, _ in prompts], [0, 0], [t for _, t in prompts])
        return then([p[-1:] for p, _ in prompts], [len(p) - 1 for p, _ in prompts],
                    [t for _, t in prompts])

    def torch_step(ids, starts, tables):
        return runner.forward(
            [SeqInput(i, s, t) for i, s, t in zip(ids, starts, tables, strict=True)])

    ref = prefill_then_decode(torch_step, torch_step)
    for mixed in (prefill_then_decode(torch_step, kernel.forward),
                  prefill_then_decode(kernel.forward, torch_step)):
        assert (mixed - ref).abs().max() < 0.05 * ref.abs().max()
        assert mixed.argmax(-1).tolist() == ref.argmax(-1).tolist()


@pytest.mark.parametrize("fmt", ["q8_0", "q4_1", "f32"])
@pytest.mark.parametrize("int8", [False, True])
def test_embedding_rows_from_packed_blocks_equal_the_tables(fmt, int8, tmp_path, kernel_build):
    """Token rows read out of packed blocks (either quant order) are the dequantized table's rows
    exactly; a model whose embedding is read from its Q8_0 blocks gives the logits of one reading an
    fp32 table."""
    torch.manual_seed(0)
    q = QuantizedMatrix("f32", 100, 96, torch.randn(100, 96)) if fmt == "f32" else random_blocks(
        fmt, 100, 96)
    rows = [0, 7, 8, 99, 42, 7]
    assert torch.equal(native.matrix_rows(q, rows, int8 and fmt != "f32"), q.dequantize()[rows])
    if fmt != "q8_0" or int8:
        return
    path, _ = write_tiny_gguf(tmp_path / "tiny.gguf")
    ckpt = load_checkpoint(str(path), torch.float32)
    name = "model.embed_tokens.weight"
    assert ckpt.quantized[name].kind == "q8_0"
    assert torch.equal(native.matrix_rows(ckpt.quantized[name], rows), ckpt.weights[name][rows])
    # an fp32 head; the embedding apart
    untied = dataclasses.replace(ckpt.config, tie_word_embeddings=False)
    weights = {**ckpt.weights, "lm_head.weight": ckpt.weights[name]}
    kernels = [
        NativeForward(untied, weights, qs, allocate_kv_cache(untied, 160, 16, torch.float32, "cpu"),
                      16)
        for qs in (ckpt.quantized, {k: v
                                    for k, v in ckpt.quantized.items() if k != name})
    ]
    assert kernels[0].weight_bytes < kernels[1].weight_bytes
    for a, b in zip(three_steps(kernels[0]), three_steps(kernels[1]), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(("kv_dtype", "attention", "head_dim"),
                         [(torch.float32, 0, 16), (torch.bfloat16, 0, 16), (torch.bfloat16, 1, 64),
                          (torch.bfloat16, 1, 128)],
                         ids=["fp32-cache", "bf16-cache", "bf16-attention", "bf16-attention-hd128"])
def test_chunks_over_a_context_whatever_the_chunking(tmp_path, kv_dtype, attention, head_dim,
                                                     kernel_build):
    """Three query heads per KV head (register tiles then take heads of two rows): a prompt computed
    in one chunk or in several over what is cached gives the same K/V and last logits, bit for bit,
    and the torch model's (fp32 KV: to summation order). A last chunk of one token (a cache hit that
    leaves one) is a decode row's work: the same numbers too. With the bf16 attention as well
    (AVX512-BF16 or AMX where this build has one: other numbers than the fp32 attention's; the fp32
    spans otherwise)."""
    path = write_tiny_hf(tmp_path / "g3", "llama", num_attention_heads=6, num_key_value_heads=2,
                         max_position_embeddings=1024, head_dim=head_dim)
    ckpt = load_checkpoint(str(path), torch.float32)
    cfg = ckpt.config
    assert cfg.num_heads // cfg.num_kv_heads == 3
    kv = allocate_kv_cache(cfg, 64, 16, kv_dtype, "cpu")
    kernel = NativeForward(cfg, ckpt.weights, {}, kv, 16)
    prompt, table = step_inputs(400, 0)

    def run(cuts: tuple[int, ...], flag: int) -> tuple[torch.Tensor, torch.Tensor]:
        kernel.model.attention = flag  # the flag alone picks the attention (fp32 activations here)
        kv.zero_()
        start = 0
        for n in cuts:
            logits = kernel.forward([prompt[start:start + n]], [start], [table])
            start += n
        return logits, kv.clone()

    results = [
        run(cuts, attention)
        for cuts in ((400, ), (64, 336), (150, 7, 243), (333, 65, 2), (399, 1), (150, 249, 1))
    ]
    for logits, cache in results[1:]:
        assert torch.equal(logits, results[0][0]) and torch.equal(cache, results[0][1])
    if attention:
        # as close to the exact fp32 pass as the fp32 attention over the same bf16 cache is, or
        # nearly
        fp32_attention = run((400,), 0)[0]
        assert torch.equal(results[0][0], fp32_attention) == (native.bf16_attention() is None)
        exact = ModelRunner(LlamaForCausalLM.from_weights(cfg, ckpt.weights, torch.float32, "cpu"),
                            allocate_kv_cache(cfg, 64, 16, torch.float32, "cpu"), 16)
        ref = exact.forward([SeqInput(prompt, 0, table)])
        assert (results[0][0] - ref).abs().max() < 2 * (fp32_attention - ref).abs().max()
    if kv_dtype == torch.float32:
        runner = ModelRunner(LlamaForCausalLM.from_weights(cfg, ckpt.weights, torch.float32, "cpu"),
                             kv, 16)
        kv.zero_()
        runner.forward([SeqInput(prompt[:150], 0, table)])
        ref = runner.forward([SeqInput(prompt[150:], 150, table)])
        torch.testing.assert_close(results[0][0], ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("activations", ["fp32", "int8"])
def test_decode_rows_of_one_sequence_attend_together_with_each_rows_own_numbers(
        tmp_path, activations, kernel_build):
    """A verified decode's rows (the same blocks, consecutive positions, over a span boundary) are
    attended as one group reading each K/V row once: each row's logits are bit for bit those of the
    row computed alone."""
    _, (kernel,) = tiny_gguf_kernels(tmp_path, torch.bfloat16, activations=activations)
    prompt, table = step_inputs(150, 0)
    other, other_table = step_inputs(40, 20)
    kernel.kv_cache.zero_()
    kernel.forward([prompt[:125], other], [0, 0], [table, other_table])
    guesses = prompt[125:131]  # positions 125..130: 128 is a span boundary
    together = kernel.forward([[t] for t in guesses] + [[other[-1]]],
                              [125 + j for j in range(6)] + [40], [table] * 6 + [other_table])
    for j, t in enumerate(guesses):
        # the K/V of positions 125..130 are in the cache now: recompute each alone
        alone = kernel.forward([[t]], [125 + j], [table])
        assert torch.equal(alone[0], together[j]), j
    assert torch.equal(kernel.forward([[other[-1]]], [40], [other_table])[0], together[6])
