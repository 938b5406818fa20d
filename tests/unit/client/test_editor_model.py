"""One editor client model: the same keystroke script through the asyncio client (`warmpath bench`'s
replay, real HTTP to a loopback server whose answers are scripted) and through the simulator's
Driver (the same scripted answer times on virtual time) gives every request the same outcome; the
outcome rule and the clock-free EditorSession on their own."""

import asyncio
import math

import pytest
from server_harness import running_app
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from warmpath.bench.runner import replay
from warmpath.client import CANCELLED, COMPLETED, DROPPED, ERROR, SHOWN, ClientConfig, Target
from warmpath.client.editor import Cancel, EditorSession, Send
from warmpath.client.outcome import censored_ttft, outcome
from warmpath.engine.block_pool import BlockPool
from warmpath.sim.backends import StepResult
from warmpath.sim.driver import Driver
from warmpath.workloads import Trace, editor_document

# Every decision below has >= 150 ms on either side of it, so scheduling jitter cannot flip an
# outcome.
CONFIG = ClientConfig(debounce_ms=200, deadline_ms=500, max_time_ms=5000, max_tokens=4)
TEXT = "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(40))
# (t, cursor, the answer: first token this long after the request arrives, then gaps between tokens)
KEYS = [
    (0.00, 100, (0.05, [])),  # typed over 50 ms later, inside the debounce: never sent
    (0.05, 101, (0.10, [])),  # sent at 0.25, first token at 0.35: shown
    (1.00, 140, (1.00, [])),  # sent at 1.20, no token by its 1.70 deadline: dropped
    # sent at 3.20, typed over at 3.35, before its token at 3.60: cancelled
    (3.00, 180, (0.40, [])),
    # sent at 3.55, first token at 3.65: shown; typed over before the second
    (3.35, 181, (0.10, [0.60])),
    (3.90, 220, (0.10, [0.05])),  # sent at 4.10: shown, to its end
]
EXPECTED = [SHOWN, DROPPED, CANCELLED, SHOWN, SHOWN]


def trace() -> Trace:
    meta = {
        "workload": "editor", "duration_s": 5.0,
        "editor": {"prefix_chars": 5000, "suffix_chars": 1000}
    }
    t = Trace(meta, {"dev": {"session": "dev", "kind": "editor", "files": {"f.py": TEXT}}})
    t.events = [{
        "type": "key", "t": at, "session": "dev", "file": "f.py", "cursor": c,
        "end": len(TEXT) - 100
    } for at, c, _ in KEYS]
    return t


SCRIPT = {TEXT[:c]: answer for _, c, answer in KEYS}


def answer(prompt: str) -> tuple[float, list[float]]:
    return SCRIPT.get(prompt, (0.05, []))


def scripted_app() -> Starlette:
    async def completions(request: Request):
        first, gaps = answer((await request.json())["prompt"])

        async def events():
            for i, wait in enumerate([first, *gaps]):
                await asyncio.sleep(wait)
                yield (f'data: {{"choices": [{{"index": 0, "text": "t{i}", '
                       '"finish_reason": null}]}\n\n')
            yield 'data: {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}\n\n'
            yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    async def models(request: Request):
        return JSONResponse({"data": []})

    return Starlette(routes=[
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models)
    ])


class ScriptedBackend:
    """A backend for the simulator's Driver whose tokens come at the scripted times after each
    request's arrival (in steps of at most 10 ms, as a server's stream would)."""

    def __init__(self):
        self.pool = BlockPool(64, 16)
        self.due: dict[str, list[float]] = {}

    def add(self, rid, ids, max_tokens, session, deadline, now):
        first, gaps = answer("".join(map(chr, ids)))
        times = [now + first]
        for g in gaps:
            times.append(times[-1] + g)
        self.due[rid] = times

    def abort(self, rid, now):
        self.due.pop(rid, None)

    def busy(self):
        return bool(self.due)

    def step(self, now):
        end = max(now, min(min(now + 0.01, ts[0]) for ts in self.due.values()))
        tokens, finished = [], []
        for rid, ts in list(self.due.items()):
            if ts[0] <= end:
                ts.pop(0)
                tokens.append((rid, 1))
                if not ts:
                    finished.append((rid, "length"))
                    del self.due[rid]
        return StepResult(end - now, tokens, finished, {})

    @property
    def stats(self):
        return {"queried": 0, "hit": 0, "preemptions": 0, "evictions": 0}


