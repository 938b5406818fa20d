"""`warmpath route` as a fleet of replicas with changing membership, on real tiny-model servers on
loopback: the nodes file reloaded (join, drain, leave: only the changed node's sessions move), node
kinds detected and their load read from their own /metrics, two replicas sending every session to
the same node, and a node declared as an engine that rejects `suffix` getting the prompt the router
rendered."""

import contextlib
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_harness import CODE, counter, running_app, running_server, wait_for_step

from warmpath.api.scope import ScopeCutter
from warmpath.config import RouterConfig
from warmpath.router.app import create_router_app

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def fleet(server_config):
    with contextlib.ExitStack() as stack:
        nodes = [stack.enter_context(running_server(server_config)) for _ in range(3)]
        yield {url: app for url, app in nodes}


@contextlib.contextmanager
def router(**kwargs):
    cfg = RouterConfig(health_interval=kwargs.pop("health_interval", 0.2), policy="session",
                       **kwargs)
    with running_app(create_router_app(cfg)) as (url, app):
        yield url, app


def node_of(rurl: str, session: str, prompt: str = "# x\n") -> str:
    r = httpx.post(f"{rurl}/v1/completions", json={"prompt": prompt, "max_tokens": 1},
                   headers={"X-Session-Id": session}, timeout=60)
    assert r.status_code == 200, r.text
    return r.headers["x-warmpath-node"]


def nodes_view(rurl: str) -> dict[str, dict]:
    return {n["url"]: n for n in httpx.get(f"{rurl}/health").json()["nodes"]}


def until(condition, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)


SESSIONS = [f"dev-{i}" for i in range(24)]


def test_the_nodes_file_is_reloaded_and_only_the_changed_nodes_sessions_move(fleet, tmp_path):
    a, b, c = fleet
    f = tmp_path / "nodes"
    f.write_text(f"{a}\n{b}\n")
    with router(nodes_file=str(f)) as (rurl, _):
        two = {s: node_of(rurl, s) for s in SESSIONS}
        assert set(two.values()) == {a, b}
        f.write_text(f"# one more\n{a}\n{b}\nwarmpath={c}\n")  # c joins
        until(lambda: nodes_view(rurl).get(c, {}).get("healthy"))
        three = {s: node_of(rurl, s) for s in SESSIONS}
        assert {s
                for s in SESSIONS if three[s] != two[s]} == {s
                                                             for s in SESSIONS
                                                             if three[s] == c} != set()
        # b drains: its sessions go elsewhere, it stays listed
        f.write_text(f"{a}\n{b} drain\nwarmpath={c}\n")
        until(lambda: nodes_view(rurl)[b]["draining"])
        drained = {s: node_of(rurl, s) for s in SESSIONS}
        assert b not in drained.values() and all(drained[s] == three[s]
                                                 for s in SESSIONS if three[s] != b)
        f.write_text("not a url line with three words\n")  # a bad file changes nothing
        time.sleep(0.6)
        assert set(nodes_view(rurl)) == {a, b, c} and node_of(rurl,
                                                              SESSIONS[0]) == drained[SESSIONS[0]]
        f.write_text(f"{a}\nwarmpath={c}\n")  # b leaves for good; a and c keep their sessions
        until(lambda: b not in nodes_view(rurl))
        assert {s: node_of(rurl, s) for s in SESSIONS} == drained


def test_node_kind_is_detected_and_its_load_read_from_its_metrics(fleet):
    url, app = next(iter(fleet.items()))
    with router(node=[url]) as (rurl, _):
        assert nodes_view(rurl)[url]["engine"] == "warmpath"
        with ThreadPoolExecutor(1) as pool:
            # a long request in flight on the node, sent around the router
            long = pool.submit(httpx.post, f"{url}/v1/completions",
                               json={"prompt": CODE * 20, "max_tokens": 300,
                                     "ignore_eos": True}, timeout=120)
            wait_for_step(app, lambda e: e.requests)
            until(lambda: (nodes_view(rurl)[url]["reported"] or {}).get("running", 0) >= 1)
            # not this router's: seen only in the node's gauges
            assert nodes_view(rurl)[url]["in_flight"] == 0
            assert long.result().status_code == 200


