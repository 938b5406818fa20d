"""`warmpath route` speaks the editor protocols too, in front of real tiny-model servers on
loopback: llama.vim's /infill keeps its session on one node with only a bearer token (the one header
it can set) and hits that node's prefix cache; Tabby's completions (on OpenAI's path) keep theirs by
`user` or bearer token, and greedy ones are cached; the ollama and mistralai clients get the node's
text through the router, whole and streamed; past the deadline each protocol's empty answer; a
disconnect reaches the node; bad input and the router's own faults in each protocol's shape; with
model tiers, each protocol's line completions go to the small model."""

import asyncio
import contextlib
import hashlib
import json

import httpx
import ollama
import pytest
from llama_vim import EXTRA, FILE, LINES, VIM_ACCEPTS, vim_fim
from mistralai.client import Mistral
from server_harness import CODE, counter, free_port, running_app, running_server, wait_for_step
from server_harness import running_router as router

from warmpath.config import EngineConfig, RouterConfig, SchedulerConfig
from warmpath.router.app import create_router_app
from warmpath.router.hashing import HashRing

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def fleet(tiny_long_dir):
    """Three nodes at 256 tokens per step: llama.vim's 500 ms prompt budget holds on a busy 2-core
    machine."""
    cfg = EngineConfig(model=str(tiny_long_dir), dtype="float32", num_kv_blocks=1024,
                       scheduler=SchedulerConfig(max_num_batched_tokens=256))
    with contextlib.ExitStack() as stack:
        nodes = [stack.enter_context(running_server(cfg)) for _ in range(3)]
        yield {url: app for url, app in nodes}


def test_llama_vim_keeps_its_node_with_only_a_bearer_token(fleet):
    urls = list(fleet)
    with router(urls) as (rurl, _):  # the default hybrid policy: sessions first
        for dev in ("alice-key", "bob-key", "carol-key"):
            auth = {"Authorization": f"Bearer {dev}"}
            home = HashRing(urls).home("key-" +
                                       hashlib.sha256(f"Bearer {dev}".encode()).hexdigest()[:32])
            seen, cached = set(), []
            for middle in ("def g(", "def g(y", "def g(y,"):
                r = httpx.post(f"{rurl}/infill", json=vim_fim(f"# {dev}\n" + FILE, middle,
                                                              "\n" + LINES[0], EXTRA), headers=auth,
                               timeout=60)
                assert r.status_code == 200 and VIM_ACCEPTS.search(r.text), r.text
                seen.add(r.headers["x-warmpath-node"])
                cached.append(r.json()["tokens_cached"])
            assert seen == {home}
            # the node kept this developer's prefix warm
            assert cached[1] > 64 and cached[2] >= cached[1]
        assert counter(rurl, "warmpath_router_decisions_total",
                       'decision="affinity_kept",policy="hybrid"') == 9


def test_ollama_and_mistral_clients_through_the_router(fleet):
    node = next(iter(fleet))
    name = httpx.get(f"{node}/v1/models").json()["data"][0]["id"]
    suffix = "\n\nprint(add(1, 2))\n"
    with router([node]) as (rurl, _):
        direct, routed = ollama.Client(host=node), ollama.Client(host=rurl)
        opts = {"num_predict": 12, "temperature": 0}
        want = direct.generate(model=name, prompt=CODE, suffix=suffix, options=opts).response
        assert routed.generate(model=name, prompt=CODE, suffix=suffix,
                               options=opts).response == want
        parts = list(
            routed.generate(model=name, prompt=CODE, suffix=suffix, options=opts, stream=True))
        assert "".join(p.response for p in parts) == want and parts[-1].done and len(parts) > 2
        assert [m.model
                for m in routed.list().models] == [name] and ".Suffix" in routed.show(name).template
        assert httpx.get(f"{rurl}/api/version").json() == httpx.get(f"{node}/api/version").json()
        m = Mistral(api_key="unused", server_url=rurl)
        r = m.fim.complete(model=name, prompt=CODE, suffix=suffix, max_tokens=12, temperature=0)
        assert r.choices[0].message.content == want
        events = list(
            m.fim.stream(model=name, prompt=CODE, suffix=suffix, max_tokens=12, temperature=0))
        assert "".join(e.data.choices[0].delta.content or "" for e in events) == want


