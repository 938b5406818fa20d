"""Router policies without a network: consistent hashing moves only a removed node's keys, bounded
loads cap every node at c x the average under a skewed session mix, prefix matching, hybrid, tiering
rule, the response cache."""

import math
import random

import pytest

from warmpath.router.cache import ResponseCache, cache_key, complete_answer
from warmpath.router.hashing import HashRing, bounded_walk, load_cap
from warmpath.router.model_tiers import LINE, MULTI, completion_kind
from warmpath.router.policies import RouteKey, Router, prompt_blocks

NODES = [f"http://10.0.0.{i}:8000" for i in range(1, 6)]


def test_removing_one_of_n_nodes_moves_about_one_nth_of_the_keys_and_no_others():
    ring = HashRing(NODES, virtual_nodes=100)
    keys = [f"session-{i}" for i in range(10_000)]
    before = {k: ring.home(k) for k in keys}
    gone = NODES[2]
    after = {k: ring.home(k, set(NODES) - {gone}) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert all(before[k] == gone for k in moved)  # only the removed node's keys move ...
    assert all(after[k] != gone for k in keys)
    assert sum(before[k] == gone for k in keys) == len(moved)  # ... and every one of them does
    # ~1/n with 100 virtual nodes
    assert 0.6 / len(NODES) < len(moved) / len(keys) < 1.4 / len(NODES)
    # spread over the survivors, not dumped on one neighbour
    assert len({after[k] for k in moved}) == len(NODES) - 1
    # the node comes back: its keys return, nothing else changes
    assert {k: ring.home(k, set(NODES)) for k in keys} == before


def test_virtual_nodes_balance_the_keys():
    ring = HashRing(NODES, virtual_nodes=100)
    counts = {n: 0 for n in NODES}
    for i in range(10_000):
        counts[ring.home(f"k{i}")] += 1
    assert max(counts.values()) < 1.3 * 10_000 / len(NODES)


def _simulate(c: float, steps: int = 20_000, seed: int = 0) -> tuple[int, int, float]:
    """A skewed session mix (Zipf: a few sessions send most requests), each request held for a
    random time. Returns (placements over the bound, max load seen, share of requests kept on their
    home node)."""
    rng = random.Random(seed)
    ring = HashRing(NODES[:4], virtual_nodes=100)
    sessions = [f"dev-{i}" for i in range(40)]
    weights = [1 / (i + 1) ** 1.5 for i in range(len(sessions))]
    loads = {n: 0 for n in ring.nodes}
    held: list[tuple[int, str]] = []
    violations, worst, kept = 0, 0, 0
    for t in range(steps):
        held_now = [(end, n) for end, n in held if end > t]
        for end, n in held:
            if end <= t:
                loads[n] -= 1
        held = held_now
        session = rng.choices(sessions, weights)[0]
        cap = load_cap(loads, ring.nodes, 1.25)
        node = bounded_walk(ring, session, loads, c)[0] if math.isfinite(c) else ring.home(session)
        kept += node == ring.home(session)
        loads[node] += 1
        violations += loads[node] > cap
        worst = max(worst, max(loads.values()))
        held.append((t + rng.randint(1, 24), node))
    return violations, worst, kept / steps


def test_bounded_loads_keep_every_node_within_c_times_the_average():
    violations, _, kept = _simulate(1.25)
    assert violations == 0
    assert kept > 0.5  # affinity still holds for most requests
    # The same mix on plain consistent hashing overloads the hot sessions' node: the bound is what
    # prevents it.
    plain_violations, plain_worst, plain_kept = _simulate(math.inf)
    assert plain_violations > 100 and plain_kept == 1.0


def test_session_policy_is_sticky_and_counts_broken_affinity():
    router = Router(NODES[:3], "session")
    loads = {n: 0 for n in NODES[:3]}
    first = router.choose(RouteKey("alice", "x"), NODES[:3], loads)
    assert first.decision == "affinity_kept"
    assert all(
        router.choose(RouteKey("alice", "y"), NODES[:3], loads).nodes[0] == first.nodes[0]
        for _ in range(5))
    loads[first.nodes[0]] = 10  # alice's home is far over the average
    moved = router.choose(RouteKey("alice", "x"), NODES[:3], loads)
    assert moved.decision == "affinity_broken_load" and moved.nodes[0] != first.nodes[0]
    assert first.nodes[0] in moved.nodes  # still a failover candidate


def test_prefix_policy_follows_the_longest_match_unless_overloaded():
    router = Router(NODES[:3], "prefix", block_chars=16)
    loads = {n: 0 for n in NODES[:3]}
    file_a, file_b = "import os\n" * 40, "def main():\n" * 40
    a = router.choose(RouteKey(None, file_a), NODES[:3], loads)
    assert a.decision == "least_load"  # nothing known yet
    loads[a.nodes[0]] = 1
    b = router.choose(RouteKey(None, file_b), NODES[:3], loads)
    assert b.nodes[0] != a.nodes[0]  # least load
    loads[b.nodes[0]] = 1  # two in flight: a node may hold ceil(1.25 * 3 / 3) = 2
    again = router.choose(RouteKey(None, file_a + "print(1)"), NODES[:3], loads)
    assert again.decision == "prefix_match" and again.nodes[0] == a.nodes[0]
    loads[a.nodes[0]] = 9
    busy = router.choose(RouteKey(None, file_a), NODES[:3], loads)
    assert busy.decision == "prefix_broken_load" and busy.nodes[0] != a.nodes[0]
    # a restart empties the node's cache: only the node that took it last matches
    router.forget(a.nodes[0])
    loads[a.nodes[0]] = 1
    assert router.choose(RouteKey(None, file_a), NODES[:3], loads).nodes[0] == busy.nodes[0]


def test_prefix_blocks_are_chained_and_the_index_is_bounded():
    blocks = prompt_blocks("a" * 64 + "b" * 64, 64)
    assert len(blocks) == 2 and blocks[1] != prompt_blocks("c" * 64 + "b" * 64, 64)[1]
    router = Router(NODES[:1], "prefix", block_chars=8, index_blocks=10)
    router.choose(RouteKey(None, "x" * 800), NODES[:1], {})
    assert len(router.index[NODES[0]].blocks) == 10


def test_hybrid_uses_session_then_prefix_then_least_load():
    router = Router(NODES[:3], "hybrid", block_chars=16)
    loads = {n: 0 for n in NODES[:3]}
    assert router.choose(RouteKey("bob", "z" * 100), NODES[:3], loads).decision == "affinity_kept"
    assert router.choose(RouteKey(None, "q" * 100), NODES[:3], loads).decision == "least_load"
    assert router.choose(RouteKey(None, "q" * 120), NODES[:3], loads).decision == "prefix_match"
    with pytest.raises(ValueError):
        Router(NODES, "random")
    with pytest.raises(ValueError):
        Router(NODES, "session", load_factor=0.9)


def test_round_robin_and_least_load():
    router = Router(NODES[:3], "round-robin")
    picks = [router.choose(RouteKey("s", "p"), NODES[:3], {}).nodes[0] for _ in range(6)]
    assert picks == NODES[:3] * 2
    router = Router(NODES[:3], "least-load")
    assert (router.choose(RouteKey("s", "p"), NODES[:3], {NODES[0]: 2, NODES[1]: 0, NODES[2]: 1})
            .nodes == [NODES[1], NODES[2], NODES[0]])
    assert router.choose(RouteKey("s", "p"), [], {}).nodes == []


@pytest.mark.parametrize(
    "path,body,header,kind",
    [
        ("/v1/completions", {"prompt": "x = f(", "suffix": ")\nprint(x)", "max_tokens": 16
                             }, None, LINE),
        ("/v1/completions", {"prompt": "x = ", "suffix": "\n\ndef g():", "max_tokens": 16
                             }, None, LINE),
        ("/v1/completions", {"prompt": "x = ", "max_tokens": 16}, None, LINE),
        ("/v1/completions", {"prompt": "x = ", "suffix": "foo(y)\n", "max_tokens": 16
                             }, None, MULTI),  # mid-line
        ("/v1/completions", {"prompt": "def f():\n", "max_tokens": 256}, None, MULTI),
        ("/v1/completions", {"prompt": "def f():\n", "max_tokens": 256}, "line", LINE),
        ("/v1/completions", {"prompt": "x = "}, "block", MULTI),
        ("/v1/chat/completions", {"messages": [], "max_tokens": 8}, None, MULTI),
    ])
def test_tiering_rule(path, body, header, kind):
    assert completion_kind(path, body, header, line_max_tokens=32) == kind


def test_response_cache_is_exact_bounded_and_deterministic_only(monkeypatch):
    body = {"prompt": "x", "temperature": 0, "max_tokens": 4}
    key = cache_key("/v1/completions", body)
    assert key and key == cache_key("/v1/completions", {**body, "user": "someone else"})
    assert key != cache_key("/v1/completions", {**body, "max_tokens": 5})
    assert key != cache_key("/v1/chat/completions", body)
    assert cache_key("/v1/completions", {"prompt": "x"}) is None  # default temperature samples
    assert cache_key("/v1/completions", {"prompt": "x", "temperature": 0.7}) is None
    cache = ResponseCache(max_entries=2, ttl_s=10)
    cache.put("a", b"1", "application/json")
    cache.put("b", b"2", "application/json")
    assert cache.get("a").body == b"1"  # a is now the most recent
    cache.put("c", b"3", "application/json")
    assert cache.get("b") is None and cache.get("a") and cache.get("c")
    import warmpath.router.cache as mod
    now = mod.time.monotonic()
    monkeypatch.setattr(mod.time, "monotonic", lambda: now + 11)
    assert cache.get("a") is None  # too old


def test_only_complete_answers_are_cacheable():
    ok = b'{"choices": [{"text": "x", "finish_reason": "length"}]}'
    assert complete_answer(ok, streamed=False)
    assert not complete_answer(b'{"choices": [{"text": "", "finish_reason": "deadline"}]}',
                               streamed=False)
    sse = (b'data: {"choices": [{"text": "x", "finish_reason": null}]}\n\n'
           b'data: {"choices": [{"text": "", "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')
    assert complete_answer(sse, streamed=True)
    assert not complete_answer(sse.replace(b"data: [DONE]\n\n", b""), streamed=True)
    assert not complete_answer(b'data: {"error": {"message": "x"}}\n\n', streamed=True)
