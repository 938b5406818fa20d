"""Tabby's server API on `warmpath serve` (tiny models, loopback HTTP), with the bodies tabby-agent
sends (clients/tabby-agent in github.com/TabbyML/tabby: src/TabbyAgent.ts `createSegments` /
`provideCompletions` at the 1.5.0 release, src/codeCompletion/buildRequest.ts on main) and the
answers crates/tabby/src/routes/*.rs give: the completion on OpenAI's /v1/completions told apart by
its body, its text the same FIM completion as OpenAI's, declarations and snippets as repository
context in a stable order (the family's layout, with `git_url`'s repo and `filepath` in its header),
CRLF files answered in CRLF, silence past the deadline, a disconnect aborts, its errors in plain
text; /v1/health, /v1beta/server_setting, /v1/events."""

import asyncio
import json

import httpx
import pytest
from gguf import GGMLQuantizationType as Q
from server_harness import CODE, counter, running_server, total, wait_for_step
from tiny_gguf import QWEN_VOCAB, uniform, write_gguf

from warmpath.api import tabby as api
from warmpath.api.ask import Outcome
from warmpath.api.fim import ContextFile, detect_fim, repo_context
from warmpath.config import EngineConfig, ServerConfig

SUFFIX = "\n\nprint(Point(1, 2))\n"
DECLARATIONS = [{
    "filepath": "geometry/base.py", "body": "class Shape:\n    def area(self):\n        return 0\n"
}]
CHANGED = [{
    "filepath": "geometry/rect.py", "body": "class Rect(Shape):\n    def __init__(self, w, h):\n"
    "        self.w, self.h = w, h\n", "score": 0.8
}, {
    "filepath": "util.py", "body": "def clamp(v, lo, hi):\n    return max(lo, min(v, hi))\n",
    "score": 0.5
}]
OPENED = [{
    "filepath": "main.py", "body": "from geometry.rect import Rect\nprint(Rect(2, 3).area())\n",
    "score": 1
}]


def segments(prefix: str, suffix: str = SUFFIX, **more) -> dict:
    return {"prefix": prefix, "suffix": suffix, **more}


def tabby(url: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60, **kw)


def openai(url: str, **body) -> dict:
    r = httpx.post(f"{url}/v1/completions", json={"max_tokens": 64, "temperature": 0, **body},
                   timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def context_files(*groups) -> list[dict]:
    return [{"filename": s["filepath"], "text": s["body"]} for g in groups for s in g]


@pytest.mark.server
def test_the_completion_is_openais_fim_completion_in_tabbys_shape(server):
    url, _ = server
    # tabby-agent 1.5.0's body: language, segments (prefix, suffix; filepath without a workspace),
    # user
    r = tabby(url, {"language": "python", "segments": segments(CODE)})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"id", "choices", "mode"} and body["mode"] == "standard" and body["id"]
    assert len(body["choices"]) == 1 and body["choices"][0]["index"] == 0
    ref = openai(url, prompt=CODE, suffix=SUFFIX)  # greedy and 64 tokens: Tabby's defaults here
    assert body["choices"][0]["text"] == ref["choices"][0]["text"]
    assert body["choices"][0]["finish_reason"] == ref["choices"][0]["finish_reason"]
    sampled = [
        tabby(url, {"segments": segments(CODE), "temperature": 0.8, "seed": 2**64 - 1}).json()
        for _ in range(2)
    ]  # a u64 seed, as Tabby takes it
    assert sampled[0]["choices"][0]["text"] == sampled[1]["choices"][0]["text"]
    # The body's shape decides, nothing else: with a prompt it is OpenAI's, whatever else it has
    both = openai(url, prompt=CODE, suffix=SUFFIX, segments=segments("ignored"))
    assert (
        both["object"] == "text_completion"
        and both["choices"][0]["text"] == ref["choices"][0]["text"]
    )
    r = httpx.post(f"{url}/v1/completions", json={"language": "python"})
    # no segments: OpenAI's 400
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = httpx.post(f"{url}/v1/completions", content=b'{"segments": {',
                   headers={"Content-Type": "application/json"})
    # not JSON is nobody's body in particular: OpenAI's 400
    assert r.status_code == 400 and "error" in r.json()


