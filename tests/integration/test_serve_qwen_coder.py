"""`warmpath serve --model qwen2.5-coder-0.5b` as `make serve` runs it (a subprocess, the real code
model fetched by `make setup`, a real port): one fill-in-the-middle through every editor protocol
gives the code's middle, the same greedy text cold and warm, and repo context before the prefix is
cached on the next keystroke. A named plan keeps the test off the plan measurement (the measured
plan has its own tests)."""

import httpx
import ollama
import pytest
from server_harness import serve_process

from warmpath.api.fim import MIN_SUFFIX_TOKENS

pytestmark = pytest.mark.server

PREFIX = "def fib(n):\n    if n < 2:\n        return n\n"
SUFFIX = "\n\nprint(fib(10))\n"
MIDDLE = "returnfib(n-1)+fib(n-2)"


def has_middle(text: str) -> bool:
    """The recursive case, however the model spaces it."""
    return MIDDLE in text.replace(" ", "")


@pytest.fixture(scope="module")
def served():
    with serve_process("--model", "qwen2.5-coder-0.5b", "--plan", "native-int8", "--num-kv-blocks",
                       "512") as (url, _):
        yield url


def completion(url: str, **body) -> dict:
    r = httpx.post(f"{url}/v1/completions", json={"max_tokens": 24, "temperature": 0, **body},
                   timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_fim_through_every_editor_protocol(served):
    openai_fim = completion(served, prompt=PREFIX, suffix=SUFFIX)
    assert openai_fim["fim_mode"] == "qwen2.5-coder" and has_middle(
        openai_fim["choices"][0]["text"])
    infill = httpx.post(
        f"{served}/infill",
        json={"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 24,
              "temperature": 0}, timeout=120)
    assert infill.status_code == 200 and has_middle(infill.json()["content"]), infill.text
    generated = ollama.Client(host=served).generate(model="qwen2.5-coder-0.5b", prompt=PREFIX,
                                                    suffix=SUFFIX,
                                                    options={"num_predict": 24, "temperature": 0})
    assert has_middle(generated.response)
    tabby = httpx.post(
        f"{served}/v1/completions", timeout=120,
        json={"language": "python", "segments": {"prefix": PREFIX, "suffix": SUFFIX}})
    assert tabby.status_code == 200 and has_middle(tabby.json()["choices"][0]["text"]), tabby.text


def test_the_same_greedy_middle_cold_and_warm_with_repo_context_cached(served):
    extra = [{
        "filename": "fibs.py", "text": "from functools import cache\n\n\n@cache\ndef lucas(n):\n"
        "    return 2 - n if n < 2 else lucas(n - 1) + lucas(n - 2)\n"
    }]
    cold = completion(served, prompt=PREFIX, suffix=SUFFIX, extra=extra, user="carol")
    warm = completion(served, prompt=PREFIX, suffix=SUFFIX, extra=extra, user="carol")
    # The same text cold and warm (which middle the model picks with lucas() beside it is a quality
    # question: `warmpath eval` measures that; the first test checks the middle of every protocol).
    assert (
        warm["choices"][0]["text"] == cold["choices"][0]["text"]
        and cold["choices"][0]["text"].strip()
    )
    prompt_tokens = cold["usage"]["prompt_tokens"]
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] >= prompt_tokens - 16
    # a keystroke
    typed = completion(served, prompt=PREFIX + "    ", suffix=SUFFIX, extra=extra, user="carol")
    assert typed["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_a_keystroke_computes_what_it_typed_the_suffix_stays_cached(served):
    """The anchored layout (the default): typing along the cursor's line keeps prefix, suffix and
    the middle marker cached, so a keystroke computes about its own tokens, not the suffix after the
    cursor again. The whole suffix is kept (--fim-suffix-tokens all, the default)."""
    assert httpx.get(f"{served}/v1/models").json()["data"][0]["fim_suffix_tokens"] is None
    prefix = PREFIX + "    else:\n        "
    suffix = SUFFIX + "".join(f"print(fib({i}))\n" for i in range(24))  # a suffix of ~160 tokens
    completion(served, prompt=prefix + "ret", suffix=suffix, user="dora")
    typed = completion(served, prompt=prefix + "return fi", suffix=suffix, user="dora")
    usage = typed["usage"]
    computed = usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]
    # the last partial block and the typed text; the cursor layout: the suffix too
    assert computed <= 16 + 4
    # the kept suffix among the cached tokens
    assert usage["prompt_tokens"] > computed + MIN_SUFFIX_TOKENS
    assert has_middle("return fi" + typed["choices"][0]["text"])


