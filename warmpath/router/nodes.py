"""The nodes behind the router: which they are (from the config and the nodes file, reloaded when it
changes), their engine (router/engines.py), health, drain, load (router/scorer.py) and prefix-cache
counters, read from their own /metrics at every health interval.

A node is *available* for new requests when it is healthy and not draining. It turns unhealthy after
`health_failures` failed `/health` checks in a row, or at once when it refuses a connection; it
becomes healthy again at the first check that passes. Draining stops new requests while its streams
finish. A node that turns unhealthy ends its requests in flight: those that sent nothing to the
client yet fail over, the streams already started end with the error event. A change of the nodes
file applies once it is stable and parses, and never empties the pool (NodesFileState).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from warmpath.config import RouterConfig
from warmpath.router.engines import ENGINES, EngineKind, NodeLoad, detect, read_load, split_spec
from warmpath.router.scorer import node_load

log = logging.getLogger(__name__)

# The prefix-cache counters (in tokens) the router sums over the nodes, whatever each engine calls
# them.
FLEET_COUNTERS = ("queried", "hit")


@dataclass
class Node:
    url: str  # base URL, no trailing slash, no /v1
    model_tier: str = "default"  # its model tier (--tier); "default": one pool
    # its engine (router/engines.py); None until detected at the first passing check
    kind: str | None = None
    healthy: bool = False  # until the first check passes
    draining: bool = False
    failures: int = 0  # consecutive failed checks
    in_flight: int = 0
    from_file: bool = False  # listed in the nodes file (which then decides whether it stays)
    # gone from the nodes file: no new requests; dropped once its requests end
    removed: bool = False
    # its /metrics at the last scrape (None: none read yet, or it has none)
    load: NodeLoad | None = None
    restarts_seen: int = 0
    models: list[str] = field(default_factory=list)
    # its /v1/models entries by id (what each model is)
    cards: dict[str, dict] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)  # last scraped value
    counter_base: dict[str, float] = field(default_factory=dict)  # sums of values before resets
    watches: set = field(default_factory=set)  # the attempts waiting on it (router/watch.py)

    @property
    def available(self) -> bool:
        return self.healthy and not self.draining and not self.removed

    @property
    def engine(self) -> EngineKind:
        return ENGINES[self.kind or "openai"]

    def total(self, name: str) -> float:
        return self.counter_base.get(name, 0.0) + self.counters.get(name, 0.0)


def parse_nodes(config: RouterConfig) -> tuple[list[Node], list[str]]:
    """Nodes with their model tier, and the model_tiers from smallest to largest model."""
    nodes = [new_node(spec) for spec in config.node or []]
    if config.nodes_file:
        nodes += read_nodes_file(config.nodes_file)
    if config.tier and nodes:
        raise ValueError(
            "give either --node / --nodes-file (one pool) or --tier NAME=URL,... (model tiers), "
            "not both"
        )
    model_tiers = []
    if config.tier:
        for spec in config.tier:
            name, _, members = spec.partition("=")
            if not name or not members or name in model_tiers:
                raise ValueError(
                    f"--tier wants NAME=URL[,URL...] with distinct names, got {spec!r}")
            model_tiers.append(name)
            nodes += [new_node(u, model_tier=name) for u in members.split(",") if u.strip()]
    else:
        model_tiers = ["default"]
    if not nodes:
        raise ValueError("no nodes: give --node URL (repeated), --nodes-file or --tier")
    if len({n.url for n in nodes}) != len(nodes):
        raise ValueError("a node is listed twice")
    return nodes, model_tiers


def new_node(spec: str, model_tier: str = "default", draining: bool = False) -> Node:
    kind, url = split_spec(spec.strip())
    return Node(base_url(url), model_tier=model_tier, kind=kind, draining=draining)


def read_nodes_file(path: str) -> list[Node]:
    """One node a line: `[ENGINE=]URL [drain]`, `#` comments. ValueError for a line that says
    something else."""
    with open(path) as f:
        return parse_nodes_text(f.read(), path)


def parse_nodes_text(text: str, path: str) -> list[Node]:
    nodes = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#")[0].split()
        if not words:
            continue
        if len(words) > 2 or (len(words) == 2 and words[1] != "drain"):
            raise ValueError(f"{path}:{number}: want `[ENGINE=]URL [drain]`, got {line.strip()!r}")
        node = new_node(words[0], draining=len(words) == 2)
        node.from_file = True
        nodes.append(node)
    return nodes


def base_url(url: str) -> str:
    """A node's URL as the router keys it: no trailing slash, no /v1."""
    return url.strip().rstrip("/").removesuffix("/v1")


