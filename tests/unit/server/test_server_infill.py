"""llama.cpp's /infill on `warmpath serve` (tiny model, loopback HTTP), driven with the exact bodies
llama.vim and llama.vscode send, field for field:

- llama.vim, autoload/llama.vim at a1c8e6e (github.com/ggml-org/llama.vim): `llama#fim` builds the
  completion request, `s:ring_update` the `n_predict: 0` warm-up, `s:fim_try_hint` the speculative
  follow-up after a shown hint (llama#fim with `prev` = the hint: `s:fim_ctx_local` then puts the
  hint into the cursor's line); `s:fim_on_response` drops a reply unless it matches
  `"content"\\s*:"`.
- llama.vscode, src/llama-server.ts at 3938fb3 (github.com/ggml-org/llama.vscode):
  `createRequestPayload` (its `noPredict` form is `updateExtraContext`'s warm-up); src/completion.ts
  `getComplFromContent` reads `content`.
"""

import asyncio
import json

import httpx
import pytest
from llama_vim import EXTRA, FILE, LINES, VIM_ACCEPTS, vim_fim, vim_warmup
from server_harness import CODE, computed_since, counter, wait_for_step


@pytest.fixture(scope="module")
def server_config(tiny_long_dir, server_kv_blocks):
    """llama.vim's 500 ms for the prompt phase holds on a busy 2-core machine with 256 tokens per
    step."""
    from warmpath.config import EngineConfig, SchedulerConfig

    return EngineConfig(model=str(tiny_long_dir), dtype="float32", num_kv_blocks=server_kv_blocks,
                        scheduler=SchedulerConfig(max_num_batched_tokens=256))


def vscode_fim(prefix: str, middle: str, suffix: str, chunks: list,
               no_predict: bool = False) -> dict:
    """createRequestPayload at the extension's defaults (n_predict 128, t_max_prompt_ms 500,
    t_max_predict_ms 2500, max_parallel_completions 3, no lora, no model)."""
    if no_predict:
        return {
            "id_slot": 0, "input_prefix": prefix, "input_suffix": suffix, "input_extra": chunks,
            "prompt": middle, "n_predict": 0, "samplers": [], "cache_prompt": True,
            "t_max_prompt_ms": 500, "t_max_predict_ms": 1
        }
    return {
        "id_slot": 0, "input_prefix": prefix, "input_suffix": suffix, "input_extra": chunks,
        "prompt": middle, "n_predict": 128, "n_cmpl": 3, "top_k": 40, "top_p": 0.99,
        "stream": False, "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
        "n_indent": 4, "t_max_prompt_ms": 500, "t_max_predict_ms": 2500
    }


