"""FIM templates detected from a tokenizer's special tokens (api/fim.py); chat templates
(server/chat_template.py)."""

import pytest
from tiny_model import CHAT_TEMPLATE, tiny_tokenizer
from tokenizers import AddedToken

from warmpath.api.fim import (
    ContextFile,
    Fill,
    FimFormat,
    detect_fim,
    fim_stop_ids,
    repo_context,
    split_literal,
)
from warmpath.models.tokenizer import Tokenizer
from warmpath.server.chat_template import render_chat


def tokenizer_with(*special: str) -> Tokenizer:
    backend = tiny_tokenizer()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    ids = {t: backend.token_to_id(t) for t in special}
    return Tokenizer(backend, eos_token_id=2, chat_template=CHAT_TEMPLATE, special_tokens=ids)


@pytest.mark.parametrize("tokens,name,expected", [
    (("<fim_prefix>", "<fim_suffix>", "<fim_middle>"), "starcoder",
     "<fim_prefix>P<fim_suffix>S<fim_middle>"),
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


@pytest.mark.parametrize("prompt,family", [
    ("<fim_prefix>def f(x):\n    <fim_suffix>\n    return y<fim_middle>", "starcoder"),
    ("<|fim_prefix|>def f(x):\n    <|fim_suffix|>\n    return y<|fim_middle|>", "qwen2.5-coder"),
    ("<｜fim▁begin｜>def f(x):\n    <｜fim▁hole｜>\n    return y<｜fim▁end｜>", "deepseek-coder"),
    ("[SUFFIX]\n    return y[PREFIX]def f(x):\n    ", "codestral"),
])
def test_another_familys_markers_written_in_a_prompt_are_read_as_prefix_and_suffix(prompt, family):
    """Continue (provider: openai) renders a FIM layout as text for a model name it does not
    know."""
    assert split_literal(prompt, tokenizer_with()) == ("def f(x):\n    ", "\n    return y", family)


def test_literal_markers_are_left_alone_when_the_model_has_them_or_they_do_not_frame_the_prompt():
    starcoder = tokenizer_with("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
    assert split_literal("<fim_prefix>a<fim_suffix>b<fim_middle>", starcoder) is None
    assert split_literal("x = '<fim_prefix>a<fim_suffix>b<fim_middle>'", tokenizer_with()) is None
    assert split_literal("<fim_prefix>a<fim_suffix>b<fim_suffix>c<fim_middle>",
                         tokenizer_with()) is None


def test_no_fim_tokens_means_prefix_only():
    assert detect_fim(tokenizer_with()) is None


def test_chat_template_renders_with_generation_prompt():
    text = render_chat(tokenizer_with(), [{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    no_template = tokenizer_with()
    no_template.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        render_chat(no_template, [{"role": "user", "content": "hi"}])


QWEN_FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|repo_name|>",
            "<|file_sep|>")
STAR_FIM = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<fim_pad>", "<repo_name>",
            "<file_sep>")
FILES = [{"filename": "src/b.py", "text": "def b():\n    return 2\n"},
         {"filename": "src/a.py", "text": "A = 1"}]


def test_qwen_repo_context_before_the_prefix_sorted_and_stable():
    tok = tokenizer_with(*QWEN_FIM)
    fim = detect_fim(tok)
    ctx = repo_context(FILES, fim, repo="demo", current_file="src/main.py")
    assert ctx == (
        "<|repo_name|>demo\n<|file_sep|>src/a.py\nA = 1\n<|file_sep|>src/b.py\ndef b():\n    "
        "return 2\n"
        "<|file_sep|>src/main.py\n")
    assert repo_context(
        list(reversed(FILES)) + FILES[:1], fim, repo="demo", current_file="src/main.py") == ctx
    prompt = fim.build("x = ", "\n", ctx)
    assert prompt == ctx + "<|fim_prefix|>x = <|fim_suffix|>\n<|fim_middle|>"
    # The context's tokens are a prefix of the prompt's whatever the prefix: the prefix cache keeps
    # them.
    ctx_ids = tok.encode(ctx)
    for prefix in ("x = ", "\n\nx = 1", "  def"):
        assert tok.encode(fim.build(prefix, "\n", ctx))[: len(ctx_ids)] == ctx_ids
    assert repo_context([], fim, repo="demo") == ""


def test_starcoder2_repo_context_and_starcoder1_without_file_sep():
    fim = detect_fim(tokenizer_with(*STAR_FIM))
    assert repo_context(FILES[1:], fim, repo="demo", current_file="m.py") == (
        "<repo_name>demo<file_sep>src/a.py\nA = 1\n<file_sep>m.py\n")
    # no repo name: no header
    assert repo_context(FILES[1:], fim) == "<file_sep>src/a.py\nA = 1\n<file_sep>\n"
    v1 = detect_fim(tokenizer_with("<fim_prefix>", "<fim_suffix>", "<fim_middle>"))
    assert v1.name == "starcoder" and v1.file_sep is None
    assert repo_context(FILES[1:], v1, repo="demo") == "src/a.py\nA = 1\n"


def test_deepseek_context_inside_the_hole_file_and_stop_ids():
    tok = tokenizer_with("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>")
    fim = detect_fim(tok)
    built = fim.build("P", "S", repo_context(FILES[1:], fim))
    assert built == "<｜fim▁begin｜>src/a.py\nA = 1\nP<｜fim▁hole｜>S<｜fim▁end｜>"
    assert fim_stop_ids(tok, fim) == sorted(
        tok.token_to_id(t) for t in ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"))
    qwen = tokenizer_with(*QWEN_FIM)
    assert {qwen.id_to_token(i) for i in fim_stop_ids(qwen, detect_fim(qwen))} == {
        "<|endoftext|>", "<|im_start|>", "<|im_end|>", *QWEN_FIM}


@pytest.mark.parametrize("vocab,name,family", [
    (QWEN_FIM, "Qwen/Qwen2.5-Coder-0.5B-Instruct", "qwen2.5-coder"),
    (STAR_FIM, "bigcode/starcoder2-3b", "starcoder"),
    ((), "HuggingFaceTB/SmolLM2-135M-Instruct", None),  # a chat model: no FIM tokens
    # a FIM layout we do not write
    (("▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"), "codellama/CodeLlama-7b-hf", None),
])
def test_the_vocabulary_and_the_model_name_find_the_same_family(vocab, name, family):
    """One rule (api/fim.detect_fim): the server reads the vocabulary, the router and the simulator
    the name."""
    by_vocab, by_name = detect_fim(tokenizer_with(*vocab)), detect_fim(model=name)
    assert by_vocab == by_name and (by_name.name if by_name else None) == family


def test_a_models_fim_format_reads_literal_markers_keeps_the_suffixs_first_lines_hole_at_the_end():
    """FimFormat (api/fim.py): what the server renders beyond render() itself."""
    tok = tokenizer_with(*QWEN_FIM)
    qwen = FimFormat(detect_fim(tok), "cursor", suffix_tokens=2, count=lambda t: len(t.split()),
                     vocab=tok)
    starcoder = "<fim_prefix>def f(x):\n    <fim_suffix>\n    return y\n    pass\n<fim_middle>"
    r = qwen.render(Fill(starcoder))  # another family's markers, as text: read as prefix and suffix
    # 2 words kept
    assert r.text == "<|fim_prefix|>def f(x):\n    <|fim_suffix|>\n    return y\n<|fim_middle|>"
    # the scope reads the whole suffix
    assert r.cursor == ("def f(x):\n    ", "\n    return y\n    pass\n")
    assert r.fim_mode == "qwen2.5-coder; the prompt's starcoder markers read as prefix and suffix"
    files = Fill("x = ", extra=[ContextFile("a.py", "A = 1\n")])
    assert qwen.hole_at_end(files).suffix == "" and qwen.hole_at_end(Fill("x = ")).suffix is None
    assert FimFormat(None).hole_at_end(files).suffix is None  # no family: the prefix alone
