"""Bad and hostile requests that every server, and the router in front of it, must answer in the
OpenAI error shape (the server's and the router's tests send the same ones), and a raw-socket client
for the bytes an HTTP library would not send: header bytes as given, a chunked body that stops at
the answer, a connection held open."""

import http.client
import json
import select
import socket

import httpx

# (body, status): /v1/completions bodies a node refuses, and the router in front of it alike
BAD = [
    (b"{not json", 400), (b"[1, 2]", 400), (b'"a string"', 400),
    (json.dumps({"prompt": ""}).encode(), 400),
    (json.dumps({"prompt": "x", "max_tokens": 0}).encode(), 400),
    (json.dumps({"prompt": "x", "max_tokens": "ten"}).encode(), 400),
    (json.dumps({"prompt": "x", "temperature": -1}).encode(), 400),
    (b'{"prompt": "x", "temperature": NaN}', 400),
    (json.dumps({"prompt": "x", "top_p": 0}).encode(), 400),
    (json.dumps({"prompt": "x", "top_p": 1.5}).encode(), 400),
    (json.dumps({"prompt": "x", "n": 2}).encode(), 400),
    (json.dumps({"prompt": "x", "model": "gpt-5"}).encode(), 404),
    (json.dumps({"prompt": "x", "max_tokens": 9000}).encode(), 400),
    (json.dumps({"prompt": [10**9]}).encode(), 400),
    (json.dumps({"prompt": ["a", "b"]}).encode(), 400),
    (json.dumps({"prompt": "x", "stop": [""]}).encode(), 400),
    (json.dumps({"max_tokens": 3}).encode(), 400),
]


# a lone UTF-16 surrogate, which JSON can carry and no tokenizer can encode
LONE = "def f():\n    return '\ud800'\n"


def is_openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


# (method, path, body): answered by the framework before any route, in the OpenAI shape too
MALFORMED = [
    ("GET", "/v1/nothing-here", None, 404), ("DELETE", "/v1/completions", None, 405),
    ("POST", "/v1/completions", b"[" * 50_000 + b"]" * 50_000, 400),
    ("POST", "/v1/completions", b'{"prompt": "\xff\xfe"}', 400),
]


def connect(url: str, timeout: float = 30) -> socket.socket:
    """A bare TCP connection to the server at `url`."""
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def raw_request(url: str, method: bytes, path: bytes, body: bytes,
                headers: list[bytes]) -> tuple[int, bytes]:
    """One request with header bytes exactly as given (httpx would refuse to send some of them)."""
    with connect(url) as s:
        head = [method + b" " + path + b" HTTP/1.1", b"Host: x", b"Content-Type: application/json",
                b"Content-Length: %d" % len(body), *headers]
        s.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
        resp = http.client.HTTPResponse(s)
        resp.begin()
        return resp.status, resp.read()


def chunked_upload(url: str, limit: int, headers: dict[str, str]) -> tuple[int, bytes, int]:
    """A chunked body of up to 4 x `limit` bytes sent 64 KB at a time, stopping as soon as an answer
    comes: (status, body, bytes sent by then)."""
    with connect(url) as s:
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


def closed_or_answered(s: socket.socket, within: float) -> bytes | None:
    """What the server sends before closing (b"" for a bare close), or None if it still holds the
    connection."""
    s.settimeout(within)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return data
