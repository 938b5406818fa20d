"""Ollama's /api/* and Mistral's /v1/fim/completions on `warmpath serve` (tiny model, loopback
HTTP), driven by the real `ollama` and `mistralai` clients from PyPI: FIM and plain completions,
whole and streamed, the same text as /v1/completions; silence past the deadline, disconnect aborts,
bad input in each protocol's own shape."""

import asyncio
import json

import httpx
import ollama
import pytest
from mistralai.client import Mistral
from mistralai.client.errors import HTTPValidationError, MistralError
from server_harness import CODE, counter, wait_for_step

pytestmark = pytest.mark.server

SUFFIX = "\n\nprint(add(1, 2))\n"


def greedy(url: str, prompt: str, suffix: str | None, n: int = 12) -> dict:
    body = {
        "prompt": prompt, "max_tokens": n, "temperature": 0,
        **({"suffix": suffix} if suffix else {})
    }
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()


def model_name(url: str) -> str:
    return httpx.get(f"{url}/v1/models").json()["data"][0]["id"]


# -- Ollama ----------------------------------------------------------------------------------------
def test_ollama_client_lists_shows_and_fills_in_the_middle(server):
    url, _ = server
    c, name = ollama.Client(host=url), model_name(url)
    assert [m.model for m in c.list().models] == [name]
    shown = c.show(name)
    # Continue then offers FIM
    assert ".Suffix" in shown.template and "insert" in shown.capabilities
    assert httpx.get(f"{url}/api/version").json()["version"]
    ref = greedy(url, CODE, SUFFIX)
    r = c.generate(model=name, prompt=CODE, suffix=SUFFIX,
                   options={"num_predict": 12, "temperature": 0})
    assert (
        r.done
        and r.response == ref["choices"][0]["text"]
        and r.done_reason == ref["choices"][0]["finish_reason"]
    )
    assert (
        r.prompt_eval_count == ref["usage"]["prompt_tokens"]
        and r.eval_count == ref["usage"]["completion_tokens"]
    )
    assert r.total_duration >= r.prompt_eval_duration > 0 and r.eval_duration > 0  # nanoseconds
    parts = list(c.generate(model=f"{name}:latest", prompt=CODE, suffix=SUFFIX, stream=True,
                            options={"num_predict": 12, "temperature": 0}))
    assert "".join(p.response
                   for p in parts) == r.response and parts[-1].done and not any(p.done
                                                                                for p in parts[:-1])
    assert parts[-1].eval_count == r.eval_count and len(parts) > 2  # token by token
    raw = c.generate(model=name, prompt=CODE, raw=True,
                     options={"num_predict": 12, "temperature": 0})
    assert raw.response == greedy(url, CODE, None)["choices"][0]["text"]
    assert c.generate(model=name, prompt="").done_reason == "load"  # Ollama's preload


def test_ollama_errors_are_its_own_shape(server):
    url, _ = server
    c, name = ollama.Client(host=url), model_name(url)
    with pytest.raises(ollama.ResponseError) as e:
        c.generate(model="qwen2.5-coder:1.5b", prompt="x")
    assert e.value.status_code == 404
    for body in ({"model": name,
                  "prompt": 3}, {"model": name, "prompt": "x", "options": {"num_predict": "ten"}},
                 {"model": name, "prompt": "x",
                  "context": [1, 2]}, {"prompt": "x"}, {"model": name, "stream": "no"}):
        r = httpx.post(f"{url}/api/generate", json=body)
        assert r.status_code == 400 and isinstance(r.json()["error"], str) and set(
            r.json()) == {"error"}, body
    r = httpx.post(f"{url}/api/generate", content=b"{nope")
    assert r.status_code == 400 and set(r.json()) == {"error"}
    r = httpx.post(f"{url}/api/show", json={"model": "nope"})
    assert r.status_code == 404 and set(r.json()) == {"error"}


def test_ollama_deadline_is_an_empty_response_and_disconnect_aborts(server):
    url, app = server
    name = model_name(url)
    late = ollama.Client(host=url, headers={"X-Deadline-Ms": "5"})
    r = late.generate(model=name, prompt=CODE * 12, suffix=SUFFIX, options={"num_predict": 300})
    # silence either way: "overloaded" when work still queued (an aborted request the step thread
    # has not dropped yet) already makes 5 ms impossible, "deadline" when it ran out
    assert r.done and r.response == "" and r.done_reason in ("deadline", "overloaded")
    parts = list(
        late.generate(model=name, prompt=CODE * 12, stream=True, raw=True,
                      options={"num_predict": 300}))
    assert parts[-1].done and parts[-1].done_reason in ("deadline", "overloaded")
    wait_for_step(app, lambda e: not e.requests)
    before = counter(url, "warmpath_requests_aborted_total", 'reason="client"')

    async def leave():
        async with httpx.AsyncClient(timeout=60) as http:
            body = {
                "model": name, "prompt": "# leave\n" + CODE * 12, "raw": True,
                "options": {"num_predict": 400}
            }
            async with http.stream("POST", f"{url}/api/generate", json=body) as resp:
                assert resp.headers["content-type"].startswith("application/x-ndjson")
                async for line in resp.aiter_lines():
                    assert json.loads(line)["done"] is False
                    return
    asyncio.run(leave())
    wait_for_step(app, lambda e: not e.requests and e.pool.num_used == 0)
    assert counter(url, "warmpath_requests_aborted_total", 'reason="client"') == before + 1