def test_two_replicas_send_every_session_to_the_same_node(fleet):
    urls = list(fleet)
    # The floor above this test's load: where loads move sessions is the scorer's
    # (test_router_scorer.py, and two replicas seeing different own counts may then differ); here
    # nothing but the ring decides.
    with router(node=urls, affinity_floor=64) as (r1, _), \
            router(node=urls, admin_key="k", affinity_floor=64) as (r2, _):
        def both(s: str) -> tuple[str, str]:
            prompt = f"# {s}\n" + CODE * 3
            return node_of(r1, s, prompt), node_of(r2, s, prompt)

        with ThreadPoolExecutor(6) as pool:
            # concurrently: each replica sees only its own share of the load
            pairs = list(pool.map(both, SESSIONS))
        assert all(x == y for x, y in pairs) and len({x for x, _ in pairs}) == 3
        ask = {"Authorization": "Bearer k"}
        assert [httpx.get(f"{r2}/admin/route", params={"session": s}, headers=ask).json()["node"]
                # where it would send each next, nothing sent
                for s in SESSIONS] == [x for x, _ in pairs]
        # one replica restarted: nothing moves
        with router(node=urls, affinity_floor=64) as (r3, _):
            assert [node_of(r3, s) for s in SESSIONS] == [x for x, _ in pairs]


def test_a_node_that_rejects_suffix_gets_the_prompt_rendered_by_the_router(fleet):
    """The node is a warmpath server declared as vLLM: it must receive a plain prompt (the tiny
    model has no FIM tokens, so: the repository context and the prefix), and answer exactly what
    that plain prompt gives."""
    url = next(iter(fleet))
    body = {"prompt": CODE, "suffix": "\n# end\n", "max_tokens": 6, "temperature": 0,
            "extra": [{"filename": "util.py", "text": "X = 1"}]}
    with router(node=[f"vllm={url}"], cache_entries=0) as (rurl, _):
        assert nodes_view(rurl)[url]["engine"] == "vllm"
        via = httpx.post(f"{rurl}/v1/completions", json=body, timeout=60).json()
    direct = httpx.post(
        f"{url}/v1/completions",
        json={"prompt": "util.py\nX = 1\n" + CODE, "max_tokens": 6,
              "temperature": 0}, timeout=60).json()
    assert via["choices"][0]["text"] == direct["choices"][0]["text"]
    assert via["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]


def test_editor_protocols_reach_an_engine_that_speaks_only_openai(fleet):
    """llama.vim's /infill, Ollama's NDJSON stream and Tabby's completions through the router to a
    node declared as vLLM: sent as OpenAI completions, answered in each protocol's own shape, with
    the text the plain prompt gives on the node."""
    url = next(iter(fleet))
    plain = httpx.post(
        f"{url}/v1/completions",
        json={"prompt": "util.py\nX = 1\n" + CODE, "max_tokens": 6,
              "temperature": 0}, timeout=60).json()["choices"][0]["text"]
    infill = {
        "input_prefix": CODE[:40], "prompt": CODE[40:], "input_suffix": "\n# end\n", "n_predict": 6,
        "input_extra": [{"filename": "util.py", "text": "X = 1"}], "temperature": 0
    }
    with router(node=[f"vllm={url}"], cache_entries=0) as (rurl, _):
        r = httpx.post(f"{rurl}/infill", json=infill, timeout=60)
        assert r.status_code == 200 and r.json()["content"] == plain and r.json()["stop"] is True
        assert r.json()["tokens_predicted"] == 6 and r.json()["tokens_evaluated"] > 0
        assert httpx.post(f"{rurl}/infill", json={**infill, "n_predict": 0},
                          timeout=60).json()["content"] == ""
        gen = {
            "model": "m", "prompt": "util.py\nX = 1\n" + CODE, "raw": True,
            "options": {"num_predict": 6, "temperature": 0}
        }
        r = httpx.post(f"{rurl}/api/generate", json=gen, timeout=60)  # streamed by default: NDJSON
        lines = [json.loads(line) for line in r.text.splitlines()]
        assert r.headers["content-type"].startswith("application/x-ndjson")
        assert "".join(x["response"] for x in lines) == plain and lines[-1]["done"] is True
        assert lines[-1]["eval_count"] == 6
        tabby = {
            "language": "python", "segments": {"prefix": "util.py\nX = 1\n" + CODE},
            "temperature": 0
        }
        r = httpx.post(f"{rurl}/v1/completions", json=tabby, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["text"].startswith(plain)
        # llama.cpp's own 400 shape
        bad = httpx.post(f"{rurl}/infill", json={"input_prefix": 5}, timeout=60)
        assert bad.status_code == 400 and "error" in bad.json()


def test_a_whole_answer_from_an_engine_that_aborts_only_streams_is_streamed_and_collected(fleet):
    """Declared as llama.cpp (which keeps computing a non-streamed request whose client left): the
    router streams it from the node and answers the whole completion itself; the same text and usage
    as the node's own."""
    url, app = next(iter(fleet.items()))
    body = {"prompt": CODE, "max_tokens": 7, "temperature": 0}
    direct = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    chat = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 5, "temperature": 0}
    direct_chat = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60).json()
    with router(node=[f"llamacpp={url}"], cache_entries=0) as (rurl, _):
        via = httpx.post(f"{rurl}/v1/completions", json=body, timeout=60).json()
        assert (
            via["object"] == "text_completion"
            and via["choices"][0]["text"] == direct["choices"][0]["text"]
        )
        assert (
            via["choices"][0]["finish_reason"] == "length"
            and via["usage"]["completion_tokens"] == 7
        )
        via_chat = httpx.post(f"{rurl}/v1/chat/completions", json=chat, timeout=60).json()
        assert via_chat["choices"][0]["message"] == direct_chat["choices"][0]["message"]
        # past the deadline: silence, and the node stopped (the stream was closed)
        r = httpx.post(f"{rurl}/v1/completions", json={"prompt": CODE * 40, "max_tokens": 500},
                       headers={"X-Deadline-Ms": "40"}, timeout=60)
        assert r.json()["choices"][0]["finish_reason"] == "deadline"
        wait_for_step(app, lambda e: not e.requests)


