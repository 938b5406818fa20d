"""FIM end to end through `warmpath serve` and `warmpath route`, per family: tiny random models with
Qwen2.5-Coder's and StarCoder2's special tokens get the family's template (fim_mode), stop at the
family's markers with no marker in the text, and take repository context (`extra`) before the
prefix, from the prefix cache on the next keystroke.

To see a stop honoured, each model's head is edited so that greedy decoding emits the family's file
separator a few tokens in (its head row: twice the row of a token the model emits there)."""

import httpx
import pytest
from gguf import GGMLQuantizationType as Q
from server_harness import running_app, running_server
from tiny_gguf import QWEN_VOCAB, STARCODER_VOCAB, uniform, write_gguf

from warmpath import LLM, SamplingParams
from warmpath.api.fim import detect_fim, repo_context
from warmpath.config import EngineConfig, RouterConfig, ServerConfig
from warmpath.router.app import create_router_app

pytestmark = pytest.mark.server

PREFIX = "def area(w, h):\n    return "
SUFFIX = "\n\nprint(area(2, 3))\n"
EXTRA = [{
    "filename": "geometry/shapes.py", "text": "class Rect:\n    def __init__(self, w, h):\n"
    "        self.w, self.h = w, h\n" * 4
}, {
    "filename": "geometry/__init__.py",
    "text": "from geometry.shapes import Rect\n__all__ = ['Rect']\n"
}]
FAMILIES = {
    "qwen2.5-coder": (QWEN_VOCAB, "<|file_sep|>"), "starcoder": (STARCODER_VOCAB, "<file_sep>")
}


def engine_config(path) -> EngineConfig:
    return EngineConfig(model=str(path), dtype="float32", num_kv_blocks=128)


def greedy(path, ids, n=8) -> list[int]:
    llm = LLM(**vars(engine_config(path)))
    sp = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    return llm.generate({"prompt_token_ids": ids}, sp)[0].token_ids


def quiet_specials(w, tokens, vocab):
    """Zero head rows for the special tokens: a random model then never emits one by chance."""
    for t in vocab.tokens()[1]:
        w["lm_head.weight"][tokens.index(t)] = 0


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    """(name, model path, marker, FIM prompt ids, the tokens greedy decoding gives before the
    marker)."""
    name = request.param
    vocab, marker = FAMILIES[name]
    tmp = tmp_path_factory.mktemp(name)
    plain, _, _ = write_gguf(tmp / "plain.gguf", "qwen2", uniform(Q.Q8_0), vocab,
                             edit=lambda w, tokens: quiet_specials(w, tokens, vocab))
    tok = LLM(**vars(engine_config(plain))).get_tokenizer()
    fim = detect_fim(tok)
    assert fim is not None and fim.name == name
    ids = tok.encode(fim.build(PREFIX, SUFFIX))
    base = greedy(plain, ids)
    mark = tok.token_to_id(marker)
    for step in range(2, 7):
        # the marker's head row := twice the row of the token emitted at `step`
        def edit(w, tokens, t=base[step]):
            quiet_specials(w, tokens, vocab)
            w["lm_head.weight"][mark] = 2 * w["lm_head.weight"][t]

        path, _, _ = write_gguf(tmp / f"marker{step}.gguf", "qwen2", uniform(Q.Q8_0), vocab,
                                edit=edit)
        out = greedy(path, ids)
        if mark in out and out.index(mark) >= 2:
            return name, path, marker, ids, out[: out.index(mark)]
    pytest.fail("no head edit made the model emit the marker")