def post(url: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(f"{url}/infill", json=body, timeout=60, **kw)


def warming(app):
    """Call before a warm-up is sent; the function it returns waits until the engine computed it."""
    start = app.state.engine.stats()["num_computed_tokens"]
    return lambda: computed_since(app, start)


@pytest.mark.server
def test_a_warm_up_is_answered_at_once_and_computes_only_in_steps_with_nothing_else(server):
    # llama.vscode opens a long file (its warm-up) as another developer's keystroke comes: the
    # keystroke's steps never carry a warm-up chunk, and the warm-up still computes, alone.
    url, app = server
    steps: list[tuple[bool, ...]] = []
    app.state.engine.scheduler.add_listener(
        lambda batch: steps.append(tuple(c.request.warmup for c in batch.chunks)))
    asked = counter(url, "warmpath_warm_ups_asked_total")
    warmed = warming(app)
    chunks = [{"text": CODE * 12, "time": 1722000000000, "filename": "big.py"}]
    warm = post(url, vscode_fim(CODE * 4, "", "\n", chunks, no_predict=True))
    keystroke = post(url, vscode_fim("# another developer's\n" + CODE, "    ", "\n", []),
                     headers={"X-Session-Id": "b"})
    warmed()
    assert warm.status_code == 200 and warm.json()["content"] == ""
    assert warm.json()["tokens_predicted"] == 0 and warm.json()["stop"] is True
    assert keystroke.status_code == 200 and "content" in keystroke.json()
    assert counter(url, "warmpath_warm_ups_asked_total") == asked + 1
    mixed = [s for s in steps if any(s) and not all(s)]
    assert mixed == [] and any(all(s) and s for s in steps), steps


@pytest.mark.server
def test_llama_vim_keystrokes_warmup_and_speculative_follow_up(server):
    url, app = server
    # a chunk was yanked: the ring's context goes in ahead of any completion
    warmed = warming(app)
    r = post(url, vim_warmup(EXTRA))
    # response_fields [""]: llama.cpp answers an empty object
    assert r.status_code == 200 and r.json() == {}
    warmed()  # answered at once, computed in the engine's idle steps before the first keystroke
    prefix, suffix = FILE, "\n" + "".join(LINES[:2])
    cached = []
    for middle in ("def g(", "def g(y"):  # two keystrokes along one line
        r = post(url, vim_fim(prefix, middle, suffix, EXTRA))
        assert r.status_code == 200 and r.text.startswith("{") and VIM_ACCEPTS.search(
            r.text), r.text
        reply = r.json()
        assert set(reply) == {
            "content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
            "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
            "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated",
            "tokens_cached"
        }
        assert isinstance(reply["content"], str) and reply["truncated"] is False
        cached.append(reply["tokens_cached"])
    # The warm-up filled the cache: the first keystroke already finds the context; the second finds
    # more.
    assert cached[0] >= 16 and cached[1] > cached[0]
    # The hint was shown: llama.vim asks at once for what follows it (its cursor line now ends with
    # the hint).
    hint = reply["content"].split("\n")[0]
    follow = vim_fim(prefix, "def g(y" + hint, "\n" + "".join(LINES[:2]), EXTRA, first=False)
    r = post(url, follow)
    assert r.status_code == 200 and VIM_ACCEPTS.search(
        r.text) and r.json()["tokens_cached"] >= cached[1] - 16


@pytest.mark.server
def test_llama_vscode_bodies(server):
    url, _ = server
    chunks = [{"text": c["text"], "time": 1722000000000 + i, "filename": c["filename"]}
              for i, c in enumerate(EXTRA)]
    r = post(url, vscode_fim("", "", "", chunks, no_predict=True))  # updateExtraContext
    assert r.status_code == 200
    warm = r.json()
    assert warm["content"] == "" and warm["tokens_predicted"] == 0 and warm["stop"] is True
    r = post(url, vscode_fim(FILE, "    ", "\n", chunks))
    assert r.status_code == 200
    data = r.json()
    assert "content" in data and isinstance(data["content"], str)  # getComplFromContent's test
    t = data["timings"]
    assert (
        t["prompt_n"] + t["cache_n"] == data["tokens_evaluated"]
        and t["cache_n"] == data["tokens_cached"] > 0
    )
    assert (
        t["predicted_n"] == data["tokens_predicted"]
        and data["generation_settings"]["top_p"] == 0.99
    )


@pytest.mark.server
def test_stream_and_the_same_text_as_v1_completions(server):
    url, _ = server
    body = {
        "input_prefix": CODE, "input_suffix": "", "prompt": "        ", "n_predict": 24,
        "temperature": 0.0, "stream": True
    }
    with httpx.stream("POST", f"{url}/infill", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert all(not e["stop"] for e in events[:-1]) and events[-1]["stop"] is True
    assert events[-1]["content"] == "" and events[-1]["tokens_predicted"] == 24
    text = "".join(e["content"] for e in events)
    ref = httpx.post(f"{url}/v1/completions", json={"prompt": CODE + "        ", "max_tokens": 24,
                                                     "temperature": 0}, timeout=60).json()
    assert text == ref["choices"][0]["text"] and len(events) > 2  # token by token, not one piece
    whole = post(url, {**body, "stream": False}).json()
    assert (
        whole["content"] == text
        and whole["tokens_cached"]
        == ref["usage"]["prompt_tokens_details"]["cached_tokens"]
        == whole["timings"]["cache_n"]
    )


def _greedy(url: str, prompt: str, n: int = 64) -> dict:
    return httpx.post(
        f"{url}/v1/completions",
        json={"prompt": prompt, "max_tokens": n, "temperature": 0,
              "ignore_eos": True}, timeout=60).json()


@pytest.mark.server
def test_t_max_predict_ms_ends_at_a_newline_past_the_budget(server):
    url, _ = server
    # A prompt whose greedy completion has a newline well before its end (the tiny model is random).
    prompt, full = next((p, t) for p in (f"# {i}\n" + CODE for i in range(60))
                        if 0 < (t := _greedy(url, p)["choices"][0]["text"]).find("\n") < len(t) - 8)
    r = post(url,
             {"input_prefix": prompt, "n_predict": 64, "temperature": 0.0, "t_max_predict_ms": 1})
    reply = r.json()
    assert "\n" in reply["content"] and full.startswith(reply["content"]) and len(
        reply["content"]) < len(full)
    assert reply["stop_type"] == "limit" and reply["tokens_predicted"] < 64
    # Without the budget, the same request runs to n_predict.
    assert post(
        url,
        {"input_prefix": prompt, "n_predict": 64, "temperature": 0.0}).json()["content"] == full


@pytest.mark.server
def test_n_indent_ends_before_a_line_that_leaves_the_block(server):
    url, _ = server
    prompt, full = next((p, t) for p in (f"# {i}\n" + CODE for i in range(60))
                        if 0 < (t := _greedy(url, p)["choices"][0]["text"]).find("\n") < len(t) - 8)
    cut = post(
        url, {"input_prefix": prompt, "n_predict": 64, "temperature": 0.0, "n_indent": 200}).json()
    # the first new line is indented less than 200 columns
    assert cut["content"] == full[:full.find("\n")]


@pytest.mark.server
def test_t_max_prompt_ms_is_silence_and_a_warmup_is_never_cut(server):
    url, app = server
    before = counter(url, "warmpath_requests_aborted_total", 'reason="deadline"')
    long = "# prompt phase\n" + CODE * 12  # ~700 tokens at 64 per step: many steps
    r = post(url, {"input_prefix": long, "n_predict": 16, "t_max_prompt_ms": 1})
    assert r.status_code == 200 and r.json()["content"] == "" and r.json(
    )["finish_reason"] == "deadline"
    assert counter(url, "warmpath_requests_aborted_total", 'reason="deadline"') == before + 1
    wait_for_step(app, lambda e: not e.requests)
    warm, warmed = "# warmed\n" + CODE * 12, warming(app)
    r = post(url,
             {"input_prefix": warm, "n_predict": 0, "t_max_prompt_ms": 1, "t_max_predict_ms": 1})
    assert r.status_code == 200 and r.json()["content"] == "" and r.json()["tokens_predicted"] == 0
    warmed()
    after = post(url, {"input_prefix": warm + "x", "n_predict": 1}).json()
    # the warm-up's prompt is all in the cache
    assert after["tokens_cached"] >= after["tokens_evaluated"] - 32


@pytest.mark.server
def test_deadline_header_is_silence_whole_and_streamed(server):
    url, _ = server
    body = {"input_prefix": CODE * 12, "n_predict": 200}
    r = post(url, body, headers={"X-Deadline-Ms": "5"})
    # silence either way: "overloaded" when queued work (an aborted request not yet dropped) makes 5
    # ms impossible
    answer = r.json()
    assert r.status_code == 200 and answer["content"] == "" and answer["finish_reason"] in (
        "deadline", "overloaded")
    r = post(url, {**body, "stream": True}, headers={"X-Deadline-Ms": "5"})
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert r.status_code == 200 and events[-1]["stop"] is True and events[-1]["finish_reason"] in (
        "deadline", "overloaded")


@pytest.mark.server
def test_disconnect_aborts_on_the_engine(server):
    url, app = server
    before = counter(url, "warmpath_requests_aborted_total", 'reason="client"')

    async def leave_mid_stream():
        async with httpx.AsyncClient(timeout=60) as http:
            body = {"input_prefix": "# leave\n" + CODE * 12, "n_predict": 400, "stream": True}
            async with http.stream("POST", f"{url}/infill", json=body) as r:
                async for _ in r.aiter_lines():
                    return
    asyncio.run(leave_mid_stream())
    wait_for_step(app, lambda e: not e.requests and e.pool.num_used == 0)
    assert counter(url, "warmpath_requests_aborted_total", 'reason="client"') == before + 1


BAD = [
    b"{not json", b"[1]",
    json.dumps({"n_predict": "ten"}).encode(),
    json.dumps({"n_predict": -2}).encode(),
    json.dumps({"input_prefix": 7}).encode(),
    json.dumps({"input_extra": [{"text": 1}]}).encode(),
    json.dumps({"input_extra": "x"}).encode(),
    json.dumps({"samplers": ["mirostat9"]}).encode(),
    json.dumps({"top_p": 0}).encode(),
    json.dumps({"stop": [""]}).encode(),
    json.dumps({"input_prefix": "\ud800"}).encode(),
    json.dumps({"input_prefix": "", "prompt": ""}).encode()
]


@pytest.mark.server
@pytest.mark.parametrize("payload", BAD)
def test_bad_input_gets_llama_cpps_error_object(server, payload):
    url, app = server
    r = httpx.post(f"{url}/infill", content=payload, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"code", "message", "type"} and err["code"] == 400 and err["message"]
    assert app.state.async_engine.alive


def test_indent_cutter_holds_back_only_a_new_lines_indentation():
    from warmpath.api.cutters import Chain, IndentCutter
    from warmpath.api.scope import ScopeCutter

    c = IndentCutter(4)
    text = "x = 1\n    y = 2\n\n    z = 3\nw = 4\n"
    out = "".join(c.feed(ch) for ch in text)  # one character per delta
    assert out == "x = 1\n    y = 2\n\n    z = 3" and c.cut
    c = IndentCutter(4)
    # shown once the line is known
    assert c.feed("a\n  ") == "a" and c.feed("  b") == "\n    b" and not c.cut
    # the cursor before `return`
    chain = Chain(IndentCutter(4), ScopeCutter("def f():\n", "    return\n"))
    # "    return" may go on
    assert chain.feed("    v = 1\n    return") == "    v = 1" and not chain.cut
    assert chain.feed("\n    x") == "\n" and chain.cut and chain.rule == "suffix"
