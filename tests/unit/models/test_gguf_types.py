"""Every GGUF tensor type people download: decoded bit for bit as `gguf.quants.dequantize` decodes
it; the test fixtures' own K-quant encoder checked against that reader; tiny llama / qwen2 files
holding every type load to the reference weights and compute transformers' logits; the native
kernel's converted blocks."""

import warnings

import numpy as np
import pytest
import torch
import transformers
from gguf import GGML_QUANT_SIZES, GGUFReader
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from kquants import QUANTIZERS
from test_hf_loader import all_position_logits
from tiny_gguf import EVERY_TYPE, QWEN_VOCAB, every_type, q4_k_m, uniform, write_gguf

from warmpath import LLM
from warmpath.engine.runner import ModelRunner, SeqInput
from warmpath.kernels.native import NativeForward
from warmpath.models.ggml_blocks import BLOCK_TYPES, dequantize, raw_blocks
from warmpath.models.gguf_file import read_gguf
from warmpath.models.gguf_meta import read_config
from warmpath.models.kernel_blocks import convert, for_fp32_activations, kernel_kind, kernel_kinds
from warmpath.models.kv_cache import allocate_kv_cache
from warmpath.models.llama import LlamaForCausalLM
from warmpath.models.loader import load_checkpoint

PROMPT = ("def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n"
          "    return total / len(xs)  # ünï\n")


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(
        np.asarray(a, np.float32).view(np.uint32),
        np.asarray(b, np.float32).view(np.uint32))


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def every_type_file(request, tmp_path_factory):
    return write_gguf(
        tmp_path_factory.mktemp("gguf") / f"tiny-{request.param}.gguf", request.param, every_type)


@pytest.mark.parametrize("name", sorted(QUANTIZERS))
def test_fixture_quantizer_round_trips_through_gguf(name):
    """The fixtures' K-quant bytes stand for the values the encoder says (gguf reads the same bits),
    near x."""
    x = np.random.default_rng(1).normal(size=(6, 512)).astype(np.float32)
    raw, values = QUANTIZERS[name](x)
    qtype = Q[name]
    assert raw.shape == (12, GGML_QUANT_SIZES[qtype][1])
    assert same_bits(gguf_dequantize(raw, qtype).reshape(-1), values)
    assert same_bits(dequantize(raw, qtype).numpy(), values)
    rms = {"Q2_K": 0.4, "Q3_K": 0.2, "Q4_K": 0.1, "Q5_K": 0.05, "Q6_K": 0.025}[name]
    assert np.sqrt(np.mean((values - x.reshape(-1)) ** 2)) < rms


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda q: q.name)
def test_any_bytes_decode_as_gguf_decodes_them(qtype):
    """Random bytes in every field (every scale and bit pattern; NaN fp16 scales decode to NaN in
    both)."""
    raw = np.random.default_rng(int(qtype)).integers(0, 256, size=(40, GGML_QUANT_SIZES[qtype][1]),
                                                     dtype=np.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # inf * 0 in gguf's numpy
        ref = np.asarray(gguf_dequantize(raw, qtype), np.float32).reshape(-1)
    ours = dequantize(raw, qtype).numpy()
    nan = np.isnan(ref)
    assert np.array_equal(nan, np.isnan(ours)) and same_bits(ours[~nan], ref[~nan])


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0],
                         ids=lambda q: q.name)
def test_gguf_quantized_tensors_decode_as_gguf_decodes_them(qtype):
    x = np.random.default_rng(0).normal(size=(48, 64)).astype(np.float32)
    raw = gguf_quantize(x, qtype)
    assert same_bits(dequantize(raw, qtype).numpy(), gguf_dequantize(raw, qtype).reshape(-1))


def test_every_type_loads_to_the_reference_weights(every_type_file):
    path, decoded, cfg = every_type_file
    ckpt = load_checkpoint(str(path), torch.float32)
    assert set(ckpt.tensor_types) >= {q.name for q in EVERY_TYPE}
    assert set(ckpt.weights) == set(decoded)
    for name, w in decoded.items():
        assert torch.equal(ckpt.weights[name], w), name
    c = ckpt.config
    assert (c.architecture, c.hidden_size, c.num_layers, c.head_dim) == (cfg["model_type"], 256, 2,
                                                                         64)
    assert (c.rope_theta, c.max_position_embeddings) == (cfg["rope_theta"], 1024)
    assert c.rms_norm_eps == pytest.approx(cfg["rms_norm_eps"])
    assert c.attention_bias == (c.architecture == "qwen2")
    assert c.tie_word_embeddings == (c.architecture == "llama")  # qwen2: an untied output.weight


