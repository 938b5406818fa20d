"""Issue 18's bounds not covered elsewhere: `--response-timeout`, the router's bound on a whole
(non-streamed) answer — past it the node counts as failed: the request fails over while nothing has
reached the client, and with no node left the client gets the router's 502 — and
`--keep-alive-timeout`, after which an idle keep-alive connection is closed, on the server and on
the router.

The hung node is a real warmpath server whose step thread is stuck (its engine's step blocks until
the test lets it go): it accepts connections and answers /health, so only the router's own bound can
end the wait. (test_router_hardening.py covers the first-byte and idle bounds of streams;
test_server_hardening.py and test_body_timeout.py the header and body timeouts.)"""

import contextlib
import http.client
import threading
import time

import httpx
import pytest
from bad_requests import closed_or_answered, connect
from server_harness import CODE, counter, running_server, wait_for_step
from server_harness import running_router as router
from test_router import session_homed_on

from warmpath.config import ServerConfig

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def nodes(server_config):
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(running_server(server_config)) for _ in range(2)]


@contextlib.contextmanager
def stuck(app):
    """The node's next engine step blocks (a deadlocked step thread, as far as anyone outside can
    tell) until the block exits; then the node finishes what it was given (or aborts it: the router
    has gone)."""
    engine, release = app.state.engine, threading.Event()
    step = engine.step

    def blocked():
        release.wait(60)
        return step()

    engine.step = blocked
    try:
        yield
    finally:
        engine.step = step
        release.set()
        wait_for_step(app, lambda e: not e.requests)


def post(url: str, session: str, **body) -> tuple[httpx.Response, float]:
    """A completion through the router with this session; the answer and how long it took."""
    t = time.monotonic()
    r = httpx.post(f"{url}/v1/completions",
                   json={"prompt": CODE, "max_tokens": 4, "temperature": 0.5,
                         **body}, headers={"X-Session-Id": session}, timeout=30)
    return r, time.monotonic() - t


def test_a_whole_answer_past_the_response_timeout_fails_over(nodes):
    (hung, hung_app), (ok, _) = nodes
    urls = [hung, ok]
    dev = session_homed_on(hung, urls)
    # the first-byte bound out of the way: only response_timeout can end the wait on the hung node
    with router(urls, policy="session", response_timeout=2.0, first_byte_timeout=60.0) as (rurl, _):
        r, took = post(rurl, dev)  # a healthy node within the bound: answered as usual
        assert r.status_code == 200 and r.headers["x-warmpath-node"] == hung
        with stuck(hung_app):
            r, took = post(rurl, dev)
            assert r.status_code == 200 and r.headers["x-warmpath-node"] == ok, r.text
            assert r.json()["choices"][0]["finish_reason"] in ("length", "stop")
            assert 1.9 < took < 12, took  # failed over at the bound, not when the node came back
            assert counter(rurl, "warmpath_router_failovers_total", f'node="{hung}"') == 1
        assert all(n["in_flight"] == 0 for n in httpx.get(f"{rurl}/health").json()["nodes"])


def test_past_the_response_timeout_a_lone_node_is_a_502_and_streams_keep_the_first_byte_bound(
        nodes):
    (hung, hung_app), _ = nodes
    with router([hung], response_timeout=1.0, first_byte_timeout=4.0) as (rurl, _), stuck(hung_app):
        r, took = post(rurl, "solo")
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_failed", r.text
        assert 0.9 < took < 3.5, took
        # a stream's wait is the first-byte bound's, not this one
        r, took = post(rurl, "solo", stream=True)
        assert r.status_code == 502 and 3.5 < took < 10, (r.status_code, took)
        assert counter(rurl, "warmpath_router_degraded_total", 'reason="nodes_failed"') == 2


@contextlib.contextmanager
def target(via: str, server_config, nodes):
    """A server, or a router in front of one, that closes idle keep-alive connections after 1 s (and
    wants the next request's headers only within 30 s: that bound is not the one that closes
    them)."""
    limits = {"keep_alive_timeout": 1.0, "header_timeout": 30.0}
    if via == "serve":
        with running_server(server_config, ServerConfig(**limits)) as (url, _):
            yield url
    else:
        with router([nodes[1][0]], **limits) as (url, _):
            yield url


def _get(s) -> int:
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    resp = http.client.HTTPResponse(s)
    resp.begin()
    resp.read()
    return resp.status


@pytest.mark.parametrize("via", ["serve", "route"])
def test_an_idle_keep_alive_connection_is_closed_after_the_keep_alive_timeout(
        server_config, nodes, via):
    with target(via, server_config, nodes) as url:
        with connect(url) as s:
            assert _get(s) == 200
            time.sleep(0.3)
            # kept alive: the next request on the same connection, within the bound
            assert _get(s) == 200
            t = time.monotonic()
            closed = closed_or_answered(s, 10.0)
            waited = time.monotonic() - t
        assert closed == b"", closed  # closed without a word (no 408: that is the header timeout's)
        assert 0.7 < waited < 3.0, waited  # uvicorn's own default would be 5 s
        assert httpx.get(f"{url}/health").status_code == 200
