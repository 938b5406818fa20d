"""Replays a trace against one server, as the developers and agents in it would: editor keystrokes
open-loop on the trace's clock (people type whatever the server does), agent turns closed-loop (the
next turn waits for the previous answer, then the think time)."""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field

import httpx

from warmpath.bench.scrape import scrape
from warmpath.client.completion import RequestRecord, Target, discover_model, stream_completion
from warmpath.client.editor_http import EditorClient
from warmpath.config import BenchConfig, ClientConfig
from warmpath.workloads import Trace, editor_document


@dataclass
class RunResult:
    target: str
    model: str | None
    duration_s: float
    records: list[RequestRecord]
    keystrokes: int
    metrics_before: dict | None
    metrics_after: dict | None
    extra: dict = field(default_factory=dict)


class Progress:
    """One live line on stderr: elapsed / total, requests by outcome."""

    def __init__(self, label: str, total_s: float, records: list[RequestRecord],
                 enabled: bool = True):
        self.label, self.total_s, self.records, self.enabled = label, total_s, records, enabled
        self.tty = sys.stderr.isatty()
        self._last = 0.0

    def update(self, t: float, force: bool = False) -> None:
        if not self.enabled or (not force and t - self._last < (0.5 if self.tty else 15.0)):
            return
        self._last = t
        counts: dict[str, int] = {}
        for r in self.records:
            counts[r.outcome or "in-flight"] = counts.get(r.outcome or "in-flight", 0) + 1
        frac = min(1.0, t / self.total_s) if self.total_s else 1.0
        bar = "#" * int(frac * 30)
        parts = " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
        line = f"{self.label} [{bar:<30}] {t:6.0f}/{self.total_s:.0f} s  {parts}"
        print(("\r" + line + "\x1b[K") if self.tty else line, end="" if self.tty else "\n",
              file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.enabled and self.tty:
            print(file=sys.stderr)


async def _agent(http: httpx.AsyncClient, target: Target, session: str, turns: list[dict],
                 records: list[RequestRecord], clock, duration: float) -> None:
    prev_done = 0.0
    for turn in turns:  # Trace.agent_turns: each with its full prompt
        prompt = turn["prompt"]
        send_at = max(turn["t"], prev_done + turn["after"])
        if send_at >= duration:  # a slow server pushed this turn past the end of the run
            return
        wait = send_at - clock()
        if wait > 0:
            await asyncio.sleep(wait)
        rec = RequestRecord(session, "agent", clock(), prompt_chars=len(prompt))
        records.append(rec)
        body = {
            "prompt": prompt, "max_tokens": turn["max_tokens"], "temperature": 0.0, "user": session
        }
        await stream_completion(http, target, body, rec, clock, session=session)
        prev_done = clock()


async def replay(trace: Trace, target: Target, config: ClientConfig, label: str = "bench",
                 progress: bool = True, drain_s: float = BenchConfig.drain_s) -> RunResult:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    timeout = httpx.Timeout(600.0, connect=10.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as http:
        target.model = target.model or await discover_model(http, target)
        before = await scrape(http, target)
        records: list[RequestRecord] = []
        start = time.monotonic()

        def clock() -> float:
            return time.monotonic() - start

        editors: dict[str, EditorClient] = {}
        agents = []
        duration = float(
            trace.meta.get("duration_s") or (trace.events[-1]["t"] if trace.events else 0))
        for session, ts in trace.agent_turns().items():
            agents.append(
                asyncio.create_task(_agent(http, target, session, ts, records, clock, duration)))
        bar = Progress(label, duration, records, progress)
        for e in trace.events:
            if e["type"] != "key":
                continue
            wait = e["t"] - clock()
            if wait > 0:
                await asyncio.sleep(wait)
            bar.update(clock())
            client = editors.get(e["session"])
            if client is None:
                client = editors[e["session"]] = EditorClient(http, target, e["session"], config,
                                                              records, clock)
            prefix, suffix, expected = editor_document(trace, e)
            client.keystroke(prefix, suffix, expected)
        while clock() < duration:
            # the trace's time is the run's time, even if its last key came early
            await asyncio.sleep(min(0.5, duration - clock()))
            bar.update(clock())
        # Drain: requests still in flight may finish (bounded); whatever is left after that is
        # cancelled.
        pending = [a for a in agents if not a.done()]
        pending += [c.pending for c in editors.values() if c.pending is not None]
        if pending:
            await asyncio.wait(pending, timeout=drain_s)
        for a in agents:
            a.cancel()
        await asyncio.gather(*agents, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in editors.values()))
        elapsed = clock()
        bar.update(elapsed, force=True)
        bar.done()
        await asyncio.sleep(0.5)  # let the server record the last aborts before the scrape
        after = await scrape(http, target)
    return RunResult(target.url, target.model, elapsed, records,
                     sum(c.keystrokes for c in editors.values()), before, after)
