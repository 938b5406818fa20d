"""Issue 50's tenancy findings, on real tiny-model nodes and routers on loopback: a router that
authenticates to its nodes with its own key keeps each client its own tenant on a node isolated by
key (prefix hits, sessions); a client cannot name another's tenant; sessions (speculation history,
warm-ups) are kept per tenant; two Authorization headers are refused wherever they would be read; a
`#` inside a key is part of it; the router's response cache keeps model tiers apart."""

import asyncio
import json
import time

import httpx
import pytest
from bad_requests import raw_request
from server_harness import CODE, running_app, running_server, wait_for_step
from server_harness import running_router as router

from warmpath.config import RouterConfig, ServerConfig
from warmpath.router.app import create_router_app

pytestmark = pytest.mark.server

ALICE, BOB = {"Authorization": "Bearer alice-key"}, {"Authorization": "Bearer bob-key"}
NODE_KEY = {"Authorization": "Bearer node-key"}


@pytest.fixture(scope="module")
def node(server_config, tmp_path_factory):
    """A node isolated by key: the router's key, and alice's, bob's and carol's for calling it
    directly."""
    keys = tmp_path_factory.mktemp("node") / "keys"
    keys.write_text("# direct callers\nalice-key\nbob-key  # bob's team\ncarol#key\n")
    cfg = ServerConfig(api_key="node-key", api_keys_file=str(keys), cache_isolation="key")
    with running_server(server_config, cfg) as (url, app):
        yield url, app


@pytest.fixture
def clients_file(tmp_path):
    keys = tmp_path / "clients"
    keys.write_text("alice-key\nbob-key\n")
    return str(keys)


