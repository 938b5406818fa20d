"""Fleet mode: N simulated nodes behind R router replicas, each replica a real `Router` with its own
open-request counts, reading every node's load as the real router does (`router.scorer.node_load`
over its own counts and the node's gauges as of its last scrape), and a node that dies mid-run.

A developer's requests reach one replica: hashed by developer (a load balancer that keeps each
editor's keep-alive connection on one replica, as L4 balancers do) or round-robin by request (an L7
balancer). The replicas scrape on the same interval but out of phase (they start independently), so
each routes on a snapshot of its own age.

A node that dies is marked down by every replica at once (a crashed process resets its connections
and refuses the next one: the real router marks a node down on a refused connect), and forgotten
(its prefix index), as the real router's on_unhealthy does. Its requests in flight are treated as
the real proxy treats them: one that sent nothing to the client yet fails over to the next candidate
of its own routing decision (once, while its deadline allows), a stream already started ends with
the error event.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from warmpath.api.fim import FimTemplate
from warmpath.client.outcome import CUT
from warmpath.config import ClientConfig, RouterConfig, SimConfig
from warmpath.router.engines import NodeLoad
from warmpath.router.hashing import bounded_walk, hash64
from warmpath.router.policies import RouteKey, Router
from warmpath.router.scorer import node_load
from warmpath.sim.driver import Driver, SimRecord
from warmpath.workloads import Trace

# router/proxy.py MAX_ATTEMPTS - 1: the chosen node, then one more (a test holds them equal)
FAILOVERS = 1
REPLICA_BY = ("developer", "request")


@dataclass
class FleetSpec:
    """The router side of a fleet; the defaults are the real router's."""

    replicas: int = SimConfig.replicas
    replica_by: str = SimConfig.replica_by
    policy: str = RouterConfig.policy
    scrape_s: float = RouterConfig.health_interval
    floor: int = RouterConfig.affinity_floor
    load_factor: float = RouterConfig.load_factor
    virtual_nodes: int = RouterConfig.virtual_nodes
    kill_at: float | None = None  # simulated second at which one node dies
    kill_node: int | None = None  # which; None: the node that is home to the most sessions then


@dataclass
class Placement:
    """Where a request went and what its routing decision said to try next."""

    replica: int
    node: int
    candidates: list[int]
    failovers: int = 0


@dataclass
class KillReport:
    node: int
    at: float
    # sessions whose last request went there
    sessions_homed: list[str] = field(default_factory=list)
    homes: dict[str, int] = field(default_factory=dict)  # every session's node at the kill
    in_flight: int = 0
    failed_over: int = 0
    cut_streams: int = 0  # started streams ended with the error event
    lost: int = 0  # no candidate left or past the deadline: the client got an error or silence


def scrape(backend) -> NodeLoad:
    """What a node's /metrics would say now: the engine's num_requests_running /
    num_requests_waiting and kv_cache_usage_ratio (engine/engine.py's stats, server/metrics.py's
    gauges)."""
    pool = backend.pool
    return NodeLoad(float(backend.scheduler.num_running), float(backend.scheduler.num_waiting),
                    pool.num_used / pool.num_blocks)


class Walked:
    """A ring whose walk for one key is already known: the replicas share one ring (the same names
    and points), so one walk serves them all."""

    def __init__(self, order: list[str]):
        self.order = order

    def walk(self, key: str, available: set[str] | None = None) -> list[str]:
        return self.order


def by_session(router: Router, key: RouteKey) -> bool:
    """Router.choose takes its session branch for this request (hybrid with a key, or session with
    one)."""
    return bool(key.session) and router.policy in ("hybrid", "session")


def would_choose(router: Router, key: RouteKey, available: list[str], loads: dict[str, float],
                 ring=None) -> str | None:
    """The node a replica would pick for a session-keyed request, without touching its state
    (Router.choose's session branch: bounded loads on the ring); None where the policy is not the
    session one."""
    if not by_session(router, key) or not available:
        return None
    return bounded_walk(ring or router.ring, key.session, loads, router.c, set(available),
                        router.floor)[0]