# -- Mistral ---------------------------------------------------------------------------------------
def test_mistral_client_fim_whole_and_streamed(server):
    url, _ = server
    m, name = Mistral(api_key="unused", server_url=url), model_name(url)
    ref = greedy(url, CODE, SUFFIX)
    r = m.fim.complete(model=name, prompt=CODE, suffix=SUFFIX, max_tokens=12, temperature=0)
    assert r.choices[0].message.content == ref["choices"][0]["text"]
    assert r.choices[0].finish_reason == ref["choices"][0]["finish_reason"]
    assert (r.usage.prompt_tokens == ref["usage"]["prompt_tokens"]
            and r.usage.completion_tokens == 12)
    # the second time round
    assert r.usage.additional_properties["prompt_tokens_details"]["cached_tokens"] > 0
    events = list(m.fim.stream(model=name, prompt=CODE, suffix=SUFFIX, max_tokens=12,
                               temperature=0))
    text = "".join(e.data.choices[0].delta.content or "" for e in events)
    assert text == r.choices[0].message.content and len(events) > 2
    assert events[-1].data.choices[0].finish_reason == r.choices[0].finish_reason


def test_mistral_deadline_and_errors(server):
    url, _ = server
    m, name = Mistral(api_key="unused", server_url=url), model_name(url)
    r = m.fim.complete(model=name, prompt=CODE * 12, max_tokens=300,
                       http_headers={"X-Deadline-Ms": "5"})
    assert r.choices[0].message.content == "" and r.choices[0].finish_reason == "deadline"
    with pytest.raises(HTTPValidationError) as e:
        m.fim.complete(model=name, prompt=CODE, temperature=9.0)
    assert e.value.data.detail[0].loc[-1] == "temperature"
    with pytest.raises(MistralError) as e:
        m.fim.complete(model="codestral-latest", prompt=CODE)
    assert e.value.status_code == 404
    r = httpx.post(f"{url}/v1/fim/completions", json={"model": name, "prompt": 1})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "prompt"]
    r = httpx.post(f"{url}/v1/fim/completions", content=b"[]")
    assert r.status_code == 400 and r.json()["object"] == "error"


# -- Zed's edit prediction -------------------------------------------------------------------------
# The stop list Zed versions shipped until mid-2026 send with every request (its FIM markers of
# every family).
ZED_STOPS = [
    "<|endoftext|>", "<|file_separator|>", "<|fim_pad|>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<PRE>", "<SUF>", "<MID>",
    "[PREFIX]", "[SUFFIX]"
]


def test_zeds_edit_prediction_bodies_are_answered_and_one_stop_bound_holds_for_every_protocol(
        server):
    """Zed's bodies as it sends them (open_ai_compatible_api: POST /v1/completions, no temperature,
    not streamed; ollama: /api/generate raw) with its 14 stop strings answer 200 with text; more
    than the one bound (32) is a 400/422 in each protocol's shape, /v1/completions, /api/generate,
    /infill and Mistral's FIM alike."""
    url, _ = server
    name = model_name(url)
    prompt = f"<|fim_prefix|>{CODE}<|fim_suffix|>{SUFFIX}<|fim_middle|>"
    r = httpx.post(f"{url}/v1/completions", json={"model": name, "prompt": prompt, "max_tokens": 16,
                                                  "stop": ZED_STOPS}, timeout=60)
    assert r.status_code == 200 and isinstance(r.json()["choices"][0]["text"], str), r.text
    r = httpx.post(
        f"{url}/api/generate", json={
            "model": name, "prompt": prompt, "raw": True, "stream": False,
            "options": {"num_predict": 16, "temperature": 0.2, "stop": ZED_STOPS}
        }, timeout=60)
    assert r.status_code == 200 and isinstance(r.json()["response"],
                                               str) and r.json()["created_at"], r.text
    too_many = [f"stop{i}" for i in range(33)]
    for path, body in (("/v1/completions", {"prompt": "x", "stop": too_many}), ("/api/generate", {
            "model": name, "prompt": "x", "options": {"stop": too_many}
    }), ("/infill", {"input_prefix": "x", "input_suffix": "", "stop": too_many}),
                       ("/v1/fim/completions", {"model": name, "prompt": "x", "stop": too_many})):
        r = httpx.post(f"{url}{path}", json=body, timeout=60)
        assert r.status_code in (400, 422) and "at most 32" in r.text, (path, r.status_code, r.text)
