"""The native CPU forward pass (cpu/forward.c and the headers it includes): built with the system C
compiler on first use, called via ctypes.

NativeForward holds the model's weights as the checkpoint stores them (GGUF Q4_1 / Q8_0 blocks,
models/quant.py; fp32 for anything else), its own copies of them, independent of any torch model,
and computes the sequences of a step it is given in one call, over the same paged KV cache (fp32,
bf16, fp16 or int8) the torch path uses. Which sequences those are is the runner's decision
(engine/runner.py, route()).
"""

from __future__ import annotations

import ctypes
import itertools
import logging
from functools import cache
from pathlib import Path

import torch

from warmpath.config import ModelConfig
from warmpath.kernels.build import NativeKernelError, build_library
from warmpath.kernels.packed_cache import PackedCache, PackedMatrix, cache_path
from warmpath.kernels.packing import KINDS, pack
from warmpath.models.kernel_blocks import for_fp32_activations
from warmpath.models.kv_quant import row_width
from warmpath.models.llama import rope_table
from warmpath.models.quant import FILE_KINDS, QuantizedMatrix, concat_rows

log = logging.getLogger(__name__)

# cpu/common.h WP_KV_*
KV_TYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.int8: 3}


class Matrix(ctypes.Structure):
    pass


Matrix._fields_ = [("type", ctypes.c_int32), ("rows", ctypes.c_int32), ("cols", ctypes.c_int32),
                   ("act", ctypes.c_int32), ("data", ctypes.c_void_p), ("bias", ctypes.c_void_p),
                   ("next", ctypes.POINTER(Matrix))]  # a chain's next part (cpu/common.h wp_matrix)


class Layer(ctypes.Structure):
    _fields_ = [("input_norm", ctypes.c_void_p), ("post_attention_norm", ctypes.c_void_p),
                ("qkv", Matrix), ("o", Matrix), ("gate_up", Matrix), ("down", Matrix)]


class Model(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_int32)
        for n in ("num_layers", "hidden", "intermediate", "num_heads", "num_kv_heads", "head_dim",
                  "vocab", "block_size", "max_positions", "num_kv_blocks", "kv_type")
    ]
    _fields_ += [("eps", ctypes.c_float), ("scale", ctypes.c_float), ("embed", ctypes.c_void_p),
                 ("embed_blocks", Matrix), ("norm", ctypes.c_void_p), ("rope", ctypes.c_void_p),
                 ("layers", ctypes.POINTER(Layer)), ("head", Matrix), ("attention", ctypes.c_int32)]


def available() -> bool:
    """Whether the kernel builds and loads here (a plan without it has torch alone)."""
    try:
        load_library()
        return True
    except NativeKernelError as e:
        log.warning("native kernel unavailable, planning with torch alone: %s", e)
        return False


def load_library() -> ctypes.CDLL:
    """The kernel built for this CPU (build.py: compiled once, cached under $WARMPATH_HOME/kernels),
    loaded."""
    return _load_library(build_library())


@cache
def _load_library(out: Path) -> ctypes.CDLL:
    # torch's own OpenMP runtime is the one already loaded: the kernel's threads share its pool.
    lib = ctypes.CDLL(str(out))
    lib.wp_forward.restype = ctypes.c_int
    lib.wp_forward.argtypes = [
        ctypes.POINTER(Model), ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int
    ]
    lib.wp_matmul.restype = ctypes.c_int
    lib.wp_matmul.argtypes = [
        ctypes.POINTER(Matrix), ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int
    ]
    lib.wp_set_amx.restype = ctypes.c_int
    lib.wp_set_amx.argtypes = [ctypes.c_int]
    lib.wp_bf16_attention.restype = ctypes.c_int
    lib.wp_bf16_attention.argtypes = []
    lib.wp_store_kv.restype = None
    lib.wp_store_kv.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int
    ]
    lib.wp_matrix_rows.restype = None
    lib.wp_matrix_rows.argtypes = [
        ctypes.POINTER(Matrix), ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p
    ]
    return lib


def bf16_attention() -> str | None:
    """The bf16 attention this CPU runs (int8 activations over a bf16 cache): "AMX tiles",
    "AVX512-BF16" or None (the kernel as built here; None where it does not build)."""
    try:
        kind = load_library().wp_bf16_attention()
    except NativeKernelError:
        return None
    return {2: "AMX tiles", 1: "AVX512-BF16"}.get(kind)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _matrix(q: QuantizedMatrix, packed: torch.Tensor, bias: torch.Tensor | None = None,
            int8_activations: bool = False) -> Matrix:
    return Matrix(KINDS[q.kind], q.rows, q.cols, int(int8_activations), _ptr(packed), _ptr(bias))


