"""One over-long file, sent the way each protocol sends it (OpenAI completions with `suffix`,
llama.cpp's /infill, Mistral FIM, Ollama's generate, Tabby): every protocol cuts it the same way
(server/prompt_fitter.py: the prefix's first lines, then the suffix's last lines, leaving the answer
its tokens), answers 200 in its own shape, and computes the same prompt."""

import httpx
import pytest
from gguf import GGMLQuantizationType as Q
from server_harness import running_server
from tiny_gguf import QWEN_VOCAB, uniform, write_gguf

from warmpath.config import EngineConfig

pytestmark = pytest.mark.server

# tabby-agent asks for 64 tokens (api/tabby.py MAX_TOKENS): every protocol asks the same
MAX_LEN, ANSWER = 512, 64
PREFIX = "".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(60))
SUFFIX = "".join(f"print(f{i}(2))\n" for i in range(60))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path, _, _ = write_gguf(
        tmp_path_factory.mktemp("qwen") / "tiny.gguf", "qwen2", uniform(Q.Q8_0), QWEN_VOCAB)
    with running_server(EngineConfig(model=str(path), dtype="float32", num_kv_blocks=256,
                                     max_model_len=MAX_LEN)) as running:
        yield running


def prompt_tokens(url: str) -> float:
    metrics = httpx.get(f"{url}/metrics").text
    return next(
        float(ln.split()[-1]) for ln in metrics.splitlines()
        if ln.startswith("warmpath_prompt_tokens_total"))


BODIES = {
    "/v1/completions": {"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": ANSWER, "temperature": 0},
    "/infill": {
        "input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": "", "n_predict": ANSWER,
        "temperature": 0
    },
    "/v1/fim/completions": {
        "model": "MODEL", "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": ANSWER, "temperature": 0
    },
    "/api/generate": {
        "model": "MODEL", "prompt": PREFIX, "suffix": SUFFIX, "stream": False,
        "options": {"num_predict": ANSWER, "temperature": 0}
    },
    "tabby": {
        "language": "python", "segments": {"prefix": PREFIX, "suffix": SUFFIX}, "temperature": 0
    },
}


def test_every_protocol_cuts_an_over_long_prompt_the_same_way(server):
    url, app = server
    tokenizer = app.state.engine.tokenizer
    assert len(tokenizer.encode(PREFIX + SUFFIX)) > 2 * MAX_LEN  # far over the context
    model = app.state.served.model_name
    computed = {}
    for path, body in BODIES.items():
        body = {k: model if v == "MODEL" else v for k, v in body.items()}
        before = prompt_tokens(url)
        r = httpx.post(f"{url}{'/v1/completions' if path == 'tabby' else path}", json=body,
                       timeout=120)
        assert r.status_code == 200, (path, r.text)
        computed[path] = prompt_tokens(url) - before
        reply = r.json()
        if path == "/infill":
            assert reply["truncated"] is True and reply["tokens_evaluated"] == computed[path]
        elif path in ("/v1/completions", "/v1/fim/completions"):
            assert reply["usage"]["prompt_tokens"] == computed[path]
        elif path == "/api/generate":
            assert reply["done"] is True and reply["prompt_eval_count"] <= computed[path]
        else:
            assert reply["choices"][0]["text"] is not None
    assert len(set(computed.values())) == 1, computed
    kept = next(iter(computed.values()))
    # cut to leave the answer its tokens, not to nothing
    assert MAX_LEN // 2 < kept <= MAX_LEN - ANSWER


def test_a_prompt_that_cannot_be_cut_is_a_400_in_each_protocols_shape(server):
    url, app = server
    model = app.state.served.model_name
    line = "x = [" + ", ".join(str(i) for i in range(2000)) + "]"  # one line: nothing to leave out
    r = httpx.post(f"{url}/v1/completions", json={"prompt": line, "max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = httpx.post(f"{url}/infill", json={"input_prefix": line, "input_suffix": "", "n_predict": 4})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{url}/api/generate",
                   json={"model": model, "prompt": line, "suffix": "", "stream": False})
    assert r.status_code == 400 and "context" in r.json()["error"]
