"""Replays a trace against engine backends on a clock: the engine's own Scheduler and BlockPool with
a cost model (SimBackend, virtual time), or the real Engine with the model (RealBackend, wall time)
for validation.

The client side is `warmpath.client`'s own code: each developer is an `EditorSession` (debounce,
cancel on a newer keystroke, the client deadline) told the virtual time of each event, and every
request's outcome is `warmpath.client.outcome`'s rule; the server deadline (X-Deadline-Ms) is the
request's engine deadline; agent turns are closed-loop. Requests join a node's batch at its next
step boundary, exactly as with the AsyncEngine. Several nodes are routed by `warmpath.router`'s own
policies.
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from warmpath.api.fim import Fill, FimFormat, FimTemplate
from warmpath.client.editor import EditorSession
from warmpath.client.outcome import outcome
from warmpath.config import ClientConfig, ServerConfig, SimConfig
from warmpath.router.policies import RouteKey, Router
from warmpath.workloads import Trace, editor_prompt

if TYPE_CHECKING:
    pass



@dataclass
class SimRecord:
    rid: str
    session: str
    kind: str  # editor | agent
    sent: float
    prompt_tokens: int
    node: int = 0
    first_token: float | None = None
    token_times: list[float] = field(default_factory=list)
    done: float | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    cancelled_at: float | None = None  # a newer keystroke closed it
    client_deadline: float | None = None  # the first token must come before this
    turn_index: int | None = None  # agent turns: which turn of the session
    # the router answered an error, or ended the stream with one (its node died)
    error: str | None = None

    @property
    def outcome(self) -> str:
        return outcome(self.kind, self.first_token, cancelled_at=self.cancelled_at,
                       deadline=self.client_deadline, finish_reason=self.finish_reason,
                       error=self.error)

    @property
    def ttft(self) -> float | None:
        """To the first token the client saw: None if none came before its cancel or its deadline
        (the simulator knows when it would have come; the client had closed the stream)."""
        first = self.first_token
        if first is None or any(t is not None and first > t
                                for t in (self.cancelled_at, self.client_deadline)):
            return None
        return first - self.sent


@dataclass
class Sample:
    """The fleet's state at one moment (for pool-over-time plots and resident-session counts)."""

    t: float
    used_blocks: int
    cached_blocks: int
    resident_sessions: int
    preemptions: int


