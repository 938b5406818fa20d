"""The completion scope on `warmpath serve` (tiny model, loopback HTTP): every FIM path's answer is
the unscoped answer as api/scope.py cuts it, cut answers end with finish_reason "stop" and fewer
tokens (the decode stopped there), each cut is counted by rule, the per-request `scope` overrides
the server's, and a bad one is a 400 in each protocol's shape."""

import json

import httpx
import pytest
from server_harness import CODE, total

from warmpath.api.scope import ScopeCutter

pytestmark = pytest.mark.server

# Cursors mid-line (line scope: the tiny model's text after these prefixes holds a newline) and at a
# line's end (block scope), with code after them. The tiny model has no FIM tokens: prefix-only, the
# suffix cut by the scope.
HOLES = [("def add(a,", " b):\n    return a + b\n"), ("def add(a, b)", ":\n    return a + b\n"),
         ("def add(a, b):\n    return ", "a + b\n"),
         (CODE, "\n        self.y = y\n\np = Point(1, 2)\n")]


def openai(url: str, prefix: str, suffix: str, scope: str | None = None,
           stream: bool = False) -> dict:
    body = {"prompt": prefix, "suffix": suffix, "max_tokens": 48, "temperature": 0,
            **({"scope": scope} if scope else {})}
    if not stream:
        return httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    text = ""
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True},
                      timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                text += json.loads(line[6:])["choices"][0]["text"]
    return {"choices": [{"text": text}]}


def test_every_fim_answer_is_the_whole_answer_cut_by_the_scope(server):
    url, _ = server
    cuts_before = total(url, "warmpath_completion_scope_cuts_total")
    cut = 0
    for prefix, suffix in HOLES:
        whole = openai(url, prefix, suffix, scope="none")
        scope = ScopeCutter(prefix, suffix)
        want = scope.feed(whole["choices"][0]["text"])
        want += "" if scope.cut else scope.feed("", final=True)
        got = openai(url, prefix, suffix)
        assert got["choices"][0]["text"] == want == openai(url, prefix, suffix,
                                                           stream=True)["choices"][0]["text"]
        infill = httpx.post(
            f"{url}/infill", json={
                "input_prefix": prefix, "input_suffix": suffix, "n_predict": 48, "temperature": 0
            }, timeout=60).json()
        assert infill["content"] == want
        if scope.cut:
            cut += 1
            assert got["choices"][0]["finish_reason"] == "stop"
            assert got["usage"]["completion_tokens"] < whole["usage"]["completion_tokens"]
    assert cut >= 3  # the three mid-line cursors
    # openai, stream, /infill
    assert total(url, "warmpath_completion_scope_cuts_total") >= cuts_before + 3 * cut


@pytest.mark.parametrize("path,body,shape", [
    ("/v1/completions", {"prompt": "x", "suffix": "y"}, "error"),
    ("/infill", {"input_prefix": "x", "input_suffix": "y"}, "error"),
    ("/api/generate", {"prompt": "x", "suffix": "y", "stream": False}, "error"),
    ("/v1/fim/completions", {"prompt": "x", "suffix": "y"}, "detail"),
])
def test_an_unknown_scope_is_refused_in_the_protocols_own_shape(server, path, body, shape):
    url, _ = server
    model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    r = httpx.post(f"{url}{path}", json={"model": model, **body, "scope": "paragraph"}, timeout=60)
    assert r.status_code in (400, 422) and shape in r.json() and "scope" in r.text, r.text
