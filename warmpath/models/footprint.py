"""What a model takes in memory, from its shape alone (no torch): resident weights per backend, the
working buffers of the largest step, KV bytes, and the KV pool a memory budget leaves. The engine's
`memory_budget` and the simulator's profiles both count with these functions, so they agree on the
block count."""

from __future__ import annotations

import re

from warmpath.config import ModelConfig

BLOCK = 32  # values per quantized block along a row (GGUF's Q4_1 / Q8_0)
BLOCK_BYTES = {"q4_1": 20, "q8_0": 34}
# The blocks the kernel reads as the file has them: (values, bytes) of one GGUF block.
FILE_BLOCKS = {
    "q4_1": (32, 20), "q8_0": (32, 34), "q4_0": (32, 18), "q5_0": (32, 22), "q4_k": (256, 144),
    "q5_k": (256, 176), "q6_k": (256, 210)
}
GROUP = 8  # the native kernel packs output rows in groups of 8 (zero rows pad the last)
# Bytes of a packed group's 8 rows x 32 columns (kernels/cpu/matmul.h block_bytes): the file's
# bytes, but Q4_K's and Q5_K's scales and mins, 6-bit in the file, take a byte each in the kernel
# (Q4_K: 1184 bytes where the file has 1152).
PACKED_BYTES = {
    "q4_1": 160, "q8_0": 272, "q4_0": 144, "q5_0": 176, "q4_k": 148, "q5_k": 180, "q6_k": 210,
    "f32": 1024
}


def row_bytes(kind: str, cols: int) -> int:
    """Bytes of one row of cols values in the file's blocks of this kind."""
    values, size = FILE_BLOCKS[kind]
    return cols // values * size

UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
         "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(text: str | int) -> int:
    """'2GiB', '1.5 GB', '512MiB', '1073741824' -> bytes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in UNITS:
        raise ValueError(f"not a size: {text!r} (e.g. 2GiB, 1.5GB, 512MiB or a number of bytes)")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


def num_params(m: ModelConfig) -> int:
    """Parameters of the torch model (a tied head shares the embedding's)."""
    q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    layer = m.hidden_size * (q +
                             2 * kv) + q * m.hidden_size + 3 * m.hidden_size * m.intermediate_size
    layer += 2 * m.hidden_size + ((q + 2 * kv) if m.attention_bias else 0)
    head = 0 if m.tie_word_embeddings else m.vocab_size * m.hidden_size
    return m.vocab_size * m.hidden_size + m.num_layers * layer + m.hidden_size + head


def _packed(rows: int, cols: int, kind: str) -> int:
    return -(-rows // GROUP) * (cols // BLOCK) * PACKED_BYTES[kind]


def native_weight_bytes(m: ModelConfig, matrix_kind: str, embed_kind: str) -> int:
    """What the native kernel keeps (kernels/native.py NativeForward): each layer's fused q|k|v, o,
    gate|up and down matrices packed in the checkpoint's blocks (matrix_kind), the head in the
    embedding's blocks when tied (embed_kind), fp32 norms, biases and the RoPE table."""
    q, kv, h, i = (m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim, m.hidden_size,
                   m.intermediate_size)
    layer = (_packed(q + 2 * kv, h, matrix_kind) + _packed(h, q, matrix_kind) +
             _packed(2 * i, h, matrix_kind) + _packed(h, i, matrix_kind) + 4 *
             (2 * h + ((q + 2 * kv) if m.attention_bias else 0)))
    if m.tie_word_embeddings:
        tables = _packed(m.vocab_size, h, embed_kind)
    else:  # an untied head in the matrices' blocks, the embedding in its own (or read as fp32 rows)
        tables = _packed(m.vocab_size, h, matrix_kind) + _packed(m.vocab_size, h, embed_kind)
    rope = 2 * m.max_position_embeddings * m.head_dim * 4
    return m.num_layers * layer + tables + 4 * h + rope


def weight_bytes(m: ModelConfig, backends: list[str], matrix_kind: str = "q4_1",
                 embed_kind: str = "q8_0") -> int:
    """Resident weights of a plan's backends (engine/plan.py names): a torch model in its dtype, the
    native kernel's packed blocks."""
    total = 0
    for b in backends:
        if b.startswith("native-"):
            total += native_weight_bytes(m, matrix_kind, embed_kind)
        elif b in ("torch-fp32", "torch-bf16"):
            total += num_params(m) * (4 if b == "torch-fp32" else 2)
        else:
            raise ValueError(f"unknown backend {b!r}")
    return total


def working_bytes(m: ModelConfig, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """The fp32 activations of the largest step (every row's hidden states, q|k|v, attention output
    and MLP, as the native kernel allocates them, and one logits row per sequence): reserved beside
    weights and KV."""
    q, kv, h, i = (m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim, m.hidden_size,
                   m.intermediate_size)
    per_row = 2 * h + (q + 2 * kv) + q + 3 * i
    return 4 * (max_num_batched_tokens * per_row + max_num_seqs * (h + m.vocab_size))


def kv_pool_blocks(budget: int, weights: int, working: int, kv_bytes_per_block: int) -> int:
    """Blocks of the KV pool: what the budget leaves after resident weights and working buffers."""
    free = budget - weights - working
    if free < kv_bytes_per_block:
        raise ValueError(
            f"a memory budget of {budget / 2**20:.0f} MiB leaves no room for the KV cache: weights "
            "take "
            f"{weights / 2**20:.0f} MiB and working buffers {working / 2**20:.0f} MiB")
    return free // kv_bytes_per_block
