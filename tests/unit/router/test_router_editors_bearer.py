"""Issue 20's per-protocol points not covered elsewhere: session affinity through `warmpath route`
with only a bearer token for Ollama's /api/generate, Mistral's /v1/fim/completions and OpenAI's
/v1/completions (test_router_editors.py covers /infill and Tabby), and a Mistral FIM stream whose
client leaves aborting on the engine, on a node and through the router (test_server_editors.py
covers Ollama's)."""

import asyncio
import hashlib

import httpx
import pytest
from server_harness import CODE, counter, wait_for_step
from test_router_editors import fleet, router  # noqa: F401 (three tiny nodes; a router in front of given nodes)

from warmpath.router.hashing import HashRing

pytestmark = pytest.mark.server

SUFFIX = "\n\nprint(add(1, 2))\n"


def bodies(name: str, n: int) -> dict[str, dict]:
    """Each protocol's FIM request (no user field, no X-Session-Id), a keystroke `n` along."""
    prefix = f"# keystroke {n}\n" + CODE
    return {
        "/api/generate": {
            "model": name, "prompt": prefix, "suffix": SUFFIX, "stream": False,
            "options": {"num_predict": 4, "temperature": 0}
        },
        "/v1/fim/completions": {"model": name, "prompt": prefix, "suffix": SUFFIX, "max_tokens": 4},
        "/v1/completions": {
            "prompt": prefix, "suffix": SUFFIX, "max_tokens": 4, "temperature": 0.5
        }
    }


def test_every_protocol_keeps_its_node_with_only_a_bearer_token(fleet):  # noqa: F811
    urls = list(fleet)
    name = httpx.get(f"{urls[0]}/v1/models").json()["data"][0]["id"]
    devs = ("gina-key", "hal-key", "ivan-key", "jo-key")
    homes = {
        d: HashRing(urls).home("key-" + hashlib.sha256(f"Bearer {d}".encode()).hexdigest()[:32])
        for d in devs
    }
    # the same bodies from every developer: only the token can place them
    assert len(set(homes.values())) > 1
    with router(urls) as (rurl, _):
        for dev, home in homes.items():
            for n in range(2):
                for path, body in bodies(name, n).items():
                    r = httpx.post(f"{rurl}{path}", json=body,
                                   headers={"Authorization": f"Bearer {dev}"}, timeout=60)
                    assert r.status_code == 200, (path, r.text)
                    assert r.headers["x-warmpath-node"] == home, (dev, path)


@pytest.mark.parametrize("via", ["node", "router"])
def test_a_mistral_stream_whose_client_leaves_aborts_on_the_engine(fleet, via):  # noqa: F811
    url, app = next(iter(fleet.items()))
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    with router([url]) as (rurl, _):
        target = url if via == "node" else rurl
        wait_for_step(app, lambda e: not e.requests)
        before = counter(url, "warmpath_requests_aborted_total", 'reason="client"')

        async def leave():
            async with httpx.AsyncClient(timeout=60) as http:
                body = {
                    "model": name, "prompt": f"# leave {via}\n" + CODE * 12, "max_tokens": 400,
                    "stream": True
                }
                async with http.stream("POST", f"{target}/v1/fim/completions", json=body) as r:
                    assert r.status_code == 200
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            return
        asyncio.run(leave())
        wait_for_step(app, lambda e: not e.requests and e.pool.num_used == 0)
        assert counter(url, "warmpath_requests_aborted_total", 'reason="client"') == before + 1
