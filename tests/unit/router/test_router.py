"""`warmpath route` in front of three real tiny-model servers on loopback: affinity and the prefix
cache, byte-identical streaming, failover before the first byte, an error event (never [DONE]) when
a node dies mid-stream, client disconnect and deadline reach the node, drain, tiering, the response
cache, bad input and auth exactly as on a node, /health and /metrics."""

import asyncio
import contextlib
import json
import signal

import httpx
import pytest
from bad_requests import BAD
from server_harness import (
    CODE,
    counter,
    free_port,
    running_app,
    running_server,
    serve_process,
    stream_then_signal,
    total,
    wait_for_step,
)
from server_harness import (
    running_router as router,
)

from warmpath.config import EngineConfig, RouterConfig, ServerConfig
from warmpath.router.app import create_router_app
from warmpath.router.hashing import HashRing


@pytest.fixture(scope="module")
def fleet(server_config):
    with contextlib.ExitStack() as stack:
        nodes = [stack.enter_context(running_server(server_config)) for _ in range(3)]
        yield {url: app for url, app in nodes}


def complete(url: str, prompt: str, session: str | None = None, **body) -> httpx.Response:
    headers = {"X-Session-Id": session} if session else {}
    return httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 4, **body},
                      headers=headers, timeout=60)


def session_homed_on(node: str, nodes: list[str], prefix: str = "dev") -> str:
    ring = HashRing(nodes)
    return next(f"{prefix}-{i}" for i in range(10_000) if ring.home(f"{prefix}-{i}") == node)


@pytest.mark.server
def test_a_session_stays_on_its_node_and_hits_its_prefix_cache(fleet):
    urls = list(fleet)
    with router(urls, policy="session") as (rurl, _):
        for i, dev in enumerate(["alice", "bob", "carol", "dave"]):
            text = f"# {dev}\n" + CODE * (6 + i)
            seen, cached = set(), []
            for turn in range(3):
                r = complete(rurl, text, dev)
                assert r.status_code == 200, r.text
                seen.add(r.headers["x-warmpath-node"])
                cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
                text += f"x{turn} = {turn}\n"
            assert len(seen) == 1 and seen == {HashRing(urls).home(dev)}
            # the node kept the session's prefix warm
            assert cached[0] == 0 and min(cached[1:]) >= 64
        decisions = counter(rurl, "warmpath_router_decisions_total",
                            'decision="affinity_kept",policy="session"')
        assert decisions == 12


@pytest.mark.server
def test_round_robin_spreads_a_session_over_every_node(fleet):
    with router(fleet, policy="round-robin") as (rurl, _):
        seen = {complete(rurl, CODE, "erin").headers["x-warmpath-node"] for _ in range(3)}
        assert seen == set(fleet)


@pytest.mark.server
def test_streams_through_the_router_are_the_nodes_bytes(fleet):
    node = next(iter(fleet))
    body = {"prompt": CODE * 3, "max_tokens": 12, "temperature": 0, "stream": True, "seed": 1}
    direct = httpx.post(f"{node}/v1/completions", json=body, timeout=60)
    with router([node], cache_entries=0) as (rurl, _):
        routed = httpx.post(f"{rurl}/v1/completions", json=body, timeout=60)
    assert routed.headers["content-type"].startswith("text/event-stream")

    def texts(r):
        events = [e[6:] for e in r.text.split("\n\n") if e.startswith("data: ")]
        assert events[-1] == "[DONE]"
        return "".join(c["text"] for e in events[:-1] for c in json.loads(e)["choices"])
    assert texts(routed) == texts(direct) and texts(direct)


@pytest.mark.server
@pytest.mark.parametrize("payload,status", BAD)
def test_bad_input_gets_exactly_the_nodes_error(fleet, payload, status):
    node = next(iter(fleet))
    headers = {"Content-Type": "application/json"}
    direct = httpx.post(f"{node}/v1/completions", content=payload, headers=headers)
    with router([node]) as (rurl, _):
        routed = httpx.post(f"{rurl}/v1/completions", content=payload, headers=headers)
    assert routed.status_code == direct.status_code == status
    assert routed.json() == direct.json()