def simulated(tr: Trace) -> list[str]:
    driver = Driver(tr, [ScriptedBackend()], lambda text: [ord(ch) for ch in text], CONFIG)
    driver.run()
    return [r.outcome for r in driver.records.values()]


@pytest.mark.server
def test_the_asyncio_client_and_the_simulator_give_the_same_outcome_to_every_request():
    tr = trace()
    assert editor_document(tr, tr.events[1])[0] == TEXT[:101]  # the prompt the script answers
    with running_app(scripted_app()) as (url, _):
        result = asyncio.run(replay(tr, Target(url), CONFIG, progress=False, drain_s=5.0))
    real = [r.outcome for r in result.records]
    assert result.keystrokes == len(KEYS)
    # and as many requests sent: the first key was debounced away
    assert simulated(tr) == real == EXPECTED
    shown = [r for r in result.records if r.outcome == SHOWN]
    assert all(r.ttft is not None and r.ttft < CONFIG.deadline_ms / 1000 for r in shown)


@pytest.mark.parametrize("kind, first, kw, expected", [
    ("editor", 1.0, {"deadline": 2.0}, SHOWN),
    # would have come after the client closed the stream
    ("editor", 2.5, {"deadline": 2.0}, DROPPED),
    ("editor", None, {"deadline": 2.0}, DROPPED),
    ("editor", 1.5, {"cancelled_at": 1.2, "deadline": 2.0}, CANCELLED),
    ("editor", 1.0, {"cancelled_at": 1.2, "deadline": 2.0}, SHOWN),  # shown, then typed over
    # cut short: nothing shown
    ("editor", None, {"error": "x", "finish_reason": "upstream_failed"}, DROPPED),
    ("agent", None, {"error": "x", "finish_reason": "upstream_failed"}, ERROR),
    ("editor", 1.0, {"error": "HTTP 500"}, ERROR),
    ("agent", 1.0, {"finish_reason": "length"}, COMPLETED),
    ("agent", 1.0, {"finish_reason": None}, DROPPED),  # never finished
    ("agent", None, {"cancelled_at": 3.0}, CANCELLED),
])
def test_the_outcome_rule(kind, first, kw, expected):
    assert outcome(kind, first, **kw) == expected


def test_ttft_is_censored_once():
    assert censored_ttft(SHOWN, 0.2) == 0.2
    assert censored_ttft(DROPPED, None) == math.inf and censored_ttft(ERROR, None) == math.inf
    assert censored_ttft(CANCELLED, None) is None


def test_the_editor_session_is_told_the_time_and_answers_what_to_do():
    ed = EditorSession("dev", CONFIG)
    assert ed.keystroke(0.0, "a") is None and ed.due == pytest.approx(0.2)
    assert ed.keystroke(0.1, "ab", "tail") is None  # re-armed for 0.3
    assert ed.timer(0.2) is None  # the first key's timer: typed over
    send = ed.timer(ed.due)
    assert isinstance(send, Send) and send.body == {
        "prompt": "ab", "suffix": "tail", "max_tokens": 4, "temperature": 0.0, "user": "dev"
    }
    assert send.deadline == pytest.approx(0.8) and send.max_time == pytest.approx(5.3)
    assert ed.deadline(0.8) == Cancel("client_deadline")  # no first token by then
    assert ed.keystroke(1.0, "abc") is None  # nothing in flight any more
    ed.timer(1.2)
    ed.first_token(1.3)
    assert ed.deadline(1.7) is None
    assert ed.keystroke(1.8, "abcd") == Cancel("client_cancel")  # streaming: the stream is closed
    assert ed.keystrokes == 4 and ed.requests_sent == 2
