"""The one request value (api/ask.py): every protocol parses into an Ask, and the router's
translation of an editor protocol's Ask into an OpenAI request parses back into the same prompt and
sampling."""

import json

import pytest

from warmpath.api import infill, mistral, ollama, tabby
from warmpath.api.fim import ContextFile, Fill
from warmpath.api.protocol import ApiError, ChatRequest, CompletionRequest
from warmpath.router.translate import openai_request

BODIES = [
    (infill, {
        "input_prefix": "def f(x):\n    ", "input_suffix": "\n    return y\n", "prompt": "y = ",
        "input_extra": [{"filename": "a.py",
                         "text": "A = 1\n"}], "n_predict": 12, "top_k": 5, "seed": 3
    }),
    (ollama, {
        "model": "m", "prompt": "def f(x):\n    ", "suffix": "\n    return y\n",
        "options": {"num_predict": 9, "temperature": 0.1, "stop": ["\n\n"]}
    }),
    (mistral,
     {"model": "m", "prompt": "def f(x):\n    ", "suffix": "\n", "max_tokens": 7,
      "random_seed": 4}),
    (tabby, {
        "segments": {
            "prefix": "def f(x):\n    ", "suffix": "\n",
            "declarations": [{"filepath": "b.py", "body": "B = 2\n"}]
        }, "temperature": 0.2
    }),
]


@pytest.mark.parametrize("wire,body", BODIES, ids=lambda v: getattr(v, "NAME", ""))
def test_an_editor_ask_translated_for_an_openai_engine_reads_back_the_same(wire, body):
    ask = wire.parse(json.dumps(body).encode())
    assert ask.kind == wire.NAME and isinstance(ask.fill, Fill)
    path, openai = openai_request(ask, "m")
    assert path == "/v1/completions"
    back = CompletionRequest.model_validate(openai).ask()
    # the cursor's line (/infill's prompt) goes at the prefix's end: the same text before the hole
    assert back.fill.prefix == ask.fill.prefix + ask.fill.middle and back.fill.suffix == (
        ask.fill.suffix or None)
    assert list(back.fill.extra) == list(ask.fill.extra)
    for name in ("temperature", "top_p", "seed", "stop", "stream"):
        assert getattr(back, name) == getattr(ask, name), name
    assert back.max_tokens == ask.max_tokens


def test_openai_bodies_as_asks():
    ask = CompletionRequest.model_validate(
        {"prompt": "x = ", "suffix": "", "extra": [{"filename": "a.py", "text": "A = 1"}]}).ask()
    assert ask.fill == Fill("x = ", None, extra=[ContextFile("a.py", "A = 1")])  # "" is no suffix
    assert ask.temperature is None and ask.exact_max_tokens and ask.max_tokens == 16
    ids = CompletionRequest.model_validate({"prompt": [1, 2, 3], "echo": True}).ask()
    assert ids.token_ids == [1, 2, 3] and ids.fill is None and ids.echo
    with pytest.raises(ApiError, match="need a text prompt"):
        CompletionRequest.model_validate({"prompt": [1, 2], "suffix": "s"})
    chat = ChatRequest.model_validate({
        "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5, "stream": True,
        "stream_options": {"include_usage": True}
    }).ask()
    assert chat.kind == "chat" and chat.messages == [{"role": "user", "content": "hi"}]
    assert chat.max_tokens == 5 and chat.include_usage and chat.fill is None


def test_ollamas_templated_generate_goes_as_a_chat():
    ask = ollama.parse(json.dumps({"model": "m", "prompt": "hi", "system": "be brief"}).encode())
    assert ask.chat and ask.system == "be brief"
    path, body = openai_request(ask, "m")
    assert path == "/v1/chat/completions"
    assert ChatRequest.model_validate(body).ask().messages == [{
        "role": "system", "content": "be brief"
    }, {"role": "user", "content": "hi"}]
