"""Replays a trace against engine backends on a clock: the engine's own Scheduler and BlockPool with a cost model
(SimBackend, virtual time), or the real Engine with the model (RealBackend, wall time) for validation.

The client side is the editor plugin's and the agent's behaviour from `warmpath.client` / `warmpath.bench`:
a keystroke cancels what is pending and debounces a new request; a first token later than the client
deadline drops the request (aborted in the engine); the server deadline (X-Deadline-Ms) is the request's
engine deadline; agent turns are closed-loop. Requests join a node's batch at its next step boundary, exactly
as with the AsyncEngine. Several nodes are routed by `warmpath.router`'s own policies.
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field

from warmpath.client.editor import ClientConfig
from warmpath.engine.engine import Engine
from warmpath.engine.block_pool import BlockPool
from warmpath.engine.request import FinishReason, Request, RequestMetrics, SamplingParams
from warmpath.engine.scheduler import Scheduler
from warmpath.router.policies import RouteKey, Router
from warmpath.sim.cost import CostModel, StepShape, step_shape
from warmpath.workloads import Trace, editor_document

SIM_TOKEN = 1  # what the simulated model "samples": never a stop token (requests run to max_tokens)


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

    @property
    def outcome(self) -> str:
        if self.kind == "agent":
            return "completed" if self.finish_reason in ("length", "stop") else "dropped"
        first = self.first_token
        if self.cancelled_at is not None and (first is None or first > self.cancelled_at):
            return "cancelled"
        if first is None or (self.client_deadline is not None and first > self.client_deadline):
            return "dropped"
        return "shown"

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.sent


@dataclass
class StepResult:
    seconds: float
    tokens: list[tuple[str, int]]  # (request id, new tokens) at the end of the step
    finished: list[tuple[str, str]]  # (request id, finish reason)
    cached: dict[str, int]  # request id -> prefix-cache hit at first admission


class SimBackend:
    """The engine's Scheduler and BlockPool, no model: a step costs what the cost model says."""

    def __init__(self, cost: CostModel, num_blocks: int, block_size: int = 16, max_num_batched_tokens: int = 512,
                 max_num_seqs: int = 64, enable_prefix_caching: bool = True):
        from warmpath.config import EngineConfig

        self.cost = cost
        self.pool = BlockPool(num_blocks, block_size, enable_prefix_caching, b"sim")
        self.scheduler = Scheduler(EngineConfig(max_num_batched_tokens=max_num_batched_tokens,
                                                max_num_seqs=max_num_seqs, block_size=block_size), self.pool)
        self.requests: dict[str, Request] = {}
        self.now = 0.0
        self.scheduler.clock = lambda: self.now

    def add(self, rid: str, ids: list[int], max_tokens: int, session: str, deadline: float | None, now: float):
        req = Request(rid, ids, SamplingParams(max_tokens=max_tokens, temperature=0.0), frozenset(), max_tokens,
                      None, RequestMetrics(arrival_time=now), session, deadline)
        self.requests[rid] = req
        self.scheduler.add(req)

    def abort(self, rid: str) -> None:
        req = self.requests.pop(rid, None)
        if req is not None:
            self.scheduler.finish(req, FinishReason.ABORT)

    def busy(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self, now: float) -> StepResult:
        self.now = now
        plan = self.scheduler.schedule()
        sampling = [c.request for c in plan.chunks if c.sample]
        seconds = self.cost.step_seconds(step_shape(plan)) if plan.chunks else 0.0
        done = plan.finished + (self.scheduler.update(plan, [SIM_TOKEN] * len(sampling)) if plan.chunks else [])
        cached = {c.request.request_id: c.request.num_cached_tokens for c in plan.chunks}
        for r in done:
            self.requests.pop(r.request_id, None)
        return StepResult(seconds, [(r.request_id, 1) for r in sampling],
                          [(r.request_id, r.finish_reason.value) for r in done], cached)

    @property
    def stats(self) -> dict:
        s = self.scheduler.stats
        return {"queried": s.prefix_cache_queried_tokens, "hit": s.prefix_cache_hit_tokens,
                "preemptions": s.num_preemptions, "evictions": self.pool.num_evictions}