def complete(url, **body) -> dict:
    r = httpx.post(f"{url}/v1/completions", json={"max_tokens": 8, "temperature": 0, **body},
                   timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def served(family):
    """The server, and the router in front of it; the plain (cursor) FIM layout, which the router
    also writes for a cursor inside a line: the anchored layout, the server's default, has its own
    test below."""
    with running_server(engine_config(family[1]), ServerConfig(fim_layout="cursor")) as (url, app):
        with running_app(create_router_app(RouterConfig(node=[url],
                                                        health_interval=0.2))) as (router_url, _):
            yield url, router_url, app.state.engine.tokenizer


@pytest.mark.parametrize("via", ["serve", "route"])
def test_the_family_template_and_its_stops(family, served, via):
    name, _, marker, ids, before = family
    url = served[0] if via == "serve" else served[1]
    tok = served[2]
    body = complete(url, prompt=PREFIX, suffix=SUFFIX)
    choice = body["choices"][0]
    assert body["fim_mode"] == name
    assert body["usage"]["prompt_tokens"] == len(ids)  # exactly the family's layout
    assert choice["finish_reason"] == "stop" and body["usage"]["completion_tokens"] == len(
        before) + 1
    assert choice["text"] == tok.decode(before, skip_special_tokens=True)
    # The same prompt as token ids is not a FIM request: the marker is no stop there, and never text
    # either.
    raw = complete(url, prompt=ids)
    assert "fim_mode" not in raw and raw["usage"]["completion_tokens"] > len(before) + 1
    assert raw["choices"][0]["text"].startswith(choice["text"])
    for text in (choice["text"], raw["choices"][0]["text"]):
        assert marker not in text and "<fim" not in text and "<|fim" not in text


@pytest.mark.parametrize("via", ["serve", "route"])
def test_repo_context_before_the_prefix_and_cached_on_the_next_keystroke(family, served, via):
    name = family[0]
    url, tok = (served[0] if via == "serve" else served[1]), served[2]
    fim = detect_fim(tok)
    context = repo_context(EXTRA, fim)
    assert context.count(fim.file_sep) == 3  # two files and the hole's own
    ctx_ids = tok.encode(context)
    assert len(ctx_ids) >= 64
    salt = f"{via}-{name}"  # a cache of its own: the other test's requests share nothing with it
    first = complete(url, prompt=PREFIX, suffix=SUFFIX, extra=EXTRA, cache_salt=salt)
    assert first["fim_mode"] == name
    assert first["usage"]["prompt_tokens"] == len(tok.encode(fim.build(PREFIX, SUFFIX, context)))
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # A keystroke later, the client sends its files in another order: the context is the same, from
    # the cache.
    nxt = complete(url, prompt=PREFIX + "w", suffix=SUFFIX, extra=EXTRA[::-1], cache_salt=salt)
    assert nxt["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(ctx_ids) // 16 * 16
    assert marker_free(nxt["choices"][0]["text"], fim)


def test_the_default_anchored_layout_heals_and_keeps_the_suffix_cached_along_the_line(family):
    """`warmpath serve`'s default: the prefix's last lines after the middle marker (api/fim.py
    anchor()), the prompt's last token given back and spelled by the completion (engine/healing.py);
    typing along the line leaves everything before the marker in the prefix cache."""
    with running_server(engine_config(family[1])) as (url, app):
        tok = app.state.engine.tokenizer
        fim = detect_fim(tok)
        prefix = "import math\n\n\n" + PREFIX
        first = complete(url, prompt=prefix, suffix=SUFFIX * 8)
        anchored = tok.encode(fim.build(prefix, SUFFIX * 8, layout="anchored"))
        # healed: its last token given back
        assert first["usage"]["prompt_tokens"] == len(anchored) - 1
        assert marker_free(first["choices"][0]["text"], fim)
        before_middle = tok.encode(
            fim.build(prefix, SUFFIX * 8, layout="anchored").split(fim.tokens[-1])[0])
        assert len(before_middle) >= 48
        typed = complete(url, prompt=prefix + "w * h", suffix=SUFFIX * 8)
        assert typed["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(
            before_middle) // 16 * 16


def marker_free(text: str, fim) -> bool:
    return not any(m in text for m in (*fim.tokens, *fim.stops))


def test_extra_needs_a_text_prompt(served):
    r = httpx.post(f"{served[0]}/v1/completions",
                   json={"prompt": [1, 2, 3], "extra": EXTRA, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "extra"


def test_models_lists_what_is_loaded(family, served):
    """/v1/models (server and router): architecture, quant mix, what the kernel reads, FIM template,
    context, KV."""
    for url in served[:2]:
        card = httpx.get(f"{url}/v1/models").json()["data"][0]
        assert card["architecture"] == "qwen2" and card["context_length"] == 1024
        # norms and biases; 14 matrices, embedding, head
        assert card["quantization"] == {"F32": 11, "Q8_0": 16}
        assert card["fim_template"] == family[0] and card["repo_context"] is True
        # layers, K and V, kv heads, head_dim, fp32
        assert card["kv_bytes_per_token"] == 2 * 2 * 2 * 64 * 4
        assert card["kernel_weights"] in (None, ["q8_0"])