@pytest.mark.server
def test_snippets_are_repository_context_in_a_stable_order(server):
    url, app = server
    who = {"language": "python", "user": "ctx-test"}
    seg = segments(CODE, declarations=DECLARATIONS, relevant_snippets_from_changed_files=CHANGED,
                   relevant_snippets_from_recently_opened_files=OPENED,
                   clipboard="print('copied')\n", filepath="geometry/point.py",
                   git_url="https://github.com/acme/shapes.git")
    first = tabby(url, {**who, "segments": seg}).json()
    # this model has no file separator: the files are plain blocks before the prefix, as OpenAI's
    # `extra` gives
    ref = openai(url, prompt=CODE, suffix=SUFFIX, extra=context_files(DECLARATIONS, CHANGED,
                                                                      OPENED))
    assert first["choices"][0]["text"] == ref["choices"][0]["text"]
    # A keystroke later the agent ranks its snippets otherwise: the same context and prefix, from
    # the prefix cache
    files = [
        ContextFile(f["filename"], f["text"]) for f in context_files(DECLARATIONS, CHANGED, OPENED)
    ]
    warm = len(app.state.engine.tokenizer.encode(repo_context(files, None) + CODE))
    before = total(url, "warmpath_prefix_cache_hit_tokens_total")
    reordered = {
        **seg, "prefix": CODE + "  ", "relevant_snippets_from_changed_files": CHANGED[::-1]
    }
    assert tabby(url, {**who, "segments": reordered}).status_code == 200
    assert total(url, "warmpath_prefix_cache_hit_tokens_total") - before >= (warm - 1) // 16 * 16
    # disable_retrieval_augmented_code_completion: the context is left out, as Tabby leaves it out
    plain = tabby(
        url,
        {"segments": seg, "debug_options": {"disable_retrieval_augmented_code_completion": True}})
    assert plain.json()["choices"][0]["text"] == openai(url, prompt=CODE,
                                                        suffix=SUFFIX)["choices"][0]["text"]


def test_what_does_not_fit_goes_first_recently_opened_then_changed_then_declarations():
    ask = api.parse(
        json.dumps({
            "segments": segments(CODE, declarations=DECLARATIONS,
                                 relevant_snippets_from_changed_files=CHANGED,
                                 relevant_snippets_from_recently_opened_files=OPENED,
                                 git_url="https://github.com/acme/shapes.git/")
        }).encode())
    # server/prompt_fitter.py fit() leaves out Fill.extra from its front: Tabby's priority, reversed
    assert [e.filename for e in ask.fill.extra
            ] == ["main.py", "util.py", "geometry/rect.py", "geometry/base.py"]
    assert ask.fill.repo == "shapes" == api.repo_name(
        "git@github.com:acme/shapes.git") and ask.max_tokens == 64


@pytest.mark.server
def test_crlf_files_are_prompted_in_lf_and_answered_in_crlf(server):
    url, _ = server
    lf = tabby(url, {"segments": segments(CODE)}).json()["choices"][0]["text"]
    crlf = tabby(
        url,
        {"segments": segments(CODE.replace("\n", "\r\n"), SUFFIX.replace("\n", "\r\n"))}).json()
    # the same prompt: the same completion
    assert crlf["choices"][0]["text"] == lf.replace("\n", "\r\n")
    # a random model may write no newline: the answer's own rule, on a text that has them
    ask = api.parse(json.dumps({"segments": segments("a\r\nb", "\r\n")}).encode())
    answer = json.loads(api.answer(ask, "cmpl-1", Outcome(text="x\ny\r\n\nz", finish="stop"), None))
    assert (
        ask.fill.prefix == "a\nb"
        and ask.fill.suffix == "\n"
        and answer["choices"][0]["text"] == "x\r\ny\r\n\r\nz"
    )


@pytest.mark.server
def test_raw_prompt_is_completed_as_it_is(server):
    url, _ = server
    r = tabby(url, {"segments": segments("ignored"), "debug_options": {"raw_prompt": CODE}})
    assert r.json()["choices"][0]["text"] == openai(url, prompt=CODE)["choices"][0]["text"]


@pytest.mark.server
def test_past_the_deadline_an_empty_text_and_a_disconnect_aborts(server):
    url, app = server
    r = tabby(url, {"segments": segments(CODE * 12)}, headers={"X-Deadline-Ms": "5"})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == ""
    assert r.json()["choices"][0]["finish_reason"] in ("deadline", "overloaded")
    wait_for_step(app, lambda e: not e.requests)
    before = counter(url, "warmpath_requests_aborted_total", 'reason="client"')

    async def leave():  # a newer keystroke: tabby-agent aborts the request it no longer needs
        async with httpx.AsyncClient(timeout=60) as http:
            task = asyncio.ensure_future(
                http.post(f"{url}/v1/completions",
                          json={"segments": segments("# leave\n" + CODE * 12)}))
            await asyncio.to_thread(wait_for_step, app, lambda e: bool(e.requests))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    asyncio.run(leave())
    wait_for_step(app, lambda e: not e.requests and e.pool.num_used == 0)
    assert counter(url, "warmpath_requests_aborted_total", 'reason="client"') == before + 1


