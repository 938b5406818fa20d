"""State a client can make the server (and the router) keep, bounded, on a real server on loopback:
the warm-ups that requests refused at their deadline leave (per tenant and in all, in tokens), and
session ids (capped, hashed where they are kept as keys); each bound counted in /metrics when
hit."""

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_harness import CODE, counter, running_app, total, wait_for_step

from warmpath.api.credentials import tenant_of
from warmpath.config import RouterConfig
from warmpath.router.app import create_router_app

# tokens of queued warm-ups: 2 of this test's prompts (544 tokens) a tenant, 5 in all
PER_TENANT, ALL = 1200, 3000
TENANTS = ("team-a", "team-b", "team-c")


def team(i: int) -> str:
    """team-a sends most requests (its bound binds), team-b and team-c a few (then the total bound
    binds)."""
    return TENANTS[0] if i % 4 else TENANTS[1 + i // 4 % 2]


CAP = 128  # characters of a session id kept as it is (the default)


@pytest.fixture(scope="module")
def server_config(tiny_long_dir):
    from warmpath.config import EngineConfig, SchedulerConfig

    return EngineConfig(
        model=str(tiny_long_dir), dtype="float32", num_kv_blocks=1024,
        scheduler=SchedulerConfig(max_num_batched_tokens=64, warm_up_tokens_per_tenant=PER_TENANT,
                                  warm_up_tokens=ALL))


@pytest.fixture(scope="module")
def server(server_config):
    from server_harness import running_server

    with running_server(server_config) as (url, app):
        yield url, app


def in_the_step_thread(app, look, steps: int = 2):
    """look(engine) at the end of the `steps`-th step from now (the step thread's own state, read
    where it changes); by then every command sent before this call has been taken in."""
    done, seen, result = threading.Event(), [0], []

    def listener(engine):
        seen[0] += 1
        if seen[0] == steps and not done.is_set():
            result.append(look(engine))
            done.set()

    app.state.async_engine.step_listeners.append(listener)
    try:
        assert done.wait(60), "the engine stopped stepping"
    finally:
        app.state.async_engine.step_listeners.remove(listener)
    return result[0]


@pytest.mark.server
def test_requests_refused_at_their_deadline_from_new_sessions_keep_warm_ups_within_the_bounds(
        server):
    """A client sending X-Deadline-Ms: 1 with a new (long) session id each time: each refusal leaves
    its prompt to warm, but the queued warm-ups stay within the tenant's and the total bound (the
    oldest go, counted), and every session id kept is at most CAP characters (a longer one as its
    hash, counted)."""
    url, app = server
    hashed_before = total(url, "warmpath_session_ids_hashed_total")
    dropped_before = total(url, "warmpath_warm_ups_dropped_total")
    with ThreadPoolExecutor(1) as pool:
        # Someone decoding: every step has work, so no warm-up is admitted (they wait for an idle
        # step).
        busy = pool.submit(
            httpx.post, f"{url}/v1/completions", timeout=300,
            json={"prompt": CODE, "max_tokens": 8000, "ignore_eos": True, "temperature": 0})
        wait_for_step(app,
                      lambda e: any(r.output_token_ids for r in e.scheduler.running_requests()))
        n = 40
        for i in range(n):
            # A tenant is its key's (server/tenancy.py): a new cache_salt each time is no way out of
            # its bound.
            r = httpx.post(
                f"{url}/v1/completions", timeout=60, headers={
                    "X-Deadline-Ms": "1", "X-Session-Id": f"dev-{i}-" + "x" * 1000,
                    "Authorization": f"Bearer {team(i)}"
                },
                json={"prompt": f"# file {i}\n" + CODE * 8, "max_tokens": 4, "cache_salt": f"s{i}"})
            assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in (
                "deadline", "overloaded")
        queued, still_busy = in_the_step_thread(
            app, lambda e:
            ([(w.tenant, w.session_id, len(w.prompt_token_ids))
              for w in e.scheduler.queued_warm_ups()],
             any(r.output_token_ids and not r.warmup for r in e.scheduler.running_requests())))
        assert still_busy, "the busy request ended early: warm-ups were free to run"
        for rid in list(app.state.engine.requests):
            app.state.async_engine.abort(rid)
        busy.result()
    assert 0 < sum(k for _, _, k in queued) <= ALL
    assert {t for t, _, _ in queued} <= {tenant_of(f"Bearer {t}") for t in TENANTS}
    assert all(
        sum(k for t, _, k in queued if t == tenant_of(f"Bearer {tenant}")) <= PER_TENANT
        for tenant in TENANTS)
    assert len(queued) < n and total(
        url, "warmpath_warm_ups_dropped_total") - dropped_before == n - len(queued)
    assert counter(url, "warmpath_warm_ups_dropped_total", 'bound="tenant"') > 0
    assert counter(url, "warmpath_warm_ups_dropped_total", 'bound="total"') > 0
    sessions = [s for _, s, _ in queued]
    assert all(len(s) <= CAP for s in sessions) and len(set(sessions)) == len(sessions)
    assert total(url, "warmpath_session_ids_hashed_total") - hashed_before == n


@pytest.mark.server
def test_the_router_keeps_long_session_ids_as_their_hash(server):
    """The router keys sessions (its session log, the ring) by the same capped rule as the node."""
    url, _ = server
    cfg = RouterConfig(node=[url], admin_key="k", health_interval=0.2)
    with running_app(create_router_app(cfg)) as (rurl, _):
        for i in range(3):
            r = httpx.post(f"{rurl}/v1/completions", timeout=60,
                           headers={"X-Session-Id": f"u{i}-" + "y" * 5000},
                           json={"prompt": CODE, "max_tokens": 1})
            assert r.status_code == 200
        kept = httpx.get(f"{rurl}/admin/sessions",
                         headers={"Authorization": "Bearer k"}).json()["sessions"]
        assert len(kept) == 3 and all(len(s) <= CAP for s in kept)
        assert total(rurl, "warmpath_router_session_ids_hashed_total") == 3


def test_a_session_id_over_the_cap_is_counted_and_still_kept_per_tenant():
    """The node keeps every session per tenant as a 32-character hash (server/tenancy.py); an id
    over the cap is hashed first (api/asgi.session_key) and counted: two long ids stay two sessions,
    two tenants' same id two."""
    from warmpath.server.tenancy import tenancy

    alice, bob = {"authorization": "Bearer alice"}, {"authorization": "Bearer bob"}
    short = tenancy({**alice, "x-session-id": "dev-1"}, None, None, "none")
    assert not short.session_hashed and len(
        short.session) == 32 and short.tenant == tenant_of("Bearer alice")
    long1, long2 = ({**alice, "x-session-id": f"{i}" + "x" * 5000} for i in (1, 2))
    t1, t2 = tenancy(long1, None, None, "none"), tenancy(long2, None, None, "none")
    assert t1.session_hashed and t2.session_hashed and len(
        t1.session) == 32 and t1.session != t2.session
    assert tenancy({**bob, "x-session-id": "dev-1"}, None, None, "none").session != short.session
    # `user` too, under either isolation
    assert tenancy(alice, "u" * (CAP + 1), "salt", "key").session_hashed
    assert not tenancy(alice, "u" * CAP, "salt", "key").session_hashed
