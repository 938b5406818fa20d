"""The HTTP server on loopback with the tiny model: OpenAI client, streaming exactness under
concurrency, cancel on disconnect, deadlines and overload as silence, bad input, sessions, metrics,
health."""

import asyncio
import json
import re
import socket
import threading
import time

import httpx
import openai
import pytest
from bad_requests import BAD
from server_harness import CODE, running_server, wait_for_step

from warmpath import LLM, SamplingParams
from warmpath.config import EngineConfig, ServerConfig

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def offline(tiny_long_dir):
    return LLM(str(tiny_long_dir), dtype="float32", num_kv_blocks=1024)


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_openai_client_completes_streams_and_chats(server, offline, tiny_long_dir):
    url, _ = server
    c = client(url)
    model = c.models.list().data[0].id
    assert model == str(tiny_long_dir)
    expected = offline.generate(CODE, SamplingParams(max_tokens=12, temperature=0))[0]
    r = c.completions.create(model=model, prompt=CODE, max_tokens=12, temperature=0)
    assert r.choices[0].text == expected.text and r.usage.completion_tokens == len(
        expected.token_ids)
    assert r.choices[0].finish_reason in ("length", "stop")
    chunks = list(
        c.completions.create(model=model, prompt=CODE, max_tokens=12, temperature=0, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == expected.text
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    chat = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                     max_tokens=8, temperature=0)
    assert chat.choices[0].message.role == "assistant" and chat.usage.prompt_tokens > 3
    parts = list(
        c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                  max_tokens=8, temperature=0, stream=True))
    assert "".join(p.choices[0].delta.content or "" for p in parts
                   if p.choices) == chat.choices[0].message.content