def test_logits_equal_transformers_on_the_same_file(every_type_file):
    """transformers reads the same GGUF (its own loader, gguf's dequantization): fp32 logits at
    every position."""
    path, _, _ = every_type_file
    llm = LLM(str(path), dtype="float32", kernel="torch", num_kv_blocks=32)
    ids = llm.get_tokenizer().encode(PROMPT)
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                                  dtype=torch.float32).eval()
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(all_position_logits(llm, ids), ref, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda q: q.name)
def test_kernel_blocks_of_each_type(qtype):
    """Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q5_K / Q6_K kept as the file has them, the rest
    requantized to Q8_0 within half a step (and the step's own fp16 rounding, up to 127 * 2^-11 of a
    step). For fp32 activations (Q4_1 / Q8_0 products only): Q4_0 -> Q4_1 and Q5_0 -> Q8_0 exact,
    Q4_K -> Q4_1 to fp16 scales, Q5_K / Q6_K requantized."""
    x = np.random.default_rng(3).normal(size=(16, 512)).astype(np.float32) * 0.05
    raw = QUANTIZERS[qtype.name](x)[0] if qtype.name in QUANTIZERS else gguf_quantize(x, qtype)
    values = dequantize(raw, qtype)
    q = convert(raw_blocks(raw, qtype), qtype, lambda: values, 16, 512, kernel_kind(qtype))
    assert q.kind == kernel_kind(qtype) and q.data.dtype == torch.uint8 and q.rows == 16
    if qtype in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K):
        assert q.kind == qtype.name.lower() and torch.equal(q.data.reshape(-1),
                                                            raw_blocks(raw, qtype).reshape(-1))
    fp32 = for_fp32_activations(q)
    assert fp32.kind in ("q4_1", "q8_0")
    for m in (q, fp32):
        got, exact = m.dequantize().reshape(-1), values
        if qtype in (Q.Q4_0, Q.Q4_1, Q.Q5_0,
                     Q.Q8_0) or m is q and qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
            assert torch.equal(got, exact)
        elif qtype == Q.Q4_K:
            assert not torch.equal(got, exact) and (got -
                                                    exact).abs().max() < 2e-3 * exact.abs().max()
        else:
            step = exact.reshape(-1, 32).abs().amax(1, keepdim=True) / 127
            assert ((got - exact).reshape(-1, 32).abs() <= step * (0.5 + 127 * 2**-11)).all()


def test_a_fused_group_of_mixed_types_keeps_each_members_kind():
    """Q4_K_M's Q4_K q/k beside a Q6_K v: each read as the file has it (the kernel chains the
    parts)."""
    p = "model.layers.0."
    kinds = kernel_kinds({
        p + "self_attn.q_proj.weight": Q.Q4_K, p + "self_attn.k_proj.weight": Q.Q4_K,
        p + "self_attn.v_proj.weight": Q.Q6_K, "model.layers.1.self_attn.q_proj.weight": Q.F16
    })
    assert [kinds[p + f"self_attn.{x}_proj.weight"] for x in "qkv"] == ["q4_k", "q4_k", "q6_k"]
    assert kinds["model.layers.1.self_attn.q_proj.weight"] is None


@pytest.mark.parametrize("rule", ["every_type", "q4_k_m"])
def test_native_kernel_reads_blocks_for_every_type(tmp_path, rule):
    """With fp32 activations the kernel computes K-quant files over Q4_1 / Q8_0 blocks (fp32 only
    for F16/BF16 matrices; int8 activations read the file's own:
    test_int8_products_over_the_files_own_k_quant_blocks): the logits of the torch model over those
    blocks' values, to summation order, and its greedy tokens. (Their distance to the file's exact
    values is per matrix, test_kernel_blocks_of_each_type; on real code,
    benchmarks/kquant_models.py: a tiny random model amplifies any change chaotically, so it says
    nothing about agreement.)"""
    types = every_type if rule == "every_type" else q4_k_m(4)
    path, _, _ = write_gguf(tmp_path / f"{rule}.gguf", "qwen2", types, QWEN_VOCAB,
                            num_layers=2 if rule == "every_type" else 4)
    ckpt = load_checkpoint(str(path), torch.float32)
    cfg = ckpt.config
    kv = allocate_kv_cache(cfg, 32, 16, torch.float32, "cpu")
    kernel = NativeForward(cfg, ckpt.weights, ckpt.quantized, kv, 16)
    assert kernel.weight_kinds == (["f32", "q4_1", "q8_0"]
                                   if rule == "every_type" else ["q4_1", "q8_0"])
    # fp32 activations: the matrices' file kinds as Q4_1 / Q8_0 (for_fp32_activations); token rows
    # read exactly
    as_read = {
        **ckpt.weights, **{
            n: for_fp32_activations(q).dequantize()
            for n, q in ckpt.quantized.items() if n != "model.embed_tokens.weight"
        }
    }
    runner = ModelRunner(LlamaForCausalLM.from_weights(cfg, as_read, torch.float32, "cpu"), kv, 16)
    tok = ckpt.tokenizer
    prompts = [tok.encode(PROMPT), tok.encode("import os\nprint(os.getcwd())\n")]
    tables = [[0, 1, 2, 3, 4, 5], [10, 11]]
    got = kernel.forward(prompts, [0, 0], tables)
    ref = runner.forward([SeqInput(ids, 0, t) for ids, t in zip(prompts, tables, strict=True)])
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())
    assert got.argmax(-1).tolist() == ref.argmax(-1).tolist()


