"""The router's Prometheus metrics: per node requests, in-flight, failovers, health, prefix index
size; policy decisions; cache hits; degraded answers; per-tier counts; and the fleet's prefix-cache
counters summed over the nodes (under the nodes' own names, so `warmpath bench` reads the fleet's
hit rate through the router)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from warmpath.router.nodes import FLEET_COUNTERS, NodeSet
from warmpath.router.policies import Router


class _NodeCollector(Collector):
    def __init__(self, nodes: NodeSet):
        self.nodes = nodes

    def collect(self):
        nodes = list(self.nodes.nodes.values())
        for name, doc, value in (
            ("warmpath_router_node_in_flight", "Requests the router has open to the node",
             lambda n: n.in_flight),
            ("warmpath_router_node_healthy", "1 while the node passes health checks",
             lambda n: int(n.healthy)),
            ("warmpath_router_node_draining", "1 while the node takes no new requests",
             lambda n: int(n.draining)),
            ("warmpath_router_node_load",
             "The node's load as bounded loads count it (router/scorer.py)",
             lambda n: self.nodes.loads().get(n.url, 0.0)),
            ("warmpath_router_node_requests_reported",
             "Running + waiting requests in the node's own /metrics", lambda n: n.load.requests
             if n.load else 0.0),
        ):
            g = GaugeMetricFamily(name, doc, labels=["node", "tier", "engine"])
            for n in nodes:
                g.add_metric([n.url, n.model_tier, n.kind or "unknown"], value(n))
            yield g
        for key in FLEET_COUNTERS:  # under warmpath's names, whatever each engine calls them
            base = f"warmpath_prefix_cache_{key}_tokens"
            fleet = CounterMetricFamily(
                base, "Summed over the nodes (restart-safe), scraped at this request")
            fleet.add_metric([], sum(n.total(key) for n in nodes))
            yield fleet
            per = CounterMetricFamily(base.replace("warmpath_", "warmpath_router_node_"),
                                      "Per node", labels=["node"])
            for n in nodes:
                per.add_metric([n.url], n.total(key))
            yield per


class _IndexCollector(Collector):
    """Each node's prefix index (a node gone for less than DEPARTED_S keeps its own): bounded by
    --prefix-index-blocks, and the router's largest table."""

    def __init__(self, routers: dict[str, Router]):
        self.routers = routers

    def collect(self):
        blocks = GaugeMetricFamily(
            "warmpath_router_prefix_index_blocks", "Prompt blocks the router remembers "
            "routing to the node (at most --prefix-index-blocks)", labels=["node"])
        size = GaugeMetricFamily("warmpath_router_prefix_index_bytes",
                                 "Memory of the node's prefix index", labels=["node"])
        for router in self.routers.values():
            indexes = {**{n: i for n, (_, i) in router.departed.items()}, **router.index}
            for node, index in indexes.items():
                blocks.add_metric([node], len(index.blocks))
                size.add_metric([node], index.nbytes())
        yield blocks
        yield size


class RouterMetrics:
    def __init__(self, nodes: NodeSet, routers: dict[str, Router]):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("warmpath_router_requests", "Requests sent to a node", ["node"],
                                registry=r)
        self.failovers = Counter(
            "warmpath_router_failovers", "Requests moved to another node before the first "
            "byte, by the node that failed", ["node"], registry=r)
        self.decisions = Counter("warmpath_router_decisions", "Routing decisions by outcome",
                                 ["policy", "decision"], registry=r)
        self.cache = Counter("warmpath_router_cache_requests",
                             "Deterministic requests by response-cache result", ["result"],
                             registry=r)
        self.degraded = Counter(
            "warmpath_router_degraded", "Answers that were silence or an error event because "
            "of the fleet (deadline, node lost mid-stream, no node)", ["reason"], registry=r)
        self.model_tiers = Counter("warmpath_router_tier_requests", "Requests by model tier",
                                   ["tier", "kind"], registry=r)
        self.session_ids_hashed = Counter(
            "warmpath_router_session_ids_hashed", "Requests whose session id was "
            "longer than --max-session-id-chars: kept as its hash", registry=r)
        r.register(_NodeCollector(nodes))
        r.register(_IndexCollector(routers))

    def render(self) -> bytes:
        return generate_latest(self.registry)
