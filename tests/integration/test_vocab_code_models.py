"""Code models' tokenizers against llama.cpp's own test vectors (vocab-only GGUFs of StarCoder,
DeepSeek-Coder, Qwen2, Llama 3, Refact, GPT-2 from the llama-cpp-python sdist): the same ids for
every case, FIM markers single special ids, the family's FIM template and stops found in the
vocabulary."""

import pytest
from llama_vocab import NAMES, fetch_vocabs, vocab_cases

from warmpath.api.fim import detect_fim, fim_stop_ids, repo_context
from warmpath.models.gguf_file import read_gguf
from warmpath.models.gguf_meta import read_tokenizer


@pytest.fixture(scope="module")
def vocabs():
    return fetch_vocabs()


def tokenizer(vocabs, name):
    return read_tokenizer(read_gguf(vocabs / f"ggml-vocab-{name}.gguf"))


@pytest.mark.parametrize("name", NAMES)
def test_ids_equal_llama_cpp_test_vectors(vocabs, name):
    tok = tokenizer(vocabs, name)
    cases = vocab_cases(vocabs, name)
    assert len(cases) >= 40
    # llama.cpp's test-tokenizer-0 tokenizes without BOS (add_special false)
    wrong = [(text, tok.encode(text, add_bos=False), ids) for text, ids in cases
             if tok.encode(text, add_bos=False) != ids]
    assert wrong == []


@pytest.mark.parametrize(("name", "family", "markers", "stops"), [
    ("starcoder", "starcoder",
     ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>", "<repo_name>"), {
         "<|endoftext|>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<fim_pad>", "<file_sep>",
         "<repo_name>"
     }),
    ("deepseek-coder", "deepseek-coder", ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
     {"<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", "<｜end▁of▁sentence｜>", "<|EOT|>"}),
])
def test_fim_markers_are_single_ids(vocabs, name, family, markers, stops):
    tok = tokenizer(vocabs, name)
    fim = detect_fim(tok)
    assert fim is not None and fim.name == family
    for m in markers:
        assert tok.encode(m, add_bos=False) == [tok.token_to_id(m)], m
    assert {tok.id_to_token(i) for i in fim_stop_ids(tok, fim)} == stops
    prompt = fim.build("def f(x):\n    return ", "\n\nprint(f(2))\n",
                       repo_context([{"filename": "util.py", "text": "X = 1\n"}], fim, repo="demo"))
    ids = tok.encode(prompt, add_bos=False)
    assert all(ids.count(tok.token_to_id(m)) >= 1 for m in fim.tokens)
    # byte-exact round trip, markers included
    assert tok.decode(ids, skip_special_tokens=False) == prompt
    if fim.file_sep:  # StarCoder2: the repository context in its own markers
        assert ids.count(
            tok.token_to_id("<file_sep>")) == 2 and ids[0] == tok.token_to_id("<repo_name>")


def test_qwen2_vocabulary_has_no_fim_tokens_and_its_own_regex(vocabs):
    """This Qwen2 vocabulary predates Qwen2.5-Coder's FIM tokens (prefix-only there); its
    pre-tokenizer is qwen2's, not smollm's: digits one at a time but letters after a non-letter kept
    together (`_abc` is one piece)."""
    tok = tokenizer(vocabs, "qwen2")
    assert detect_fim(tok) is None
    pieces = [p for p, _ in tok.backend.pre_tokenizer.pre_tokenize_str("x_abc=123")]
    assert pieces == ["x", "_abc", "=", "1", "2", "3"]