def test_32_concurrent_streams_get_exactly_the_offline_text(server, offline):
    url, _ = server
    prompts = [f"# file {i}\n" + CODE * (1 + i % 3) + f"x{i} = " for i in range(32)]
    expected = [
        o.text for o in offline.generate(prompts, SamplingParams(max_tokens=20, temperature=0))
    ]

    async def one(http: httpx.AsyncClient, prompt: str) -> str:
        body = {"prompt": prompt, "max_tokens": 20, "temperature": 0, "stream": True}
        text = ""
        async with http.stream("POST", f"{url}/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            lines = [line async for line in resp.aiter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        for line in lines[:-1]:
            text += json.loads(line[6:])["choices"][0]["text"]
        return text

    async def all_of_them():
        async with httpx.AsyncClient(timeout=120) as http:
            return await asyncio.gather(*(one(http, p) for p in prompts))

    assert asyncio.run(all_of_them()) == expected


def _aborted(url: str, reason: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    line = next(x for x in text.splitlines()
                if x.startswith(f'warmpath_requests_aborted_total{{reason="{reason}"}}'))
    return float(line.split()[-1])


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_disconnect_aborts_and_returns_blocks(server, phase):
    url, app = server
    engine = app.state.engine
    before = _aborted(url, "client")
    prompt = f"# {phase}\n" + CODE * 12  # ~700 tokens at 64 per step: a long prefill
    body = {"prompt": prompt, "max_tokens": 400, "temperature": 0, "stream": phase == "decode"}

    def reached(e):
        reqs = list(e.requests.values())
        if phase == "prefill":
            return any(0 < r.num_computed_tokens < len(r.prompt_token_ids) - 64 for r in reqs)
        return any(len(r.output_token_ids) >= 3 for r in reqs)

    with httpx.Client(timeout=60) as http:
        if phase == "decode":
            with http.stream("POST", f"{url}/v1/completions", json=body) as resp:
                for _ in resp.iter_lines():
                    if reached(engine):
                        break  # leaving the block closes the connection mid-stream
        else:
            drop = threading.Event()
            t = threading.Thread(target=_post_and_drop, args=(url, body, drop), daemon=True)
            t.start()
            wait_for_step(app, reached)
            drop.set()
            t.join(timeout=60)
    steps_at_close = engine.num_steps
    wait_for_step(
        app, lambda e: not e.requests and e.pool.num_used == 0 or e.num_steps > steps_at_close + 50)
    assert engine.pool.num_used == 0 and not engine.requests  # every block back, cached prefix kept
    assert engine.num_steps <= steps_at_close + 3
    assert _aborted(url, "client") == before + 1


def _post_and_drop(url: str, body: dict, drop: threading.Event) -> None:
    """A non-streaming client that gives up (closes its socket) while the server is still
    computing."""
    payload = json.dumps(body).encode()
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    drop.wait(60)
    s.close()


def test_deadline_is_silence(server):
    url, _ = server
    r = httpx.post(f"{url}/v1/completions",
                   json={"prompt": CODE, "max_tokens": 300,
                         "temperature": 0}, headers={"X-Deadline-Ms": "1"}, timeout=60)
    assert r.status_code == 200
    body = r.json()
    assert body["choices"][0]["text"] == "" and body["choices"][0]["finish_reason"] == "deadline"


def behind_a_queue(url: str, app, tag: str, send) -> tuple:
    """`send(http)` while twelve long prompts fill the engine (four or more waiting): (its answer,
    whether the queue was still there when it came)."""
    busy = {"prompt": CODE * 12, "max_tokens": 5, "temperature": 0}

    async def burst():
        async with httpx.AsyncClient(timeout=120) as http:
            work = [
                asyncio.create_task(
                    http.post(f"{url}/v1/completions",
                              json={**busy, "prompt": f"#{tag}{i}\n" + busy["prompt"]}))
                for i in range(12)
            ]
            await asyncio.to_thread(wait_for_step, app, lambda e: e.scheduler.num_waiting >= 4)
            answer = await send(http)
            queued = app.state.engine.has_unfinished_requests()
            await asyncio.gather(*work)
            return answer, queued

    return asyncio.run(burst())


def test_overloaded_is_answered_at_once(server):
    url, app = server
    before = _aborted(url, "overloaded")
    late, answered_early = behind_a_queue(
        url, app, "o",
        lambda http: http.post(f"{url}/v1/completions", json={"prompt": CODE, "max_tokens": 5},
                               headers={"X-Deadline-Ms": "10"}))
    # Answered while the queue ahead of it was still there: it did not wait its turn.
    assert late.status_code == 200 and answered_early
    assert late.json()["choices"][0] == {
        "index": 0, "text": "", "logprobs": None, "finish_reason": "overloaded"
    }
    assert _aborted(url, "overloaded") == before + 1


def test_an_overloaded_refusal_warms_its_sessions_prompt(server):
    """Refused unrun, a developer's cold file would never warm (each keystroke refused in turn): the
    refusal leaves the prompt computing at the lowest priority, and the session's next request finds
    it cached."""
    url, app = server
    mine = {"prompt": "# refused while others computed\n" + CODE * 4, "user": "dev-refused"}
    refused, _ = behind_a_queue(url, app, "w", lambda http: http.post(
        f"{url}/v1/completions", json={**mine, "max_tokens": 5}, headers={"X-Deadline-Ms": "10"}))
    assert refused.json()["choices"][0]["finish_reason"] == "overloaded"
    for _ in range(600):  # the warm-up runs after everyone else
        if not app.state.engine.has_unfinished_requests():
            break
        time.sleep(0.05)
    again = httpx.post(f"{url}/v1/completions", timeout=60,
                       json={**mine, "max_tokens": 1, "temperature": 0}).json()
    prompt_tokens = again["usage"]["prompt_tokens"]
    assert (
        again["usage"]["prompt_tokens_details"]["cached_tokens"]
        >= prompt_tokens // 16 * 16 - 16
        > 0
    )


@pytest.mark.parametrize("payload,status", BAD)
def test_bad_input_gets_an_openai_error(server, payload, status):
    url, app = server
    r = httpx.post(f"{url}/v1/completions", content=payload,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"] and len(
        err["message"]) <= 1000
    assert app.state.async_engine.alive


def test_bad_headers_and_chat(server):
    url, _ = server
    r = httpx.post(f"{url}/v1/completions", content=b'{"prompt": "' + b"x" * (5 << 20) + b'"}',
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "error" in r.json()
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "x"}, headers={"X-Deadline-Ms": "soon"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-Deadline-Ms"
    r = httpx.post(f"{url}/v1/chat/completions", json={"messages": []})
    assert r.status_code == 400 and "error" in r.json()
    r = httpx.post(f"{url}/v1/chat/completions",
                   json={"messages": [{"role": "wizard", "content": "x"}]})
    assert r.status_code == 400


def test_session_turns_hit_the_prefix_cache(server):
    url, _ = server
    prompt, last_len = "# session file\n" + CODE * 4, None
    for turn in range(4):
        body = httpx.post(f"{url}/v1/completions",
                          json={"prompt": prompt, "max_tokens": 4, "temperature": 0},
                          headers={"X-Session-Id": "dev-1"}, timeout=60).json()
        cached, n = (
            body["usage"]["prompt_tokens_details"]["cached_tokens"],
            body["usage"]["prompt_tokens"],
        )
        if last_len is not None:
            assert last_len - 16 <= cached <= n  # the whole previous prompt, to a block
        last_len = n
        prompt += f"    value_{turn} = {turn}\n"  # the developer typed a line


def test_fim_without_fim_tokens_completes_from_prefix(server):
    url, _ = server
    body = httpx.post(
        f"{url}/v1/completions", json={
            "prompt": CODE, "suffix": "\n\nprint(add(1, 2))\n", "max_tokens": 8, "temperature": 0
        }, timeout=60).json()
    assert (body["fim_mode"] == "prefix-only"
            and "print(add(1, 2))" not in body["choices"][0]["text"])


def test_a_prompt_in_another_familys_fim_layout_is_filled_not_continued(server):
    """Continue's provider: openai sends `<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>` as
    text; this model has no such tokens, so the server completes the prefix as for `suffix` and says
    so in fim_mode."""
    url, _ = server
    literal = f"<fim_prefix>{CODE}<fim_suffix>\n\nprint(add(1, 2))\n<fim_middle>"
    got = httpx.post(f"{url}/v1/completions",
                     json={"prompt": literal, "max_tokens": 8,
                           "temperature": 0}, timeout=60).json()
    plain = httpx.post(
        f"{url}/v1/completions", json={
            "prompt": CODE, "suffix": "\n\nprint(add(1, 2))\n", "max_tokens": 8, "temperature": 0
        }, timeout=60).json()
    assert (
        got["fim_mode"] == "prefix-only; the prompt's starcoder markers read as prefix and suffix"
    )
    assert got["choices"][0]["text"] == plain["choices"][0]["text"]
    assert got["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]


def test_metrics_and_health(server):
    url, _ = server
    text = httpx.get(f"{url}/metrics").text
    for name in ("warmpath_time_to_first_token_seconds_bucket",
                 "warmpath_prefix_cache_queried_tokens_total",
                 "warmpath_prefix_cache_hit_tokens_total", "warmpath_preemptions_total",
                 'warmpath_requests_aborted_total{reason="deadline"}',
                 "warmpath_kv_cache_usage_ratio", "warmpath_num_requests_running",
                 "warmpath_prompt_tokens_total"):
        assert name in text, name
    used = float(re.search(r"^warmpath_heap_used_bytes (\S+)$", text, re.M).group(1))
    # the server's own Python objects at least (glibc); the soak reads it beside RSS
    assert used > 1e6
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}


def test_api_key_and_dead_engine(tiny_llama_dir):
    cfg = EngineConfig(model=str(tiny_llama_dir), dtype="float32", num_kv_blocks=64)
    with running_server(cfg, ServerConfig(api_key="sekret")) as (url, app):
        assert httpx.get(f"{url}/v1/models").status_code == 401
        assert httpx.get(f"{url}/v1/models",
                         headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(f"{url}/v1/models",
                         headers={"Authorization": "Bearer sekret"}).status_code == 200
        assert httpx.get(f"{url}/health").status_code == 200

        def broken_step():
            raise RuntimeError("boom")

        app.state.engine.step = broken_step
        auth = {"Authorization": "Bearer sekret"}
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=auth,
                       timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead"
        assert httpx.get(f"{url}/health").status_code == 503
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "x"}, headers=auth)
        assert r.status_code == 503


def test_a_failing_step_answers_error_and_the_server_lives_on(server):
    url, app = server
    runner = app.state.engine.runner
    real = runner.forward

    def fail_once(seqs):
        runner.forward = real
        raise RuntimeError("simulated kernel failure")

    runner.forward = fail_once
    try:
        r = httpx.post(f"{url}/v1/completions", json={"prompt": CODE, "max_tokens": 5}, timeout=60)
    finally:
        runner.forward = real
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "error"
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    ok = httpx.post(f"{url}/v1/completions", json={"prompt": CODE, "max_tokens": 5},
                    timeout=60).json()
    assert ok["choices"][0]["finish_reason"] in ("length", "stop")


class _Witness:
    """Stands in for an engine part and notes which thread reaches it."""

    def __init__(self, inner, seen: set):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_seen", seen)

    def __getattr__(self, name):
        self._seen.add(threading.current_thread().name)
        return getattr(self._inner, name)

    def __setattr__(self, name, value):
        self._seen.add(threading.current_thread().name)
        setattr(self._inner, name, value)


def test_only_the_step_thread_touches_the_scheduler_and_the_pool(server_config):
    """The event loop decides "overloaded" and /metrics answers from the snapshot the step thread
    publishes: no read of the scheduler's queues or the pool while a step changes them."""
    from server_harness import running_server

    with running_server(server_config) as (url, app):
        engine, seen = app.state.engine, set()
        engine.scheduler, engine.pool = _Witness(engine.scheduler,
                                                 seen), _Witness(engine.pool, seen)
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", f"{url}/v1/completions",
                             json={"prompt": CODE * 4, "max_tokens": 8, "stream": True}) as resp:
                assert resp.status_code == 200 and [line for line in resp.iter_lines() if line]
            late = http.post(f"{url}/v1/completions", json={"prompt": CODE, "max_tokens": 4},
                             headers={"X-Deadline-Ms": "2000"})
            assert late.status_code == 200
            metrics = http.get(f"{url}/metrics").text
            assert http.get(f"{url}/health").status_code == 200
        assert "warmpath_kv_cache_blocks" in metrics
        assert 'warmpath_requests_total{finish_reason="length"} 2.0' in metrics
        assert seen == {"warmpath-engine"}
