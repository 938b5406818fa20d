"""The router under hostile or broken traffic: the response cache per tenant and only after
validation, the body limit on bytes received, bad text and header bytes, hung nodes (first-byte and
idle bounds, a node that leaves the ring), and error shapes."""

import contextlib
import json
import os
import signal
import time

import httpx
import pytest
from bad_requests import (
    LONE,
    MALFORMED,
    chunked_upload,
    closed_or_answered,
    connect,
    is_openai_error,
    raw_request,
)
from server_harness import CODE, counter, running_server, serve_process, stream_then_signal, total
from server_harness import running_router as router
from test_router import complete, session_homed_on

from warmpath.config import ServerConfig

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def keyed_node(server_config):
    """A node that wants an API key; routers in front of it forward the client's Authorization."""
    with running_server(server_config, ServerConfig(api_key="node-key",
                                                    max_body_bytes=1 << 20)) as (url, app):
        yield url, app


@pytest.fixture(scope="module")
def fleet2(server_config):
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(running_server(server_config))[0] for _ in range(2)]


GOOD = {"Authorization": "Bearer node-key"}


@pytest.mark.parametrize("stream", [False, True])
def test_the_cache_never_answers_a_credential_the_node_would_refuse(keyed_node, stream):
    node, _ = keyed_node
    body = {"prompt": CODE, "max_tokens": 4, "temperature": 0, "stream": stream}
    with router([node], admin_key="admin-key") as (rurl, _):
        url = f"{rurl}/v1/completions"
        first = httpx.post(url, json=body, headers=GOOD, timeout=60)
        assert first.status_code == 200 and "x-warmpath-cache" not in first.headers
        assert httpx.post(url, json=body, headers=GOOD,
                          timeout=60).headers.get("x-warmpath-cache") == "hit"
        wrong = ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer admin-key"},
                 {"Authorization": "node-key"})
        for headers in wrong:
            r = httpx.post(url, json=body, headers=headers, timeout=60)
            assert r.status_code == 401 and "x-warmpath-cache" not in r.headers, (headers, r.text)
            assert r.json()["error"]["code"] == "invalid_api_key"
        # validated before the cache: the node would answer 400, so does the router, hit or not
        r = httpx.post(url, json=body, headers={**GOOD, "X-Deadline-Ms": "abc"}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "X-Deadline-Ms"
        # another tenant's salt is another entry
        r = httpx.post(url, json={**body, "cache_salt": "tenant-b"}, headers=GOOD, timeout=60)
        assert r.status_code == 200 and "x-warmpath-cache" not in r.headers


def test_the_router_takes_one_key_per_tenant_from_a_file(keyed_node, tmp_path):
    """The router checks its own keys (a file, one per tenant) and sends the nodes theirs; each
    tenant's cached answers are its own."""
    node, _ = keyed_node
    keys = tmp_path / "keys"
    keys.write_text("# tenants\ntenant-a\ntenant-b  # the second team\n")
    body = {"prompt": CODE, "max_tokens": 4, "temperature": 0}
    with router([node], api_keys_file=str(keys), upstream_api_key="node-key") as (rurl, _):
        url = f"{rurl}/v1/completions"
        for key in ("tenant-a", "tenant-b"):
            r = httpx.post(url, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)
            # b never sees a's entry
            assert r.status_code == 200 and "x-warmpath-cache" not in r.headers, key
        r = httpx.post(url, json=body, headers={"Authorization": "Bearer tenant-a"}, timeout=60)
        assert r.headers.get("x-warmpath-cache") == "hit"
        for headers in ({}, {"Authorization": "Bearer node-key"},
                        {"Authorization": "Bearer # tenants"}):
            assert httpx.post(url, json=body, headers=headers,
                              timeout=60).status_code == 401, headers


def test_the_body_limit_counts_bytes_received_through_the_router(keyed_node):
    node, _ = keyed_node
    with router([node], max_body_bytes=1 << 20) as (rurl, _):
        status, body, sent = chunked_upload(rurl, 1 << 20, GOOD)
        assert status == 413 and json.loads(body)["error"]["message"].startswith(
            "request body over")
        # answered once the limit passed, not after the whole upload
        assert sent < (1 << 20) + (1 << 20)


def test_header_bytes_that_are_not_utf8_never_get_a_500(keyed_node):
    node, _ = keyed_node
    with router([node]) as (rurl, _):
        payload = json.dumps({"prompt": "x", "max_tokens": 2}).encode()
        status, _ = raw_request(rurl, b"POST", b"/v1/completions", payload,
                                [b"Authorization: Bearer node-key", b"X-Session-Id: caf\xe9"])
        assert status == 200
        status, body = raw_request(rurl, b"POST", b"/v1/completions", payload,
                                   [b"Authorization: Bearer \xff"])
        assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"


def test_unencodable_text_is_the_nodes_400_and_never_a_failover(fleet2):
    with router(fleet2, policy="round-robin") as (rurl, _):
        for temperature in (0, 1):
            for path, body in (("/v1/completions", {"prompt": LONE, "user": LONE}),
                               ("/v1/chat/completions",
                                {"messages": [{"role": "user", "content": LONE}]})):
                r = httpx.post(
                    rurl + path,
                    content=json.dumps({**body, "max_tokens": 2, "temperature": temperature}),
                    headers={"Content-Type": "application/json"}, timeout=60)
                assert r.status_code == 400 and "error" in r.json(), r.text
        assert total(rurl, "warmpath_router_failovers_total") == 0


def _in_flight(rurl: str, node: str) -> int:
    """The router's count of requests in flight on `node`."""
    return next(n["in_flight"] for n in httpx.get(f"{rurl}/health").json()["nodes"]
                if n["url"] == node)


@pytest.mark.slow
def test_a_frozen_node_fails_over_what_it_has_not_started_and_ends_what_it_has(
        tiny_long_dir, fleet2):
    """A node stopped with SIGSTOP accepts connections (the kernel does) and answers nothing,
    forever."""
    with serve_process("--model", str(tiny_long_dir), "--dtype", "float32", "--num-kv-blocks",
                       "512", "--num-threads", "1") as (node, proc):
        urls = [node, *fleet2]
        dev = session_homed_on(node, urls)
        try:
            # health checks out of the way: the bounds alone (loose enough for the live nodes on a
            # busy machine)
            with router(urls, policy="session", health_interval=3600, first_byte_timeout=3.0,
                        idle_timeout=2.0) as (rurl, _):
                events, frozen = stream_then_signal(rurl, dev, node, proc.pid, signal.SIGSTOP)
                ended = time.monotonic() - frozen
                assert ended < 8, ended  # ended by the idle bound, not by the thaw
                assert "[DONE]" not in events and json.loads(
                    events[-1])["error"]["code"] == "upstream_failed"
                # nothing sent yet: past the first-byte bound the request fails over, for the client
                # unseen
                t = time.monotonic()
                r = complete(rurl, CODE, dev, stream=True)
                assert (
                    r.status_code == 200
                    and r.headers["x-warmpath-node"] != node
                    and "error" not in r.text
                )
                assert time.monotonic() - t < 10, time.monotonic() - t
                assert counter(rurl, "warmpath_router_failovers_total", f'node="{node}"') == 1
            os.kill(proc.pid, signal.SIGCONT)
            # health checks on, the bounds out of the way: sent to the node just frozen (the router
            # cannot know yet), the request fails over when the node leaves the ring
            with router(urls, policy="session", health_interval=0.3,
                        health_failures=2) as (rurl, _):
                os.kill(proc.pid, signal.SIGSTOP)
                t = time.monotonic()
                r = complete(rurl, CODE * 20, dev, max_tokens=8)
                assert r.status_code == 200 and r.headers["x-warmpath-node"] != node, r.text
                assert time.monotonic() - t < 15, time.monotonic() - t
                # it went there first
                assert counter(rurl, "warmpath_router_failovers_total", f'node="{node}"') == 1
                assert _in_flight(rurl, node) == 0
        finally:
            os.kill(proc.pid, signal.SIGCONT)


def test_the_router_cuts_off_slow_connections_and_answers_protocol_errors(fleet2):
    with router(fleet2, header_timeout=1.0, max_connections=4) as (rurl, _):
        slow = [connect(rurl) for _ in range(6)]
        for s in slow:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        answers = [closed_or_answered(s, 5.0) for s in slow]
        assert None not in answers and all(a[:12] in (b"HTTP/1.1 408", b"HTTP/1.1 503")
                                           for a in answers)
        for s in slow:
            s.close()
        status, body = raw_request(rurl, b"GET", b"/health", b"", [b"X-Big: " + b"a" * (1 << 20)])
        assert status == 431 and "error" in json.loads(body)
        assert httpx.get(f"{rurl}/health").status_code == 200


def test_errors_and_models_retrieve_through_the_router(fleet2):
    import openai

    with router(fleet2) as (rurl, _):
        for method, path, body, status in MALFORMED:
            r = httpx.request(method, rurl + path, content=body,
                              headers={"Content-Type": "application/json"})
            is_openai_error(r, status)
        r = httpx.post(f"{rurl}/v1/completions", json={"prompt": "x", "best_of": 3})
        assert is_openai_error(r, 400)["param"] == "best_of"  # the node's refusal, relayed
        c = openai.OpenAI(base_url=f"{rurl}/v1", api_key="unused", max_retries=0)
        name = c.models.list().data[0].id
        assert c.models.retrieve(name).id == name
        with pytest.raises(openai.NotFoundError):
            c.models.retrieve("gpt-9")