@pytest.mark.server
def test_auth_body_limit_and_bad_headers_as_on_a_node(fleet):
    node = next(iter(fleet))
    with router([node], api_key="sekret", upstream_api_key=None) as (rurl, _):
        r = httpx.post(f"{rurl}/v1/completions", json={"prompt": "x"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{rurl}/health").status_code == 200  # open, as on a node
        ok = httpx.post(f"{rurl}/v1/completions", json={"prompt": "x", "max_tokens": 2},
                        headers={"Authorization": "Bearer sekret"}, timeout=60)
        assert ok.status_code == 200
    with router([node]) as (rurl, _):
        # just over the 4 MiB limit: refused as it arrives, with the upload all but done (a client
        # still sending megabytes when the server answers and closes may see the reset before the
        # 413)
        big = b'{"prompt": "' + b"x" * ((4 << 20) + 4096) + b'"}'
        r1 = httpx.post(f"{rurl}/v1/completions", content=big,
                        headers={"Content-Type": "application/json"})
        r2 = httpx.post(f"{node}/v1/completions", content=big,
                        headers={"Content-Type": "application/json"})
        assert r1.status_code == r2.status_code == 413 and r1.json() == r2.json()
        r1 = httpx.post(f"{rurl}/v1/completions", json={"prompt": "x"},
                        headers={"X-Deadline-Ms": "soon"})
        r2 = httpx.post(f"{node}/v1/completions", json={"prompt": "x"},
                        headers={"X-Deadline-Ms": "soon"})
        assert r1.status_code == r2.status_code == 400 and r1.json() == r2.json()
        r1 = httpx.post(f"{rurl}/v1/chat/completions",
                        json={"messages": [{"role": "wizard", "content": "x"}]})
        r2 = httpx.post(f"{node}/v1/chat/completions",
                        json={"messages": [{"role": "wizard", "content": "x"}]})
        assert r1.status_code == r2.status_code == 400 and r1.json() == r2.json()


@pytest.mark.server
def test_a_node_that_refuses_fails_over_before_the_first_byte(fleet, tiny_long_dir):
    cfg = EngineConfig(model=str(tiny_long_dir), dtype="float32", num_kv_blocks=256)
    with contextlib.ExitStack() as stack:
        victim, _ = stack.enter_context(running_server(cfg))
        urls = [*fleet, victim]
        with router(urls, health_interval=3600, policy="session") as (rurl, _):
            # health checks won't notice
            dev = session_homed_on(victim, urls)
            assert complete(rurl, CODE, dev).headers["x-warmpath-node"] == victim
            stack.close()  # the victim stops: it now refuses connections
            for stream in (False, True):
                r = complete(rurl, CODE, dev, stream=stream)
                assert r.status_code == 200 and r.headers["x-warmpath-node"] != victim
                assert "error" not in r.text and r.text
            assert counter(rurl, "warmpath_router_failovers_total", f'node="{victim}"') == 1
            health = httpx.get(f"{rurl}/health").json()
            assert [n["healthy"] for n in health["nodes"] if n["url"] == victim] == [False]
            # its sessions moved to the next node on the ring, nobody else's did
            others = [f"dev-{i}" for i in range(200)
                      if HashRing(urls).home(f"dev-{i}") != victim][:5]
            for key in others:
                assert complete(rurl, "x",
                                key).headers["x-warmpath-node"] == HashRing(urls).home(key)


@pytest.mark.server
def test_a_node_dying_mid_stream_ends_the_stream_with_an_error_event(tiny_long_dir, fleet):
    with serve_process("--model", str(tiny_long_dir), "--dtype", "float32", "--num-kv-blocks",
                       "512", "--num-threads", "1") as (node, proc):
        with router([node, *fleet], policy="session", health_interval=3600) as (rurl, _):
            dev = session_homed_on(node, [node, *fleet])
            # the node dies mid-stream
            events, _ = stream_then_signal(rurl, dev, node, proc.pid, signal.SIGKILL)
            assert "[DONE]" not in events  # never a clean end
            last = json.loads(events[-1])
            assert last["error"]["code"] == "upstream_failed"
            assert counter(rurl, "warmpath_router_degraded_total",
                           'reason="mid_stream_failure"') == 1
            # the next request from that session fails over to a live node (no replay of the lost
            # one)
            r = complete(rurl, CODE, dev)
            assert r.status_code == 200 and r.headers["x-warmpath-node"] in fleet


@pytest.mark.server
def test_client_disconnect_and_deadline_reach_the_node(fleet):
    url, app = next(iter(fleet.items()))
    with router([url]) as (rurl, _):
        before = counter(url, "warmpath_requests_aborted_total", 'reason="client"')

        async def drop_after_first_chunk():
            async with httpx.AsyncClient(timeout=60) as http:
                body = {
                    "prompt": "# decode\n" + CODE * 12, "max_tokens": 400, "temperature": 0,
                    "stream": True
                }
                async with http.stream("POST", f"{rurl}/v1/completions", json=body) as r:
                    async for _ in r.aiter_lines():
                        return  # the developer typed again: the client closes the stream
        asyncio.run(drop_after_first_chunk())
        wait_for_step(app, lambda e: not e.requests and e.pool.num_used == 0)
        assert counter(url, "warmpath_requests_aborted_total", 'reason="client"') == before + 1
        # the router closed the upstream stream first: nothing counted in flight, nothing leaked
        assert [n["in_flight"] for n in httpx.get(f"{rurl}/health").json()["nodes"]] == [0]
        # past the deadline: silence (200, empty, "deadline"), and the node stops working on it
        r = httpx.post(f"{rurl}/v1/completions", json={"prompt": CODE * 60, "max_tokens": 500},
                       headers={"X-Deadline-Ms": "30"}, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == ""
        assert r.json()["choices"][0]["finish_reason"] == "deadline"
        wait_for_step(app, lambda e: not e.requests)
        r = httpx.post(f"{rurl}/v1/completions",
                       json={"prompt": CODE * 60, "max_tokens": 500,
                             "stream": True}, headers={"X-Deadline-Ms": "30"}, timeout=60)
        events = [e[6:] for e in r.text.split("\n\n") if e.startswith("data: ")]
        assert events[-1] == "[DONE]" and json.loads(
            events[-2])["choices"][0]["finish_reason"] == "deadline"
        wait_for_step(app, lambda e: not e.requests)


@pytest.mark.server
def test_a_request_cancelled_before_its_first_token_stops_the_node_at_once(fleet):
    """A newer keystroke closes the stream while the node is still prefilling: the router must pass
    that on then, not when the first token would have come."""
    url, app = next(iter(fleet.items()))
    with router([url]) as (rurl, rapp):
        before = counter(url, "warmpath_requests_aborted_total", 'reason="client"')
        prompt = "# cancelled early\n" + CODE * 12  # ~700 tokens at 64 per step: a long prefill

        def prefilling(e):
            return any(0 < r.num_computed_tokens < len(r.prompt_token_ids) - 64
                       for r in e.requests.values())

        async def type_again():
            async with httpx.AsyncClient(timeout=60) as http:
                body = {"prompt": prompt, "max_tokens": 50, "stream": True}
                task = asyncio.create_task(http.post(f"{rurl}/v1/completions", json=body))
                await asyncio.to_thread(wait_for_step, app, prefilling)
                task.cancel()  # the client closes the connection mid-prefill
                await asyncio.gather(task, return_exceptions=True)
        asyncio.run(type_again())
        steps = app.state.engine.num_steps
        wait_for_step(app, lambda e: not e.requests)
        assert counter(url, "warmpath_requests_aborted_total", 'reason="client"') == before + 1
        # aborted within a few steps, not after the prefill
        assert app.state.engine.num_steps <= steps + 3
        assert [n["in_flight"] for n in httpx.get(f"{rurl}/health").json()["nodes"]] == [0]


@pytest.mark.server
def test_drain_stops_new_requests_while_streams_finish(fleet):
    urls = list(fleet)
    with router(urls, policy="session", admin_key="adm") as (rurl, _):
        home = urls[0]
        dev = session_homed_on(home, urls)
        admin = {"Authorization": "Bearer adm"}
        assert httpx.post(f"{rurl}/admin/nodes/drain", json={"node": home}).status_code == 401
        with httpx.stream("POST", f"{rurl}/v1/completions", timeout=60,
                          headers={"X-Session-Id": dev},
                          json={"prompt": CODE * 10, "max_tokens": 30, "stream": True}) as r:
            assert r.headers["x-warmpath-node"] == home
            d = httpx.post(f"{rurl}/admin/nodes/drain", json={"node": home}, headers=admin)
            assert d.status_code == 200 and d.json()["draining"]
            # new work goes elsewhere
            assert complete(rurl, CODE, dev).headers["x-warmpath-node"] != home
            text = r.read().decode()
        # the stream in flight finished on the draining node
        assert text.rstrip().endswith("data: [DONE]")
        nodes = httpx.get(f"{rurl}/admin/nodes", headers=admin).json()["nodes"]
        assert [n["in_flight"] for n in nodes if n["url"] == home] == [0]
        httpx.post(f"{rurl}/admin/nodes/undrain", json={"node": home}, headers=admin)
        # the session comes back
        assert complete(rurl, CODE, dev).headers["x-warmpath-node"] == home
        seen = httpx.get(f"{rurl}/admin/sessions", headers=admin).json()["sessions"][dev]
        assert seen == {"node": home, "requests": 3}
        assert httpx.post(f"{rurl}/admin/nodes/drain", json={"node": "http://nowhere:1"},
                          headers=admin).status_code == 404
    with router(urls) as (rurl, _):
        assert httpx.get(f"{rurl}/admin/nodes").status_code == 403  # no admin key configured: off


@pytest.mark.server
def test_response_cache_serves_repeats_without_a_node(fleet):
    urls = list(fleet)
    with router(urls) as (rurl, _):
        sent = lambda: total(rurl, "warmpath_router_requests_total")  # noqa: E731
        first = complete(rurl, CODE, "fay", temperature=0)
        n = sent()
        again = complete(rurl, CODE, "someone-else", temperature=0)
        assert again.headers.get(
            "x-warmpath-cache") == "hit" and again.json() == first.json() and sent() == n
        streamed = [complete(rurl, CODE, "fay", temperature=0, stream=True) for _ in range(2)]
        assert streamed[1].headers.get(
            "x-warmpath-cache") == "hit" and streamed[1].text == streamed[0].text
        complete(rurl, CODE, "fay", temperature=0.8)
        complete(rurl, CODE, "fay", temperature=0.8)
        assert sent() == n + 3  # sampling requests always reach a node
        assert counter(rurl, "warmpath_router_cache_requests_total", 'result="hit"') == 2


@pytest.mark.server
def test_tiers_send_line_completions_to_the_small_model(fleet):
    small, *large = list(fleet)
    cfg = RouterConfig(tier=[f"small={small}", f"large={','.join(large)}"], health_interval=0.2)
    with running_app(create_router_app(cfg)) as (rurl, _):
        r = httpx.post(f"{rurl}/v1/completions",
                       json={"prompt": "x = f(", "suffix": ")\n", "max_tokens": 8}, timeout=60)
        assert r.status_code == 200 and r.headers["x-warmpath-node"] == small
        r = httpx.post(f"{rurl}/v1/completions", json={"prompt": "def f():\n", "max_tokens": 64},
                       timeout=60)
        assert r.headers["x-warmpath-node"] in large
        r = httpx.post(f"{rurl}/v1/chat/completions",
                       json={"messages": [{"role": "user", "content": "explain"}],
                             "max_tokens": 4}, timeout=60)
        assert r.status_code == 200 and r.headers["x-warmpath-node"] in large
        r = httpx.post(f"{rurl}/v1/completions", json={"prompt": "def f():\n", "max_tokens": 64},
                       headers={"X-Completion-Kind": "line"}, timeout=60)
        assert r.headers["x-warmpath-node"] == small
        assert counter(rurl, "warmpath_router_tier_requests_total", 'kind="line",tier="small"') == 2
        assert counter(rurl, "warmpath_router_tier_requests_total",
                       'kind="multi",tier="large"') == 2


@pytest.mark.server
def test_health_reflects_the_nodes_and_no_node_is_an_error(fleet):
    closed = f"http://127.0.0.1:{free_port()}"
    with router([closed]) as (rurl, _):
        assert httpx.get(f"{rurl}/health").status_code == 503
        r = complete(rurl, "x")
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_node"
    with router([*fleet, closed]) as (rurl, _):
        h = httpx.get(f"{rurl}/health")
        assert h.status_code == 200 and sum(n["healthy"] for n in h.json()["nodes"]) == 3
        models = httpx.get(f"{rurl}/v1/models").json()["data"]
        assert len(models) == 1
        # the fleet's prefix-cache counters are the sum of the nodes'
        fleet_hits = counter(rurl, "warmpath_prefix_cache_hit_tokens_total")
        assert fleet_hits == sum(
            counter(u, "warmpath_prefix_cache_hit_tokens_total") for u in fleet)


def test_router_config_errors():
    with pytest.raises(ValueError, match="no nodes"):
        create_router_app(RouterConfig())
    with pytest.raises(ValueError, match="not both"):
        create_router_app(RouterConfig(node=["http://a:1"], tier=["small=http://b:1"]))
    with pytest.raises(ValueError, match="policy"):
        create_router_app(RouterConfig(node=["http://a:1"], policy="random"))
    assert ServerConfig  # the router reuses the server's guard (same 401/413 shapes)
