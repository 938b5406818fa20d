"""A cold file's first keystroke on `warmpath serve` (tiny model, loopback HTTP, llama.vscode's
/infill body): answered from its short context (the lines nearest the cursor) when its whole prompt
cannot answer within --first-token-ms, the whole file warming on; the next keystroke is answered
from the whole file, out of the prefix cache. The short answer is exactly what --short-context
always answers (what `warmpath eval` measures)."""

import dataclasses

import httpx
import pytest
from server_harness import CODE, computed_since, counter

pytestmark = pytest.mark.server

SHORT = "warmpath_short_context_answers_total"
FILE = "".join(f"def f{i}(x):\n    return x * {i} + {i * i}\n\n" for i in range(40))


@pytest.fixture(scope="module")
def server(server_config):
    """first_token_ms 1: no cold prompt answers in time, so the choice depends on the cache
    alone."""
    from server_harness import running_server

    from warmpath.config import ServerConfig

    with running_server(server_config, ServerConfig(first_token_ms=1.0)) as (url, app):
        app.state.served.short_context_tokens = 64  # the tiny model would make it the whole file
        yield url, app


def infill(url: str, prefix: str, middle: str, deadline_ms: int | None = 5000) -> dict:
    body = {"input_prefix": prefix, "input_suffix": "\n" + CODE, "input_extra": [],
            "prompt": middle, "n_predict": 8, "cache_prompt": True, "samplers": [],
            "t_max_prompt_ms": deadline_ms or -1}
    r = httpx.post(f"{url}/infill", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_cold_file_is_answered_from_its_short_context_then_from_the_whole_file(server):
    url, app = server
    before, start = counter(url, SHORT), app.state.engine.stats()["num_computed_tokens"]
    first = infill(url, FILE, "    ")
    assert first["truncated"] is True and first["tokens_evaluated"] < 100 < len(FILE) // 8
    assert counter(url, SHORT) == before + 1
    computed_since(app, start)  # the whole file warmed after the answer
    second = infill(url, FILE, "    r")
    assert second["truncated"] is False and second["tokens_evaluated"] > 300, second
    assert second["tokens_cached"] >= second["tokens_evaluated"] - 32
    assert counter(url, SHORT) == before + 1
    # --short-context always answers the same short prompt: the same answer, token for token
    served = app.state.served
    config = served.config
    served.config = dataclasses.replace(config, short_context="always")
    try:
        always = infill(url, FILE, "    ")
    finally:
        served.config = config
    assert always["content"] == first["content"] and always["truncated"] is True
    assert always["tokens_evaluated"] == first["tokens_evaluated"]
    assert counter(url, SHORT) == before + 2


def test_a_request_with_no_deadline_is_answered_from_the_whole_file(server):
    url, _ = server
    before = counter(url, SHORT)
    other = FILE.replace("def f", "def g")  # another cold file
    whole = infill(url, other, "    ", deadline_ms=None)
    assert whole["truncated"] is False and whole["tokens_evaluated"] > 300
    assert counter(url, SHORT) == before
