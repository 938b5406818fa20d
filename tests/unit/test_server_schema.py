"""schemathesis drives the server through its own OpenAPI schema: no input it generates gets a 5xx."""

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from server_harness import running_server

from warmpath.config import EngineConfig


@pytest.fixture(scope="module")
def served(tiny_llama_dir):
    cfg = EngineConfig(model=str(tiny_llama_dir), dtype="float32", num_kv_blocks=256)
    with running_server(cfg) as (url, app):
        yield url, app


def test_no_input_gets_a_5xx(served):
    url, app = served
    schema = schemathesis.openapi.from_dict(httpx.get(f"{url}/openapi.json").json())
    checked = []
    for op in schema.get_all_operations():
        operation = op.ok()
        strategy = operation.as_strategy()

        @settings(max_examples=40, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def run(case):
            # A deadline bounds generation time for whatever max_tokens the fuzzer picks.
            resp = case.call(base_url=url, headers={"X-Deadline-Ms": "300"}, timeout=60)
            assert resp.status_code < 500, f"{case.method} {case.path}: {resp.status_code} {resp.text[:300]}"
            checked.append(resp.status_code)

        run()
    assert len(checked) > 40 and app.state.async_engine.alive
