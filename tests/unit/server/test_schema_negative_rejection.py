"""schemathesis's negative-data check on the server and through the router: every input its NEGATIVE
mode generates (a value the OpenAPI schema does not allow) is refused with a 4xx, none accepted
(2xx) or a 5xx. test_server_schema.py only asserts no 5xx; this adds the `negative_data_rejection`
check itself."""

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import negative_data_rejection, not_a_server_error
from test_server_schema import served  # noqa: F401 (the module's fixture: a tiny server and a router before it)

pytestmark = pytest.mark.server


def reject_negative(schema_url: str, base_url: str, paths=None,
                    max_examples: int = 25) -> list[int]:
    """Negative cases of every operation (those under `paths`, if given) sent to `base_url`, each
    validated with schemathesis's negative_data_rejection and not_a_server_error checks; the
    statuses they got."""
    schema = schemathesis.openapi.from_dict(httpx.get(schema_url).json())
    sent = []
    for op in schema.get_all_operations():
        operation = op.ok()
        if paths is not None and operation.path not in paths:
            continue

        @settings(max_examples=max_examples, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=GenerationMode.NEGATIVE))
        def run(case):
            # a deadline far past any refusal: on a loaded 2-core box a node's 400 can take longer
            # than an editor's 300 ms, and the router answers a late one with silence (a 200), which
            # would read as accepted
            resp = case.call(base_url=base_url, headers={"X-Deadline-Ms": "5000"}, timeout=60)
            case.validate_response(resp, checks=[not_a_server_error, negative_data_rejection])
            sent.append(resp.status_code)

        try:
            run()
        except Unsatisfiable:  # nothing to make invalid (no parameters, no body)
            pass
    return sent


def test_negative_data_is_rejected_by_the_server(served):  # noqa: F811
    url, app, _ = served
    statuses = reject_negative(f"{url}/openapi.json", url)
    assert len(statuses) > 20 and all(400 <= s < 500
                                      for s in statuses) and app.state.async_engine.alive


def test_negative_data_is_rejected_through_the_router(served):  # noqa: F811
    url, app, rurl = served
    proxied = reject_negative(f"{url}/openapi.json", rurl,
                              paths={"/v1/completions", "/v1/chat/completions"})
    own = reject_negative(f"{rurl}/openapi.json", rurl, max_examples=15)
    assert len(proxied) > 10 and all(400 <= s < 500
                                     for s in proxied + own) and app.state.async_engine.alive
