"""FIM templates detected from a tokenizer's special tokens; the prefix-only suffix cut; chat templates."""

import pytest
from tiny_model import CHAT_TEMPLATE, tiny_tokenizer
from tokenizers import AddedToken

from warmpath.models.tokenizer import Tokenizer
from warmpath.server.prompts import SuffixCutter, detect_fim, render_chat


def tokenizer_with(*special: str) -> Tokenizer:
    backend = tiny_tokenizer()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    ids = {t: backend.token_to_id(t) for t in special}
    return Tokenizer(backend, eos_token_id=2, chat_template=CHAT_TEMPLATE, special_tokens=ids)


@pytest.mark.parametrize("tokens,name,expected", [
    (("<fim_prefix>", "<fim_suffix>", "<fim_middle>"), "starcoder", "<fim_prefix>P<fim_suffix>S<fim_middle>"),
    (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"), "qwen2.5-coder",
     "<|fim_prefix|>P<|fim_suffix|>S<|fim_middle|>"),
    (("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"), "deepseek-coder",
     "<｜fim▁begin｜>P<｜fim▁hole｜>S<｜fim▁end｜>"),
    (("[SUFFIX]", "[PREFIX]"), "codestral", "[SUFFIX]S[PREFIX]P"),
])
def test_fim_family_detected_and_built(tokens, name, expected):
    tok = tokenizer_with(*tokens)
    fim = detect_fim(tok)
    assert fim.name == name and fim.build("P", "S") == expected
    ids = tok.encode(fim.build("P", "S"))
    assert all(tok.token_to_id(t) in ids for t in tokens)  # the markers are single special tokens


def test_no_fim_tokens_means_prefix_only():
    assert detect_fim(tokenizer_with()) is None


def test_suffix_cutter_stops_where_the_suffix_repeats():
    cut = SuffixCutter("\n    return total\n\nprint(f())\n")
    streamed = "".join(cut.feed(d) for d in ["    total = ", "0\n    for x in xs:\n", "        total += x\n",
                                             "    return to", "tal\n", "print(1)\n"])
    assert streamed + cut.feed("", final=True) == "    total = 0\n    for x in xs:\n        total += x\n"
    assert cut.cut
    keep = SuffixCutter("")  # no suffix line: nothing is held or cut
    assert keep.feed("a\nb") == "a\nb"
    tail = SuffixCutter("x = 1\n")
    assert tail.feed("y = 2\nx = 1") == "y = 2\n" and tail.feed("", final=True) == "" and tail.cut


def test_chat_template_renders_with_generation_prompt():
    text = render_chat(tokenizer_with(), [{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    no_template = tokenizer_with()
    no_template.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        render_chat(no_template, [{"role": "user", "content": "hi"}])
