"""Typing through a suggestion (server/type_through.py): a request that only adds characters of the
session's last answer is answered with the rest of it, with no model step; anything else asks the
model. On a real server (tiny model, loopback HTTP), OpenAI completions with a suffix and /infill as
llama.vscode sends it, whole and streamed."""

import json

import httpx
import pytest
from server_harness import CODE, counter

from warmpath.api.ask import Ask
from warmpath.api.fim import ContextFile, Fill
from warmpath.server.type_through import TAIL_CHARS, Suggestions

SUFFIX = "\n\nprint(add(1, 2))\n"


def fim(prefix: str, suffix: str = SUFFIX, **fields) -> Ask:
    return Ask(**{"fill": Fill(prefix, suffix), "max_tokens": 16, "temperature": 0.0, **fields})


def test_the_rest_of_the_last_answer_once_its_first_characters_are_typed():
    now = [0.0]
    s = Suggestions(clock=lambda: now[0], max_sessions=2, ttl_s=60)
    s.remember("dev", fim(CODE), "self.x = x\n", "stop", 40, 0.9, "anchored")
    hit = s.match("dev", fim(CODE + "self.x"))
    assert (hit.typed, hit.rest, hit.last.prompt_tokens) == ("self.x", " = x\n", 40)
    # editors send a window of the file: its top moved, the text before the cursor still ends alike
    window = "# a line added above\n" + ("x" * TAIL_CHARS) + CODE
    s.remember("dev", fim(window), "self.x = x\n", "stop", 40, None, None)
    assert s.match("dev", fim(window[30:] + "self")).rest == ".x = x\n"
    for other in (
            fim(CODE + "self.y"),  # typed something else
            fim(CODE + "self.x = x\n"),  # typed all of it: a new question
            fim(window + "self", suffix="\n"),  # the code after the cursor changed
            fim(window + "self", temperature=0.5),  # asked differently
            Ask(fill=Fill(window + "self", SUFFIX, extra=[ContextFile("a.py", "A = 1\n")]),
                max_tokens=16, temperature=0.0),  # other context files
            fim(window + "self", max_tokens=0),  # a warm-up
    ):
        assert s.match("dev", other) is None
    assert s.match("someone else", fim(window + "self")) is None
    now[0] = 61.0
    assert s.match("dev", fim(window + "self")) is None  # too old
    s.remember("a", fim(CODE), "x", "stop", 1, None, None)
    s.remember("b", fim(CODE), "xy", "stop", 1, None, None)
    s.remember("c", fim(CODE), "xyz", "stop", 1, None, None)
    assert list(s.sessions) == ["b", "c"]  # bounded, least recent first out
    s.remember("b", fim(CODE), "", "stop", 1, None, None)  # an empty answer: nothing to type into
    s.remember("c", fim(CODE), "", "deadline", 1, None, None)  # silence: the last one still shows
    assert list(s.sessions) == ["c"]


def complete(url: str, prompt: str, session: str = "dev", suffix: str = SUFFIX, **body) -> dict:
    r = httpx.post(f"{url}/v1/completions", headers={"X-Session-Id": session}, timeout=60,
                   json={"prompt": prompt, "suffix": suffix, "max_tokens": 16, "temperature": 0,
                         "scope": "none", **body})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.server
def test_a_server_answers_typing_through_without_a_model_step(server):
    url, _ = server
    first = complete(url, CODE)
    answer = first["choices"][0]["text"]
    assert len(answer) >= 4, answer
    computed = counter(url, "warmpath_computed_tokens_total")
    k = len(answer) // 2
    typed = complete(url, CODE + answer[:k])
    assert typed["choices"][0]["text"] == answer[k:]
    assert typed["choices"][0]["finish_reason"] == first["choices"][0]["finish_reason"]
    assert typed["usage"]["prompt_tokens"] >= first["usage"]["prompt_tokens"]
    # typing on goes through what is left, streamed too
    r = httpx.post(f"{url}/v1/completions", headers={"X-Session-Id": "dev"}, timeout=60,
                   json={"prompt": CODE + answer[:k + 1], "suffix": SUFFIX, "max_tokens": 16,
                         "temperature": 0, "scope": "none", "stream": True})
    events = [json.loads(line[6:]) for line in r.text.splitlines()
              if line.startswith("data: {")]
    assert "".join(e["choices"][0]["text"] for e in events) == answer[k + 1:]
    assert counter(url, "warmpath_computed_tokens_total") == computed  # no model step
    assert counter(url, "warmpath_typed_through_total") == 2
    complete(url, CODE + answer[:k], session="another developer")  # not their suggestion
    complete(url, CODE + answer[:k], suffix="\n")  # the code after the cursor changed
    assert counter(url, "warmpath_computed_tokens_total") > computed
    assert counter(url, "warmpath_typed_through_total") == 2


@pytest.mark.server
def test_infill_types_through_as_llama_vscode_sends_it(server):
    url, _ = server
    body = {"input_prefix": CODE, "input_suffix": SUFFIX, "input_extra": [], "prompt": "    ",
            "n_predict": 16, "temperature": 0, "samplers": [], "cache_prompt": True}
    first = httpx.post(f"{url}/infill", json=body, timeout=60).json()
    answer = first["content"]
    assert len(answer) >= 2, first
    before = counter(url, "warmpath_typed_through_total")
    again = httpx.post(f"{url}/infill", json={**body, "prompt": "    " + answer[:1]},
                       timeout=60).json()
    assert again["content"] == answer[1:]
    assert counter(url, "warmpath_typed_through_total") == before + 1