def matmul(q: QuantizedMatrix, x: torch.Tensor, threads: int | None = None,
           activations: str = "fp32") -> torch.Tensor:
    """x [D, cols] fp32 @ q.T -> [D, rows], through the kernel's matrix product (for tests and
    benchmarks); activations "int8" quantizes x as the kernel's int8 mode does (Q4_1, Q8_0 and the
    file kinds, which have no other)."""
    x = x.float().contiguous()
    y = torch.empty(x.shape[0], q.rows)
    int8 = int8_activations(q, activations)
    if q.kind in FILE_KINDS and not int8:
        raise ValueError(f"{q.kind} blocks are multiplied by int8 activations only")
    packed = pack(q, int8)
    m = _matrix(q, packed, None, int8)
    rc = load_library().wp_matmul(ctypes.byref(m), x.data_ptr(), x.shape[0], y.data_ptr(),
                                  threads or torch.get_num_threads())
    if rc != 0:
        raise MemoryError("the native matrix product could not allocate its work buffer")
    return y


ACTIVATIONS = ("fp32", "int8")


def int8_activations(q: QuantizedMatrix, activations: str) -> bool:
    """Whether the kernel multiplies q by int8-quantized activations: "int8" mode, for the
    checkpoint's block matrices (fp32 ones keep fp32 activations)."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {ACTIVATIONS}, got {activations!r}")
    return activations == "int8" and q.kind != "f32"


def store_kv(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x (fp32, [..., head_dim]) as the kernel writes its rows into a KV cache of dtype (tests of
    its rounding)."""
    x = x.float().contiguous()
    out = torch.empty((*x.shape[:-1], row_width(x.shape[-1], dtype)), dtype=dtype)
    load_library().wp_store_kv(out.data_ptr(), x.data_ptr(), x[..., 0].numel(), x.shape[-1],
                               KV_TYPES[dtype])
    return out


def matrix_rows(q: QuantizedMatrix, rows: list[int], int8: bool = False) -> torch.Tensor:
    """Rows of q as the kernel reads token embeddings out of its packed blocks (for tests)."""
    packed = pack(q, int8)
    out = torch.empty(len(rows), q.cols)
    idx = torch.tensor(rows, dtype=torch.int64)
    load_library().wp_matrix_rows(ctypes.byref(_matrix(q, packed, None, int8)), idx.data_ptr(),
                                  len(rows), out.data_ptr())
    return out


WEIGHTS_MODES = ("checkpoint", "f32")


