"""Named hardware profiles. Each coefficient says where it comes from.

- `cpu-smollm2`: the bundled SmolLM2-135M on this project's 2-core CPU, fp32. Step-time coefficients
  are fitted to the real engine by `warmpath simulate --calibrate` (saved under $WARMPATH_HOME/sim/
  and preferred when present); the defaults below are such a fit, measured on the machine named in
  CPU_SMOLLM2_MEASURED.
- `cpu-qwen2.5-coder-0.5b` / `-1.5b`: the Q4_K_M code models (`warmpath fetch-model`) on the same
  kind of 2-core CPU under the engine's default plan (the native kernel on the file's own blocks).
  Fitted and saved the same way (`--calibrate --profile NAME`); the built-in fits and resident
  weights were measured on CPU_QWEN_MEASURED.
- `h100-llama3-8b`: Llama-3-8B (bf16) on one H100 SXM, from datasheet figures and the model's shape,
  not measured here (no GPU was available): a paper profile for capacity questions at GPU scale.
"""

from __future__ import annotations

from warmpath.config import ModelConfig
from warmpath.models.footprint import weight_bytes, working_bytes
from warmpath.sim.cost import CostModel, Profile, calibration_meta, load_calibration

GIB = 1 << 30

SMOLLM2 = ModelConfig(architecture="llama", vocab_size=49152, hidden_size=576,
                      intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3,
                      head_dim=64, rope_theta=100000.0, max_position_embeddings=8192,
                      tie_word_embeddings=True)
QWEN25_CODER_05B = ModelConfig(architecture="qwen2", vocab_size=151936, hidden_size=896,
                               intermediate_size=4864, num_layers=24, num_heads=14, num_kv_heads=2,
                               head_dim=64, rope_theta=1e6, max_position_embeddings=32768,
                               attention_bias=True)
QWEN25_CODER_15B = ModelConfig(architecture="qwen2", vocab_size=151936, hidden_size=1536,
                               intermediate_size=8960, num_layers=28, num_heads=12, num_kv_heads=2,
                               head_dim=128, rope_theta=1e6, max_position_embeddings=32768,
                               attention_bias=True)
LLAMA3_8B = ModelConfig(architecture="llama", vocab_size=128256, hidden_size=4096,
                        intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8,
                        head_dim=128, rope_theta=500000.0, max_position_embeddings=131072)

# The built-in fit: `warmpath simulate --calibrate` (synthetic steps plus the steps of a real editor
# trace) on the machine below; the command prints the fit's errors, and benchmarks/sim_validation.py
# checks the simulator against the real engine (benchmarks/results/sim_validation.json).
CPU_SMOLLM2_MEASURED = "2-core AMD EPYC (AVX2), torch 2.13.0 CPU, fp32, 2026-11-30"
CPU_SMOLLM2_FP32 = CostModel(base=0.0679, per_token=0.00150, prefill_attention=9.20e-7, per_seq=0.0,
                             kv_read=1.33e-5, per_chunk=0.0248)


def _cpu_smollm2() -> Profile:
    fp32 = load_calibration("cpu-smollm2") or CPU_SMOLLM2_FP32
    # int8 weights (the native kernel's Q4_1 / Q8_0 blocks): a weight pass of a quarter of the
    # bytes, assumed to halve the fixed per-step cost. bf16: the fp32 fit stands in (no bf16 fit
    # yet). Estimates for what-if sweeps, not measurements; the memory accounting is the engine's
    # own.
    int8 = CostModel(fp32.base * 0.5, fp32.per_token, fp32.prefill_attention, fp32.per_seq,
                     fp32.kv_read, fp32.per_chunk)
    backends = {"float32": "torch-fp32", "bfloat16": "torch-bf16", "int8": "native-int8"}
    return Profile(
        name="cpu-smollm2",
        model=SMOLLM2,
        weight_bytes={d: weight_bytes(SMOLLM2, [b])
                      for d, b in backends.items()},
        kv_dtype="bfloat16",  # under a plan every backend shares one bf16 KV cache
        memory_bytes=int(1.5 * GIB),
        cost={"float32": fp32, "bfloat16": fp32, "int8": int8},
        default_dtype="float32",
        max_num_batched_tokens=512,
        working_bytes=working_bytes(SMOLLM2, 512, 64),
        model_spec="smollm2",
        calibrate_dtype="float32",
        sources={
            "model": "SmolLM2-135M-Instruct GGUF metadata; the bundled file's Q4_1 matrices and "
            "Q8_0 embedding", "cost": "fitted to the real engine" +
            ("" if load_calibration("cpu-smollm2") else f" on {CPU_SMOLLM2_MEASURED} (built-in)"),
            "memory": "a 1.5 GiB memory budget (weights + working buffers + bf16 KV), counted as "
                      "the engine's "
            "--memory-budget counts (models/footprint.py)"
        })