class RealBackend:
    """The real Engine with the model; time is the wall clock (for validating the simulator)."""

    def __init__(self, engine: Engine, origin: float):
        self.engine, self.origin = engine, origin
        self.pool, self.scheduler = engine.pool, engine.scheduler
        self.steps: list[tuple[StepShape, float]] = []  # every step's plan shape and duration (calibration)
        self._shape: StepShape | None = None
        plan_step = self.scheduler.schedule

        def schedule():  # the engine plans as always; the shape is noted before the model runs
            plan = plan_step()
            self._shape = step_shape(plan)
            return plan
        self.scheduler.schedule = schedule

    def add(self, rid: str, ids: list[int], max_tokens: int, session: str, deadline: float | None, now: float):
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        self.engine.add_request(rid, ids, params, session, None if deadline is None else self.origin + deadline)

    def abort(self, rid: str) -> None:
        if rid in self.engine.requests:
            self.engine.abort(rid)

    def busy(self) -> bool:
        return self.engine.scheduler.has_unfinished()

    def step(self, now: float) -> StepResult:
        t = time.monotonic()
        outs = self.engine.step()
        if self._shape is not None and self._shape.seqs:
            self.steps.append((self._shape, time.monotonic() - t))
        tokens = [(o.request_id, len(o.new_token_ids)) for o in outs if o.new_token_ids]
        finished = [(o.request_id, o.finish_reason.value) for o in outs if o.finished]
        cached = {o.request_id: o.num_cached_tokens for o in outs}
        return StepResult(time.monotonic() - t, tokens, finished, cached)

    @property
    def stats(self) -> dict:
        s = self.engine.scheduler.stats
        return {"queried": s.prefix_cache_queried_tokens, "hit": s.prefix_cache_hit_tokens,
                "preemptions": s.num_preemptions, "evictions": self.engine.pool.num_evictions}


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
                 router: Router | None = None, realtime: bool = False, sample_every_s: float = 1.0,
                 drain_s: float = 30.0):
        self.trace, self.backends, self.tokenize = trace, backends, tokenize
        self.client = client or ClientConfig()
        self.router, self.realtime = router, realtime
        self.sample_every_s, self.drain_s = sample_every_s, drain_s
        self.records: dict[str, SimRecord] = {}
        self.samples: list[Sample] = []
        self._events: list[tuple[float, int, str, dict]] = []
        self._seq = itertools.count()
        self._pending: dict[str, int] = {}  # editor session -> debounce generation still wanted
        self._inflight: dict[str, str] = {}  # session -> request id in flight
        self._last_prompt: dict[str, tuple[int, list[int], list[bytes]]] = {}  # session -> (node, ids, hashes)
        self._agent_turns: dict[str, list[dict]] = {}
        self._free_at = [0.0] * len(backends)
        self._origin = time.monotonic()
        self.now = 0.0
        self.first_preemption: float | None = None

    # -- events ---------------------------------------------------------------------------------------------
    def _push(self, t: float, kind: str, data: dict) -> None:
        heapq.heappush(self._events, (t, next(self._seq), kind, data))

    def _load(self) -> None:
        prefix_chars = int((self.trace.meta.get("editor") or {}).get("prefix_chars", 5000))
        suffix_chars = int((self.trace.meta.get("editor") or {}).get("suffix_chars", 1000))
        prompts: dict[str, str] = {}
        for e in self.trace.events:
            if e["type"] == "key":
                self._push(e["t"], "key", {"event": e, "prefix_chars": prefix_chars, "suffix_chars": suffix_chars})
            elif e["type"] == "turn":
                prompt = prompts.get(e["session"], "")[: e["keep"]] + e["add"]
                prompts[e["session"]] = prompt
                self._agent_turns.setdefault(e["session"], []).append({**e, "prompt": prompt})
        for session, turns in self._agent_turns.items():
            self._push(turns[0]["t"], "turn", {"session": session, "index": 0})

    def _handle(self, t: float, kind: str, data: dict) -> None:
        cfg = self.client
        if kind == "key":
            e = data["event"]
            session = e["session"]
            self._cancel(session, t)
            gen = self._pending.get(session, 0) + 1
            self._pending[session] = gen
            self._push(t + cfg.debounce_ms / 1000, "send", {**data, "gen": gen})
        elif kind == "send":
            session = data["event"]["session"]
            if self._pending.get(session) != data["gen"]:
                return  # a later key replaced it
            prefix, _, _ = editor_document(self.trace, data["event"], data["prefix_chars"], data["suffix_chars"])
            rec = self._send(session, "editor", prefix, cfg.max_tokens, t, t + cfg.max_time_ms / 1000)
            rec.client_deadline = t + cfg.deadline_ms / 1000
            self._push(rec.client_deadline, "client_deadline", {"rid": rec.rid})
        elif kind == "client_deadline":
            rec = self.records[data["rid"]]
            if rec.done is None and (rec.first_token is None or rec.first_token > t):
                self.backends[rec.node].abort(rec.rid)  # the client closes the stream: the server aborts
                self._finish(rec, t, "client_deadline")
        elif kind == "turn":
            turn = self._agent_turns[data["session"]][data["index"]]
            self._send(data["session"], "agent", turn["prompt"], int(turn["max_tokens"]), t, None,
                       turn_index=data["index"])

    def _cancel(self, session: str, t: float) -> None:
        rid = self._inflight.get(session)
        if rid is not None:
            rec = self.records[rid]
            if rec.done is None:
                self.backends[rec.node].abort(rid)
                rec.cancelled_at = t
                self._finish(rec, t, "client_cancel")

    def _send(self, session: str, kind: str, text: str, max_tokens: int, t: float, deadline: float | None,
              turn_index: int | None = None) -> SimRecord:
        ids = self.tokenize(text)
        node = 0
        if self.router is not None:
            names = self.router.nodes
            loads = {names[i]: sum(1 for r in self._inflight.values() if self.records[r].node == i
                                   and self.records[r].done is None) for i in range(len(names))}
            node = names.index(self.router.choose(RouteKey(session, text), names, loads).nodes[0])
        rid = f"{session}-{len(self.records)}"
        rec = SimRecord(rid, session, kind, t, len(ids), node, turn_index=turn_index)
        self.records[rid] = rec
        self._inflight[session] = rid
        backend = self.backends[node]
        backend.add(rid, ids, max_tokens, session, deadline, t)
        self._last_prompt[session] = (node, ids, backend.pool.hashes(ids))
        self._free_at[node] = max(self._free_at[node], t)
        return rec

    def _finish(self, rec: SimRecord, t: float, reason: str) -> None:
        if rec.done is not None:
            return
        rec.done, rec.finish_reason = t, rec.finish_reason or reason
        if self._inflight.get(rec.session) == rec.rid:
            del self._inflight[rec.session]
        if rec.kind == "agent":  # closed loop: the next turn after the think time
            turns = self._agent_turns[rec.session]
            i = rec.turn_index + 1
            if i < len(turns):
                self._push(max(turns[i]["t"], t + turns[i]["after"]), "turn", {"session": rec.session, "index": i})

    # -- the clock ------------------------------------------------------------------------------------------
    def _wall(self) -> float:
        return time.monotonic() - self._origin

    def run(self) -> list[SimRecord]:
        self._load()
        end = float(self.trace.meta.get("duration_s") or 0.0)
        next_sample = 0.0
        self._origin = time.monotonic()
        while True:
            busy = [i for i, b in enumerate(self.backends) if b.busy()]
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
        if not (result.tokens or result.finished or result.seconds):  # nothing could run: wait for an event
            self._free_at[i] = self._events[0][0] if self._events else float("inf")
        for rid, cached in result.cached.items():
            rec = self.records.get(rid)
            if rec is not None and rec.cached_tokens is None and cached >= 0:
                rec.cached_tokens = cached
        for rid, n in result.tokens:
            rec = self.records.get(rid)
            if rec is None or rec.done is not None:
                continue
            rec.first_token = rec.first_token or t_end
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
        for node, ids, hashes in self._last_prompt.values():
            if hashes and len(self.backends[node].pool.find_cached_prefix(ids, hashes)) * 2 >= len(hashes):
                resident += 1
        self.samples.append(Sample(t, used, cached, resident, sum(b.stats["preemptions"] for b in self.backends)))