class NativeForward:
    """The forward pass of one model over one KV cache, in native code, on weights of its own."""

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor],
                 quantized: dict[str, QuantizedMatrix], kv_cache: torch.Tensor | None,
                 block_size: int, weights_mode: str = "checkpoint", activations: str = "fp32",
                 attention: str = "auto", source: str | None = None, keep_packing: bool = True):
        """weights: the checkpoint's HF-named tensors, any float dtype (Checkpoint.weights);
        quantized: its Q4_1 / Q8_0 blocks (Checkpoint.quantized). The kernel keeps what it reads
        (packed matrices, fp32 norms, biases and RoPE table): nothing points into a torch model,
        which may be of any dtype or absent. weights_mode: "checkpoint" reads the checkpoint's own
        quantized blocks where it has them and the fp32 weights elsewhere (both are the values the
        torch model computes with); "f32" reads fp32 everywhere. activations: "fp32" (exact, the
        torch model's products up to summation order) or "int8" (the checkpoint's Q4_1 / Q8_0
        products on int8-quantized activations, cpu/matmul.h "Int8 activations": faster, less
        precise; a model with neither, e.g. an fp32 HF directory, stays "fp32"). attention: "fp32",
        "bf16" (int8 activations over a bf16 cache, on a CPU with AMX or AVX512-BF16: bf16 products,
        cpu/attention_amx.h / attention_bf16.h) or "auto" (bf16 where it can run, else fp32).
        kv_cache: [layers, 2, blocks, block_size, kv_heads, head_dim] of float32, bfloat16 or
        float16 on the CPU; K/V are written rounded to its dtype as torch's .to() rounds. None:
        attach_kv_cache() before forward(). source: the model file, whose packed matrices are then
        kept on disk for the next start (packed_cache.py; keep_packing=False: only when
        keep_packing() is called, as for the plan's winning candidate); `quantized` is then read
        only where they are not there yet."""
        cfg = config
        if weights_mode not in WEIGHTS_MODES:
            raise ValueError(f"weights_mode must be one of {WEIGHTS_MODES}, got {weights_mode!r}")
        if cfg.head_dim % 2 or cfg.num_heads % cfg.num_kv_heads:
            raise NativeKernelError("unsupported attention shape for the native kernel")
        self.lib = load_library()
        if attention not in ("auto", "fp32", "bf16"):
            raise ValueError(f"attention must be auto, fp32 or bf16, got {attention!r}")
        if attention == "bf16" and (activations != "int8" or not bf16_attention() or
                                    config.head_dim not in (64, 128)):
            raise NativeKernelError(
                "the bf16 attention needs int8 activations, a head dim of 64 or 128 and a CPU "
                "with AMX or AVX512-BF16")
        self.attention = attention
        self.config, self.block_size = cfg, block_size
        self.kv_cache: torch.Tensor | None = None
        # every tensor the C structs point into: what the kernel holds
        self._keep: list[torch.Tensor] = []
        self._chains: list[list[Matrix]] = []
        kinds: set[str] = set()
        uses_int8: list[bool] = []

        def own(t: torch.Tensor, copy: bool = True) -> torch.Tensor:
            # an fp32 copy (or, copy=False, a view)
            t = t.detach().to(device="cpu", dtype=torch.float32, copy=copy).contiguous()
            self._keep.append(t)
            return t

        store = PackedCache(None if source is
                            None else cache_path(source, f"{weights_mode} {activations}"))

        def packed(names: list[str], products: bool = True) -> list[PackedMatrix]:
            """The fused matrix of names in parts of one kind each (consecutive members of one kind
            together), packed. products=False: a table read row by row (matrix_row), its blocks as
            they are."""
            qs = [quantized.get(n) if weights_mode == "checkpoint" else None for n in names]
            if products and activations != "int8":
                qs = [None if q is None else for_fp32_activations(q) for q in qs]
            # None: packed from the fp32 weights
            kind = ["weights" if q is None else q.kind for q in qs]
            runs = [list(g) for _, g in itertools.groupby(range(len(qs)), key=kind.__getitem__)]
            parts = []
            for run in runs:
                q = concat_rows([qs[i] for i in run]) if qs[run[0]] is not None else None
                if q is None:  # fused from the fp32 weights; pack() copies them
                    w = torch.cat([weights[names[i]].detach().float() for i in run])
                    q = QuantizedMatrix("f32", *w.shape, w)
                int8 = products and int8_activations(q, activations)
                parts.append(PackedMatrix(q.kind, q.rows, q.cols, int8, pack(q, int8)))
            return parts

        def pick(names: list[str], bias_names: list[str] | None = None) -> Matrix:
            parts = store.get("+".join(names), lambda: packed(names))
            bias = own(torch.cat([weights[n] for n in bias_names])) if bias_names else None
            chain, row = [], 0
            for m in parts:
                self._keep.append(m.data)
                kinds.add(m.kind)
                uses_int8.append(m.int8)
                part_bias = None if bias is None else bias[row:row + m.rows]
                chain.append(
                    Matrix(KINDS[m.kind], m.rows, m.cols, int(m.int8), _ptr(m.data),
                           _ptr(part_bias)))
                row += m.rows
            for a, b in itertools.pairwise(chain):
                a.next = ctypes.pointer(b)
            self._chains.append(chain)  # the parts after the first are pointed to, not copied
            return chain[0]

        layers = (Layer * cfg.num_layers)()
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            layers[i] = Layer(
                own(weights[p + "input_layernorm.weight"]).data_ptr(),
                own(weights[p + "post_attention_layernorm.weight"]).data_ptr(),
                pick([a + f"{x}_proj.weight" for x in "qkv"],
                     [a + f"{x}_proj.bias" for x in "qkv"] if cfg.attention_bias else None),
                pick([a + "o_proj.weight"]),
                pick([m + "gate_proj.weight", m + "up_proj.weight"]),
                pick([m + "down_proj.weight"]),
            )
        embed_name = "model.embed_tokens.weight"
        head = pick([embed_name if cfg.tie_word_embeddings else "lm_head.weight"])
        # Token rows come out of packed blocks where there are some (a tied head's; the checkpoint's
        # Q8_0 or Q4_1 table): the loader's fp32 table exactly, at a quarter of its bytes for Q8_0.
        # Else an fp32 table.
        embed, embed_blocks = None, Matrix()
        if cfg.tie_word_embeddings:
            embed_blocks = head
        elif weights_mode == "checkpoint" and embed_name in quantized:
            [m] = store.get(embed_name, lambda: packed([embed_name], products=False))
            self._keep.append(m.data)
            embed_blocks = Matrix(KINDS[m.kind], m.rows, m.cols, 0, _ptr(m.data), None)
        else:
            # the one large tensor not copied: an fp32 table is read where it lies (the torch
            # model's too)
            embed = own(weights[embed_name], copy=False)
        rope = own(rope_table(cfg.head_dim, cfg.rope_theta, cfg.max_position_embeddings),
                   copy=False)
        norm = own(weights["model.norm.weight"])
        self._layers = layers
        self.model = Model(
            cfg.num_layers,
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.vocab_size,
            block_size,
            cfg.max_position_embeddings,
            0,
            0,
            cfg.rms_norm_eps,
            cfg.head_dim**-0.5,
            _ptr(embed),
            embed_blocks,
            norm.data_ptr(),
            rope.data_ptr(),
            layers,
            head,
        )
        # Everything resident for the kernel (a tensor shared with an fp32 torch model counts here
        # too).
        self.weight_bytes = sum(t.numel() * t.element_size()
                                for t in {t.data_ptr(): t
                                          for t in self._keep}.values())
        self.weight_kinds = sorted(kinds)  # e.g. ["f32", "q4_1", "q8_0"]
        self.activations = "int8" if any(uses_int8) else "fp32"  # what the products actually use
        self.vocab = cfg.vocab_size
        self._packing = store
        if keep_packing:
            store.save()
        if kv_cache is not None:
            self.attach_kv_cache(kv_cache)

    def keep_packing(self) -> None:
        """Write this kernel's packed matrices for the next start (if they were packed, not read
        back)."""
        self._packing.save()

    def attach_kv_cache(self, kv_cache: torch.Tensor) -> None:
        """The cache the forward pass reads and writes (the engine sizes it after the weights are
        resident)."""
        cfg = self.config
        if kv_cache.dtype not in KV_TYPES or kv_cache.device.type != "cpu":
            raise NativeKernelError(
                f"the native kernel needs a float32, bfloat16, float16 or int8 KV cache on the "
                f"CPU; got {kv_cache.dtype} on {kv_cache.device}")
        shape = (cfg.num_layers, 2, kv_cache.shape[2], self.block_size, cfg.num_kv_heads,
                 row_width(cfg.head_dim, kv_cache.dtype))
        if tuple(kv_cache.shape) != shape or not kv_cache.is_contiguous():
            raise NativeKernelError(
                f"KV cache of shape {tuple(kv_cache.shape)}, expected a contiguous {shape}")
        self.kv_cache = kv_cache
        self.model.num_kv_blocks, self.model.kv_type = kv_cache.shape[2], KV_TYPES[kv_cache.dtype]
        # Products that already round (int8 activations) over a bf16 cache: attention in bf16 too,
        # on AMX tiles (cpu/attention_amx.h) or AVX512-BF16 dot products (cpu/attention_bf16.h)
        # where the CPU has them and the plan chose it; fp32 otherwise (attention_kind says which).
        if self.attention == "bf16" and kv_cache.dtype != torch.bfloat16:
            raise NativeKernelError(
                f"the bf16 attention reads a bfloat16 KV cache; got {kv_cache.dtype}")
        self.model.attention = int(self.attention != "fp32" and self.activations == "int8" and
                                   kv_cache.dtype == torch.bfloat16 and cfg.head_dim in (64, 128))
        log.info("native kernel: %s activations, %s attention", self.activations,
                 self.attention_kind)

    @property
    def attention_kind(self) -> str:
        """What the attention computes in on this CPU: fp32, or bf16 on AMX tiles or AVX512-BF16 dot
        products."""
        kind = bf16_attention() if self.model.attention else None
        return f"bf16 ({kind})" if kind else "fp32"

    def forward(self, token_ids: list[list[int]], starts: list[int],
                block_tables: list[list[int]]) -> torch.Tensor:
        """Sequence i computes its new tokens token_ids[i] at positions starts[i], starts[i] + 1,
        ... (starts[i] = tokens already cached) over block_tables[i]. Returns fp32 logits
        [len(token_ids), vocab], each sequence's last new token's."""
        if self.kv_cache is None:
            raise RuntimeError("no KV cache attached (attach_kv_cache)")
        n = len(token_ids)
        width = max(len(t) for t in block_tables)
        tables = torch.zeros(n, width, dtype=torch.int32)
        for i, t in enumerate(block_tables):
            tables[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
        rows = torch.tensor([0, *itertools.accumulate(len(t) for t in token_ids)],
                            dtype=torch.int32)
        tokens = torch.tensor([t for ids in token_ids for t in ids], dtype=torch.int64)
        start = torch.tensor(starts, dtype=torch.int64)
        logits = torch.empty(n, self.vocab)
        rc = self.lib.wp_forward(ctypes.byref(self.model), n, rows.data_ptr(), tokens.data_ptr(),
                                 start.data_ptr(), tables.data_ptr(),
                                 width, self.kv_cache.data_ptr(), logits.data_ptr(),
                                 torch.get_num_threads())
        if rc != 0:
            raise MemoryError("the native forward pass could not allocate its work buffers")
        return logits
