"""K-quant GGUF files on the native kernel: what converting them to the kernel's blocks costs in
greedy agreement and memory, and what they decode at, beside the same model as Q8_0.

    python benchmarks/kquant_models.py [--prompts 16] [--tokens 32] [--decode 64]

1. Agreement: the bundled SmolLM2-135M re-encoded Q4_K_M-style (llama.cpp's mix with its fallbacks
   for rows that are not a multiple of 256, as a real Qwen2.5-Coder-0.5B Q4_K_M has: 576-wide rows
   go Q5_0 / Q8_0, the 1536-wide ffn_down Q4_K / Q6_K), with tests/kquants.py's encoder. Reference:
   the exact fp32 model of that same file (torch); measured: the native kernel over the converted
   blocks (fp32 activations), greedy, real code.
2. Speed: a random 16-layer model with 256-multiple rows (hidden 1024, intermediate 2816, ~210 M
   parameters), as Q4_K_M (mostly Q4_K -> Q4_1) and as Q8_0: decode tokens/s of one sequence, int8
   activations (the serving configuration), one run each.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import gguf
import numpy as np
from common import code_windows, machine, write_json
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType
from gguf.quants import quantize

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from kquants import QUANTIZERS  # noqa: E402

from warmpath import LLM, SamplingParams  # noqa: E402
from warmpath.models.ggml_blocks import dequantize  # noqa: E402
from warmpath.models.registry import resolve_model  # noqa: E402


def q4_k_m_type(name: str, cols: int, layer: int, n_layers: int) -> Q:
    """llama.cpp's Q4_K_M choice for one tensor, with its fallbacks where a row is not a multiple of
    256."""
    more = layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2
    want = Q.Q6_K if name in ("output", "token_embd_tied") or (name in ("attn_v", "ffn_down") and
                                                               more) else Q.Q4_K
    if cols % 256:
        return Q.Q8_0 if want == Q.Q6_K else Q.Q5_0
    return want


def encode(arr: np.ndarray, qtype: Q) -> np.ndarray:
    if qtype == Q.F32:
        return arr
    if qtype.name in QUANTIZERS:
        return QUANTIZERS[qtype.name](arr)[0].reshape(arr.shape[0], -1)
    return quantize(arr, qtype)


def copy_metadata(reader: GGUFReader, w: gguf.GGUFWriter) -> None:
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), vtype, sub)


def reencode(src: Path, dst: Path, rule) -> dict[str, int]:
    """src's tensors, exactly dequantized, re-encoded per rule(gguf name kind, cols, layer) into
    dst."""
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    n_layers = int(reader.fields[f"{arch}.block_count"].contents())
    tied = "output.weight" not in {t.name for t in reader.tensors}
    w = gguf.GGUFWriter(str(dst), arch)
    copy_metadata(reader, w)
    counts: dict[str, int] = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        arr = dequantize(np.asarray(t.data), t.tensor_type).numpy().reshape(shape)
        parts = t.name.split(".")
        kind = parts[2] if parts[0] == "blk" else parts[0]
        if kind == "token_embd" and tied:
            kind = "token_embd_tied"  # llama.cpp quantizes a tied head's table as the head
        layer = int(parts[1]) if parts[0] == "blk" else -1
        qtype = rule(kind, shape[-1], layer, n_layers) if len(shape) == 2 else Q.F32
        raw = encode(arr, qtype)
        w.add_tensor(t.name, raw, raw_dtype=None if qtype == Q.F32 else qtype)
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return counts


def agreement(path: Path, prompts: int, tokens: int) -> dict:
    exact = LLM(str(path), dtype="float32", kernel="torch", num_kv_blocks=256)
    fast = LLM(str(path), dtype="float32", kernel="native", kernel_activations="fp32",
               num_kv_blocks=256)
    windows = code_windows(exact.get_tokenizer(), 96, prompts)
    sp = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    ref = exact.generate([{"prompt_token_ids": w} for w in windows], sp)
    got = fast.generate([{"prompt_token_ids": w} for w in windows], sp)
    prefix = []
    for r, g in zip(ref, got, strict=True):
        n = next(
            (i for i, (a, b) in enumerate(zip(r.token_ids, g.token_ids, strict=True)) if a != b),
            tokens)
        prefix.append(n)
    native = fast.engine.runner.native
    return {"prompts": prompts, "tokens": tokens, "identical": sum(p == tokens for p in prefix),
            "mean_identical_prefix": sum(prefix) / len(prefix), "kernel_kinds": native.weight_kinds,
            "kernel_weight_mb": native.weight_bytes / 1e6, "file_mb": path.stat().st_size / 1e6}


def medium_model(path: Path, qtype_rule) -> dict[str, int]:
    """A random 16-layer llama (hidden 1024, 8/2 heads of 128, intermediate 2816, vocab of
    SmolLM2's)."""
    src = resolve_model("smollm2")
    reader = GGUFReader(src)
    w = gguf.GGUFWriter(str(path), "llama")
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            vtype = field.types[0]
            w.add_key_value(key, field.contents(), vtype,
                            field.types[1] if vtype == GGUFValueType.ARRAY else None)
    h, inter, layers, heads, kv, hd = 1024, 2816, 16, 8, 2, 128
    vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    for add, v in ((w.add_block_count, layers), (w.add_context_length, 2048),
                   (w.add_embedding_length, h), (w.add_feed_forward_length, inter),
                   (w.add_head_count, heads), (w.add_head_count_kv, kv),
                   (w.add_rope_dimension_count, hd), (w.add_vocab_size, vocab)):
        add(v)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    rng = np.random.default_rng(0)
    counts: dict[str, int] = {}

    def put(name: str, rows: int, cols: int, kind: str, layer: int) -> None:
        arr = (rng.standard_normal((rows, cols), dtype=np.float32) * cols**-0.5).astype(np.float32)
        qtype = qtype_rule(kind, cols, layer, layers)
        w.add_tensor(name, encode(arr, qtype), raw_dtype=qtype)
        counts[qtype.name] = counts.get(qtype.name, 0) + 1

    put("token_embd.weight", vocab, h, "token_embd_tied", -1)
    w.add_tensor("output_norm.weight", np.ones(h, np.float32))
    for i in range(layers):
        for name, rows, cols in (("attn_q", heads * hd, h), ("attn_k", kv * hd, h),
                                 ("attn_v", kv * hd, h), ("attn_output", h, heads * hd),
                                 ("ffn_gate", inter, h), ("ffn_up", inter, h), ("ffn_down", h,
                                                                                inter)):
            put(f"blk.{i}.{name}.weight", rows, cols, name, i)
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(h, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(h, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return counts


def decode_speed(path: Path, n: int) -> dict:
    t0 = time.perf_counter()
    llm = LLM(str(path), dtype="float32", kernel="native", kernel_activations="int8",
              num_kv_blocks=64)
    load_s = time.perf_counter() - t0
    prompt = {"prompt_token_ids": code_windows(llm.get_tokenizer(), 32, 1)[0]}
    llm.generate(prompt, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))  # warm
    t0 = time.perf_counter()
    llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    llm.generate(prompt, SamplingParams(max_tokens=n + 1, temperature=0, ignore_eos=True))
    total = time.perf_counter() - t0
    native = llm.engine.runner.native
    return {
        "decode_tok_s": n / (total - first), "load_s": load_s, "kernel_kinds": native.weight_kinds,
        "kernel_weight_mb": native.weight_bytes / 1e6, "file_mb": path.stat().st_size / 1e6
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--dir", default="/tmp/warmpath-kquant")
    ap.add_argument("--json", default="benchmarks/results/kquant_models.json")
    args = ap.parse_args()
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"machine": machine()}
    small = out / "smollm2-q4_k_m.gguf"
    result["smollm2_q4_k_m_types"] = reencode(resolve_model("smollm2"), small, q4_k_m_type)
    result["agreement"] = agreement(small, args.prompts, args.tokens)
    print("agreement", result["agreement"], result["smollm2_q4_k_m_types"], flush=True)
    for name, rule in (("q4_k_m", q4_k_m_type), ("q8_0", lambda *a: Q.Q8_0)):
        path = out / f"medium-{name}.gguf"
        types = medium_model(path, rule)
        result[f"medium_{name}"] = {"types": types, **decode_speed(path, args.decode)}
        print(name, result[f"medium_{name}"], flush=True)
    write_json(args.json, result)


if __name__ == "__main__":
    main()