def test_an_engine_without_a_completion_scope_has_its_fim_answers_cut_by_the_router(fleet):
    """Declared as an engine with no completion scope, the node's fill-in-the-middle answers are cut
    by the router where `warmpath serve` cuts its own (api/scope.py), whole and streamed, OpenAI's
    and /infill's; the router closes the node's stream at the cut, so the node stops decoding;
    `scope: none` asks for the engine's whole answer. (Declared as vLLM or llama.cpp, a warmpath
    node would get a constraint on how its answer begins, for the router's token healing, which it
    refuses: as "openai", an engine that takes none, it gets the cursor layout. Healing on the real
    engines: tests/fleet/test_engines.py.)"""
    url = next(iter(fleet))
    prefix, suffix = "def add(a,", " b):\n    return a + b\n"  # mid-line: the rest of the line
    raw = httpx.post(
        f"{url}/v1/completions",
        json={"prompt": prefix, "max_tokens": 48, "temperature": 0},
        timeout=60,
    ).json()["choices"][0]["text"]  # the plain prompt the router renders (no FIM tokens)
    scope = ScopeCutter(prefix, suffix)
    want = scope.feed(raw)
    assert scope.cut and want != raw
    # the node would write on far past the cut, so each cut below ends a node request still running
    # (a short answer could finish before the router closes it, and the node would count no client
    # gone)
    body = {
        "prompt": prefix, "suffix": suffix, "max_tokens": 2000, "ignore_eos": True, "temperature": 0
    }
    for engine in ("openai",):
        with router(node=[f"{engine}={url}"], cache_entries=0) as (rurl, _):
            aborted = counter(url, "warmpath_requests_aborted_total", 'reason="client"')
            whole = httpx.post(f"{rurl}/v1/completions", json=body, timeout=60).json()
            assert (
                whole["choices"][0]["text"] == want
                and whole["choices"][0]["finish_reason"] == "stop"
            )
            with httpx.stream("POST", f"{rurl}/v1/completions", json={**body, "stream": True},
                              timeout=60) as r:
                chunks = [
                    json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")
                ]
            assert "".join(c["choices"][0]["text"] for c in chunks) == want
            assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
            infill = {
                "input_prefix": prefix, "input_suffix": suffix, "n_predict": 2000, "temperature": 0
            }
            assert httpx.post(f"{rurl}/infill", json=infill, timeout=60).json()["content"] == want
            # each of the three closed the node's stream at the cut: the node counts its client gone
            gone = aborted + 3
            until(lambda: counter(url, "warmpath_requests_aborted_total", 'reason="client"')
                  >= gone)  # noqa: B023
            none = httpx.post(f"{rurl}/v1/completions",
                              json={**body, "max_tokens": 48, "scope": "none"}, timeout=60).json()
            assert none["choices"][0]["text"] == raw
