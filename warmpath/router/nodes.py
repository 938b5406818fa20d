"""The nodes behind the router: which they are (from the config), health, drain, in-flight load, and their
prefix-cache counters.

A node is *available* for new requests when it is healthy and not draining. It turns unhealthy after
`health_failures` failed `/health` checks in a row, or at once when it refuses a connection; it becomes
healthy again at the first check that passes. Draining stops new requests while its streams finish. A node
that turns unhealthy ends its requests in flight: those that sent nothing to the client yet fail over, the
streams already started end with the error event.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from warmpath.config import RouterConfig

log = logging.getLogger(__name__)

# Node counters the router sums into fleet totals (restart-safe: a counter that went down was reset).
FLEET_COUNTERS = ("warmpath_prefix_cache_queried_tokens_total", "warmpath_prefix_cache_hit_tokens_total")


@dataclass
class Node:
    url: str  # base URL, no trailing slash, no /v1
    tier: str = "default"
    healthy: bool = False  # until the first check passes
    draining: bool = False
    failures: int = 0  # consecutive failed checks
    in_flight: int = 0
    restarts_seen: int = 0
    models: list[str] = field(default_factory=list)
    cards: dict[str, dict] = field(default_factory=dict)  # its /v1/models entries by id (what each model is)
    counters: dict[str, float] = field(default_factory=dict)  # last scraped value
    counter_base: dict[str, float] = field(default_factory=dict)  # sums of values before resets
    watches: set = field(default_factory=set)  # the attempts waiting on it (router/watch.py)

    @property
    def available(self) -> bool:
        return self.healthy and not self.draining

    def total(self, name: str) -> float:
        return self.counter_base.get(name, 0.0) + self.counters.get(name, 0.0)


def parse_nodes(config: RouterConfig) -> tuple[list[Node], list[str]]:
    """Nodes with their tier, and the tiers from smallest to largest model."""
    urls = list(config.node or [])
    if config.nodes_file:
        with open(config.nodes_file) as f:
            urls += [line.split("#")[0].strip() for line in f if line.split("#")[0].strip()]
    if config.tier and urls:
        raise ValueError("give either --node (one pool) or --tier NAME=URL,... (model tiers), not both")
    nodes, tiers = [], []
    if config.tier:
        for spec in config.tier:
            name, _, members = spec.partition("=")
            if not name or not members or name in tiers:
                raise ValueError(f"--tier wants NAME=URL[,URL...] with distinct names, got {spec!r}")
            tiers.append(name)
            nodes += [Node(base_url(u), tier=name) for u in members.split(",") if u.strip()]
    else:
        tiers = ["default"]
        nodes = [Node(base_url(u)) for u in urls]
    if not nodes:
        raise ValueError("no nodes: give --node URL (repeated), --nodes-file or --tier")
    if len({n.url for n in nodes}) != len(nodes):
        raise ValueError("a node is listed twice")
    return nodes, tiers


def base_url(url: str) -> str:
    """A node's URL as the router keys it: no trailing slash, no /v1."""
    return url.strip().rstrip("/").removesuffix("/v1")


class NodeSet:
    def __init__(self, nodes: list[Node], http: httpx.AsyncClient, interval_s: float = 1.0,
                 failures: int = 3, headers: dict[str, str] | None = None, on_unhealthy=None):
        self.nodes = {n.url: n for n in nodes}
        self.http, self.interval_s, self.max_failures = http, interval_s, failures
        self.headers = headers or {}
        self.on_unhealthy = on_unhealthy  # called with a node that left (its cache is gone or unreachable)
        self._task: asyncio.Task | None = None

    def available(self, tier: str | None = None) -> list[str]:
        return [u for u, n in self.nodes.items() if n.available and (tier is None or n.tier == tier)]

    def loads(self) -> dict[str, int]:
        return {u: n.in_flight for u, n in self.nodes.items()}

    # -- health -----------------------------------------------------------------------------------------------
    async def check(self, node: Node) -> bool:
        try:
            r = await self.http.get(node.url + "/health", timeout=max(0.5, self.interval_s))
            ok = r.status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok:
            if not node.healthy:
                log.info("node %s is healthy", node.url)
                await self._learn_models(node)
            node.healthy, node.failures = True, 0
        else:
            node.failures += 1
            if node.healthy and node.failures >= self.max_failures:
                self.mark_down(node, f"{node.failures} failed health checks")
        return ok

    def mark_down(self, node: Node, why: str) -> None:
        if node.healthy:
            log.warning("node %s leaves the ring: %s", node.url, why)
            node.healthy = False
            for watch in list(node.watches):  # its requests in flight fail over, or end their stream
                watch.node_left()
            if self.on_unhealthy:
                self.on_unhealthy(node)

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(n) for n in self.nodes.values()))

    async def _learn_models(self, node: Node) -> None:
        try:
            r = await self.http.get(node.url + "/v1/models", headers=self.headers, timeout=5)
            data = r.json().get("data", [])
            node.models = [m["id"] for m in data]
            node.cards = {m["id"]: m for m in data if isinstance(m, dict)}
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            node.models, node.cards = [], {}

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.check_all()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    # -- the nodes' own counters --------------------------------------------------------------------------------
    async def scrape(self) -> None:
        """Refresh every reachable node's fleet counters (a node that is down keeps its last values)."""
        async def one(node: Node) -> None:
            try:
                r = await self.http.get(node.url + "/metrics", headers=self.headers, timeout=2)
                if r.status_code != 200:
                    return
                values = {}
                for family in text_string_to_metric_families(r.text):
                    for s in family.samples:
                        if s.name in FLEET_COUNTERS:
                            values[s.name] = values.get(s.name, 0.0) + s.value
            except (httpx.HTTPError, ValueError):
                return
            if any(v < node.counters.get(k, 0.0) for k, v in values.items()):  # the node restarted
                for k, v in node.counters.items():
                    node.counter_base[k] = node.counter_base.get(k, 0.0) + v
                node.restarts_seen += 1
            node.counters.update(values)

        await asyncio.gather(*(one(n) for n in self.nodes.values()))
