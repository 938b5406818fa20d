"""One request value from the wire to the scheduler: every protocol's request is checked by the
engine once (Engine.check, at AsyncEngine.submit) before any answer starts; a request the engine can
never run is a 400 also when streamed; a late or refused one is silence, counted once."""

import httpx
import pytest
from gguf import GGMLQuantizationType as Q
from server_harness import counter, running_server
from tiny_gguf import QWEN_VOCAB, uniform, write_gguf

from warmpath.config import EngineConfig

pytestmark = pytest.mark.server

CODE = "def area(r):\n    return 3.14 * r * r\n\n\ndef perimeter(r):\n"
SUFFIX = "\n\nprint(area(2))\n"
BODIES = {
    "/v1/completions": {"prompt": CODE, "suffix": SUFFIX, "max_tokens": 4, "temperature": 0},
    "/v1/chat/completions": {
        "messages": [{"role": "user", "content": CODE}], "max_tokens": 4, "temperature": 0
    },
    "/infill": {
        "input_prefix": CODE, "input_suffix": SUFFIX, "prompt": "", "n_predict": 4, "temperature": 0
    },
    "/v1/fim/completions": {
        "model": "MODEL", "prompt": CODE, "suffix": SUFFIX, "max_tokens": 4, "temperature": 0
    },
    "/api/generate": {
        "model": "MODEL", "prompt": CODE, "suffix": SUFFIX, "options": {"num_predict": 4}
    },
    "tabby": {
        "language": "python", "segments": {"prefix": CODE, "suffix": SUFFIX}, "temperature": 0
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path, _, _ = write_gguf(
        tmp_path_factory.mktemp("qwen") / "tiny.gguf", "qwen2", uniform(Q.Q8_0), QWEN_VOCAB)
    with running_server(EngineConfig(model=str(path), dtype="float32", num_kv_blocks=256,
                                     max_model_len=512)) as running:
        yield running


def post(url: str, path: str, body: dict, model: str, stream: bool,
         headers: dict | None = None) -> httpx.Response:
    body = {k: model if v == "MODEL" else v for k, v in body.items()} | {"stream": stream}
    return httpx.post(f"{url}{'/v1/completions' if path == 'tabby' else path}", json=body,
                      headers=headers, timeout=120)


@pytest.mark.parametrize("stream", [False, True])
def test_every_protocol_s_request_is_checked_once(server, stream):
    url, app = server
    engine, model = app.state.engine, app.state.served.model_name
    checked = []
    real = engine.check

    def check(request):
        checked.append(request.request_id)
        return real(request)

    engine.check = check
    try:
        for path, body in BODIES.items():
            if path == "tabby" and stream:
                continue  # Tabby's completions are never streamed
            checked.clear()
            r = post(url, path, body, model, stream)
            assert r.status_code == 200, (path, r.text)
            assert len(checked) == 1, (path, checked)
    finally:
        del engine.check


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_the_engine_can_never_run_is_a_400_before_any_answer(server, stream):
    url, app = server
    vocab = app.state.engine.model_config.vocab_size
    r = httpx.post(f"{url}/v1/completions",
                   json={"prompt": [1, 2, vocab + 5], "max_tokens": 2,
                         "stream": stream}, timeout=60)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert error["param"] == "prompt" and str(vocab) in error["message"]
    assert app.state.async_engine.alive and not app.state.async_engine._queued


@pytest.mark.parametrize("path", ["/v1/completions", "/infill", "/api/generate"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_late_request_is_silence_counted_once(server, path, stream):
    url, app = server
    model = app.state.served.model_name
    before = {
        r: counter(url, "warmpath_requests_total", f'finish_reason="{r}"')
        for r in ("deadline", "overloaded")
    }
    r = post(url, path, BODIES[path], model, stream, headers={"X-Deadline-Ms": "1"})
    assert r.status_code == 200, r.text
    after = {
        r: counter(url, "warmpath_requests_total", f'finish_reason="{r}"')
        for r in ("deadline", "overloaded")
    }
    assert sum(after.values()) - sum(before.values()) == 1, (before, after)
    if path == "/v1/completions":
        chunks = [e for e in r.text.split("\n\n")
                  if e.startswith("data: {")] if stream else [r.text]
        assert all('"text": ""' in c or '"text":""' in c for c in chunks), r.text


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_gone_right_after_sending_leaves_nothing_behind(server, stream):
    """Submitted before its answer starts, a request whose client closes the socket at once is
    aborted all the same (the stream's end, or the response's background task when the stream never
    started): no request, no block held, counted once as the client's abort."""
    import json
    import socket
    import time
    from urllib.parse import urlsplit

    url, app = server
    engine = app.state.engine
    before = counter(url, "warmpath_requests_aborted_total", 'reason="client"')
    aborted = app.state.async_engine.snapshot.stats["num_aborted"]
    body = json.dumps({"prompt": CODE * 4, "max_tokens": 400, "temperature": 0, "ignore_eos": True,
                       "stream": stream}).encode()
    host, port = urlsplit(url).hostname, urlsplit(url).port
    with socket.create_connection((host, port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if counter(url, "warmpath_requests_aborted_total", 'reason="client"') == before + 1 and \
                not engine.requests and engine.pool.num_used == 0:
            break
        time.sleep(0.1)
    assert counter(url, "warmpath_requests_aborted_total", 'reason="client"') == before + 1
    assert not engine.requests and engine.pool.num_used == 0
    # stopped, not run to its end
    assert app.state.async_engine.snapshot.stats["num_aborted"] >= aborted + 1