class FleetDriver(Driver):
    def __init__(self, trace: Trace, backends: list, tokenize, client: ClientConfig | None = None,
                 spec: FleetSpec | None = None,
                 sample_every_s: float = SimConfig.fleet_sample_every_s,
                 drain_s: float = SimConfig.drain_s, fim: FimTemplate | None = None,
                 suffix_tokens: int | None = None):
        super().__init__(trace, backends, tokenize, client, None, sample_every_s=sample_every_s,
                         drain_s=drain_s, fim=fim, suffix_tokens=suffix_tokens)
        self.spec = spec = spec or FleetSpec()
        if spec.replica_by not in REPLICA_BY:
            raise ValueError(f"replica_by must be one of {', '.join(REPLICA_BY)}")
        n = len(backends)
        self.names = [f"node{i}" for i in range(n)]
        self.index = {name: i for i, name in enumerate(self.names)}
        self.replicas = [
            Router(self.names, spec.policy, spec.load_factor, spec.virtual_nodes,
                   RouterConfig.prefix_block_chars, RouterConfig.prefix_index_blocks, spec.floor)
            for _ in range(spec.replicas)
        ]
        self.own = [[0] * n for _ in range(spec.replicas)]  # each replica's open requests per node
        self.scraped: list[list[NodeLoad | None]] = [[None] * n for _ in range(spec.replicas)]
        self.alive = [True] * n
        self.placed: dict[str, Placement] = {}
        self.decisions: dict[str, int] = {}
        self.agreement = [0, 0]  # (requests all replicas would place alike, requests asked)
        # thread CPU seconds of loads + Router.choose, per routed request
        self.choose_cpu: list[float] = []
        self.kill: KillReport | None = None
        self._rr = itertools.count()

    # -- events ------------------------------------------------------------------------------------
    def _load(self) -> None:
        super()._load()
        for r in range(self.spec.replicas):
            # out of phase: each replica's first scrape at its own offset
            self._push(self.spec.scrape_s * r / self.spec.replicas, "scrape",
                       {"session": "", "replica": r})
        if self.spec.kill_at is not None:
            self._push(self.spec.kill_at, "kill", {"session": ""})

    def _handle(self, t: float, kind: str, data: dict) -> None:
        if kind == "scrape":
            r = data["replica"]
            self.scraped[r] = [
                scrape(b) if self.alive[i] else self.scraped[r][i]
                for i, b in enumerate(self.backends)
            ]
            end = float(self.trace.meta.get("duration_s") or 0.0) + self.drain_s
            if t + self.spec.scrape_s <= end:
                self._push(t + self.spec.scrape_s, "scrape", data)
        elif kind == "kill":
            self._kill(t)
        else:
            super()._handle(t, kind, data)

    # -- routing -----------------------------------------------------------------------------------
    def loads(self, r: int) -> dict[str, float]:
        """Replica r's view, as the real NodeSet.loads() computes it."""
        own, scraped, floor = self.own[r], self.scraped[r], self.spec.floor
        return {name: node_load(own[i], scraped[i], floor) for i, name in enumerate(self.names)}

    def available(self) -> list[str]:
        return [name for name, up in zip(self.names, self.alive, strict=True) if up]

    def replica_for(self, session: str) -> int:
        if self.spec.replica_by == "developer":
            return hash64(session) % self.spec.replicas
        return next(self._rr) % self.spec.replicas

    def _route(self, rid: str, session: str, text: str) -> int:
        r = self.replica_for(session)
        key, available = RouteKey(session, text), self.available()
        t = time.thread_time()
        loads = self.loads(r)
        decision = self.replicas[r].choose(key, available, loads)
        self.choose_cpu.append(time.thread_time() - t)
        self.decisions[decision.decision] = self.decisions.get(decision.decision, 0) + 1
        nodes = [self.index[n] for n in decision.nodes]
        if not nodes:
            return -1
        if self.spec.replicas > 1 and by_session(self.replicas[r], key):
            ring = Walked(self.replicas[r].ring.walk(session, set(available)))
            choices = {would_choose(q, key, available, loads if i == r else self.loads(i), ring)
                       for i, q in enumerate(self.replicas)}
            self.agreement[0] += len(choices) == 1
            self.agreement[1] += 1
        self.placed[rid] = Placement(r, nodes[0], nodes)
        self.own[r][nodes[0]] += 1
        return nodes[0]

    def _finish(self, rec: SimRecord, t: float, reason: str) -> None:
        if rec.done is None:
            p = self.placed.pop(rec.rid, None)
            if p is not None:
                self.own[p.replica][p.node] -= 1
        super()._finish(rec, t, reason)

    # -- node loss ---------------------------------------------------------------------------------
    def _kill(self, t: float) -> None:
        homes = {s: node for s, (node, _, _) in self._last_prompt.items()}
        i = self.spec.kill_node
        if i is None:  # the worst case: the node most sessions call home
            counts = [0] * len(self.backends)
            for node in homes.values():
                counts[node] += 1
            i = max(range(len(counts)), key=lambda j: (counts[j], -j))
        report = self.kill = KillReport(i, t, sorted(s for s, n in homes.items() if n == i), homes)
        self.alive[i] = False
        for router in self.replicas:
            router.forget(self.names[i])
        backend = self.backends[i]
        for rid, req in list(backend.requests.items()):
            backend.abort(rid, t)
            rec = self.records[rid]
            report.in_flight += 1
            if rec.first_token is not None:
                # the client has tokens: the stream ends with the error event
                report.cut_streams += 1
                rec.error = rec.finish_reason = CUT
                self._finish(rec, t, CUT)
                continue
            p = self.placed[rid]
            # the proxy tries its decision's candidates in order, FAILOVERS more
            attempt = p.failovers + 1
            nxt = p.candidates[attempt] if attempt <= FAILOVERS and attempt < len(
                p.candidates) else None
            deadline = req.deadline
            if nxt is None or not self.alive[nxt] or (deadline is not None and t >= deadline):
                report.lost += 1  # a 502 (no candidate), or silence past the deadline
                if not (deadline is not None and t >= deadline):
                    rec.error = "upstream_failed"
                self._finish(rec, t, "upstream_failed")
                continue
            j = nxt
            report.failed_over += 1
            self.own[p.replica][i] -= 1
            self.own[p.replica][j] += 1
            p.node, p.failovers = j, p.failovers + 1
            rec.node, rec.cached_tokens = j, None  # its prefix hit is the new node's
            ids = req.prompt_token_ids
            self.backends[j].add(rid, ids, req.max_tokens, rec.session, deadline, t)
            self._last_prompt[rec.session] = (j, ids, None)
            self._free_at[j] = max(self._free_at[j], t)
            self._active.add(j)
        backend.pool.reset_prefix_cache()  # the process is gone, and its memory with it
