"""The editor-like client against a real server on loopback (tiny model): a burst of keystrokes
leaves exactly one request alive and the server aborts the rest; debounce; the client deadline drops
silently; `warmpath complete`; `warmpath bench` end to end (JSON + PNG)."""

import asyncio
import json
import time

import httpx
import pytest
from server_harness import CODE, counter, wait_for_step

from warmpath import LLM, SamplingParams
from warmpath.bench.runner import replay
from warmpath.cli import main
from warmpath.client import CANCELLED, COMPLETED, DROPPED, SHOWN, ClientConfig, EditorClient, Target
from warmpath.client.completion import (
    RequestRecord,
    discover_model,
    monotonic_clock,
    stream_completion,
)
from warmpath.workloads import AgentParams, agent_trace

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server_kv_blocks() -> int:
    # the `server` fixture (conftest.py) with a larger pool for this module
    return 2048


def finished(url: str) -> float:
    return sum(
        counter(url, "warmpath_requests_total", f'finish_reason="{r}"') for r in ("stop", "length"))


def test_a_burst_of_keystrokes_leaves_one_request_alive_and_the_server_aborts_the_rest(server):
    url, app = server
    engine = app.state.engine
    aborted0, finished0 = counter(url, "warmpath_requests_aborted_total",
                                  'reason="client"'), finished(url)
    # still computing
    cfg = ClientConfig(debounce_ms=20, deadline_ms=60_000, max_time_ms=60_000, max_tokens=400)
    seen: set[str] = set()

    def arrived(n):
        def cond(e):
            seen.update(e.requests)
            return len(seen) >= n
        return cond

    def slow_step(e):  # 400 tokens take seconds, so no request can finish before the next key lands
        time.sleep(0.05)

    async def burst():
        records = []
        async with httpx.AsyncClient(timeout=60) as http:
            client = EditorClient(http, Target(url), "dev-burst", cfg, records, monotonic_clock())
            text = "# burst\n" + CODE * 14
            app.state.async_engine.step_listeners.append(slow_step)
            try:
                for k in range(5):
                    # each key lands while the previous key's request is being computed
                    client.keystroke(text + "x" * (k + 1))
                    await asyncio.to_thread(wait_for_step, app, arrived(k + 1))
            finally:
                app.state.async_engine.step_listeners.remove(slow_step)
            await client.idle()
        return client, records

    client, records = asyncio.run(burst())
    assert client.keystrokes == 5 and client.requests_sent == 5
    assert [r.outcome for r in records[:4]] == [CANCELLED] * 4 and records[4].outcome == SHOWN
    assert records[4].done is not None and records[4].tokens > 0
    wait_for_step(app, lambda e: not e.requests)
    # aborted ...
    assert counter(url, "warmpath_requests_aborted_total", 'reason="client"') == aborted0 + 4
    assert finished(url) == finished0 + 1  # ... not completed: one request ran to its end
    assert engine.pool.num_used == 0 and not engine.requests


def test_keys_inside_the_debounce_send_one_request(server):
    url, _ = server

    async def typing():
        records = []
        async with httpx.AsyncClient(timeout=60) as http:
            client = EditorClient(http, Target(url), "dev-fast",
                                  ClientConfig(debounce_ms=150, max_tokens=4, deadline_ms=30_000),
                                  records, monotonic_clock())
            for k in range(6):
                client.keystroke(CODE + "y" * k)
                await asyncio.sleep(0.01)
            await client.idle()
        return client, records

    client, records = asyncio.run(typing())
    assert client.keystrokes == 6 and client.requests_sent == 1 and len(records) == 1
    assert records[0].outcome == SHOWN and records[0].prompt_chars == len(CODE) + 5


def test_a_late_first_token_is_dropped_silently_and_the_server_stops(server):
    url, app = server
    aborted0 = counter(url, "warmpath_requests_aborted_total", 'reason="client"')

    seen: set[str] = set()

    def slow_step(e):  # ~1,700 tokens at 64 per step, 50 ms each: far beyond the deadline
        seen.update(e.requests)
        time.sleep(0.05)

    async def late():
        records = []
        async with httpx.AsyncClient(timeout=60) as http:
            # 300 ms: long enough for the request to reach the server on a slow machine, so it has
            # one to stop
            client = EditorClient(http, Target(url), "dev-late",
                                  ClientConfig(debounce_ms=1, deadline_ms=300), records,
                                  monotonic_clock())
            app.state.async_engine.step_listeners.append(slow_step)
            try:
                client.keystroke("# late\n" + CODE * 30)
                await client.idle()
            finally:
                app.state.async_engine.step_listeners.remove(slow_step)
        return records

    records = asyncio.run(late())
    assert seen  # the server had the request, so there was something to stop
    assert len(records) == 1 and records[0].outcome == DROPPED and records[0].error is None
    assert records[0].text == "" and records[0].first_token is None
    # answered by nobody, its prompt warms on for the session's next keystroke (Scheduler.abort),
    # then lets go
    wait_for_step(app, lambda e: not e.requests and not e.scheduler.has_unfinished())
    assert counter(url, "warmpath_requests_aborted_total", 'reason="client"') == aborted0 + 1
    assert app.state.engine.pool.num_used == 0