@pytest.mark.parametrize(("activations", "kind"), [("fp32", "q8_0"), ("int8", "q6_k")])
def test_a_uniform_q6_k_file_is_counted_by_the_footprint(tmp_path, activations, kind):
    from warmpath.models.footprint import native_weight_bytes

    path, _, _ = write_gguf(tmp_path / "q6k.gguf", "qwen2", uniform(Q.Q6_K), QWEN_VOCAB)
    llm = LLM(str(path), dtype="float32", kernel="native", num_kv_blocks=8,
              kernel_activations=activations)
    assert llm.engine.runner.native.weight_kinds == [kind]
    # the token table is read row by row in the file's blocks, whatever the activations
    assert llm.engine.runner.native.weight_bytes == native_weight_bytes(
        llm.model_config, kind, "q6_k")


@pytest.mark.parametrize(
    ("rule", "kinds"),
    [("q4_k_m", ["q4_k", "q6_k"]),
     ("every_type", ["f32", "q4_0", "q4_1", "q4_k", "q5_0", "q5_k", "q6_k", "q8_0"])])
def test_int8_products_over_the_files_own_blocks(tmp_path, rule, kinds):
    """Int8 activations multiply a file's blocks as it has them (Q5_1 / Q2_K / Q3_K as Q8_0, F16 /
    BF16 as fp32), a fused q|k|v of Q4_K and Q6_K as a chain of parts: logits near the exact
    weights' (only the activations' rounding differs), and a sequence's logits the same bit for bit
    alone or beside another (other tiles)."""
    types = every_type if rule == "every_type" else q4_k_m(4)
    path, _, _ = write_gguf(tmp_path / "m.gguf", "qwen2", types, QWEN_VOCAB, num_layers=4)
    ckpt = load_checkpoint(str(path), torch.float32)
    cfg = ckpt.config
    kv = allocate_kv_cache(cfg, 32, 16, torch.float32, "cpu")
    kernel = NativeForward(cfg, ckpt.weights, ckpt.quantized, kv, 16, activations="int8")
    assert kernel.weight_kinds == kinds and kernel.activations == "int8"
    runner = ModelRunner(LlamaForCausalLM.from_weights(cfg, ckpt.weights, torch.float32, "cpu"), kv,
                         16)
    tok = ckpt.tokenizer
    prompts = [tok.encode(PROMPT), tok.encode("import os\nprint(os.getcwd())\n")]
    tables = [[0, 1, 2, 3, 4, 5], [10, 11]]
    ref = runner.forward([SeqInput(ids, 0, t) for ids, t in zip(prompts, tables, strict=True)])
    kv.zero_()
    both = kernel.forward(prompts, [0, 0], tables)
    # a random 4-layer model amplifies the activations' rounding (Q4_1 / Q8_0 blocks of the same
    # values: 4.7%)
    assert not torch.equal(both, ref) and (both - ref).abs().max() < 0.1 * ref.abs().max()
    for i in (0, 1):
        kv.zero_()
        assert torch.equal(kernel.forward([prompts[i]], [0], [tables[i]])[0], both[i])


def test_rope_scaling_it_cannot_apply_is_refused(tmp_path):
    """DeepSeek-Coder's GGUFs carry linear RoPE scaling (x4): refused by name rather than computed
    wrong."""
    path, _, _ = write_gguf(tmp_path / "scaled.gguf", "llama", uniform(Q.Q8_0))
    reader = GGUFReader(path)
    assert read_config(read_gguf(path)).architecture == "llama"
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "meta.gguf"), "llama")
    for key, field in reader.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            w.add_key_value(key, field.contents(), field.types[0],
                            field.types[1] if len(field.types) > 1 else None)
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(4.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    with pytest.raises(ValueError, match="RoPE scaling 'linear' x4 is not supported"):
        read_config(read_gguf(tmp_path / "meta.gguf"))
