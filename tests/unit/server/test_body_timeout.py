"""Issue 18 item 7's body read timeout (README Security: `--body-timeout`, 408), on the server and
on the router: a client that sends its headers and part of its body, then stalls, is answered 408 in
the OpenAI shape once the bound passes and its connection is closed; the server goes on answering.
(test_server_hardening.py and test_router_hardening.py cover the header timeout and the connection
limit.)"""

import contextlib
import json
import time

import httpx
import pytest
from bad_requests import closed_or_answered, connect
from server_harness import running_app, running_server

from warmpath.config import RouterConfig, ServerConfig
from warmpath.router.app import create_router_app

pytestmark = pytest.mark.server


@contextlib.contextmanager
def target(via: str, server_config):
    with running_server(server_config, ServerConfig(body_timeout=1.0)) as (url, _):
        if via == "serve":
            yield url
            return
        with running_app(
                create_router_app(RouterConfig(node=[url], health_interval=0.2,
                                               body_timeout=1.0))) as (rurl, _):
            yield rurl


@pytest.mark.parametrize("via", ["serve", "route"])
def test_a_body_that_stalls_is_answered_408_and_closed(server_config, via):
    with target(via, server_config) as url:
        with connect(url) as s:
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1000\r\n\r\n" +
                b'{"prompt": "x')  # 13 of the 1,000 bytes announced
            t = time.monotonic()
            answer = closed_or_answered(s, 10.0)
            waited = time.monotonic() - t
        # answered, then closed
        assert answer is not None and answer.startswith(b"HTTP/1.1 408"), answer
        assert 0.8 < waited < 5.0, waited
        error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
        assert error["code"] == "timeout" and error["message"]
        assert httpx.get(f"{url}/health", timeout=30).status_code == 200
