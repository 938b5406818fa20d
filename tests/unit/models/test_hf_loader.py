"""Our Llama/Qwen2 decoder over the paged cache matches transformers on the same HF checkpoint
(fp32)."""

import pytest
import torch
import transformers

from warmpath import LLM
from warmpath.engine.runner import SeqInput


def all_position_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    """Logits at every position of one prompt computed in one prefill."""
    bs = llm.config.block_size
    blocks = llm.engine.pool.allocate(-(-len(ids) // bs))
    try:
        x = llm.engine.runner.prepare([SeqInput(ids, 0, blocks)])
        return llm.engine.model(x.input_ids, x.positions, x.meta, llm.engine.runner.kv_cache,
                                torch.arange(len(ids)))
    finally:
        llm.engine.pool.free(blocks)


@pytest.mark.parametrize("fixture", ["tiny_llama_dir", "tiny_qwen2_dir"])
def test_logits_match_transformers(fixture, request):
    path = request.getfixturevalue(fixture)
    llm = LLM(str(path), dtype="float32", num_kv_blocks=64)
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = llm.get_tokenizer().encode("def f(x):\n    return x * 12345  # ünï\n")
    assert len(ids) > 20
    ours = all_position_logits(llm, ids)
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(ours, ref, atol=2e-4, rtol=1e-4)


def test_config_and_tokenizer_from_hf_dir(tiny_qwen2_dir):
    llm = LLM(str(tiny_qwen2_dir), dtype="float32", num_kv_blocks=8)
    cfg = llm.model_config
    assert (cfg.architecture, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads) == ("qwen2", 2, 4, 2)
    assert cfg.attention_bias and cfg.tie_word_embeddings
    tok = llm.get_tokenizer()
    assert tok.eos_token_id == tok.token_to_id("<|im_end|>")
    # digits one by one
    assert tok.encode("x = 123") == tok.encode("x = 1") + tok.encode("2") + tok.encode("3")
    assert tok.encode("<|im_start|>") == [tok.token_to_id("<|im_start|>")]
    assert tok.chat_template and "im_start" in tok.chat_template