def test_tabby_keeps_its_node_by_user_or_token_and_greedy_answers_are_cached(fleet):
    urls = list(fleet)
    with router(urls) as (rurl, _):
        body = {
            "language": "python", "segments": {"prefix": CODE, "suffix": "\n\nprint(add(1, 2))\n"},
            "user": "dana"
        }
        home = HashRing(urls).home("dana")
        direct = httpx.post(f"{home}/v1/completions", json=body, timeout=60).json()
        r = httpx.post(f"{rurl}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.headers["x-warmpath-node"] == home
        assert r.json()["choices"] == direct["choices"]
        # greedy: Tabby's default here
        again = httpx.post(f"{rurl}/v1/completions", json=body, timeout=60)
        assert again.headers.get(
            "x-warmpath-cache") == "hit" and again.json()["choices"] == direct["choices"]
        sampled = httpx.post(f"{rurl}/v1/completions", json={**body, "temperature": 0.5},
                             timeout=60)
        assert sampled.status_code == 200 and "x-warmpath-cache" not in sampled.headers
        for dev in ("erin-key", "frank-key"):
            # tabby-agent's `token`, no user: the bearer token is the session
            auth = {"Authorization": f"Bearer {dev}"}
            key_home = HashRing(urls).home(
                "key-" + hashlib.sha256(f"Bearer {dev}".encode()).hexdigest()[:32])
            for n in range(2):
                seg = {"prefix": f"# {dev} {n}\n" + CODE, "suffix": ""}
                r = httpx.post(f"{rurl}/v1/completions", json={"segments": seg}, headers=auth,
                               timeout=60)
                assert r.status_code == 200 and r.headers["x-warmpath-node"] == key_home
        name = httpx.get(f"{home}/v1/models").json()["data"][0]["id"]
        # a node's health: the agent offers completions
        assert httpx.get(f"{rurl}/v1/health").json()["model"] == name
        assert httpx.get(f"{rurl}/v1beta/server_setting").json() == {
            "disable_client_side_telemetry": True
        }
        event = {"type": "select", "completion_id": "cmpl-1", "choice_index": 0}
        assert httpx.post(f"{rurl}/v1/events", json=event).status_code == 200
        assert httpx.post(f"{rurl}/v1/events", json={**event, "type": "nope"}).status_code == 400


@pytest.mark.parametrize(
    "path,body,empty",
    [
        ("/infill", {"input_prefix": CODE * 60, "n_predict": 300}, lambda b: b["content"] == ""),
        ("/api/generate", {
            "model": None, "prompt": CODE * 60, "raw": True, "stream": False,
            "options": {"num_predict": 300}
        }, lambda b: b["response"] == "" and b["done"]),
        ("/v1/fim/completions", {"model": None, "prompt": CODE * 60, "max_tokens": 300
                                 }, lambda b: b["choices"][0]["message"]["content"] == ""),
        ("/v1/completions", {"segments": {"prefix": CODE * 60}
                             }, lambda b: b["choices"][0]["text"] == ""),  # Tabby's
    ])
def test_past_the_deadline_each_protocol_gets_its_empty_answer(fleet, path, body, empty):
    node, app = next(iter(fleet.items()))
    body = {
        **body, **({
            "model": httpx.get(f"{node}/v1/models").json()["data"][0]["id"]
        } if "model" in body else {})
    }
    with router([node]) as (rurl, _):
        r = httpx.post(f"{rurl}{path}", json=body, headers={"X-Deadline-Ms": "30"}, timeout=60)
        assert r.status_code == 200 and empty(r.json()), r.text
        wait_for_step(app, lambda e: not e.requests)


def test_a_disconnect_through_the_router_aborts_on_the_node(fleet):
    url, app = next(iter(fleet.items()))
    with router([url]) as (rurl, _):
        before = counter(url, "warmpath_requests_aborted_total", 'reason="client"')

        async def leave():
            async with httpx.AsyncClient(timeout=60) as http:
                body = {"input_prefix": "# leave\n" + CODE * 12, "n_predict": 400, "stream": True}
                async with http.stream("POST", f"{rurl}/infill", json=body) as r:
                    async for _ in r.aiter_lines():
                        return
        asyncio.run(leave())
        wait_for_step(app, lambda e: not e.requests and e.pool.num_used == 0)
        assert counter(url, "warmpath_requests_aborted_total", 'reason="client"') == before + 1
        assert [n["in_flight"] for n in httpx.get(f"{rurl}/health").json()["nodes"]] == [0]


def test_bad_input_is_the_nodes_and_the_routers_faults_are_the_protocols(fleet):
    node = next(iter(fleet))
    with router([node]) as (rurl, _):
        for path, payload in (("/infill", {"n_predict": "x"}), ("/api/generate", {"prompt": "x"}),
                              ("/v1/fim/completions", {"prompt": 1}), ("/infill", "[")):
            content = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            direct = httpx.post(f"{node}{path}", content=content)
            routed = httpx.post(f"{rurl}{path}", content=content)
            assert routed.status_code == direct.status_code and 400 <= direct.status_code < 500
            assert routed.json() == direct.json()
        for payload in ({"segments": {"prefix": 1}}, {"segments": None}):
            # Tabby's errors are plain text
            direct = httpx.post(f"{node}/v1/completions", json=payload)
            routed = httpx.post(f"{rurl}/v1/completions", json=payload)
            assert routed.status_code == direct.status_code and 400 <= direct.status_code < 500
            assert routed.text == direct.text and routed.headers["content-type"].startswith(
                "text/plain")
    with router([f"http://127.0.0.1:{free_port()}"]) as (rurl, _):
        for path, method in (("/v1/completions", "POST"), ("/v1/health", "GET")):
            r = httpx.request(method, f"{rurl}{path}",
                              json={"segments": {"prefix": "x"}} if method == "POST" else None)
            assert r.status_code == 503 and r.headers["content-type"].startswith(
                "text/plain") and r.text
        r = httpx.post(f"{rurl}/infill", json={"input_prefix": "x"})
        assert r.status_code == 503 and set(r.json()["error"]) == {"code", "message", "type"}
        r = httpx.post(f"{rurl}/api/generate", json={"model": "m", "prompt": "x"})
        assert r.status_code == 503 and isinstance(r.json()["error"], str)


def test_tiers_send_an_editor_protocols_line_completions_to_the_small_model(fleet):
    """With model tiers the router applies the line rule (router/model_tiers.py) to an editor
    protocol's limits and suffix: a few tokens with the rest of the cursor's line empty or closing
    brackets go to the small tier; more tokens than --line-max-tokens (llama.vim's default n_predict
    128; Tabby's 64), no limit, or code after the cursor on its line go to the large tier.
    (test_router.py covers OpenAI's /v1/completions and chat.)"""
    small, *large = list(fleet)
    name = httpx.get(f"{small}/v1/models").json()["data"][0]["id"]
    # the cursor's line ends at once / goes on with code
    line, rest = ")\n" + LINES[0], " + 1)\n" + LINES[0]

    def generate(suffix: str, num_predict: int) -> dict:
        return {"model": name, "prompt": CODE, "suffix": suffix, "stream": False,
                "options": {"num_predict": num_predict, "temperature": 0}}

    cases = [
        ("/infill", {**vim_fim(FILE, "x = add(1", line, EXTRA), "n_predict": 8}, "small"),
        ("/infill", {"input_prefix": CODE, "input_suffix": "\n" + LINES[0],
                     "n_predict": 16}, "small"),
        ("/infill", vim_fim(FILE, "x = add(1", line, EXTRA), "large"),  # n_predict 128
        ("/infill", {"input_prefix": CODE,
                     "input_suffix": line}, "large"),  # n_predict -1: up to the context
        ("/infill",
         {"input_prefix": CODE, "prompt": "x = add(1", "input_suffix": rest,
          "n_predict": 8}, "large"),
        ("/api/generate", generate(line, 8), "small"),
        ("/api/generate", generate(line, 64), "large"),
        ("/api/generate", generate(rest, 8), "large"),
        ("/v1/fim/completions", {"model": name, "prompt": CODE, "suffix": line,
                                 "max_tokens": 8}, "small"),
        ("/v1/fim/completions", {"model": name, "prompt": CODE, "suffix": rest,
                                 "max_tokens": 8}, "large"),
        ("/v1/completions", {"segments": {"prefix": CODE,
                                          "suffix": line}}, "large"),  # Tabby's: 64 tokens
    ]
    cfg = RouterConfig(tier=[f"small={small}", f"large={','.join(large)}"], health_interval=0.2)
    with running_app(create_router_app(cfg)) as (rurl, _):
        for path, body, tier in cases:
            r = httpx.post(f"{rurl}{path}", json=body, timeout=60)
            assert r.status_code == 200, (path, r.text)
            assert (r.headers["x-warmpath-node"] == small) == (tier == "small"), (path, body, tier)
            assert r.headers["x-warmpath-node"] in ([small] if tier == "small" else large)
        assert counter(rurl, "warmpath_router_tier_requests_total", 'kind="line",tier="small"') == 4
        assert counter(rurl, "warmpath_router_tier_requests_total",
                       'kind="multi",tier="large"') == 7