class NodeSet:
    def __init__(self, nodes: list[Node], http: httpx.AsyncClient, interval_s: float = 1.0,
                 failures: int = 3, headers: dict[str, str] | None = None, on_unhealthy=None,
                 floor: int = 0, nodes_file: str | None = None, on_members=None):
        self.nodes = {n.url: n for n in nodes}
        self.http, self.interval_s, self.max_failures, self.floor = (http, interval_s, failures,
                                                                     floor)
        self.headers = headers or {}
        # called with a node that left (its cache is gone or unreachable)
        self.on_unhealthy = on_unhealthy
        # called with the pool's node URLs when the nodes file changed them
        self.on_members = on_members
        self.nodes_file = nodes_file
        # what the pool was built from: the first read applied
        self._file = NodesFileState(_read(nodes_file))
        self._task: asyncio.Task | None = None

    def available(self, model_tier: str | None = None) -> list[str]:
        return [u for u, n in self.nodes.items()
                if n.available and (model_tier is None or n.model_tier == model_tier)]

    def loads(self) -> dict[str, float]:
        return {u: node_load(n.in_flight, n.load, self.floor) for u, n in self.nodes.items()}

    # -- membership --------------------------------------------------------------------------------
    def reload(self) -> bool:
        """Read the nodes file again; a change applies once it is stable and parses
        (NodesFileState): new nodes join (once healthy), removed ones take no new requests and are
        dropped when their last request ends, `drain` is applied. True when the pool's members
        changed."""
        text = _read(self.nodes_file)
        if not self._file.settled(text):
            return False
        try:
            listed = {n.url: n for n in parse_nodes_text(text, self.nodes_file)}
        except ValueError as e:
            log.error("nodes file not reloaded: %s", e)
            return False
        if not listed:
            # an editor's truncation, or a slip: a router needs nodes, and the index is theirs
            log.error("nodes file %s lists no node: the pool is kept as it is", self.nodes_file)
            return False
        pool = {u for u, n in self.nodes.items() if n.from_file and not n.removed}
        for url, node in listed.items():
            known = self.nodes.get(url)
            if known is None:
                log.info("node %s joins", url)
                self.nodes[url] = node
            else:
                known.draining, known.removed, known.from_file = node.draining, False, True
                known.kind = node.kind or known.kind
        for url in pool - set(listed):
            log.info("node %s leaves (not in %s)", url, self.nodes_file)
            self.nodes[url].removed = True
        self._drop_removed()
        if set(listed) != pool and self.on_members:
            self.on_members(
                [u for u, n in self.nodes.items() if n.model_tier == "default" and not n.removed])
        return set(listed) != pool

    def _drop_removed(self) -> None:
        for url in [u for u, n in self.nodes.items() if n.removed and n.in_flight == 0]:
            del self.nodes[url]

    # -- health ------------------------------------------------------------------------------------
    async def check(self, node: Node) -> bool:
        try:
            r = await self.http.get(node.url + "/health", timeout=max(0.5, self.interval_s))
            ok = r.status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok:
            if not node.healthy:
                await self._learn_models(node)
                log.info("node %s is healthy (%s)", node.url, node.kind)
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
            for watch in list(node.watches):
                # its requests in flight fail over, or end their stream
                watch.node_left()
            if self.on_unhealthy:
                self.on_unhealthy(node)

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(n) for n in list(self.nodes.values())))

    async def _learn_models(self, node: Node) -> None:
        try:
            r = await self.http.get(node.url + "/v1/models", headers=self.headers, timeout=5)
            body = r.json()
            data = body.get("data", [])
            node.models = [m["id"] for m in data]
            node.cards = {m["id"]: m for m in data if isinstance(m, dict)}
            node.kind = node.kind or detect(body)
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
            node.models, node.cards = [], {}

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            if self.nodes_file:
                self.reload()
            self._drop_removed()
            await self.check_all()
            await self.scrape()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    # -- the nodes' own counters -------------------------------------------------------------------
    async def scrape(self) -> None:
        """Refresh every healthy node's load and fleet counters from its /metrics (a node that is
        down keeps its last counters; its load is not read)."""
        async def one(node: Node) -> None:
            if not node.healthy or not (node.engine.running or node.engine.prefix_counters):
                return
            try:
                r = await self.http.get(node.url + "/metrics", headers=self.headers,
                                        timeout=min(2.0, max(0.5, self.interval_s)))
                if r.status_code != 200:
                    return
                load = read_load(node.engine, r.text)
            except (httpx.HTTPError, ValueError):
                return
            node.load, values = load, load.counters
            if any(v < node.counters.get(k, 0.0) for k, v in values.items()):  # the node restarted
                for k, v in node.counters.items():
                    node.counter_base[k] = node.counter_base.get(k, 0.0) + v
                node.restarts_seen += 1
            node.counters.update(values)

        await asyncio.gather(*(one(n) for n in list(self.nodes.values())))


@dataclass
class NodesFileState:
    """When a read of the nodes file may change the pool: an editor rewrites a file in steps
    (truncate, then write; or a line at a time), and a read in between sees a file nobody meant. So
    a content applies only once two reads in a row (a health interval apart) found it, and differs
    from the one applied; each is judged once."""

    applied: str | None  # the content the pool follows (None: unreadable)
    seen: str | None = None  # the last read's content, while it waits for a second read

    def settled(self, text: str | None) -> bool:
        """Whether this read's content should be applied now."""
        if text is None or text == self.applied:
            # gone or unreadable (kept as it is), or what we follow
            self.seen = None
            return False
        if text != self.seen:
            self.seen = text  # changing, or new: wait for the next read
            return False
        self.applied, self.seen = text, None
        return True


def _read(path: str | None) -> str | None:
    try:
        return None if path is None else Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return None