def cached(url: str, prompt: str, headers: dict, session: str | None = None) -> int:
    """The prompt tokens a completion found in the prefix cache."""
    headers = {**headers, **({"X-Session-Id": session} if session else {})}
    r = httpx.post(f"{url}/v1/completions",
                   json={"prompt": prompt, "max_tokens": 2,
                         "temperature": 0}, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_behind_a_router_with_its_own_key_each_client_keeps_its_own_prefix_cache(
        node, clients_file):
    """The review's reproduction: the router checks its clients' keys and sends the node its own;
    the node isolates by key. Bob's request for alice's prompt finds none of her blocks; each one's
    repeat finds its own."""
    url, _ = node
    prompt = "# alice's file\nAPI_TOKEN = 'hunter2'\n" + CODE * 6
    with router([url], api_keys_file=clients_file, upstream_api_key="node-key",
                cache_entries=0) as (rurl, _):
        assert cached(rurl, prompt, ALICE) == 0
        assert cached(rurl, prompt, ALICE) >= 64  # her repeat hits
        # no hit, no timing: bob learns nothing of alice's prompt
        assert cached(rurl, prompt, BOB) == 0
        assert cached(rurl, prompt, BOB) >= 64


def test_a_client_cannot_name_another_tenant(node, clients_file):
    """Bob sends the tenant header the router sends for alice: through the router it is dropped (the
    router names bob's own), and straight to the node it only splits bob's own tenant. Only the
    router's key names tenants."""
    from warmpath.api.credentials import TENANT_HEADER, tenant_of

    url, _ = node
    alices = {TENANT_HEADER: tenant_of("Bearer alice-key")}
    prompt = "# alice's other file\n" + CODE * 6
    with router([url], api_keys_file=clients_file, upstream_api_key="node-key",
                cache_entries=0) as (rurl, _):
        assert cached(rurl, prompt, ALICE) == 0 and cached(rurl, prompt, ALICE) >= 64
        assert cached(rurl, prompt, {**BOB, **alices}) == 0
    assert cached(url, prompt, {**BOB, **alices}) == 0
    assert cached(url, prompt, NODE_KEY) == 0  # the router's own tenant is none of its clients'
    assert cached(url, prompt, {**NODE_KEY, **alices}) >= 64  # the router's key naming alice: hers


def _histories(app) -> set[str]:
    return set(app.state.engine.speculator.proposer.sessions)


def test_speculation_history_is_kept_per_tenant(node, clients_file):
    """The suffix proposer drafts from what a session saw: bob naming alice's session gets a history
    of his own, straight to the node and through a router with its own key."""
    url, app = node
    before = _histories(app)
    cached(url, "# mine\n" + CODE, ALICE, session="shared-dev")
    cached(url, "# mine\n" + CODE, BOB, session="shared-dev")
    new = _histories(app) - before
    assert len(new) == 2
    cached(url, "# again\n" + CODE, ALICE, session="shared-dev")
    assert _histories(app) - before == new  # alice's own requests share hers
    with router([url], api_keys_file=clients_file, upstream_api_key="node-key",
                cache_entries=0) as (rurl, _):
        for who in (ALICE, BOB):
            cached(rurl, "# routed\n" + CODE, who, session="routed-dev")
    assert len(_histories(app) - before - new) == 2


def test_another_tenants_request_does_not_end_a_warm_up(node):
    """A request refused behind a queue leaves its prompt warming for its session's next request; a
    request of another key naming the same session used to abort it, so alice's next keystroke found
    nothing cached."""
    url, app = node
    busy = {"prompt": CODE * 12, "max_tokens": 5, "temperature": 0}
    alice = {"prompt": "# alice typing\n" + CODE * 4, "max_tokens": 5}

    async def scene():
        async with httpx.AsyncClient(timeout=120) as http:
            work = [
                asyncio.create_task(
                    http.post(f"{url}/v1/completions", headers=NODE_KEY,
                              json={**busy, "prompt": f"#q{i}\n" + busy["prompt"]}))
                for i in range(12)
            ]
            await asyncio.to_thread(wait_for_step, app, lambda e: e.scheduler.num_waiting >= 4)
            refused = await http.post(
                f"{url}/v1/completions", json=alice,
                headers={**ALICE, "X-Session-Id": "dev-w", "X-Deadline-Ms": "10"})
            bob = await http.post(f"{url}/v1/completions",
                                  json={"prompt": "# bob\n",
                                        "max_tokens": 1}, headers={**BOB, "X-Session-Id": "dev-w"})
            await asyncio.gather(*work)
            return refused, bob

    refused, bob = asyncio.run(scene())
    assert refused.json()["choices"][0]["finish_reason"] == "overloaded" and bob.status_code == 200
    for _ in range(600):  # the warm-up runs after everyone else
        if not app.state.engine.has_unfinished_requests():
            break
        time.sleep(0.05)
    again = httpx.post(f"{url}/v1/completions", json={**alice, "max_tokens": 1, "temperature": 0},
                       headers={**ALICE, "X-Session-Id": "dev-w"}, timeout=60).json()
    prompt_tokens = again["usage"]["prompt_tokens"]
    assert (
        again["usage"]["prompt_tokens_details"]["cached_tokens"]
        >= prompt_tokens // 16 * 16 - 16
        > 0
    )


def _twice(url: str, path: bytes, first: bytes, second: bytes) -> tuple[int, dict]:
    payload = json.dumps({"prompt": "x", "max_tokens": 1}).encode()
    status, body = raw_request(url, b"POST" if path.startswith(b"/v1") else b"GET", path, payload,
                               [b"Authorization: " + first, b"Authorization: " + second])
    return status, json.loads(body)


def test_two_authorization_headers_are_refused_wherever_they_would_be_read(
        node, server, clients_file):
    """The guard read the last copy, the cache salt, the session and the router the first: a wrong
    key then a right one got in. Now either order is a 400 with the error object, with or without
    keys to check."""
    url, _ = node
    good, wrong = b"Bearer alice-key", b"Bearer nobody"
    with router([url], api_keys_file=clients_file, upstream_api_key="node-key",
                admin_key="admin") as (rurl, _):
        for target, path in ((url, b"/v1/completions"), (server[0], b"/v1/completions"),
                             (rurl, b"/v1/completions"), (rurl, b"/admin/nodes")):
            for first, second in ((wrong, good), (good, wrong), (good, good)):
                if path == b"/admin/nodes":
                    first, second = first.replace(b"alice-key",
                                                  b"admin"), second.replace(b"alice-key", b"admin")
                status, body = _twice(target, path, first, second)
                assert status == 400 and body["error"]["code"] == "duplicate_authorization", (
                    target, path, body)


def _status(url: str, key: str) -> int:
    return httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 1},
                      headers={"Authorization": f"Bearer {key}"}, timeout=60).status_code


def test_a_hash_inside_a_key_is_part_of_the_key(node, tmp_path):
    """`carol#key` in a keys file is that key, not `carol`; a `#` after a space or at a line's start
    is a comment."""
    url, _ = node
    keys = tmp_path / "clients"
    keys.write_text("# clients\ncarol#key  # carol's laptop\n")
    with router([url], api_keys_file=str(keys)) as (rurl, _):
        for target in (url, rurl):  # the node's file lists carol#key too
            assert _status(target, "carol#key") == 200, target
            assert _status(target, "carol") == 401 and _status(target, "# clients") == 401, target


def test_the_response_cache_keeps_model_tiers_apart(server_config):
    """The same body sent as a line completion (small tier) and as a block (large tier) is two
    answers from two models: the large tier's is never the small one's cached answer."""
    with running_server(server_config) as (small, _), running_server(server_config) as (large, _):
        cfg = RouterConfig(tier=[f"small={small}", f"large={large}"], health_interval=0.2)
        with running_app(create_router_app(cfg)) as (rurl, _):
            def ask(kind: str) -> httpx.Response:
                return httpx.post(f"{rurl}/v1/completions",
                                  json={"prompt": CODE, "max_tokens": 4, "temperature": 0},
                                  headers={"X-Completion-Kind": kind}, timeout=60)
            assert ask("line").headers["x-warmpath-node"] == small
            # the cache still answers a repeat
            assert ask("line").headers.get("x-warmpath-cache") == "hit"
            block = ask("block")
            assert (
                "x-warmpath-cache" not in block.headers
                and block.headers["x-warmpath-node"] == large
            )