# Zed's edit prediction, from its source: the FIM prompt written out, 14 stop strings, no
# temperature, 256 tokens.
ZED_STOPS = [
    "<|endoftext|>", "<|file_separator|>", "<|fim_pad|>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<PRE>", "<SUF>", "<MID>",
    "[PREFIX]", "[SUFFIX]"
]


def test_zed_gets_the_middle_under_the_tagged_name_and_it_ends_where_the_code_ends(served):
    """Zed's bodies (open_ai_compatible_api and ollama, the model named with its Ollama tag, as Zed
    needs to tell the format) answer the middle alone: the completion scope stops the decode before
    the suffix's code, far short of max_tokens, and /metrics counts the rule that cut."""
    assert [m["id"] for m in httpx.get(f"{served}/v1/models").json()["data"]
            ] == ["qwen2.5-coder-0.5b", "qwen2.5-coder:0.5b"]
    assert [m["name"] for m in httpx.get(f"{served}/api/tags").json()["models"]
            ] == ["qwen2.5-coder-0.5b", "qwen2.5-coder:0.5b"]
    before = httpx.get(f"{served}/metrics").text
    prompt = f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>"
    for stops in (ZED_STOPS, ZED_STOPS[:4]):
        r = httpx.post(
            f"{served}/v1/completions", json={
                "model": "qwen2.5-coder:0.5b", "prompt": prompt, "max_tokens": 256, "stop": stops
            }, timeout=120)
        assert r.status_code == 200, r.text
        answer = r.json()
        text = answer["choices"][0]["text"]
        assert has_middle(
            text) and "print" not in text and answer["choices"][0]["finish_reason"] == "stop", text
        assert answer["usage"]["completion_tokens"] < 64
    r = httpx.post(
        f"{served}/api/generate", json={
            "model": "qwen2.5-coder:0.5b", "prompt": prompt, "raw": True, "stream": False,
            "options": {"num_predict": 256, "temperature": 0.2, "stop": ZED_STOPS}
        }, timeout=120)
    assert r.status_code == 200 and has_middle(
        r.json()["response"]) and "print" not in r.json()["response"], r.text
    # The issue's case: after the middle this model writes print(fib(1)), print(fib(2)), ... until
    # max_tokens; the scope ends it before the first line that leaves the function.
    issue = ("<|fim_prefix|>def fib(n):\n    if n < 2: return n"
             "<|fim_suffix|>\n\nprint(fib(10))<|fim_middle|>")
    r = httpx.post(
        f"{served}/v1/completions",
        json={"model": "qwen2.5-coder:0.5b", "prompt": issue, "max_tokens": 256,
              "stop": ZED_STOPS}, timeout=120)
    text = r.json()["choices"][0]["text"]
    assert r.status_code == 200 and has_middle(
        text) and "print" not in text and text.rstrip() == text, text

    def cuts(metrics: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith("warmpath_completion_scope_cuts_total{"))
    assert cuts(httpx.get(f"{served}/metrics").text) >= cuts(before) + 1


@pytest.mark.slow
def test_a_restarted_server_reads_the_prefix_back_from_the_kv_tier_and_answers_the_same(tmp_path):
    """The disk tier on the real model (the native kernel's own bf16 KV): after a restart the file's
    prefix comes back from disk, not from a recompute, and the greedy answer is the one a cold
    prompt gives."""
    # ~500 tokens before it
    code = "".join(f"def scale_{i}(x):\n    return x * {i}\n\n\n" for i in range(30))
    args = ("--model", "qwen2.5-coder-0.5b", "--plan", "native-int8", "--num-kv-blocks", "512",
            "--kv-offload-dir", str(tmp_path))
    with serve_process(*args) as (url, _):
        cold = completion(url, prompt=code + PREFIX, suffix=SUFFIX)
    with serve_process(*args) as (url, _):
        back = completion(url, prompt=code + PREFIX, suffix=SUFFIX)
        metrics = httpx.get(f"{url}/metrics").text
    assert back["choices"][0]["text"] == cold["choices"][0]["text"] and has_middle(
        back["choices"][0]["text"])
    details = back["usage"]["prompt_tokens_details"]
    assert (
        details["tier_cached_tokens"]
        == details["cached_tokens"]
        >= back["usage"]["prompt_tokens"] - 32
    )
    assert cold["usage"]["prompt_tokens_details"]["tier_cached_tokens"] == 0
    tier_hits = next(line for line in metrics.splitlines()
                     if line.startswith("warmpath_prefix_cache_tier_hit_tokens"))
    assert float(tier_hits.split()[-1]) == details["tier_cached_tokens"]
