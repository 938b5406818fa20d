"""The router under hostile or broken traffic: the response cache per tenant and only after validation, the
body limit on bytes received, bad text and header bytes, hung nodes (first-byte and idle bounds, a node that
leaves the ring), and error shapes."""

import contextlib
import json

import httpx
import pytest
from server_harness import CODE, running_app, running_server, total
from test_server_hardening import chunked_upload, raw_request

from warmpath.config import RouterConfig, ServerConfig
from warmpath.router.app import create_router_app


@contextlib.contextmanager
def router(urls, **kwargs):
    cfg = RouterConfig(node=list(urls), health_interval=kwargs.pop("health_interval", 0.2), **kwargs)
    with running_app(create_router_app(cfg)) as (url, app):
        yield url, app


@pytest.fixture(scope="module")
def keyed_node(server_config):
    """A node that wants an API key; routers in front of it forward the client's Authorization."""
    with running_server(server_config, ServerConfig(api_key="node-key", max_body_bytes=1 << 20)) as (url, app):
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
        assert httpx.post(url, json=body, headers=GOOD, timeout=60).headers.get("x-warmpath-cache") == "hit"
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


def test_the_body_limit_counts_bytes_received_through_the_router(keyed_node):
    node, _ = keyed_node
    with router([node], max_body_bytes=1 << 20) as (rurl, _):
        status, body, sent = chunked_upload(rurl, 1 << 20, GOOD)
        assert status == 413 and json.loads(body)["error"]["message"].startswith("request body over")
        assert sent < (1 << 20) + (1 << 20)  # answered once the limit passed, not after the whole upload


def test_header_bytes_that_are_not_utf8_never_get_a_500(keyed_node):
    node, _ = keyed_node
    with router([node]) as (rurl, _):
        payload = json.dumps({"prompt": "x", "max_tokens": 2}).encode()
        status, _ = raw_request(rurl, b"POST", b"/v1/completions", payload,
                                [b"Authorization: Bearer node-key", b"X-Session-Id: caf\xe9"])
        assert status == 200
        status, body = raw_request(rurl, b"POST", b"/v1/completions", payload, [b"Authorization: Bearer \xff"])
        assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"


def test_unencodable_text_is_the_nodes_400_and_never_a_failover(fleet2):
    from test_server_hardening import LONE

    with router(fleet2, policy="round-robin") as (rurl, _):
        for temperature in (0, 1):
            for path, body in (("/v1/completions", {"prompt": LONE, "user": LONE}),
                               ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONE}]})):
                r = httpx.post(rurl + path, content=json.dumps({**body, "max_tokens": 2, "temperature": temperature}),
                               headers={"Content-Type": "application/json"}, timeout=60)
                assert r.status_code == 400 and "error" in r.json(), r.text
        assert total(rurl, "warmpath_router_failovers_total") == 0