class Driver:
    def __init__(self, trace: Trace, backends: list, tokenize, client: ClientConfig | None = None,
                 router: Router | None = None, realtime: bool = False,
                 sample_every_s: float = SimConfig.sample_every_s,
                 drain_s: float = SimConfig.drain_s, fim: FimTemplate | None = None,
                 suffix_tokens: int | None = None):
        self.trace, self.backends, self.tokenize = trace, backends, tokenize
        # The served model's FIM format: an editor request's prompt is computed as the server
        # renders it, the suffix's first lines only (suffix_tokens; api/fim.keep_suffix)
        self.fim = FimFormat(fim, ServerConfig.fim_layout, suffix_tokens,
                             lambda text: len(tokenize(text)))
        self.client = client or ClientConfig()
        self.router, self.realtime = router, realtime
        self.sample_every_s, self.drain_s = sample_every_s, drain_s
        self.records: dict[str, SimRecord] = {}
        self.samples: list[Sample] = []
        self._events: list[tuple[float, int, str, dict]] = []
        self._seq = itertools.count()
        self._editors: dict[str, EditorSession] = {}  # editor session -> its plugin
        self._inflight: dict[str, str] = {}  # session -> request id in flight
        # session -> (node, ids, block hashes: computed when a sample first needs them)
        self._last_prompt: dict[str, tuple[int, list[int], list[bytes] | None]] = {}
        # nodes given work since they were last seen idle (fleets: few of many)
        self._active: set[int] = set()
        self._agent_turns: dict[str, list[dict]] = {}
        self._free_at = [0.0] * len(backends)
        self._origin = time.monotonic()
        self.now = 0.0
        self.first_preemption: float | None = None

    # -- events ------------------------------------------------------------------------------------
    def _push(self, t: float, kind: str, data: dict) -> None:
        heapq.heappush(self._events, (t, next(self._seq), kind, data))

    def _load(self) -> None:
        for e in self.trace.events:
            if e["type"] == "key":
                self._push(e["t"], "key", e)
        self._agent_turns = self.trace.agent_turns()
        for session, turns in self._agent_turns.items():
            self._push(turns[0]["t"], "turn", {"session": session, "index": 0})

    def _handle(self, t: float, kind: str, data: dict) -> None:
        session = data["session"]
        if kind == "key":
            editor = self._editors.get(session)
            if editor is None:
                editor = self._editors[session] = EditorSession(session, self.client)
            if editor.keystroke(t, *editor_prompt(self.trace, data)) is not None:
                self._close(session, t, "client_cancel")
            self._push(editor.due, "timer", {"session": session})
        elif kind == "timer":
            send = self._editors[session].timer(t)
            if send is not None:
                rec = self._send(session, "editor", send.body["prompt"], send.body["max_tokens"], t,
                                 send.max_time, computed=self._rendered(send.body))
                rec.client_deadline = send.deadline
                self._push(send.deadline, "deadline", {"session": session})
        elif kind == "deadline":
            if self._editors[session].deadline(t) is not None:
                self._close(session, t, "client_deadline")
        elif kind == "turn":
            turn = self._agent_turns[session][data["index"]]
            self._send(session, "agent", turn["prompt"], int(turn["max_tokens"]), t, None,
                       turn_index=data["index"])

    def _close(self, session: str, t: float, reason: str) -> None:
        """The client closes the stream of its request in flight: the server aborts it."""
        rec = self.records[self._inflight[session]]
        self.backends[rec.node].abort(rec.rid, t)
        if reason == "client_cancel":
            rec.cancelled_at = t
        self._finish(rec, t, reason)

    def _rendered(self, body: dict) -> str:
        """The prompt the server computes for an editor body: with a suffix, the FIM prompt as it
        renders it."""
        if "suffix" not in body:
            return body["prompt"]
        return self.fim.render(Fill(prefix=body["prompt"], suffix=body["suffix"])).text

    def _send(self, session: str, kind: str, text: str, max_tokens: int, t: float,
              deadline: float | None, turn_index: int | None = None,
              computed: str | None = None) -> SimRecord:
        """`text` is what the router reads (the prompt field), `computed` what the server tokenizes
        (default: text)."""
        ids = self.tokenize(text if computed is None else computed)
        rid = f"{session}-{len(self.records)}"
        node = self._route(rid, session, text)
        rec = SimRecord(rid, session, kind, t, len(ids), node, turn_index=turn_index)
        self.records[rid] = rec
        self._inflight[session] = rid
        if node < 0:  # no node to take it: the router answers 503 at once
            rec.error = "no_healthy_node"
            self._finish(rec, t, "error")
            return rec
        backend = self.backends[node]
        backend.add(rid, ids, max_tokens, session, deadline, t)
        self._last_prompt[session] = (node, ids, None)
        self._active.add(node)
        self._free_at[node] = max(self._free_at[node], t)
        return rec

    def _route(self, rid: str, session: str, text: str) -> int:
        """The node for a new request (-1: none): the router's policy on this driver's open requests
        per node."""
        if self.router is None:
            return 0
        names = self.router.nodes
        loads = {names[i]: sum(1 for r in self._inflight.values() if self.records[r].node == i
                               and self.records[r].done is None) for i in range(len(names))}
        return names.index(self.router.choose(RouteKey(session, text), names, loads).nodes[0])

    def _finish(self, rec: SimRecord, t: float, reason: str) -> None:
        if rec.done is not None:
            return
        rec.done, rec.finish_reason = t, rec.finish_reason or reason
        if self._inflight.get(rec.session) == rec.rid:
            del self._inflight[rec.session]
            if rec.kind == "editor":
                self._editors[rec.session].done(t)
        if rec.kind == "agent":  # closed loop: the next turn after the think time
            turns = self._agent_turns[rec.session]
            i = rec.turn_index + 1
            if i < len(turns):
                self._push(max(turns[i]["t"], t + turns[i]["after"]), "turn",
                           {"session": rec.session, "index": i})

    # -- the clock ---------------------------------------------------------------------------------
    @property
    def origin(self) -> float:
        """time.monotonic() at the trace's time 0 (a real backend's deadlines are on that clock)."""
        return self._origin

    def _wall(self) -> float:
        return time.monotonic() - self._origin

    def run(self) -> list[SimRecord]:
        self._load()
        end = float(self.trace.meta.get("duration_s") or 0.0)
        next_sample = 0.0
        self._origin = time.monotonic()
        while True:
            busy = sorted(i for i in self._active if self.backends[i].busy())
            self._active = set(busy)
            t_event = self._events[0][0] if self._events else float("inf")
            t_step = min((self._free_at[i] for i in busy), default=float("inf"))
            if self.realtime:
                self.now = self._wall()
                if t_event <= self.now or (not busy and t_event < float("inf")):
                    if t_event > self.now:
                        time.sleep(t_event - self.now)
                    t, _, kind, data = heapq.heappop(self._events)
                    if t > end + self.drain_s:
                        break
                    self._handle(max(t, 0.0), kind, data)
                    continue
                if not busy:
                    break
                self._step(busy[0], self._wall(), realtime=True)
            else:
                if t_event == t_step == float("inf"):
                    break
                if t_event <= t_step:
                    t, _, kind, data = heapq.heappop(self._events)
                    if t > end + self.drain_s:
                        break
                    self.now = t
                    self._handle(t, kind, data)
                else:
                    i = min(busy, key=lambda j: self._free_at[j])
                    self.now = self._free_at[i]
                    self._step(i, self.now, realtime=False)
            while self.now >= next_sample:
                self._sample(next_sample)
                next_sample += self.sample_every_s
        return list(self.records.values())

    def _step(self, i: int, now: float, realtime: bool) -> None:
        backend = self.backends[i]
        result = backend.step(now)
        t_end = self._wall() if realtime else now + result.seconds
        self._free_at[i] = t_end
        if not (result.tokens or result.finished or result.seconds):
            # nothing could run: wait for an event
            self._free_at[i] = self._events[0][0] if self._events else float("inf")
        for rid, cached in result.cached.items():
            rec = self.records.get(rid)
            if rec is not None and rec.cached_tokens is None and cached >= 0:
                rec.cached_tokens = cached
        for rid, n in result.tokens:
            rec = self.records.get(rid)
            if rec is None or rec.done is not None:
                continue
            if rec.first_token is None:
                rec.first_token = t_end
                if rec.kind == "editor":
                    self._editors[rec.session].first_token(t_end)
            rec.token_times += [t_end] * n
        for rid, reason in result.finished:
            rec = self.records.get(rid)
            if rec is not None:
                rec.finish_reason = rec.finish_reason or reason
                self._finish(rec, t_end, reason)
        if self.first_preemption is None and backend.stats["preemptions"] > 0:
            self.first_preemption = now

    def _sample(self, t: float) -> None:
        used = sum(b.pool.num_used for b in self.backends)
        cached = sum(len(b.pool.cached) for b in self.backends)
        resident = 0
        for session, (node, ids, hashes) in self._last_prompt.items():
            if hashes is None:
                hashes = self.backends[node].pool.hashes(ids)
                self._last_prompt[session] = (node, ids, hashes)
            if hashes and len(self.backends[node].pool.find_cached_prefix(
                    ids, hashes)) * 2 >= len(hashes):
                resident += 1
        self.samples.append(
            Sample(t, used, cached, resident, sum(b.stats["preemptions"] for b in self.backends)))
