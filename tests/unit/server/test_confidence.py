"""The confidence gate (server/confidence.py) on `warmpath serve` (tiny model, loopback HTTP): every
FIM answer reports its first line's confidence; below the threshold (the request's `min_confidence`,
else the server's --min-confidence) the answer is silence in every protocol's own shape: 200, empty
text, finish reason "low_confidence"; the decode stops as soon as the first line is judged; nothing
of a silenced stream is shown."""

import json
import math

import httpx
import pytest
from server_harness import CODE, counter, running_server

from warmpath.server.confidence import Gate

SUFFIX = "\n\nprint(add(1, 2))\n"


def test_the_gate_judges_the_first_line_by_its_tokens_geometric_mean_probability():
    g = Gate(0.5)
    g.observe([b"    ", b"return"], [math.log(0.9), math.log(0.5)])
    assert not g.judged
    # the line ends with the token that ends it
    g.observe([b" x\n", b"print"], [math.log(0.8), math.log(0.01)])
    assert g.judged and g.value == pytest.approx((0.9 * 0.5 * 0.8) ** (1 / 3)) and not g.unsure
    blank_first = Gate(0.5)
    # a leading newline is not the line
    blank_first.observe([b"\n", b"  y"], [math.log(0.9), math.log(0.1)])
    assert not blank_first.judged
    blank_first.finish()  # the answer ended first: judged on what there is
    assert blank_first.value == pytest.approx(0.3) and blank_first.unsure


@pytest.fixture(scope="module")
def gated(server_config):
    """A server whose default gate silences nearly everything the tiny random model writes."""
    from warmpath.config import ServerConfig

    with running_server(server_config, ServerConfig(min_confidence=0.99)) as (url, app):
        yield url, app


@pytest.mark.server
def test_every_protocol_answers_an_unsure_completion_with_its_silence(gated):
    url, _ = gated
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    silenced = counter(url, "warmpath_requests_aborted_total", 'reason="low_confidence"')
    r = httpx.post(f"{url}/v1/completions",
                   json={"prompt": CODE, "suffix": SUFFIX, "max_tokens": 64,
                         "temperature": 0}, timeout=60).json()
    assert r["choices"][0]["text"] == "" and r["choices"][0]["finish_reason"] == "low_confidence"
    assert r["choices"][0]["confidence"] < 0.99
    # the tiny model's first line after this prefix ends within ten tokens: the decode stops there
    # (no scope)
    r = httpx.post(
        f"{url}/v1/completions", json={
            "prompt": "def add(a,", "suffix": " b):\n", "max_tokens": 64, "temperature": 0,
            "scope": "none"
        }, timeout=60).json()
    assert (
        r["choices"][0]["finish_reason"] == "low_confidence"
        and r["usage"]["completion_tokens"] <= 12
    )
    with httpx.stream(
            "POST", f"{url}/v1/completions", json={
                "prompt": CODE, "suffix": SUFFIX, "max_tokens": 64, "temperature": 0, "stream": True
            }, timeout=60) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks) == ""  # nothing of it was ever streamed
    assert chunks[-1]["choices"][0]["finish_reason"] == "low_confidence"
    infill = httpx.post(
        f"{url}/infill",
        json={"input_prefix": CODE, "input_suffix": SUFFIX, "n_predict": 64,
              "temperature": 0}, timeout=60).json()
    assert infill["content"] == "" and infill["finish_reason"] == "low_confidence"
    ollama = httpx.post(
        f"{url}/api/generate", json={
            "model": name, "prompt": CODE, "suffix": SUFFIX, "stream": False,
            "options": {"num_predict": 64, "temperature": 0}
        }, timeout=60).json()
    assert ollama["response"] == "" and ollama["done_reason"] == "low_confidence"
    mistral = httpx.post(
        f"{url}/v1/fim/completions",
        json={"model": name, "prompt": CODE, "suffix": SUFFIX, "max_tokens": 64,
              "temperature": 0}, timeout=60).json()
    assert (mistral["choices"][0]["message"]["content"] == ""
            and mistral["choices"][0]["finish_reason"] == "low_confidence")
    tabby = httpx.post(f"{url}/v1/completions",
                       json={"language": "python",
                             "segments": {"prefix": CODE, "suffix": SUFFIX}}, timeout=60).json()
    assert (
        tabby["choices"][0]["text"] == ""
        and tabby["choices"][0]["finish_reason"] == "low_confidence"
    )
    assert counter(url, "warmpath_requests_aborted_total",
                   'reason="low_confidence"') == silenced + 7


@pytest.mark.server
def test_a_request_sets_its_own_threshold_and_a_plain_completion_is_never_judged(gated):
    url, _ = gated
    body = {"prompt": CODE, "suffix": SUFFIX, "max_tokens": 24, "temperature": 0}
    shown = httpx.post(f"{url}/v1/completions", json={**body, "min_confidence": 0},
                       timeout=60).json()["choices"][0]
    assert shown["text"] and shown["finish_reason"] in ("stop",
                                                        "length") and 0 < shown["confidence"] < 0.99
    plain = httpx.post(f"{url}/v1/completions",
                       json={"prompt": CODE, "max_tokens": 8,
                             "temperature": 0}, timeout=60).json()["choices"][0]
    assert plain["text"] and "confidence" not in plain  # not a fill in the middle: shown as it is
    bad = httpx.post(f"{url}/v1/completions", json={**body, "min_confidence": 2}, timeout=60)
    assert bad.status_code == 400 and "min_confidence" in bad.text
    bad = httpx.post(f"{url}/infill", json={"input_prefix": CODE, "min_confidence": -1}, timeout=60)
    assert bad.status_code == 400 and "error" in bad.json()
