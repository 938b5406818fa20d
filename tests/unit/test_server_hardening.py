"""The server under hostile or broken input: the body limit on bytes received (chunked too), bad text and
header bytes, tokenization off the event loop, the cache salt, connection timeouts, the overload estimate,
error shapes and the OpenAI parameters it implements or refuses, and chat content that cannot forge turns."""

import http.client
import json
import select
import socket

import httpx
import pytest
from server_harness import CODE, running_server

from warmpath.config import ServerConfig


def _connect(url: str, timeout: float = 30) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def raw_request(url: str, method: bytes, path: bytes, body: bytes, headers: list[bytes]) -> tuple[int, bytes]:
    """One request with header bytes exactly as given (httpx would refuse to send some of them)."""
    with _connect(url) as s:
        head = [method + b" " + path + b" HTTP/1.1", b"Host: x", b"Content-Type: application/json",
                b"Content-Length: %d" % len(body), *headers]
        s.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
        resp = http.client.HTTPResponse(s)
        resp.begin()
        return resp.status, resp.read()


def chunked_upload(url: str, limit: int, headers: dict[str, str]) -> tuple[int, bytes, int]:
    """A chunked body of up to 4 x `limit` bytes sent 64 KB at a time, stopping as soon as an answer comes:
    (status, body, bytes sent by then)."""
    with _connect(url) as s:
        head = [b"POST /v1/completions HTTP/1.1", b"Host: x", b"Content-Type: application/json",
                b"Transfer-Encoding: chunked", *(f"{k}: {v}".encode() for k, v in headers.items())]
        s.sendall(b"\r\n".join(head) + b"\r\n\r\n")
        sent, piece = 0, b"x" * (64 << 10)
        try:
            for i in range(4 * limit // len(piece)):
                data = (b'{"prompt": "' if i == 0 else b"") + piece
                s.sendall(b"%x\r\n%s\r\n" % (len(data), data))
                sent += len(data)
                if select.select([s], [], [], 0.01)[0]:
                    break
            else:
                s.sendall(b'2\r\n"}\r\n0\r\n\r\n')
        except (BrokenPipeError, ConnectionResetError):
            pass
        resp = http.client.HTTPResponse(s)
        resp.begin()
        return resp.status, resp.read(), sent


@pytest.fixture(scope="module")
def keyed(server_config):
    with running_server(server_config, ServerConfig(api_key="k", max_body_bytes=1 << 20)) as (url, app):
        yield url, app


AUTH = {"Authorization": "Bearer k"}


def test_a_chunked_body_over_the_limit_is_refused_as_it_arrives(keyed):
    url, app = keyed
    status, body, sent = chunked_upload(url, 1 << 20, AUTH)
    assert status == 413 and json.loads(body)["error"]["message"] == f"request body over {1 << 20} bytes"
    assert sent < 2 << 20  # refused once the limit passed, not after the whole upload
    assert httpx.get(f"{url}/health").status_code == 200 and app.state.async_engine.alive
    small = httpx.post(f"{url}/v1/completions", json={"prompt": CODE, "max_tokens": 2}, headers=AUTH, timeout=60)
    assert small.status_code == 200


def test_header_bytes_that_are_not_utf8_never_get_a_500(keyed):
    url, _ = keyed
    payload = json.dumps({"prompt": "x", "max_tokens": 2}).encode()
    status, _ = raw_request(url, b"POST", b"/v1/completions", payload, [b"Authorization: Bearer k",
                                                                         b"X-Session-Id: caf\xe9"])
    assert status == 200
    status, body = raw_request(url, b"POST", b"/v1/completions", payload, [b"Authorization: Bearer \xff"])
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