# (body, status): axum's 422 for a body of the wrong shape, Tabby's 400 for a request it refuses
BAD = [
    (json.dumps({"segments": {"prefix": 1}}).encode(), 422),
    (json.dumps({"segments": {}}).encode(), 422),
    (json.dumps({"segments": "x"}).encode(), 422),
    (json.dumps({"segments": {"prefix": "x", "declarations": [{"filepath": "a"}]}}).encode(), 422),
    (json.dumps({"segments": {"prefix": "x"}, "temperature": "hot"}).encode(), 422),
    (json.dumps({"segments": {"prefix": "x"}, "seed": -1}).encode(), 422),
    (json.dumps({"segments": {"prefix": "\ud800"}}).encode(), 422),
    (json.dumps({"segments": None}).encode(), 400),
    (json.dumps({"segments": {"prefix": "x"}, "mode": "next_edit_suggestion"}).encode(), 400),
    (json.dumps({"segments": {"prefix": "x"},
                 "debug_options": {"return_prompt": True}}).encode(), 400),
    (json.dumps({"segments": {"prefix": "", "suffix": ""}}).encode(), 400),  # nothing to complete
]


@pytest.mark.server
@pytest.mark.parametrize("payload,status", BAD)
def test_bad_input_gets_tabbys_plain_text_error(server, payload, status):
    url, app = server
    r = httpx.post(f"{url}/v1/completions", content=payload,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("text/plain") and r.text and len(r.text) <= 1000
    if status == 422:
        assert r.text.startswith("Failed to deserialize the JSON body into the target type: ")
    assert app.state.async_engine.alive


@pytest.mark.server
def test_health_server_setting_and_events(server):
    url, _ = server
    h = httpx.get(f"{url}/v1/health").json()
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    assert (
        h["model"] == name
        and h["device"] == "cpu"
        and h["cuda_devices"] == []
        and h["cpu_count"] >= 1
    )
    assert h["arch"] and h["cpu_info"] and h["models"]["completion"]["local"]["model_id"] == name
    assert set(h["version"]) == {"build_date", "build_timestamp", "git_sha", "git_describe"}
    # semver >= 0.9: the agent reads settings
    assert h["version"]["git_describe"].startswith("v0.32.0-warmpath-")
    assert httpx.post(f"{url}/v1/health").json()["model"] == name  # the agent's fallback on a 405
    assert httpx.get(f"{url}/v1beta/server_setting").json() == {
        "disable_client_side_telemetry": True
    }
    event = {"type": "view", "completion_id": "cmpl-1", "choice_index": 0, "view_id": "v1"}
    r = httpx.post(f"{url}/v1/events", json=event)
    assert r.status_code == 200 and r.content == b""
    assert httpx.post(f"{url}/v1/events?select_kind=line",
                      json={**event, "type": "select", "elapsed": 9}).status_code == 200
    assert httpx.post(f"{url}/v1/events", json={**event, "type": "scroll"}).status_code == 400
    assert httpx.post(f"{url}/v1/events", json={"type": "view"}).status_code == 422


# -- a FIM family with repo-level markers ----------------------------------------------------------
@pytest.fixture(scope="module")
def qwen_coder(tmp_path_factory):
    """A tiny model with Qwen2.5-Coder's FIM and repo-level tokens (never emitted: their head rows
    are zero); the plain (cursor) FIM layout, so the prompt is the one a token-id request can repeat
    (the default anchored layout heals its last token: tests/unit/server/test_fim_serve.py)."""
    def quiet(w, tokens):
        for t in QWEN_VOCAB.tokens()[1]:
            w["lm_head.weight"][tokens.index(t)] = 0

    path, _, _ = write_gguf(
        tmp_path_factory.mktemp("qwen-coder") / "m.gguf", "qwen2", uniform(Q.Q8_0), QWEN_VOCAB,
        edit=quiet)
    with running_server(EngineConfig(model=str(path), dtype="float32", num_kv_blocks=256),
                        ServerConfig(fim_layout="cursor")) as (url, app):
        yield url, app.state.engine.tokenizer


@pytest.mark.server
def test_the_familys_repo_layout_names_the_repository_and_the_file(qwen_coder):
    url, tok = qwen_coder
    fim = detect_fim(tok)
    assert fim is not None and fim.file_sep == "<|file_sep|>"
    seg = segments(CODE, declarations=DECLARATIONS, relevant_snippets_from_changed_files=CHANGED,
                   filepath="geometry/point.py", git_url="git@github.com:acme/shapes.git")
    files = [ContextFile(f["filename"], f["text"]) for f in context_files(DECLARATIONS, CHANGED)]
    expected = fim.build(CODE, SUFFIX, repo_context(files, fim, "shapes", "geometry/point.py"))
    assert expected.startswith(
        "<|repo_name|>shapes\n<|file_sep|>") and "<|file_sep|>geometry/point.py\n" in expected
    before = total(url, "warmpath_prompt_tokens_total")
    got = tabby(url, {"language": "python", "segments": seg}).json()["choices"][0]["text"]
    # exactly that layout
    assert total(url, "warmpath_prompt_tokens_total") - before == len(tok.encode(expected))
    ids = tok.encode(expected)
    ref = httpx.post(f"{url}/v1/completions",
                     json={"prompt": ids, "max_tokens": 64, "temperature": 0}, timeout=60).json()
    assert got == ref["choices"][0]["text"] and got