def test_warmpath_complete_prints_the_suggestion_at_the_cursor(server, tiny_long_dir, tmp_path,
                                                               capsys):
    url, _ = server
    src = tmp_path / "point.py"
    src.write_text(CODE + "        self.x = x\n")
    expected = LLM(str(tiny_long_dir), dtype="float32").generate(
        CODE + "        self.", SamplingParams(max_tokens=8, temperature=0))[0].text
    assert main(["complete", f"{src}:6:14", "--target", url, "--max-tokens", "8", "--no-fim"]) == 0
    out = capsys.readouterr()
    assert out.out == expected + "\n"
    assert "shown: TTFT" in out.err
    # outside the file: a clear error
    assert main(["complete", f"{src}:60:1", "--target", url]) == 2


def test_agent_turns_replay_closed_loop_with_warm_prefixes(server):
    url, _ = server
    p = AgentParams(start_tokens=400, max_context_tokens=700, tool_tokens=(40, 80),
                    think_s=(0.01, 0.05), max_tokens=4)
    trace = agent_trace(2, 6.0, seed=1, rate=50, params=p, count_tokens=len)
    result = asyncio.run(replay(trace, Target(url), ClientConfig(), progress=False, drain_s=30))
    agents = [r for r in result.records if r.kind == "agent"]
    assert len(agents) >= 4 and all(r.outcome == COMPLETED for r in agents)
    for sid in trace.sessions:
        mine = sorted((r for r in agents if r.session == sid), key=lambda r: r.sent)
        assert all(b.sent >= a.done for a, b in zip(mine, mine[1:], strict=False))  # closed loop
    assert sum(r.cached_tokens or 0 for r in agents) > 0.5 * sum(r.prompt_tokens
                                                                 for r in agents[2:])


@pytest.mark.slow
def test_bench_editor_end_to_end_writes_json_and_png(server, tmp_path):
    url, _ = server
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    rc = main([
        "bench", "--target", url, "--workload", "editor", "--developers", "3", "--duration", "12",
        "--rate", "400", "--seed", "1", "--deadline-ms", "5000", "--json",
        str(out), "--plot",
        str(png), "--no-progress"
    ])
    assert rc == 0
    report = json.loads(out.read_text())
    s = report["summaries"][0]
    assert s["requests"] > 3 and s["outcomes"]["error"] == 0
    assert s["outcomes"]["shown"] > 0 and s["editor_ttft_s"]["p50"] > 0
    assert 0 < s["prefix_hit_rate"] <= 1 and s["prefix_hit_rate_source"] == "server /metrics"
    # per answered request, from its usage: warm keystrokes compute little
    computed = s["computed_prompt_tokens"]
    prompts = sorted(r["prompt_tokens"] for r in next(iter(report["records"].values()))
                     if r["prompt_tokens"])
    assert 0 < computed["p50"] <= computed["p90"] and computed["p50"] < prompts[len(prompts) // 2]
    # Stale requests were aborted by the server, not run to their end: it finished no more than were
    # shown, but for the odd one whose last token left the server while the client's cancel was on
    # its way.
    server = s["server"]
    finished = server.get("finished_stop", 0) + server.get("finished_length", 0)
    assert server["aborted_client"] > 0
    assert finished <= s["outcomes"]["shown"] + 2, (finished, s["outcomes"], server)
    # reported from the server's counters: no suffix sent, so no FIM prompt and no short context
    assert s["short_context_share"] == 0 and "typed_through_share" in s
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["infill", "mistral", "ollama", "tabby"])
def test_bench_replays_the_same_trace_through_each_editor_protocol(server, tmp_path, protocol):
    """llama.vim's, Mistral's, Ollama's and Tabby's protocols for the same editor traffic:
    suggestions shown, the prefix cache reused keystroke to keystroke, and (streamed protocols)
    stale requests aborted."""
    url, _ = server
    out = tmp_path / f"{protocol}.json"
    rc = main([
        "bench", "--target", url, "--protocols", protocol, "--workload", "editor", "--developers",
        "3", "--duration", "12", "--rate", "400", "--seed", "2", "--deadline-ms", "5000", "--json",
        str(out), "--no-progress"
    ])
    assert rc == 0
    s = json.loads(out.read_text())["summaries"][0]
    assert s["requests"] > 3 and s["outcomes"]["error"] == 0 and s["outcomes"]["shown"] > 0
    assert 0 < s["prefix_hit_rate"] <= 1
    if protocol != "tabby":
        # Tabby's answer is not streamed: a cancelled one may already be written
        assert s["server"]["aborted_client"] > 0
    assert main(["bench", "--target", url, "--protocols", f"{protocol},openai",
                 "--no-progress"]) == 2


def test_each_protocol_gets_the_same_greedy_answer(server):
    url, _ = server
    body = {"prompt": CODE, "suffix": "\n\nprint(add(1, 2))\n", "max_tokens": 8, "temperature": 0}

    async def one(protocol: str) -> str:
        async with httpx.AsyncClient(timeout=60) as http:
            target = Target(url, protocol=protocol)
            target.model = await discover_model(http, target)
            rec = RequestRecord("s", "editor", 0.0)
            await stream_completion(http, target, body, rec, monotonic_clock())
            assert rec.error is None and rec.outcome in (COMPLETED, SHOWN), (protocol, rec)
            return rec.text

    texts = {p: asyncio.run(one(p)) for p in ("openai", "mistral", "ollama")}
    assert texts["openai"] and len(set(texts.values())) == 1, texts
    assert asyncio.run(one("tabby")).startswith(texts["openai"])  # Tabby asks for 64 tokens
    assert asyncio.run(one("infill"))  # llama.vim's samplers (top_k alone) sample: another text