CPU_QWEN_MEASURED = "2-core AMD EPYC (AVX2), torch 2.13.0 CPU, the default plan, 2026-12-04"
# name: (registry model, its shape, the built-in fit, resident weights in bytes), both measured on
# CPU_QWEN_MEASURED
CPU_QWEN = {
    "cpu-qwen2.5-coder-0.5b": ("qwen2.5-coder-0.5b", QWEN25_CODER_05B,
                               CostModel(base=0.0179, per_token=0.00511, prefill_attention=9.45e-7,
                                         per_seq=0.0, kv_read=2.26e-6), 503_046_656),
    "cpu-qwen2.5-coder-1.5b": ("qwen2.5-coder-1.5b", QWEN25_CODER_15B,
                               CostModel(base=0.0510, per_token=0.01564, prefill_attention=1.06e-6,
                                         per_seq=0.00326, kv_read=6.20e-6,
                                         per_chunk=0.00200), 1_165_946_368),
}
# the KV pool `warmpath serve` keeps by default (EngineConfig.kv_cache_memory)
KV_CACHE_BYTES = 1 << 30


def _cpu_qwen(name: str) -> Profile:
    spec, model, builtin, weights = CPU_QWEN[name]
    meta = calibration_meta(name)
    cost = load_calibration(name) or builtin
    weights = meta["weight_bytes"] if meta and meta.get("weight_bytes") else weights
    working = working_bytes(model, 512, 64)
    return Profile(
        name=name, model=model, weight_bytes={"q4_k_m": weights}, kv_dtype="bfloat16",
        memory_bytes=weights + working + KV_CACHE_BYTES, cost={"q4_k_m": cost},
        default_dtype="q4_k_m", max_num_batched_tokens=512, working_bytes=working, model_spec=spec,
        disk_read_bytes_per_s=(meta or {}).get("disk_read_bytes_per_s") or
        Profile.disk_read_bytes_per_s, sources={
            "model": f"{spec} Q4_K_M GGUF metadata", "cost": "fitted to the real engine" +
            ("" if meta else f" on {CPU_QWEN_MEASURED} (built-in)"),
            "memory": "resident weights (measured) + working buffers + the 1 GiB bf16 KV pool "
                      "`warmpath serve` "
            "keeps by default"
        })


def _h100_llama3_8b() -> Profile:
    # H100 SXM datasheet: HBM3 bandwidth, dense BF16 tensor FLOP/s
    hbm_bw, bf16_flops = 3.35e12, 989e12
    params = 8.03e9  # Llama-3-8B
    kv_bytes = LLAMA3_8B.kv_bytes_per_token("bfloat16")  # 131,072 bytes per token in bf16

    def cost(weight_bytes: float) -> CostModel:
        return CostModel(
            # one weight pass + ~1 ms launch/scheduling per step (CUDA graphs)
            base=weight_bytes / hbm_bw + 1e-3,
            per_token=2 * params / (bf16_flops * 0.5),  # 2 FLOPs per parameter per token at 50% MFU
            prefill_attention=4 * LLAMA3_8B.num_layers * LLAMA3_8B.num_heads * LLAMA3_8B.head_dim
            / (bf16_flops * 0.4),  # QK^T + PV FLOPs per (query, context) pair at 40% MFU
            per_seq=2e-5,  # sampling and bookkeeping per sequence (estimate)
            kv_read=kv_bytes / hbm_bw,  # each decode reads its K/V once
        )
    return Profile(
        name="h100-llama3-8b",
        model=LLAMA3_8B,
        weight_bytes={"bfloat16": int(2 * params), "int8": int(1.03 * params)},
        kv_dtype="bfloat16",
        memory_bytes=int(72 *
                         GIB),  # 80 GB HBM less ~8 GB activations, CUDA context and allocator slack
        cost={"bfloat16": cost(2 * params), "int8": cost(1.03 * params)},
        default_dtype="bfloat16",
        max_num_batched_tokens=2048,
        sources={
            "bandwidth": "H100 SXM datasheet: 3.35 TB/s HBM3",
            "compute": "H100 SXM datasheet: 989 TFLOP/s "
            "dense BF16; MFU 50% (matmuls) / 40% (attention) assumed",
            "model": "Llama-3-8B config: 32 "
            "layers, 32 heads, 8 KV heads, head_dim 128, 8.03B parameters",
            "memory": "80 GB less 8 GB "
            "reserved"
        })


PROFILES = {"cpu-smollm2": _cpu_smollm2, **{n: (lambda n=n: _cpu_qwen(n)) for n in CPU_QWEN},
            "h100-llama3-8b": _h100_llama3_8b}


def get_profile(name: str) -> Profile:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    return PROFILES[name]()
