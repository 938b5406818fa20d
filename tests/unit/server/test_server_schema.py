"""schemathesis drives the server, and the router in front of it, through their OpenAPI schemas with
valid and with invalid (negative) data: no input it generates gets a 5xx. The router's proxied
routes take the server's request bodies, so they are driven with the server's schema; its own routes
with its own."""

import contextlib

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from server_harness import running_app, running_server

from warmpath.config import EngineConfig, RouterConfig
from warmpath.router.app import create_router_app

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def served(tiny_llama_dir):
    cfg = EngineConfig(model=str(tiny_llama_dir), dtype="float32", num_kv_blocks=256)
    with contextlib.ExitStack() as stack:
        url, app = stack.enter_context(running_server(cfg))
        rurl, _ = stack.enter_context(
            running_app(create_router_app(RouterConfig(node=[url], health_interval=0.2))))
        yield url, app, rurl


def drive(schema_url: str, base_url: str, paths=None, max_examples: int = 30) -> list[int]:
    """Every operation of the schema at `schema_url` (those under `paths`, if given), positive and
    negative, called on `base_url`; the statuses it got. Fails on any 5xx."""
    schema = schemathesis.openapi.from_dict(httpx.get(schema_url).json())
    checked = []
    for op in schema.get_all_operations():
        operation = op.ok()
        if paths is not None and operation.path not in paths:
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(max_examples=max_examples, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case):
                # A deadline bounds generation time for whatever max_tokens the fuzzer picks.
                resp = case.call(base_url=base_url, headers={"X-Deadline-Ms": "300"}, timeout=60)
                assert resp.status_code < 500, (f"{case.method} {case.path}: {resp.status_code} "
                                                f"{resp.text[:300]}")
                checked.append(resp.status_code)

            try:
                run()
            except Unsatisfiable:  # nothing to make invalid (no parameters, no body)
                assert mode == GenerationMode.NEGATIVE
    return checked


def test_no_input_gets_a_5xx(served):
    url, app, _ = served
    checked = drive(f"{url}/openapi.json", url)
    assert len(checked) > 100 and any(s >= 400 for s in checked) and app.state.async_engine.alive


@pytest.mark.slow
def test_no_input_gets_a_5xx_through_the_router(served):
    url, app, rurl = served
    proxied = drive(f"{url}/openapi.json", rurl, paths={"/v1/completions", "/v1/chat/completions"})
    own = drive(f"{rurl}/openapi.json", rurl, max_examples=15)
    assert len(proxied) > 40 and {
        200, 400
    } <= set(proxied) and len(own) > 10 and app.state.async_engine.alive
